/*
 * shard.c — the "shard" source (mover.h): a sharded pipeline's component
 * loaded by every node rank at once, each copying one slice of whole
 * 4 KiB units of its slab (from node-shared host memory, or read from its
 * files by the disk tier's reader, so the node reads each byte once), and
 * the node gathering the slices into every rank's block: on the device's
 * copy queue where it can (NCCL), else by the host at the load's wait
 * (MPI over the blocks' host memory).  With sharded residency
 * (shard_resident) a rank keeps its slice alone and the caller's compute
 * gathers (docs/distributed.md).  Loaded block by block, each piece is
 * sliced and gathered on its own (progressive.c); mover.c makes the rows.
 */
#include "core/mover.h"

#include <stdio.h>

/* A sharded pipeline's component whose block is its slab alone
 * (caller-owned tensors are each rank's own: replicated); a streamed one
 * loads replicated (mover.c's table).  Under replicated ranks, a component
 * on disk too: there is no node-shared copy of it to load whole from, and
 * the node reads each byte once only if each rank reads its slice. */
bool mlo_shard_applies(const mlo_component *c) {
  const mlo_pipeline *pipe = c->pipe;
  bool sliced = pipe->sharded ? c->slab_shared || c->on_disk : pipe->comm && c->on_disk;
  return sliced && c->block_bytes == c->slab_bytes && !c->stream;
}

uint64_t mlo_shard_slice(uint64_t bytes, uint64_t ranks) {
  return ((bytes + ranks - 1) / ranks + 4095) / 4096 * 4096;
}

void mlo_shard_count_gathered(mlo_pipeline *pipe, size_t slice) {
  pipe->dist.gather_bytes += (uint64_t)slice * (uint64_t)(mlo_dist_node_size(pipe->comm) - 1);
}

int mlo_shard_gather(mlo_component *c, size_t offset, size_t slice, uint64_t piece) {
  mlo_pipeline *pipe = c->pipe;
  uint64_t g0 = mlo_plat_now(pipe->platform);
  char err[512] = "";
  int rc = mlo_collective(pipe, c, COLL_GATHER, piece, MLO_OK, NULL, NULL);
  uint64_t t0 = mlo_plat_now(pipe->platform);
  if (!rc) rc = mlo_dist_allgather(pipe->comm, (char *)c->block + offset, slice, err, sizeof err);
  /* a platform that models the node's fabric holds the gather to it */
  if (!rc) mlo_plat_gather_pace(pipe->platform, slice, mlo_dist_node_size(pipe->comm), t0);
  if (rc && err[0]) mlo_fail(pipe, rc, "%s: %s", c->name, err);
  pipe->dist.gather_ns += mlo_plat_now(pipe->platform) - g0;
  if (!rc) mlo_shard_count_gathered(pipe, slice);
  return rc;
}

/* Every node rank at this component; its slice, and the block: all the
 * slices, or this rank's alone under sharded residency. */
int mlo_shard_size(mlo_component *c, uint64_t *bytes, struct mlo_load *ld) {
  mlo_pipeline *pipe = c->pipe;
  int rc = mlo_collective(pipe, c, COLL_LOAD, 0, MLO_OK, NULL, NULL);
  if (rc) return rc;
  uint64_t n = (uint64_t)mlo_dist_node_size(pipe->comm);
  ld->slice = (size_t)mlo_shard_slice(c->block_bytes, n);
  *bytes = pipe->shard_resident ? ld->slice : (uint64_t)ld->slice * n;
  return MLO_OK;
}

/* Any rank's failure to allocate is every rank's: the load is undone
 * everywhere (a communicator set or aborted since materialization is
 * refused here too). */
int mlo_shard_allocated(mlo_component *c, int rc, struct mlo_load *ld) {
  mlo_pipeline *pipe = c->pipe;
  mlo_platform *p = pipe->platform;
  (void)ld;
  char mine[400] = "";
  if (rc)
    snprintf(mine, sizeof mine, "allocating the device block of '%.120s' failed (%s)", c->name,
             mlo_strerror(rc));
  else if ((rc = mlo_check_device_gather(pipe, mine, sizeof mine))) {
    c->stats.platform_calls++;
    mlo_plat_dev_free(p, c->block, (size_t)c->alloc_bytes);
    c->block = NULL;
  }
  int arc = mlo_collective(pipe, c, COLL_LOADED, 0, rc, rc ? mine : NULL, NULL);
  if (arc) {
    if (!rc && c->block) { /* this rank's block goes with the others' failure */
      c->stats.platform_calls++;
      mlo_plat_dev_free(p, c->block, (size_t)c->alloc_bytes);
    }
    c->block = NULL;
    return arc;
  }
  return rc;
}

/* This rank's slice of the slab, at its place in the block; a device that
 * gathers on its copy queue does it now, before the load's event; the
 * host platform gathers at the wait, through MPI. */
int mlo_shard_fetch(mlo_component *c, struct mlo_load *ld) {
  mlo_pipeline *pipe = c->pipe;
  mlo_platform *p = pipe->platform;
  size_t slice = ld->slice;
  uint64_t from = (uint64_t)mlo_dist_node_rank(pipe->comm) * slice;
  uint64_t len = from < c->slab_bytes ? c->slab_bytes - from : 0;
  if (len > slice) len = slice;
  uint64_t at = pipe->shard_resident ? 0 : from; /* a shard alone starts its block */
  bool device_gathers = !pipe->shard_resident && !p->caps.host_addressable;
  int rc = MLO_OK;
  if (c->on_disk) { /* the reader reads this rank's slice of the files (the node
                     * reads each byte once); its tier is refused where the
                     * device gathers (disk.c) */
    rc = mlo_disk_start(c, from, from + len, at, ld->undo);
    ld->counted = true;
  } else if (len) {
    rc = PCALL(c, mlo_plat_copy_h2d(p, c->block, (size_t)at, (char *)c->slab + from, (size_t)len));
  }
  ld->copies = len && !c->on_disk && !rc ? 1 : 0;
  ld->moved = len;
  ld->queued = ld->copies ? len : 0;
  if (pipe->shard_resident) {
    c->shard_offset = from;
    c->shard_bytes = len;
    ld->gathered = true; /* nothing to gather: the caller's compute does */
  }
  if (!rc && device_gathers) {
    rc = PCALL(c, mlo_plat_all_gather(p, c->block, 0, slice, mlo_dist_node_rank(pipe->comm),
                                      mlo_dist_nccl(pipe->comm), mlo_dist_timeout_ms(pipe->comm)));
    if (!rc) mlo_shard_count_gathered(pipe, slice);
    ld->gathered = true;
    c->device_gather = true; /* its first wait is the host's, watching the gather */
  }
  if (!rc && !c->on_disk) rc = PCALL(c, mlo_plat_event_record_copy(p, c->load_ev));
  return rc;
}
