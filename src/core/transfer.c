/*
 * transfer.c — what every way of moving a component's bytes shares: the
 * trace and log lines of a load and an eviction, the events a load records,
 * the waits for them (counted as the component's stall), the copies of a
 * component's own tensors and the end of a write-back.
 *
 * These are leaves: residency.c, progressive.c, stream.c, disk.c and
 * join.c call them, and they call only the platform and stream_plan.c's
 * placement, so no mechanism reaches another through them
 * (docs/architecture.md).  Every function here runs with the pipeline lock
 * held, except mlo_res_compute_wait, which waits and so must not hold it.
 */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>

int mlo_devices_synchronize(mlo_pipeline *pipe) {
  int rc = MLO_OK;
  for (size_t d = 0; d < pipe->ndevs; d++) {
    int r = mlo_plat_synchronize(pipe->devs[d].platform);
    if (!rc) rc = r;
  }
  return rc;
}

void mlo_res_count(mlo_component *c, int64_t bytes) {
  mlo_pipeline *pipe = c->pipe;
  struct mlo_device *d = c->dev;
  pipe->device_bytes += (uint64_t)bytes; /* two's complement: a negative one subtracts */
  d->bytes += (uint64_t)bytes;
  if (pipe->device_bytes > pipe->peak_device_bytes) pipe->peak_device_bytes = pipe->device_bytes;
  if (d->bytes > d->peak) d->peak = d->bytes;
}

void mlo_res_trace_at(mlo_component *c, mlo_trace_kind kind, uint64_t bytes, uint64_t t_ns) {
  mlo_pipeline *pipe = c->pipe;
  if (!pipe->trace) return;
  /* device_bytes is the figure after the event: a load's block counts from
   * its LOAD_BEGIN (allocated), though it is accounted once its copies are
   * queued. */
  uint64_t dev = pipe->device_bytes + (kind == MLO_TRACE_LOAD_BEGIN ? mlo_res_bytes(c) : 0);
  mlo_trace_event ev = {kind, c, t_ns, bytes, dev};
  pipe->trace(&ev, pipe->trace_user);
}

void mlo_res_trace(mlo_component *c, mlo_trace_kind kind, uint64_t bytes) {
  if (c->pipe->trace) mlo_res_trace_at(c, kind, bytes, mlo_plat_now(mlo_dev_plat(c)));
}

/* When c's load really completed on the device (the platform's stamp), no
 * later than `latest`; `latest` where the platform cannot tell.  Traces and
 * timelines show a load ending when its copy did, not when someone first
 * waited for it (a VAE loaded at enable and used at the end). */
static uint64_t load_done_ns(mlo_component *c, uint64_t latest) {
  uint64_t t = latest;
  if (mlo_plat_event_time(mlo_dev_plat(c), c->load_ev, &t) != MLO_OK || t > latest) t = latest;
  return t;
}

int mlo_res_ensure_event(mlo_component *c, mlo_event **ev) {
  if (*ev) return MLO_OK;
  return PCALL(c, mlo_plat_event_create(mlo_dev_plat(c), ev));
}

void mlo_res_log_transfer(const mlo_component *c, const char *what, uint64_t bytes, size_t copies) {
  if (!mlo_log_enabled(MLO_LOG_DEBUG)) return;
  char size[32];
  mlo_logf(MLO_LOG_DEBUG, "%s %s: %s in %zu cop%s", what, c->name,
           mlo_format_size(bytes, size, sizeof size), copies, copies == 1 ? "y" : "ies");
}

/* The line stable-diffusion.cpp users know, once per load, when it is
 * known to be complete: component, size, tensors, seconds, GB/s, device. */
static void log_load_done(const mlo_component *c, uint64_t done_ns) {
  if (!mlo_log_enabled(MLO_LOG_INFO)) return;
  char size[32];
  double secs = done_ns > c->load_begin_ns ? (double)(done_ns - c->load_begin_ns) / 1e9 : 0.0;
  mlo_logf(MLO_LOG_INFO, "loaded %s: %s, %zu tensors, %.4f s, %.2f GB/s, %s", c->name,
           mlo_format_size(c->block_bytes, size, sizeof size), c->own_count, secs,
           secs > 0 ? (double)c->block_bytes / secs / 1e9 : 0.0,
           mlo_platform_name(mlo_dev_plat(c)));
}

/* The load's end, traced and logged once per residency, when it is known
 * complete: at the acquire's wait for a whole load, at the last block's
 * begin (or the eviction) for one that went block by block. */
void mlo_res_load_ended(mlo_component *c, uint64_t latest) {
  if (!c->load_ended) mlo_res_load_ended_at(c, load_done_ns(c, latest));
}

/* The same, at t exactly (a load the host completed itself: a gather). */
void mlo_res_load_ended_at(mlo_component *c, uint64_t t) {
  c->load_ended = true;
  log_load_done(c, t);
  mlo_res_trace_at(c, MLO_TRACE_LOAD_END, c->block_bytes, t);
}

int mlo_res_copy_tensors(mlo_component *c, bool every, size_t *copies, uint64_t *moved) {
  mlo_platform *p = mlo_dev_plat(c);
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (t->target || !t->nbytes) continue;
    if (!every && !(t->flags & MLO_TENSOR_EXTERNAL)) continue;
    uint64_t at = t->dev_offset; /* a streamed plan places them in its footprint */
    int rc = c->stream ? mlo_stream_tensor_offset(c, t, &at) : MLO_OK;
    if (!rc) rc = PCALL(c, mlo_plat_copy_h2d(p, c->block, (size_t)at, t->host, t->nbytes));
    if (rc) return rc;
    ++*copies;
    *moved += t->nbytes;
  }
  return MLO_OK;
}

int mlo_res_finish_writeback(mlo_component *c) {
  if (!c->writeback_pending) return MLO_OK;
  int rc = PCALL(c, mlo_plat_event_sync(mlo_dev_plat(c), c->writeback_ev));
  if (!rc) c->writeback_pending = false;
  return rc;
}

int mlo_res_compute_wait(mlo_platform *p, mlo_event *ev, mlo_sync_mode sync) {
  return sync == MLO_SYNC_DEVICE ? mlo_plat_synchronize(p) : mlo_plat_compute_wait(p, ev);
}

void mlo_res_count_wait(mlo_component *c, uint64_t t0, uint64_t t1, bool traced) {
  mlo_pipeline *pipe = c->pipe;
  c->stats.platform_calls++;
  c->stats.wait_ns += t1 - t0;
  if (!traced || !pipe->trace) return;
  mlo_trace_event e1 = {MLO_TRACE_WAIT_BEGIN, c, t0, 0, pipe->device_bytes};
  mlo_trace_event e2 = {MLO_TRACE_WAIT_END, c, t1, 0, pipe->device_bytes};
  pipe->trace(&e1, pipe->trace_user);
  pipe->trace(&e2, pipe->trace_user);
}
