/*
 * progressive.c — a load issued block by block, in the order the forward
 * runs them, each block behind an event of its own (docs/streaming.md,
 * "Progressive loads").
 *
 * A whole load ends in one event, and the acquire waits for it: at a
 * switch the component's first forward waits for every byte of it, though
 * its first block needs a fraction.  A component whose forward says where
 * it is (mlo_block_begin/end around every block: a streamed one, or one
 * declared with mlo_component_set_progressive) loads instead as
 *
 *   head: prologue, epilogue, caller-owned tensors, blocks holding mutable
 *         tensors                                      -> head event
 *   block 0 -> its event, block 1 -> its event, ...    (copy queue, FIFO)
 *
 * A streamed plan interleaves its kept blocks' copies with its slots' in
 * the order the forward runs them: the load issues the kept blocks before
 * the first streamed one, and the rest go out as the slots are refilled,
 * each run of kept blocks just before the streamed block that follows it
 * (mlo_prog_issue_upto, from stream.c).  Issued all at once, they would
 * sit in the FIFO ahead of every slot's refill, and a streamed block early
 * in the forward would wait for the whole resident part.  A begin of a
 * kept block not issued yet issues it then.
 *
 * The acquire waits for the head only (residency.c); each begin waits for
 * its block's event (C8), once per residency.  The blocks land behind each
 * other at the link's speed while the ones before them compute, so at a
 * switch the stall is the head and the first block, not the component.
 *
 * Why the head holds what it does: the prologue runs before any begin and
 * the epilogue after the last end, without calls of their own; caller-owned
 * tensors may be read anywhere; mutable tensors are written back at
 * eviction by a copy that follows the load's first event on a readback
 * queue (residency.c), so their bytes must be in by then.
 *
 * Sharded, block by block (a node-shared slab, shard.c): each piece (the
 * prologue, each block, the epilogue) has a region of its own in the block,
 * padded to the node's ranks times a slice of whole 4 KiB units; each rank
 * copies its slice of each piece, and the node gathers each piece, on the
 * device's copy queue right after the slice (NCCL), or by the host at the
 * piece's wait (MPI: the head's at the acquire, a block's at its begin), so
 * block k computes while block k+1's slices and gather run.  Its tensors
 * are placed in those regions (t->place).
 *
 * Not progressive (a whole load, as before): components with no blocks,
 * loads from disk (the reader issues them, disk.c), sharded loads from disk
 * or under sharded residency, copy_back and per_tensor_copies (the
 * specification-literal baselines).
 *
 * Every function runs with the pipeline lock held, except where a begin
 * waits (mlo_prog_begin drops it: the caller holds the component, so it
 * stays resident).
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>

struct mlo_prog {
  size_t n;           /* blocks the arrays were made for */
  mlo_event **ev;     /* per block: recorded after its copy (created at first use) */
  bool *pending;      /* per block: copied in this residency, compute not yet ordered */
  bool *in_head;      /* per block: holds a mutable tensor, so it goes with the head */
  bool *late;         /* per block: issued by a synchronize while held (mlo_prog_settle) */
  mlo_event *head_ev; /* recorded after the head's copies */
  bool active;        /* this residency was loaded block by block */
  size_t next;        /* the blocks before it have had their copies issued */
  /* sharded (above): per piece, index 0 the prologue, 1..n the blocks, n+1
   * the epilogue: its region in the block, each rank's slice of it, and
   * whether the host still has to gather it (MPI, at its wait) */
  bool sliced;
  bool dev_gathers; /* the device gathers them on its copy queue: each wait watches */
  uint64_t *rdev, *rslice;
  bool *rgather;
  /* ... and where the host's gathers run on the pipeline's gather thread
   * (gatherer.c), each piece's job; epoch: this sliced load's, unique in
   * the pipeline (0: none since the last one ended) */
  struct mlo_gather_job *jobs;
  uint64_t epoch;
};

bool mlo_prog_applies(const mlo_component *c) {
  const mlo_pipeline *pipe = c->pipe;
  if (!c->nblocks || !(c->progressive || c->stream) || c->on_disk) return false;
  if (pipe->settings.copy_back || pipe->settings.per_tensor_copies) return false;
  /* sharded: a streamed one loads replicated; another by slices of each
   * piece, where it is one slab the ranks share (not a sharded residency) */
  return !pipe->sharded || c->stream || (!pipe->shard_resident && c->slab_shared);
}

bool mlo_prog_active(const mlo_component *c) {
  return c->prog && c->prog->active;
}

void mlo_prog_free(mlo_component *c) {
  struct mlo_prog *g = c->prog;
  if (!g) return;
  mlo_prog_drain(c);
  for (size_t b = 0; b < g->n; b++) mlo_plat_event_destroy(mlo_dev_plat(c), g->ev[b]);
  mlo_plat_event_destroy(mlo_dev_plat(c), g->head_ev);
  free(g->ev);
  free(g->pending);
  free(g->in_head);
  free(g->late);
  free(g->rdev);
  free(g->rslice);
  free(g->rgather);
  free(g->jobs);
  free(g);
  c->prog = NULL;
}

void mlo_prog_evicted(mlo_component *c) {
  struct mlo_prog *g = c->prog;
  if (!g) return;
  mlo_prog_drain(c);
  g->active = false;
  g->sliced = g->dev_gathers = false;
  g->epoch = 0; /* the next load's is its own */
  for (size_t b = 0; b < g->n; b++) g->pending[b] = g->late[b] = false;
}

/* The per-block state for c's blocks now (their count is fixed once c is
 * materialized; a new count after a rematerialization makes it anew). */
static int prepare(mlo_component *c) {
  struct mlo_prog *g = c->prog;
  if (g && g->n == c->nblocks) return MLO_OK;
  mlo_prog_free(c);
  if (!(g = mlo_calloc(1, sizeof *g))) return MLO_ENOMEM;
  c->prog = g;
  g->n = c->nblocks;
  g->ev = mlo_calloc(g->n, sizeof *g->ev);
  g->pending = mlo_calloc(g->n, sizeof *g->pending);
  g->in_head = mlo_calloc(g->n, sizeof *g->in_head);
  g->late = mlo_calloc(g->n, sizeof *g->late);
  g->rdev = mlo_calloc(g->n + 2, sizeof *g->rdev);
  g->rslice = mlo_calloc(g->n + 2, sizeof *g->rslice);
  g->rgather = mlo_calloc(g->n + 2, sizeof *g->rgather);
  g->jobs = mlo_calloc(g->n + 2, sizeof *g->jobs);
  if (!g->ev || !g->pending || !g->in_head || !g->late || !g->rdev || !g->rslice || !g->rgather ||
      !g->jobs) {
    mlo_prog_free(c);
    return MLO_ENOMEM;
  }
  return MLO_OK;
}

static const struct mlo_span *span_of(const mlo_component *c, long b) {
  return b == MLO_BLOCK_PROLOGUE ? &c->pro : b == MLO_BLOCK_EPILOGUE ? &c->epi : &c->spans[b];
}

/* A whole component's device block is its slab: a piece runs to the next
 * one, so the pieces together copy the slab exactly as one copy would,
 * padding included.  A streamed plan places each kept piece (stream.c);
 * false for a block that streams (its slots are stream.c's). */
static bool whole_extent(const mlo_component *c, long b, uint64_t *src, uint64_t *len,
                         uint64_t *dev);

/* Piece b's index in the sliced arrays. */
static size_t piece_index(const struct mlo_prog *g, long b) {
  return b == MLO_BLOCK_PROLOGUE ? 0 : b == MLO_BLOCK_EPILOGUE ? g->n + 1 : (size_t)b + 1;
}

bool mlo_prog_extent(const mlo_component *c, long b, uint64_t *src, uint64_t *len, uint64_t *dev) {
  const struct mlo_prog *g = c->prog;
  if (!g || !g->sliced) return whole_extent(c, b, src, len, dev);
  /* sharded: this rank's slice of the piece, at its place in the region */
  uint64_t from, all, at;
  whole_extent(c, b, &from, &all, &at);
  size_t k = piece_index(g, b);
  uint64_t r = (uint64_t)mlo_dist_node_rank(c->pipe->comm) * g->rslice[k];
  *src = from + r;
  *len = r < all ? all - r : 0;
  if (*len > g->rslice[k]) *len = g->rslice[k];
  *dev = g->rdev[k] + r;
  return true;
}

static bool whole_extent(const mlo_component *c, long b, uint64_t *src, uint64_t *len,
                         uint64_t *dev) {
  const struct mlo_span *sp = span_of(c, b);
  *src = sp->off;
  *len = sp->bytes;
  if (c->stream) return mlo_stream_piece_offset(c, b, dev);
  *dev = sp->off;
  if (!sp->bytes) return true;
  uint64_t end = c->slab_bytes; /* the next non-empty piece's start: blocks, then the epilogue */
  if (b != MLO_BLOCK_EPILOGUE)
    for (size_t n = b == MLO_BLOCK_PROLOGUE ? 0 : (size_t)b + 1; n <= c->nblocks; n++) {
      const struct mlo_span *q = n < c->nblocks ? &c->spans[n] : &c->epi;
      if (q->bytes) {
        end = q->off;
        break;
      }
    }
  if (end > *src + *len) *len = end - *src;
  return true;
}

/* Whether piece k goes with the head: the prologue, the epilogue, a block
 * holding mutable tensors. */
static bool head_piece(const struct mlo_prog *g, size_t k) {
  return k == 0 || k == g->n + 1 || g->in_head[k - 1];
}

/* Piece k's host gather, marked by gather_piece, to the pipeline's gather
 * thread where it has one, behind ev (this rank's slice recorded).  Not
 * posted (no thread): the piece's wait gathers, as without one. */
static void post_gather(mlo_component *c, size_t k, mlo_event *ev) {
  struct mlo_prog *g = c->prog;
  mlo_pipeline *pipe = c->pipe;
  struct mlo_gather_job *j = &g->jobs[k];
  if (!g->sliced || !mlo_gather_async(pipe) || j->posted || !g->rgather[k]) return;
  *j = (struct mlo_gather_job){.plat = mlo_dev_plat(c),
                               .ev = ev,
                               .buf = (char *)c->block + g->rdev[k],
                               .slice = (size_t)g->rslice[k],
                               .id = mlo_collective_id(c, COLL_GATHER),
                               .check = (uint64_t)k + 1,
                               .epoch = g->epoch,
                               .what = c->name};
  mlo_gather_post(pipe, j);
}

void mlo_prog_post_failure(mlo_component *c, int rc) {
  mlo_pipeline *pipe = c->pipe;
  if (!mlo_gather_async(pipe)) return;
  /* this load's epoch where it was sliced, else one of its own (never a
   * failed load's, whose jobs the thread skips) */
  uint64_t epoch = c->prog && c->prog->epoch ? c->prog->epoch : mlo_gather_epoch(pipe);
  struct mlo_gather_job like = {.plat = mlo_dev_plat(c),
                                .id = mlo_collective_id(c, COLL_GATHER),
                                .status = rc,
                                .epoch = epoch,
                                .what = c->name};
  snprintf(like.err, sizeof like.err, "%s: its load failed (%s)", c->name, mlo_strerror(rc));
  mlo_gather_post_failure(pipe, &like);
}

void mlo_prog_drain(mlo_component *c) {
  struct mlo_prog *g = c->prog;
  if (!g || !g->jobs) return;
  for (size_t k = 0; k < g->n + 2; k++)
    if (g->jobs[k].posted) {
      mlo_gather_wait(c->pipe, &g->jobs[k]);
      g->jobs[k].posted = false;
    }
}

/* A sharded piece's gather, after this rank's slice: on the device's
 * copy queue where it gathers (NCCL), else marked for the host's gather at
 * the piece's wait.  Every rank gathers every non-empty piece, its own
 * slice empty or not. */
static int gather_piece(mlo_component *c, long b) {
  struct mlo_prog *g = c->prog;
  mlo_pipeline *pipe = c->pipe;
  size_t k = piece_index(g, b);
  if (!g->rslice[k]) return MLO_OK;
  if (pipe->platform->caps.host_addressable) {
    g->rgather[k] = true;
    return MLO_OK;
  }
  int rc =
      PCALL(c, mlo_plat_all_gather(mlo_dev_plat(c), c->block, (size_t)g->rdev[k],
                                   (size_t)g->rslice[k], mlo_dist_node_rank(pipe->comm),
                                   mlo_dist_nccl(pipe->comm), mlo_dist_timeout_ms(pipe->comm)));
  if (!rc) mlo_shard_count_gathered(pipe, (size_t)g->rslice[k]);
  c->device_gather = true; /* the head's wait is the host's, watching the gathers */
  g->dev_gathers = true;   /* and each block's begin (mlo_prog_begin) */
  return rc;
}

static int copy_piece(mlo_component *c, long b, size_t *copies, uint64_t *moved) {
  uint64_t src, len, dev;
  if (!mlo_prog_extent(c, b, &src, &len, &dev)) return MLO_OK;
  if (len) {
    int rc = PCALL(c, mlo_plat_copy_h2d(mlo_dev_plat(c), c->block, (size_t)dev,
                                        (char *)c->slab + src, (size_t)len));
    if (rc) return rc;
    ++*copies;
    *moved += len;
  }
  return c->prog->sliced ? gather_piece(c, b) : MLO_OK;
}

int mlo_prog_copy_head(mlo_component *c, size_t *copies, uint64_t *moved) {
  mlo_platform *p = mlo_dev_plat(c);
  *copies = 0;
  *moved = 0;
  int rc = prepare(c);
  if (rc) return rc;
  struct mlo_prog *g = c->prog;
  g->active = false; /* until the head's event is recorded */
  for (size_t b = 0; b < g->n; b++) g->in_head[b] = g->pending[b] = g->late[b] = false;
  for (size_t i = 0; i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    if (!t->target && t->block >= 0 && (t->flags & MLO_TENSOR_MUTABLE)) g->in_head[t->block] = true;
  }
  if ((rc = copy_piece(c, MLO_BLOCK_PROLOGUE, copies, moved))) return rc;
  if ((rc = copy_piece(c, MLO_BLOCK_EPILOGUE, copies, moved))) return rc;
  for (size_t b = 0; b < g->n; b++)
    if (g->in_head[b] && (rc = copy_piece(c, (long)b, copies, moved))) return rc;
  if ((rc = mlo_res_copy_tensors(c, false, copies, moved))) return rc; /* caller-owned */
  if (!g->head_ev && (rc = PCALL(c, mlo_plat_event_create(p, &g->head_ev)))) return rc;
  if ((rc = PCALL(c, mlo_plat_event_record_copy(p, g->head_ev)))) return rc;
  for (size_t k = 0; k < g->n + 2; k++)
    if (head_piece(g, k)) post_gather(c, k, g->head_ev);
  return MLO_OK;
}

/* Whether block b is copied on its own, behind its event: kept, not in
 * the head, not empty. */
static bool own_copy(const mlo_component *c, size_t b) {
  const struct mlo_prog *g = c->prog;
  uint64_t src, len, dev;
  if (g->in_head[b]) return false;
  if (g->sliced) return g->rslice[b + 1] != 0; /* the gather is every rank's */
  return mlo_prog_extent(c, (long)b, &src, &len, &dev) && len;
}

/* Issues the copies of the blocks from g->next up to limit, each followed
 * by its event; g->next then names the first block still to issue (past
 * any with no copy of their own), or the one whose copy failed. */
static int issue_range(mlo_component *c, size_t limit, size_t *copies, uint64_t *moved) {
  struct mlo_prog *g = c->prog;
  mlo_platform *p = mlo_dev_plat(c);
  int rc = MLO_OK;
  for (; g->next < limit && g->next < g->n; g->next++) {
    size_t b = g->next;
    if (!own_copy(c, b)) continue;
    if (!g->ev[b] && (rc = PCALL(c, mlo_plat_event_create(p, &g->ev[b])))) return rc;
    if ((rc = copy_piece(c, (long)b, copies, moved))) return rc;
    if ((rc = PCALL(c, mlo_plat_event_record_copy(p, g->ev[b])))) return rc;
    g->pending[b] = true;
    post_gather(c, b + 1, g->ev[b]);
  }
  while (g->next < g->n && !own_copy(c, g->next)) g->next++;
  return MLO_OK;
}

int mlo_prog_copy_blocks(mlo_component *c, size_t limit, size_t *copies, uint64_t *moved) {
  struct mlo_prog *g = c->prog;
  mlo_sync_mode sync = c->pipe->enabled ? c->pipe->settings.sync : MLO_SYNC_EVENT;
  g->next = 0;
  /* only an event-ordered begin can wait for a copy issued after the acquire */
  int rc = issue_range(c, sync == MLO_SYNC_EVENT ? limit : g->n, copies, moved);
  bool any = false;
  for (size_t b = 0; b < g->n && !any; b++) any = g->pending[b];
  /* nothing after the head (every block in it, or empty): a whole load */
  g->active = !rc && (any || g->next < g->n);
  return rc;
}

int mlo_prog_issue_upto(mlo_component *c, size_t limit) {
  struct mlo_prog *g = c->prog;
  if (!g || !g->active || g->next >= limit || g->next >= g->n) return MLO_OK;
  size_t copies = 0;
  uint64_t moved = 0;
  int rc = issue_range(c, limit, &copies, &moved);
  c->stats.h2d_bytes += moved;
  c->stats.copy_calls += copies;
  /* the load's event follows all of its copies issued so far (its end in
   * traces, mlo_component_load_done); where it cannot be recorded, the
   * copies are waited for instead, so that its earlier record still means
   * the load has landed */
  if (copies && PCALL(c, mlo_plat_event_record_copy(mlo_dev_plat(c), c->load_ev))) {
    c->stats.platform_calls++;
    mlo_plat_synchronize(mlo_dev_plat(c));
  }
  return rc;
}

/* A held component's kept blocks issued here (held) are issued early, not
 * out of order: each begin finds its block issued and waits for the
 * block's own event, as for a whole progressive load.  Only its streamed
 * blocks' refills queue behind them (a synchronize is not on a forward's
 * path).  Under MLO_SYNC_DEVICE, where a begin trusts its acquire's
 * synchronize and waits for nothing, a held component has none deferred
 * (its acquire issued them before it synchronized, residency.c) unless
 * that issue failed: those issued here are marked late, and their begins
 * wait for them. */
void mlo_prog_settle(mlo_pipeline *pipe, const mlo_component *except, bool held) {
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    if (c == except || (c->users && !held) || !mlo_prog_deferred(c)) continue;
    struct mlo_prog *g = c->prog;
    size_t from = g->next;
    if (mlo_prog_issue_upto(c, c->nblocks))
      mlo_logf(MLO_LOG_DEBUG, "%s: kept blocks not issued: %s", c->name, pipe->errmsg);
    for (size_t b = from; c->users && b < g->next; b++) g->late[b] = g->pending[b];
  }
}

bool mlo_prog_deferred(const mlo_component *c) {
  return c->prog && c->prog->active && c->prog->next < c->prog->n;
}

int mlo_prog_join_prepare(mlo_component *c) {
  int rc = prepare(c);
  if (rc) return rc;
  struct mlo_prog *g = c->prog;
  g->active = false;
  g->next = g->n; /* the join issues every copy itself */
  for (size_t b = 0; b < g->n; b++) g->in_head[b] = g->pending[b] = g->late[b] = false;
  return MLO_OK;
}

int mlo_prog_join_mark(mlo_component *c, long piece) {
  struct mlo_prog *g = c->prog;
  mlo_platform *p = mlo_dev_plat(c);
  mlo_event **ev = piece == MLO_BLOCK_PROLOGUE ? &g->head_ev : &g->ev[piece];
  int rc = *ev ? MLO_OK : PCALL(c, mlo_plat_event_create(p, ev));
  if (!rc) rc = PCALL(c, mlo_plat_event_record_copy(p, *ev));
  if (!rc && piece >= 0) g->pending[piece] = true;
  return rc;
}

void mlo_prog_join_defer(mlo_component *c, size_t from) {
  struct mlo_prog *g = c->prog;
  g->next = from;
  while (g->next < g->n && !own_copy(c, g->next)) g->next++;
}

void mlo_prog_join_activate(mlo_component *c) {
  struct mlo_prog *g = c->prog;
  bool any = g->next < g->n; /* kept blocks its own load issues (a mirror join) */
  for (size_t b = 0; b < g->n && !any; b++) any = g->pending[b];
  g->active = any;
}

mlo_event *mlo_prog_head_event(const mlo_component *c) {
  return c->prog->head_ev;
}

/* The host's gather of piece k (MPI over the block's memory: a host
 * platform), once this rank's slice of it has landed (ev); lock held. */
static int host_gather(mlo_component *c, size_t k, mlo_event *ev) {
  struct mlo_prog *g = c->prog;
  mlo_pipeline *pipe = c->pipe;
  if (g->jobs[k].posted) { /* on the gather thread: its verdict (a failure stays) */
    int rc = mlo_gather_wait(pipe, &g->jobs[k]);
    if (rc) return mlo_collective_failed(pipe, rc, g->jobs[k].err);
    g->rgather[k] = false;
    return MLO_OK;
  }
  int rc = PCALL(c, mlo_plat_event_sync(mlo_dev_plat(c), ev));
  if (rc) return mlo_fail(pipe, rc, "%s: waiting for block %zu's slice failed", c->name, k - 1);
  rc = mlo_shard_gather(c, (size_t)g->rdev[k], (size_t)g->rslice[k], (uint64_t)k + 1);
  if (!rc) g->rgather[k] = false; /* else said by the gather; the next begin gathers again */
  return rc;
}

/* Piece k's rank slice, of n ranks (as a whole sharded load's). */
static uint64_t piece_slice(const mlo_component *c, size_t k, uint64_t n) {
  long b = k == 0 ? MLO_BLOCK_PROLOGUE : k == c->nblocks + 1 ? MLO_BLOCK_EPILOGUE : (long)k - 1;
  uint64_t src, len, dev;
  whole_extent(c, b, &src, &len, &dev);
  return mlo_shard_slice(len, n);
}

uint64_t mlo_prog_slice_footprint(mlo_component *c) {
  uint64_t n = (uint64_t)mlo_dist_node_size(c->pipe->comm), at = 0;
  for (size_t k = 0; k < c->nblocks + 2; k++) at += piece_slice(c, k, n) * n;
  return at;
}

int mlo_prog_slice(mlo_component *c) {
  int rc = prepare(c);
  if (rc) return rc;
  struct mlo_prog *g = c->prog;
  uint64_t n = (uint64_t)mlo_dist_node_size(c->pipe->comm), at = 0;
  mlo_prog_drain(c);                    /* nothing of a previous load still gathering into it */
  g->epoch = mlo_gather_epoch(c->pipe); /* pipeline-wide: never one a failure was of */
  for (size_t k = 0; k < g->n + 2; k++) {
    g->rdev[k] = at;
    g->rslice[k] = piece_slice(c, k, n);
    g->rgather[k] = false;
    at += g->rslice[k] * n;
  }
  g->sliced = true;
  g->dev_gathers = false;
  /* each tensor at its piece's region, where the gather puts its bytes */
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    t->place = 0; /* no bytes: at 0, as in a whole block */
    if (t->target || !t->nbytes) continue;
    long b = t->block;
    uint64_t src, len, dev;
    whole_extent(c, b, &src, &len, &dev);
    t->place = g->rdev[piece_index(g, b)] + (t->dev_offset - src);
  }
  return MLO_OK;
}

bool mlo_prog_sliced(const mlo_component *c) {
  return c->prog && c->prog->sliced;
}

int mlo_prog_gather_head(mlo_component *c) {
  struct mlo_prog *g = c->prog;
  for (size_t k = 0; k < g->n + 2; k++) {
    if (!head_piece(g, k) || !g->rgather[k]) continue;
    int rc = g->jobs[k].posted
                 ? host_gather(c, k, g->head_ev)
                 : mlo_shard_gather(c, (size_t)g->rdev[k], (size_t)g->rslice[k], (uint64_t)k + 1);
    if (rc) return rc;
    g->rgather[k] = false;
  }
  return MLO_OK;
}

bool mlo_prog_head_gathers(const mlo_component *c) {
  const struct mlo_prog *g = c->prog;
  if (!g || !g->sliced) return false;
  for (size_t k = 0; k < g->n + 2; k++)
    if (head_piece(g, k) && g->rgather[k]) return true;
  return false;
}

/* The host's gather of block b's piece, where it is due: its wait (this
 * rank's slice landing, then the other ranks' slices) is the forward's
 * stall, counted as a wait for the block. */
static int begin_gather(mlo_component *c, size_t b) {
  struct mlo_prog *g = c->prog;
  if (!g->sliced || !g->rgather[b + 1]) return MLO_OK;
  mlo_platform *p = mlo_dev_plat(c);
  uint64_t t0 = mlo_plat_now(p);
  int rc = host_gather(c, b + 1, g->ev[b]);
  uint64_t t1 = mlo_plat_now(p);
  mlo_res_count_wait(c, t0, t1, true);
  c->stats.block_wait_ns += t1 - t0;
  return rc;
}

int mlo_prog_begin(mlo_component *c, size_t b) {
  struct mlo_prog *g = c->prog;
  mlo_pipeline *pipe = c->pipe;
  if (!g || !g->active || b >= g->n) return MLO_OK;
  bool now = b >= g->next; /* not issued yet (a deferred kept block): now */
  int rc = now ? mlo_prog_issue_upto(c, b + 1) : MLO_OK;
  if (rc)
    return mlo_fail(pipe, rc, "%s: loading block %zu failed (%s)", c->name, b, mlo_strerror(rc));
  if ((rc = begin_gather(c, b)))
    return rc; /* every sync mode: the other ranks' slices are not there without it */
  if (!g->pending[b]) return MLO_OK;
  mlo_sync_mode sync = pipe->enabled ? pipe->settings.sync : MLO_SYNC_EVENT;
  if (sync == MLO_SYNC_UNSAFE_NONE) return MLO_OK;
  if (sync == MLO_SYNC_DEVICE && !now && !g->late[b]) { /* the acquire synchronized after it */
    g->pending[b] = false;
    return MLO_OK;
  }
  mlo_event *ev = g->ev[b];
  mlo_platform *p = mlo_dev_plat(c);
  bool watch = g->sliced && g->dev_gathers; /* a gather on the device: the host watches it */
  pthread_mutex_unlock(&pipe->lock);        /* this thread holds c: it stays resident */
  uint64_t t0 = mlo_plat_now(p);
  char why[400] = "";
  rc = watch ? mlo_plat_coll_wait(p, ev, why, sizeof why) : MLO_OK;
  if (rc) {
    pthread_mutex_lock(&pipe->lock);
    return mlo_fail(pipe, rc, "%s: block %zu's all-gather failed: %s", c->name, b,
                    why[0] ? why : mlo_strerror(rc));
  }
  rc = mlo_res_compute_wait(p, ev, sync);
  uint64_t t1 = mlo_plat_now(p);
  pthread_mutex_lock(&pipe->lock);
  mlo_res_count_wait(c, t0, t1, true);
  c->stats.block_wait_ns += t1 - t0;
  if (rc) return mlo_fail(pipe, rc, "%s: waiting for block %zu's load failed", c->name, b);
  if (c->prog != g || !g->active) return MLO_OK;
  g->pending[b] = g->late[b] = false;
  /* the last block waited for: the load is complete (its event follows) */
  bool left = g->next < g->n;
  for (size_t k = 0; k < g->n && !left; k++) left = g->pending[k];
  if (!left) mlo_res_load_ended(c, t1);
  return MLO_OK;
}

int mlo_component_set_progressive(mlo_component *c, int on) {
  if (!c) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  c->progressive = on != 0; /* from its next load: this residency keeps its own */
  pthread_mutex_unlock(&c->pipe->lock);
  return MLO_OK;
}
