/*
 * mover.h — how a load fills a component's device block: one row of the
 * source table per load, chosen in one place (mlo_source_of, mover.c).
 *
 * A source is where the bytes come from: the host slab ("slab", whole or
 * block by block, as the component's shape says), the disk through the
 * reader's staging ring ("disk"), or a node's shards, each rank copying
 * its slice and the node gathering the rest, of the whole component
 * ("shard") or of each piece as the forward reaches it ("shard-blocks").  residency.c
 * allocates the block, calls the row's slots and records the transition;
 * it never asks which row it has, and no source tests another's flags.
 * The composition table (which source serves which shape, and why not
 * where it does not) is written once, in mover.c (docs/architecture.md).
 */
#ifndef MLO_CORE_MOVER_H
#define MLO_CORE_MOVER_H

#include "core/internal.h"

/* One load as its source reports it. */
struct mlo_load {
  size_t copies;                  /* copies queued */
  uint64_t moved;                 /* bytes over this rank's link */
  uint64_t queued;                /* bytes the queued copies hold, should a later one fail */
  size_t slice;                   /* a shard's slice, gathered at the wait (0: none left) */
  bool counted;                   /* the source counts its own copies (the disk reader) */
  bool gathered;                  /* nothing left to gather at the wait */
  void (*undo)(mlo_component *c); /* the residency's undo of a load that fails late */
};

struct mlo_source_ops {
  const char *name;
  /* Optional: the device bytes the block needs (default: mlo_res_bytes),
   * before it is allocated; may agree with the other ranks. */
  int (*size)(mlo_component *c, uint64_t *bytes, struct mlo_load *ld);
  /* Optional: after the allocation, whose status is rc (the ranks agree on
   * it: any rank's failure is every rank's); returns the load's status. */
  int (*allocated)(mlo_component *c, int rc, struct mlo_load *ld);
  /* Queues the load's copies into c->block and has c->load_ev recorded
   * after them (by the reader, for the disk). */
  int (*fetch)(mlo_component *c, struct mlo_load *ld);
  /* Optional: the load failed after `allocated` passed on every rank (its
   * copies part-issued, or none): what the other ranks wait for is told
   * (rc, the reason), before its block goes. */
  void (*failed)(mlo_component *c, int rc);
};

/* The shape table (shape.c): how the forward consumes the block. */
struct mlo_shape_ops {
  const char *name; /* "whole", "blocks", "streamed" */
  /* The copies of a load from host memory into c->block (lock held): the
   * slab, or this rank's slices of a sliced load's pieces; the events the
   * forward's waits use, but not c->load_ev (the source records it). */
  int (*fill)(mlo_component *c, struct mlo_load *ld);
  /* Optional: the load issued, what the shape starts with it (a streamed
   * component's first slot copies). */
  void (*started)(mlo_component *c);
  /* A block's boundaries, its checks passed (forward.c), lock held: a
   * begin returns with the lock released, an end with it held. */
  int (*begin)(mlo_component *c, size_t block);
  int (*end)(mlo_component *c, size_t block);
};

extern const struct mlo_shape_ops mlo_shape_whole, mlo_shape_blocks, mlo_shape_streamed;

/* The shape c's plan gives it now (a streaming plan, else its blocks where
 * it loads block by block, else whole): lock held. */
const struct mlo_shape_ops *mlo_shape_of(const mlo_component *c);

extern const struct mlo_source_ops mlo_source_slab, mlo_source_disk, mlo_source_shard,
    mlo_source_shard_blocks;

/* The row that loads c now (mover.c): lock held. */
const struct mlo_source_ops *mlo_source_of(const mlo_component *c);

/* shard.c: the shard row's slots (a whole sharded load), which mover.c
 * also builds the block-by-block row from. */
int mlo_shard_size(mlo_component *c, uint64_t *bytes, struct mlo_load *ld);
int mlo_shard_allocated(mlo_component *c, int rc, struct mlo_load *ld);
int mlo_shard_fetch(mlo_component *c, struct mlo_load *ld);

#endif
