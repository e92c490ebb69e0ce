/*
 * mover.c — the source table's choice and its "slab" row (mover.h).
 *
 * The composition table, the one place that says which source serves a
 * load and in which shape:
 *
 *   source \ shape   whole   block by block   streamed (resident part + slots)
 *   slab             yes     yes              yes
 *   disk             yes     no (1)           yes: its streamed blocks from host
 *                                             memory (partial) or read from its
 *                                             files at each use (disk.c)
 *   shard            yes     yes (2)          no (3): a streamed one loads replicated
 *
 * (1) the reader reads and copies in chunks of its ring, not in the
 *     forward's blocks; a component on disk loads whole and its forward
 *     waits for all of it (mlo_prog_applies says so for the shape).
 * (2) from a node-shared slab ("shard-blocks"): each piece sliced and
 *     gathered on its own; from disk (the reader reads one slice of the
 *     whole slab) and under sharded residency, whole.
 * (3) its slots would need a gather per refill, in step on every rank.
 */
#include "core/mover.h"

static int slab_fetch(mlo_component *c, struct mlo_load *ld) {
  int rc = mlo_shape_of(c)->fill(c, ld);
  if (!rc) rc = PCALL(c, mlo_plat_event_record_copy(mlo_dev_plat(c), c->load_ev));
  return rc;
}

const struct mlo_source_ops mlo_source_slab = {.name = "slab", .fetch = slab_fetch};

/* The reader reads the files, copies and records the event; a streamed
 * component's resident part (its slots are filled by mlo_stream_start). */
static int disk_fetch(mlo_component *c, struct mlo_load *ld) {
  ld->counted = true; /* the reader counts its own copies */
  if (c->stream) ld->moved = mlo_stream_resident_bytes(c);
  return mlo_disk_start(c, 0, UINT64_MAX, 0, ld->undo);
}

const struct mlo_source_ops mlo_source_disk = {.name = "disk", .fetch = disk_fetch};

const struct mlo_source_ops mlo_source_shard = {.name = "shard",
                                                .size = mlo_shard_size,
                                                .allocated = mlo_shard_allocated,
                                                .fetch = mlo_shard_fetch};

/* Every node rank at this component, its block all the pieces' padded
 * regions; nothing gathered at the wait but the head's pieces. */
static int shard_blocks_size(mlo_component *c, uint64_t *bytes, struct mlo_load *ld) {
  char why[200] = ""; /* the gather thread, where it runs, started on every rank or on none */
  int mine = mlo_gather_start(c->pipe, why, sizeof why);
  int rc = mlo_collective(c->pipe, c, COLL_LOAD, 0, mine, mine ? why : NULL, NULL);
  if (rc) return rc;
  *bytes = mlo_prog_slice_footprint(c);
  ld->gathered = true;
  return MLO_OK;
}

/* Each piece's slice, then its gather (progressive.c), block by block; the
 * tensors placed in their pieces' regions (what a whole load's layout
 * would count: block_bytes, as a whole sharded load's does). */
static int shard_blocks_fetch(mlo_component *c, struct mlo_load *ld) {
  int rc = mlo_prog_slice(c);
  if (!rc) rc = mlo_shape_blocks.fill(c, ld);
  if (!rc) rc = PCALL(c, mlo_plat_event_record_copy(mlo_dev_plat(c), c->load_ev));
  if (rc) return rc;
  c->placed = true;
  c->placed_bytes = c->block_bytes;
  return MLO_OK;
}

/* Failed after the ranks agreed to it: the other ranks' gather threads
 * wait for its pieces (gatherer.c). */
const struct mlo_source_ops mlo_source_shard_blocks = {.name = "shard-blocks",
                                                       .size = shard_blocks_size,
                                                       .allocated = mlo_shard_allocated,
                                                       .fetch = shard_blocks_fetch,
                                                       .failed = mlo_prog_post_failure};

const struct mlo_source_ops *mlo_source_of(const mlo_component *c) {
  if (mlo_shard_applies(c))
    return mlo_prog_applies(c) ? &mlo_source_shard_blocks : &mlo_source_shard;
  return c->on_disk ? &mlo_source_disk : &mlo_source_slab;
}
