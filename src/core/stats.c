/*
 * stats.c — the counters a pipeline reports: each component's, their sum,
 * and the memory figures of every tier (device, host slabs, pinned, disk,
 * the disk tier's staging ring).  Above everything it sums, so no mover
 * reaches up to report (docs/architecture.md).
 */
#include "core/internal.h"
#include "core/policy.h"

#include <string.h>

int mlo_component_get_stats(mlo_component *c, mlo_component_stats *out) {
  if (!c || !out) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  *out = c->stats;
  pthread_mutex_unlock(&c->pipe->lock);
  return MLO_OK;
}

int mlo_pipeline_get_stats(mlo_pipeline *pipe, mlo_pipeline_stats *out) {
  if (!pipe || !out) return MLO_EINVAL;
  memset(out, 0, sizeof *out);
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  for (size_t i = 0; i < pipe->ncomps; i++) {
    const mlo_component_stats *s = &pipe->comps[i]->stats;
    out->total.loads += s->loads;
    out->total.evictions += s->evictions;
    out->total.forwards += s->forwards;
    out->total.h2d_bytes += s->h2d_bytes;
    out->total.d2h_bytes += s->d2h_bytes;
    out->total.copy_calls += s->copy_calls;
    out->total.platform_calls += s->platform_calls;
    out->total.wait_ns += s->wait_ns;
    out->total.forward_ns += s->forward_ns;
    out->total.prefetches += s->prefetches;
    out->total.block_loads += s->block_loads;
    out->total.block_wait_ns += s->block_wait_ns;
    out->total.disk_loads += s->disk_loads;
    out->total.disk_read_bytes += s->disk_read_bytes;
    out->total.disk_wait_ns += s->disk_wait_ns;
    out->total.joined_loads += s->joined_loads;
  }
  out->host_budget_bytes = pipe->enabled ? pipe->settings.host_budget_bytes : 0;
  out->disk_bytes = pipe->disk_bytes;
  out->staging_bytes = mlo_disk_staging_bytes(pipe);
  out->budget_bytes = pipe->policy && pipe->policy->budget ? pipe->policy->budget(pipe) : 0;
  out->device_bytes = pipe->device_bytes;
  out->peak_device_bytes = pipe->peak_device_bytes;
  out->host_slab_bytes = pipe->host_slab_bytes;
  out->pinned_bytes = pipe->pinned_bytes;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

void mlo_pipeline_reset_stats(mlo_pipeline *pipe) {
  if (!pipe) return;
  MLO_LOCK_OR_VOID(&pipe->lock);
  for (size_t i = 0; i < pipe->ncomps; i++)
    memset(&pipe->comps[i]->stats, 0, sizeof(mlo_component_stats));
  pipe->peak_device_bytes = pipe->device_bytes;
  for (size_t d = 0; d < pipe->ndevs; d++) pipe->devs[d].peak = pipe->devs[d].bytes;
  pipe->dist.gather_bytes = pipe->dist.gather_ns = pipe->dist.collectives = 0;
  pthread_mutex_unlock(&pipe->lock);
}
