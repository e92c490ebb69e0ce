/*
 * forward.c — the calls a component's forward makes while it runs: where
 * it is in its blocks (mlo_block_begin/mlo_block_end), what its streaming
 * plan is, and the wait for every load of the pipeline.
 *
 * The checks every block boundary shares live here (the thread holds the
 * component; the block exists; its memory did not go to the next
 * component); what a boundary moves is the mover's: a kept block's begin
 * waits for its own copy (progressive.c), a streamed block's takes a slot
 * (stream.c), and its end may hand memory to a joined switch through the
 * policy.  This file sits above every mover and calls each only downward
 * (docs/architecture.md).
 */
#include "core/internal.h"
#include "core/policy.h"

static int check_block(mlo_component *c, size_t block, const char *what) {
  /* the thread must hold the component: its waits and slots end with its
   * release, and a slot is never held by a thread the component could be
   * evicted under */
  if (!mlo_held_by_this_thread(c))
    return mlo_fail(c->pipe, MLO_ESTATE,
                    "%s block %zu of '%s' outside an acquire or forward on this thread", what,
                    block, c->name);
  if (!c->materialized || block >= c->nblocks)
    return mlo_fail(c->pipe, MLO_EINVAL, "%s block %zu of '%s': it has %zu blocks", what, block,
                    c->name, c->materialized ? c->nblocks : 0);
  return MLO_OK;
}

/* A kept block's begin: counted with its thread (an end must match it),
 * and ordered after its own copy where the load was progressive. */
static int begin_kept(mlo_component *c, size_t block) {
  if (mlo_begun_add(c, block))
    return mlo_fail(c->pipe, MLO_ENOMEM, "out of host memory beginning block %zu of '%s'", block,
                    c->name);
  int rc = mlo_res_is_resident(c) ? mlo_prog_begin(c, block) : MLO_OK;
  if (rc) mlo_begun_end(c, block); /* not begun after all */
  return rc;
}

/* A kept block's end: it must match a begin on this thread; at the last
 * end of its begins on every thread its memory may go to the next
 * component (join.c), never while a begin is still open. */
static int end_kept(mlo_component *c, size_t block) {
  mlo_pipeline *pipe = c->pipe;
  if (!mlo_begun_end(c, block))
    return mlo_fail(pipe, MLO_ESTATE,
                    "block %zu of '%s' ended without a begin on this thread (every end needs "
                    "its own begin, on the thread that ends it)",
                    block, c->name);
  if (!mlo_begun_open(c, block) && mlo_res_is_resident(c) && pipe->policy &&
      pipe->policy->block_ended)
    pipe->policy->block_ended(pipe, c, block); /* its memory may go to the next component */
  return MLO_OK;
}

int mlo_block_begin(mlo_component *c, size_t block) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = check_block(c, block, "begin");
  if (!rc && mlo_join_gone(c, (long)block))
    rc = mlo_fail(pipe, MLO_ESTATE,
                  "begin block %zu of '%s': its memory went to '%s', which the schedule calls "
                  "next (a block is not begun again after its end in the component's last call "
                  "before the next one)",
                  block, c->name, mlo_join_target(c)->name);
  if (!rc && !mlo_stream_block_streams(c, block)) rc = begin_kept(c, block);
  if (rc || !mlo_stream_block_streams(c, block) || !mlo_res_is_resident(c)) { /* nothing to move */
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  return mlo_stream_begin(c, block); /* releases the lock */
}

int mlo_block_end(mlo_component *c, size_t block) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = check_block(c, block, "end");
  if (!rc && !mlo_stream_block_streams(c, block)) rc = end_kept(c, block);
  if (rc || !mlo_stream_block_streams(c, block) || !mlo_res_is_resident(c)) { /* nothing to move */
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  rc = mlo_stream_end(c, block);
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_component_stream_info(mlo_component *c, mlo_stream_info *out) {
  if (!c || !out) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  mlo_stream_describe(c, out);
  /* this residency's loads, or the next one's */
  out->progressive = mlo_prog_active(c) || (c->materialized ? mlo_prog_applies(c) : c->progressive);
  pthread_mutex_unlock(&c->pipe->lock);
  return MLO_OK;
}

int mlo_pipeline_synchronize(mlo_pipeline *pipe) {
  if (!pipe) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  for (size_t i = 0; i < pipe->ncomps; i++) mlo_disk_settle(pipe->comps[i]);
  /* a streamed load's deferred kept blocks, a held component's too (a
   * forward stopped before reaching them): every load complete */
  mlo_prog_settle(pipe, NULL, true);
  pthread_mutex_unlock(&pipe->lock);
  return mlo_devices_synchronize(pipe);
}
