/*
 * forward.c — the calls a component's forward makes while it runs: where
 * it is in its blocks (mlo_block_begin/mlo_block_end), what its streaming
 * plan is, and the wait for every load of the pipeline.
 *
 * The checks every block boundary shares live here (the thread holds the
 * component; the block exists; its memory did not go to the next
 * component); what a boundary moves is the shape's (shape.c): a kept
 * block's begin waits for its own copy (progressive.c), a streamed block's
 * takes a slot (stream.c), and its end may hand memory to a joined switch
 * through the policy.  This file sits above every mover and calls each only downward
 * (docs/architecture.md).
 */
#include "core/mover.h"

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
  if (rc) {
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  return mlo_shape_of(c)->begin(c, block); /* releases the lock */
}

int mlo_block_end(mlo_component *c, size_t block) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = check_block(c, block, "end");
  if (!rc) rc = mlo_shape_of(c)->end(c, block);
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
