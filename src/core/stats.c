/*
 * stats.c — the counters a pipeline reports: each component's, their sum,
 * and the memory figures of every tier (device, host slabs, pinned, disk,
 * the disk tier's staging ring).  Above everything it sums, so no mover
 * reaches up to report (docs/architecture.md).
 */
#include "core/internal.h"
#include "core/policy.h"

#include <stddef.h>
#include <string.h>

/* Every counter of mlo_component_stats, in its order: the one list the
 * sum below, the tools' JSON and the Python binding's check read. */
#define FIELD(n, secs)                                                                             \
  { #n, offsetof(mlo_component_stats, n), secs }
static const mlo_stats_field fields[] = {
    FIELD(loads, NULL),
    FIELD(evictions, NULL),
    FIELD(forwards, NULL),
    FIELD(h2d_bytes, NULL),
    FIELD(d2h_bytes, NULL),
    FIELD(copy_calls, NULL),
    FIELD(platform_calls, NULL),
    FIELD(wait_ns, "stall_s"),
    FIELD(forward_ns, "forward_s"),
    FIELD(prefetches, NULL),
    FIELD(block_loads, NULL),
    FIELD(block_wait_ns, "block_stall_s"),
    FIELD(disk_loads, NULL),
    FIELD(disk_read_bytes, NULL),
    FIELD(disk_wait_ns, "disk_stall_s"),
    FIELD(joined_loads, NULL),
};
_Static_assert(sizeof fields / sizeof *fields * sizeof(uint64_t) == sizeof(mlo_component_stats),
               "every counter of mlo_component_stats is in the table, each a uint64_t");

size_t mlo_component_stats_fields(const mlo_stats_field **out) {
  if (out) *out = fields;
  return sizeof fields / sizeof *fields;
}

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
    const char *s = (const char *)&pipe->comps[i]->stats;
    char *t = (char *)&out->total;
    for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
      uint64_t v, sum;
      memcpy(&v, s + fields[f].offset, sizeof v);
      memcpy(&sum, t + fields[f].offset, sizeof sum);
      sum += v;
      memcpy(t + fields[f].offset, &sum, sizeof sum);
    }
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
