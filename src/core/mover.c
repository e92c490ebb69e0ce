/*
 * mover.c — the source table's choice and its "slab" row (mover.h).
 *
 * The composition table, the one place that says which source serves a
 * load and in which shape:
 *
 *   source \ shape   whole   block by block   streamed (resident part + slots)
 *   slab             yes     yes              yes
 *   disk             yes     no (1)           yes, its streamed blocks kept in
 *                                             host memory (partial, disk.c)
 *   shard            yes     no (2)           no (2): a streamed one loads replicated
 *
 * (1) the reader reads and copies in chunks of its ring, not in the
 *     forward's blocks; a component on disk loads whole and its forward
 *     waits for all of it (mlo_prog_applies says so for the shape).
 * (2) a node gathers whole blocks of shards; a gather per block is not
 *     built (docs/distributed.md).
 */
#include "core/mover.h"

static int slab_fetch(mlo_component *c, struct mlo_load *ld) {
  mlo_pipeline *pipe = c->pipe;
  int rc;
  if (mlo_prog_applies(c)) {
    /* block by block: the head and its event (what the acquire waits for),
     * then each kept block behind an event of its own (its begin waits for
     * it), in the order the forward runs them; a streamed plan's kept
     * blocks up to its first streamed one, the rest between its slots'
     * copies (mlo_stream_start) */
    size_t more = 0;
    uint64_t also = 0;
    rc = mlo_prog_copy_head(c, &ld->copies, &ld->moved);
    if (!rc) rc = mlo_prog_copy_blocks(c, mlo_stream_load_limit(c), &more, &also);
    ld->copies += more;
    ld->moved += also;
    ld->queued = ld->moved;
  } else { /* whole: the slab in one copy, then each caller-owned tensor */
    bool per_tensor = pipe->settings.per_tensor_copies;
    rc = MLO_OK;
    if (c->slab_bytes && !per_tensor) {
      rc = PCALL(c, mlo_plat_copy_h2d(pipe->platform, c->block, 0, c->slab, c->slab_bytes));
      if (!rc) {
        ld->copies++;
        ld->queued += c->slab_bytes;
      }
    }
    if (!rc) rc = mlo_res_copy_tensors(c, per_tensor, &ld->copies, &ld->queued);
  }
  if (!rc) rc = PCALL(c, mlo_plat_event_record_copy(pipe->platform, c->load_ev));
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

const struct mlo_source_ops *mlo_source_of(const mlo_component *c) {
  if (mlo_shard_applies(c)) return &mlo_source_shard;
  return c->on_disk ? &mlo_source_disk : &mlo_source_slab;
}
