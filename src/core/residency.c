/*
 * residency.c — the residency state machine of one component:
 *
 *   UNMATERIALIZED --materialize--> HOST --load--> LOADING --wait--> DEVICE
 *                                     ^                                |
 *                                     +------------- evict ------------+
 *
 * A load is one device block and a few large copies on the copy queue,
 * then an event; compute is ordered after that event (C8).  Eviction
 * writes back only mutable tensors (docs/architecture.md) and releases the block
 * stream-ordered, so it never frees memory a queued copy or compute still
 * uses (C9).  Empty components make no platform call at all (C13).
 *
 * Every function here runs with the pipeline lock held, except
 * mlo_res_wait_loaded, which waits and so must not hold it.
 */
#include "core/mover.h"
#include "base/sysio.h"
#include "core/policy.h"

#include <stdio.h>
#include <stdlib.h>

/* Says why allocating c's device block failed (rc); the block is none. */
static int alloc_failed(mlo_component *c, int rc) {
  mlo_pipeline *pipe = c->pipe;
  char need[32];
  c->block = NULL;
  if (rc == MLO_ENOMEM)
    return mlo_fail(pipe, rc,
                    "host out of memory allocating the %s device block of '%s' (this platform "
                    "keeps device memory in host RAM)",
                    mlo_format_size(mlo_res_bytes(c), need, sizeof need), c->name);
  if (rc != MLO_ENOMEM_DEVICE)
    return mlo_fail(pipe, rc, "allocating the device block of '%s' failed (%s)", c->name,
                    mlo_strerror(rc));
  mlo_platform_memory mem = {0};
  mlo_platform_get_memory(mlo_dev_plat(c), &mem);
  char avail[32], total[32];
  return mlo_fail(pipe, rc,
                  "device out of memory loading '%s': needs %s, %s free of %s "
                  "(%s resident in this pipeline)",
                  c->name, mlo_format_size(mlo_res_bytes(c), need, sizeof need),
                  mlo_format_size(mem.free_bytes, avail, sizeof avail),
                  mlo_format_size(mem.total_bytes, total, sizeof total),
                  mlo_format_size(c->dev->bytes, (char[32]){0}, 32));
}

/* The block, from the platform, as the source sizes it.  An allocation
 * that waits (a pool reclaiming frees still queued behind copies) stalls
 * the caller like a copy does: it counts as waiting. */
static int alloc_block(mlo_component *c, const struct mlo_source_ops *src, struct mlo_load *ld) {
  mlo_platform *p = mlo_dev_plat(c);
  uint64_t bytes = mlo_res_bytes(c);
  int rc = src->size ? src->size(c, &bytes, ld) : MLO_OK;
  if (rc) return rc;
  c->alloc_bytes = bytes;
  uint64_t a0 = mlo_plat_now(p);
  rc = PCALL(c, mlo_plat_dev_alloc(p, (size_t)c->alloc_bytes, &c->block));
  c->stats.wait_ns += mlo_plat_now(p) - a0;
  if (src->allocated) { /* the ranks agree: a failure anywhere, said already, is undone here */
    int arc = src->allocated(c, rc, ld);
    if (arc) return arc;
  }
  return rc ? alloc_failed(c, rc) : MLO_OK;
}

/* A load that failed part-way: the block goes, stream-ordered after the
 * copies already queued (they cross the link all the same). */
static int load_failed(mlo_component *c, const struct mlo_source_ops *src,
                       const struct mlo_load *ld, int rc) {
  if (src->failed) src->failed(c, rc);
  if (!ld->counted) {
    c->stats.h2d_bytes += ld->queued;
    c->stats.copy_calls += ld->copies;
  }
  c->device_gather = false;
  mlo_prog_evicted(c); /* no residency: its block events are not this load's */
  c->stats.platform_calls++;
  mlo_plat_dev_free(mlo_dev_plat(c), c->block, (size_t)c->alloc_bytes);
  c->block = NULL;
  mlo_res_trace(c, MLO_TRACE_EVICT, 0); /* its LOAD_BEGIN is closed */
  return mlo_fail(c->pipe, rc, "%s: copying to the device failed (%s)", c->name, mlo_strerror(rc));
}

/* A platform that can pin memory copies pageable memory through a staging
 * buffer of its own: below link speed, and the caller blocks.  Said once. */
static void warn_pageable(mlo_component *c) {
  if (!c->pageable_bytes || c->warned_pageable || !c->pipe->platform->caps.host_register) return;
  c->warned_pageable = true;
  char size[32];
  mlo_logf(MLO_LOG_WARN,
           "loading '%s': %s of it is pageable host memory, copied below link speed with "
           "the caller blocked (pinning failed or is off: pin_host, MLO_NO_PINNED, pinned=)",
           c->name, mlo_format_size(c->pageable_bytes, size, sizeof size));
}

int mlo_res_load(mlo_component *c) {
  mlo_pipeline *pipe = c->pipe;
  if (c->state == MLO_RES_LOADING || c->state == MLO_RES_DEVICE) return MLO_OK;
  if (!c->materialized) return mlo_fail(pipe, MLO_ESTATE, "%s: not materialized", c->name);
  if (c->join) /* its copies are going into another component's memory (join.c) */
    return mlo_fail(pipe, MLO_EBUSY, "%s: already loading into the memory of a switch", c->name);
  if (!c->block_bytes) { /* C13: nothing to move, no platform call */
    c->state = MLO_RES_DEVICE;
    c->load_waited = true;
    return MLO_OK;
  }
  mlo_platform *p = mlo_dev_plat(c);
  int rc = mlo_res_ensure_event(c, &c->load_ev);
  if (rc) return mlo_fail(pipe, rc, "%s: cannot create a load event", c->name);
  const struct mlo_source_ops *src = mlo_source_of(c);
  struct mlo_load ld = {.moved = c->block_bytes, .undo = mlo_res_drop};
  if ((rc = alloc_block(c, src, &ld))) return rc;
  c->load_begin_ns = mlo_plat_now(p);
  mlo_res_trace_at(c, MLO_TRACE_LOAD_BEGIN, c->block_bytes, c->load_begin_ns);
  c->device_gather = false;
  /* A write-back into this component's host memory may still be running on
   * a readback queue of its own: the load reads that memory after it. */
  rc = c->writeback_pending && mlo_plat_separate_readback(p)
           ? PCALL(c, mlo_plat_copy_wait(p, c->writeback_ev))
           : MLO_OK;
  if (!rc) rc = src->fetch(c, &ld);
  if (rc) return load_failed(c, src, &ld, rc);
  warn_pageable(c);
  c->state = MLO_RES_LOADING;
  c->load_waited = false;
  c->load_ended = false;
  c->use_valid = false; /* a new residency: no use of it yet */
  c->gather_slice = ld.gathered ? 0 : ld.slice;
  c->stats.loads++;
  c->stats.h2d_bytes += ld.moved;
  c->stats.copy_calls += ld.copies;
  mlo_res_count(c, (int64_t)mlo_res_bytes(c));
  const struct mlo_shape_ops *shape = mlo_shape_of(c);
  if (shape->started) shape->started(c); /* a streamed one's first slots */
  mlo_res_log_transfer(c, "load", c->block_bytes, ld.copies);
  return MLO_OK;
}

static bool needs_writeback(const mlo_component *c, const mlo_tensor *t) {
  if (t->target || !t->nbytes) return false;
  if (c->on_disk) return false; /* immutable, and its host copy is its files */
  /* a streamed block is a read-only copy of the slab, and not on the
   * device now (mutable tensors keep their blocks resident) */
  if (mlo_stream_streams(c, t)) return false;
  return (t->flags & MLO_TENSOR_MUTABLE) || c->pipe->settings.copy_back;
}

int mlo_res_note_last_use(mlo_component *c) {
  mlo_pipeline *pipe = c->pipe;
  mlo_platform *p = mlo_dev_plat(c);
  c->use_valid = false;
  if (!pipe->enabled || !c->block || !mlo_plat_has_dev_free_after(p)) return MLO_OK;
  int rc = mlo_res_ensure_event(c, &c->use_ev);
  if (!rc) rc = PCALL(c, mlo_plat_event_record_compute(p, c->use_ev));
  if (rc) /* the eviction then frees after all compute, as without the slot */
    return mlo_fail(pipe, rc, "%s: recording the end of its compute failed", c->name);
  c->use_valid = true;
  c->use_epoch = pipe->enable_epoch;
  return MLO_OK;
}

/* The event after this residency's last use, where one orders its free
 * (mlo_res_note_last_use); NULL: after all compute. */
static mlo_event *last_use(const mlo_component *c) {
  const mlo_pipeline *pipe = c->pipe;
  return c->use_valid && pipe->enabled && c->use_epoch == pipe->enable_epoch ? c->use_ev : NULL;
}

/* Copies mutable tensors back to their host storage, after the compute
 * that wrote them: the residency's last-use event where there is one, else
 * an event recorded on the compute queue right now, which follows every
 * kernel submitted so far.  Under the XPU rule the copy completes before
 * return. */
static int write_back(mlo_component *c, uint64_t *bytes) {
  mlo_platform *p = mlo_dev_plat(c);
  size_t copies = 0;
  *bytes = 0;
  bool any = false;
  for (size_t i = 0; i < c->ntensors && !any; i++) any = needs_writeback(c, c->tensors[i]);
  if (!any) return MLO_OK;
  mlo_event *used = last_use(c);
  int rc = used ? MLO_OK : mlo_res_ensure_event(c, &c->compute_ev);
  if (!rc && !used) rc = PCALL(c, mlo_plat_event_record_compute(p, c->compute_ev));
  if (!rc) rc = PCALL(c, mlo_plat_readback_wait(p, used ? used : c->compute_ev));
  /* A component evicted before any forward waited for its load (or loaded
   * block by block: the forward waited for the blocks it began, maybe not
   * all): on a readback queue of its own the copies back must wait for that
   * load too (on one queue they follow it anyway). */
  if (!rc && (!c->load_waited || mlo_prog_active(c)) && mlo_plat_separate_readback(p))
    rc = PCALL(c, mlo_plat_readback_wait(p, c->load_ev)); /* progressive: blocks maybe not begun */
  for (size_t i = 0; i < c->ntensors && !rc; i++) {
    mlo_tensor *t = c->tensors[i];
    if (!needs_writeback(c, t)) continue;
    uint64_t at = c->placed ? t->place : t->dev_offset; /* a joined switch placed it */
    /* a streamed component's mutable tensors stay resident */
    if (c->stream && (rc = mlo_stream_tensor_offset(c, t, &at))) break;
    rc = PCALL(c, mlo_plat_copy_d2h(p, t->host, c->block, (size_t)at, t->nbytes));
    copies++;
    *bytes += t->nbytes;
  }
  if (!copies || rc) return rc;
  rc = mlo_res_ensure_event(c, &c->writeback_ev);
  if (!rc) rc = PCALL(c, mlo_plat_event_record_readback(p, c->writeback_ev));
  if (rc) return rc;
  c->writeback_pending = true;
  c->stats.copy_calls += copies;
  if (p->caps.blocking_d2h) rc = mlo_res_finish_writeback(c);
  return rc;
}

/* c's residency is over (evicted, dropped, or its block handed on; its
 * bytes already uncounted): no block, nothing of that residency left. */
static void left_device(mlo_component *c) {
  c->block = NULL;
  c->placed = false;
  c->use_valid = false;
  c->gather_slice = 0;
  c->device_gather = false;
  c->shard_offset = c->shard_bytes = 0;
  c->state = MLO_RES_HOST;
  c->load_waited = false;
  mlo_stream_evicted(c);
  mlo_prog_evicted(c);
}

int mlo_res_evict(mlo_component *c) {
  mlo_pipeline *pipe = c->pipe;
  /* a load from disk still being issued: its block is the reader's until
   * then (the policies pick other victims; this is the rare rest) */
  mlo_disk_settle(c);
  if (c->state != MLO_RES_LOADING && c->state != MLO_RES_DEVICE) return MLO_OK;
  if (c->users) return mlo_fail(pipe, MLO_EBUSY, "%s: cannot evict while it executes", c->name);
  if (!c->block_bytes) {
    c->state = MLO_RES_HOST;
    return MLO_OK;
  }
  /* loaded, never used (or not every block begun): end it where it ended,
   * or now where the platform cannot tell yet (never left unpaired) */
  if (!c->load_ended) mlo_res_load_ended(c, mlo_plat_now(mlo_dev_plat(c)));
  mlo_prog_drain(c); /* no gather still running into its block */
  uint64_t back = 0;
  int rc = write_back(c, &back);
  if (rc) return mlo_fail(pipe, rc, "%s: writing mutable tensors back failed", c->name);
  c->stats.platform_calls++;
  mlo_plat_dev_free_after(mlo_dev_plat(c), c->block, (size_t)c->alloc_bytes, last_use(c));
  c->stats.evictions++;
  c->stats.d2h_bytes += back;
  mlo_res_count(c, -(int64_t)mlo_res_bytes(c));
  left_device(c);
  if (!pipe->policy || !pipe->policy->streams) mlo_stream_drop(c); /* the plan was a policy's */
  mlo_res_trace(c, MLO_TRACE_EVICT, back);
  mlo_res_log_transfer(c, "evict", back, 0);
  mlo_disk_change_tier(c); /* a host plan made while it was resident */
  return MLO_OK;
}

void mlo_res_drop(mlo_component *c) {
  if (!mlo_res_is_resident(c)) return;
  mlo_prog_drain(c); /* no gather still running into its block */
  if (c->block) {
    c->stats.platform_calls++;
    mlo_plat_dev_free(mlo_dev_plat(c), c->block, (size_t)c->alloc_bytes);
    mlo_res_count(c, -(int64_t)mlo_res_bytes(c));
  }
  left_device(c);
  mlo_res_trace(c, MLO_TRACE_EVICT, 0); /* what its load began ends here */
}

void mlo_res_join_began(mlo_component *b) {
  b->load_begin_ns = mlo_plat_now(mlo_dev_plat(b));
  if (!b->pipe->trace) return;
  /* into memory already counted (the other component's): the figure stays */
  mlo_trace_event e = {MLO_TRACE_LOAD_BEGIN, b, b->load_begin_ns, b->block_bytes,
                       b->pipe->device_bytes};
  b->pipe->trace(&e, b->pipe->trace_user);
}

int mlo_res_hand_over(mlo_component *a, mlo_component *b, size_t copies, uint64_t moved,
                      bool placed) {
  mlo_pipeline *pipe = a->pipe;
  int rc = mlo_res_ensure_event(b, &b->load_ev);
  if (!rc) rc = PCALL(b, mlo_plat_event_record_copy(mlo_dev_plat(b), b->load_ev));
  if (rc) return mlo_fail(pipe, rc, "%s: recording its load's end failed", b->name);
  /* a leaves: its block is b's now, nothing freed, nothing to write back
   * (a join's source has no mutable tensor) */
  if (!a->load_ended) mlo_res_load_ended(a, mlo_plat_now(mlo_dev_plat(a)));
  void *block = a->block;
  uint64_t alloc = a->alloc_bytes, counted = mlo_res_bytes(a);
  mlo_res_count(a, -(int64_t)counted);
  a->stats.evictions++;
  left_device(a);
  /* b arrives, loading: the whole block is its (what the budget counts) */
  b->block = block;
  b->alloc_bytes = alloc;
  b->placed = placed; /* else its own plan's layout, a's (two streamed: join.c) */
  b->placed_bytes = counted;
  b->state = MLO_RES_LOADING;
  b->load_waited = false;
  b->load_ended = false;
  b->use_valid = false;
  b->gather_slice = 0;
  b->device_gather = false;
  b->stats.loads++;
  b->stats.joined_loads++;
  b->stats.h2d_bytes += moved;
  b->stats.copy_calls += copies;
  mlo_res_count(b, (int64_t)mlo_res_bytes(b));
  mlo_res_trace(a, MLO_TRACE_EVICT, 0);
  mlo_res_log_transfer(a, "evict (its block handed to the next)", 0, 0);
  mlo_res_log_transfer(b, "load (joined)", b->block_bytes, copies);
  mlo_disk_change_tier(a); /* a host plan made while it was resident */
  return MLO_OK;
}

int mlo_res_wait_loaded(mlo_component *c, mlo_sync_mode sync) {
  mlo_pipeline *pipe = c->pipe;
  mlo_platform *p = mlo_dev_plat(c);
  pthread_mutex_lock(&pipe->lock); /* internal: acquire released it just before */
  uint64_t d0 = 0, disk_ns = 0;
  if (c->disk_busy || c->disk_rc) { /* a load from disk: its reads first */
    d0 = mlo_plat_now(p);
    int rc = mlo_disk_wait(c);
    disk_ns = mlo_plat_now(p) - d0;
    c->stats.disk_wait_ns += disk_ns;
    if (rc && c->disk_tell) { /* the other node ranks are at the gather: tell them, now */
      char said[sizeof pipe->errmsg];
      snprintf(said, sizeof said, "%s", pipe->errmsg);
      c->disk_tell = false;
      mlo_collective(pipe, c, COLL_GATHER, 0, rc, said, NULL);
      mlo_res_drop(c); /* the failed sharded load, kept loading for this (disk.c) */
      mlo_fail(pipe, rc, "%s", said);
    }
    if (rc) {
      c->stats.wait_ns += disk_ns;
      pthread_mutex_unlock(&pipe->lock);
      return rc;
    }
  }
  /* the synchronize below stands for every block's wait (progressive.c):
   * kept blocks whose copies a streamed load deferred go before it */
  if (sync == MLO_SYNC_DEVICE && mlo_prog_issue_upto(c, c->nblocks))
    mlo_logf(MLO_LOG_DEBUG, "%s: kept blocks not issued: %s", c->name, pipe->errmsg);
  bool pending = !c->load_waited;
  bool empty = !c->block_bytes;
  /* loaded block by block: the head now, each block at its begin */
  mlo_event *ev = mlo_prog_active(c) ? mlo_prog_head_event(c) : c->load_ev;
  size_t slice = c->gather_slice;
  bool head_gathers = mlo_prog_head_gathers(c); /* sharded block by block: its head's pieces */
  bool device_gather = c->device_gather;
  pthread_mutex_unlock(&pipe->lock);
  if (empty || sync == MLO_SYNC_UNSAFE_NONE || (!pending && sync == MLO_SYNC_EVENT)) {
    if (disk_ns) {
      pthread_mutex_lock(&pipe->lock);
      c->stats.wait_ns += disk_ns;
      pthread_mutex_unlock(&pipe->lock);
    }
    return MLO_OK;
  }
  uint64_t t0 = disk_ns ? d0 : mlo_plat_now(p); /* the stall from its start */
  char said[sizeof pipe->errmsg] = ""; /* a failed gather's reason (another rank's, maybe) */
  int rc = MLO_OK;
  if (pending && device_gather) {
    /* A gather on the device completes only when every node rank's does:
     * the host waits for it here, watching the communicator, so that no
     * compute queued behind it can wait forever (docs/distributed.md). */
    char why[400] = "";
    rc = mlo_plat_coll_wait(p, ev, why, sizeof why);
    pthread_mutex_lock(&pipe->lock);
    c->device_gather = false;
    if (rc) {
      mlo_res_drop(c); /* its block holds what the gather left: nothing to keep */
      snprintf(said, sizeof said, "rank %d: its all-gather failed: %s", pipe->dist.rank,
               why[0] ? why : mlo_strerror(rc));
    }
    pthread_mutex_unlock(&pipe->lock);
  }
  if (!rc) rc = mlo_res_compute_wait(p, ev, sync);
  if (!rc && pending && (slice || head_gathers)) { /* the slices are in: gather them */
    rc = mlo_plat_event_sync(p, ev);
    pthread_mutex_lock(&pipe->lock);
    if (!rc && (rc = slice ? mlo_shard_gather(c, 0, slice, 0) : mlo_prog_gather_head(c)))
      snprintf(said, sizeof said, "%s", pipe->errmsg);
    if (!rc) c->gather_slice = 0; /* else the next wait gathers again (or fails again) */
    pthread_mutex_unlock(&pipe->lock);
  }
  uint64_t t1 = mlo_plat_now(p);
  pthread_mutex_lock(&pipe->lock);
  mlo_res_count_wait(c, t0, t1, !rc && pending);
  if (!rc && pending) {
    c->load_waited = true;
    if (c->state == MLO_RES_LOADING) c->state = MLO_RES_DEVICE;
    if (slice && !c->load_ended) { /* gathered by the host just now: it ended here */
      mlo_res_load_ended_at(c, t1);
    } else if (!mlo_prog_active(c) || sync == MLO_SYNC_DEVICE) {
      /* whole, or the device synchronized: every copy is in.  Else (block
       * by block) at its last block's begin, or its eviction. */
      mlo_res_load_ended(c, t1);
    }
  }
  pthread_mutex_unlock(&pipe->lock);
  if (rc)
    return mlo_fail(pipe, rc, "%s: waiting for the load failed%s%s", c->name, said[0] ? ": " : "",
                    said);
  return MLO_OK;
}

void mlo_res_release_events(mlo_component *c) {
  mlo_platform *p = mlo_dev_plat(c);
  mlo_plat_event_destroy(p, c->load_ev);
  mlo_plat_event_destroy(p, c->compute_ev);
  mlo_plat_event_destroy(p, c->writeback_ev);
  mlo_plat_event_destroy(p, c->use_ev);
  c->load_ev = c->compute_ev = c->writeback_ev = c->use_ev = NULL;
  c->use_valid = false;
  mlo_prog_free(c);
}
