/*
 * shape.c — the shape table: how a component's forward consumes its
 * device block, chosen once per load beside its source (mover.h).
 *
 *   whole     the block in one copy (and one per caller-owned tensor);
 *             the forward waits for all of it at its acquire
 *   blocks    the head, then each block behind its own event, in the
 *             forward's order; each begin waits for its own block
 *             (progressive.c)
 *   streamed  the kept blocks as "blocks" does, the rest through slots
 *             refilled as the forward goes (stream.c)
 *
 * A source fills the block in the shape it is given (the slab and the
 * node's shards call `fill`; the disk reader issues its own chunks, whole
 * or its streamed component's resident part); the residency starts the
 * shape once the load is issued and forward.c's block boundaries call it.
 * Before this table the shape was asked of each mechanism's flags where
 * it was needed (issue 40).
 */
#include "core/mover.h"
#include "core/policy.h"

/* The head and its event, then each kept block behind an event of its own
 * up to block `limit` (the rest: a streamed plan's, issued by its slots). */
static int fill_blocks(mlo_component *c, struct mlo_load *ld, size_t limit) {
  size_t more = 0;
  uint64_t also = 0;
  int rc = mlo_prog_copy_head(c, &ld->copies, &ld->moved);
  if (!rc) rc = mlo_prog_copy_blocks(c, limit, &more, &also);
  ld->copies += more;
  ld->moved += also;
  ld->queued = ld->moved;
  return rc;
}

static int whole_fill(mlo_component *c, struct mlo_load *ld) {
  bool per_tensor = c->pipe->settings.per_tensor_copies;
  int rc = MLO_OK;
  if (c->slab_bytes && !per_tensor) {
    rc = PCALL(c, mlo_plat_copy_h2d(mlo_dev_plat(c), c->block, 0, c->slab, c->slab_bytes));
    if (!rc) {
      ld->copies++;
      ld->queued += c->slab_bytes;
    }
  }
  return rc ? rc : mlo_res_copy_tensors(c, per_tensor, &ld->copies, &ld->queued);
}

static int blocks_fill(mlo_component *c, struct mlo_load *ld) {
  return fill_blocks(c, ld, c->nblocks);
}

/* (a streamed component is loaded block by block but where a baseline's
 * settings ask for whole copies: copy_back, per_tensor_copies) */
static int streamed_fill(mlo_component *c, struct mlo_load *ld) {
  return mlo_prog_applies(c) ? fill_blocks(c, ld, mlo_stream_load_limit(c)) : whole_fill(c, ld);
}

/* A kept block's begin: counted with its thread (an end must match it),
 * and ordered after its own copy where the load went block by block.
 * Returns with the lock released. */
static int kept_begin(mlo_component *c, size_t block) {
  int rc = MLO_OK;
  if (mlo_begun_add(c, block))
    rc = mlo_fail(c->pipe, MLO_ENOMEM, "out of host memory beginning block %zu of '%s'", block,
                  c->name);
  else if (mlo_res_is_resident(c) && (rc = mlo_prog_begin(c, block)))
    mlo_begun_end(c, block); /* not begun after all */
  pthread_mutex_unlock(&c->pipe->lock);
  return rc;
}

/* A kept block's end: it must match a begin on this thread; at the last
 * end of its begins on every thread its memory may go to the next
 * component (join.c, through the policy), never while a begin is open. */
static int kept_end(mlo_component *c, size_t block) {
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

/* A streamed component's block: a kept one as above; a streamed one takes
 * a slot (stream.c), while the component is resident. */
static int streamed_begin(mlo_component *c, size_t block) {
  if (!mlo_stream_block_streams(c, block)) return kept_begin(c, block);
  if (!mlo_res_is_resident(c)) {
    pthread_mutex_unlock(&c->pipe->lock);
    return MLO_OK;
  }
  return mlo_stream_begin(c, block); /* releases the lock */
}

static int streamed_end(mlo_component *c, size_t block) {
  if (!mlo_stream_block_streams(c, block)) return kept_end(c, block);
  return mlo_res_is_resident(c) ? mlo_stream_end(c, block) : MLO_OK;
}

const struct mlo_shape_ops mlo_shape_whole = {
    .name = "whole", .fill = whole_fill, .begin = kept_begin, .end = kept_end};
const struct mlo_shape_ops mlo_shape_blocks = {
    .name = "blocks", .fill = blocks_fill, .begin = kept_begin, .end = kept_end};
const struct mlo_shape_ops mlo_shape_streamed = {.name = "streamed",
                                                 .fill = streamed_fill,
                                                 .started = mlo_stream_start,
                                                 .begin = streamed_begin,
                                                 .end = streamed_end};

const struct mlo_shape_ops *mlo_shape_of(const mlo_component *c) {
  if (c->stream) return &mlo_shape_streamed;
  return mlo_prog_applies(c) ? &mlo_shape_blocks : &mlo_shape_whole;
}
