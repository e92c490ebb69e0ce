/*
 * join.c — the joined switch (docs/streaming.md, "The joined switch"): the
 * next component's copies issued during the current component's last
 * forward, into the memory that forward's ended blocks no longer need, so
 * that under a budget of one component the switch does not wait for a
 * whole load.
 *
 * The budget policy decides when (budget.c: with prefetch and a schedule,
 * in the call the schedule says is A's last before B, where B does not fit
 * beside A).  This file does it:
 *
 *  - Placement.  B takes A's device block whole.  Its slab, in the order
 *    its load needs it (its head: prologue and epilogue; then the blocks),
 *    is laid into it as a ring that starts where A's first block is: B's
 *    head and first blocks go over A's first blocks, its last ones wrap
 *    round over A's prologue.  The wrap falls between two of B's tensors
 *    and the ring starts as early as that allows, so no tensor is split
 *    and B fits wherever its slab fits A's block.  Each of B's tensors is
 *    then at t->place (comp->placed) for this residency.
 *  - Order.  B's pieces are copied in that order, each copy after the
 *    compute that read what it overwrites (C9): at the end of A's block k
 *    a compute event is recorded and the copy queue waits for it before
 *    the copies that became free to go.  What A may read until its release
 *    (prologue, epilogue, caller-owned tensors) is overwritten only after
 *    its last release, which issues the rest.
 *  - Events.  B's head (prologue and epilogue) has one event, what its
 *    acquire waits for; each block has its own, which its begin waits for
 *    (progressive.c), as a progressive load's.  A B that does not load
 *    progressively waits for all of it, at its acquire.
 *  - Hand-over, at A's last release (residency.c): A leaves the device
 *    with nothing freed; B is resident in A's block, loading.
 *  - Two streamed components with one plan (a mirror join, plan_mirror):
 *    no ring; B's kept blocks go over A's same blocks, paced behind A's
 *    own slot refills, its head at the release, and B's own load issues
 *    the rest after the hand-over.  A streamed B into a plain A's block it
 *    fits is a mirror too, over A's bytes wherever they are: its head
 *    first where nothing A reads until its release is under it.
 *  - A streamed A (into a plain B): its bytes are its plan's (a_ranges),
 *    its head and slots read until its release; B's copies are paced as a
 *    mirror's.  An A without blocks: everything of it is read until its
 *    release; its join starts at its acquire (budget.c), B's ring right
 *    after A's bytes, and it joins only where some of B goes now.
 *    Together these pass one block round a prompt: the last DiT's to the
 *    VAE, the next encoder into the room the VAE leaves, the first DiT
 *    into that (docs/streaming.md, "The prompt's cycle").
 *
 * While the join runs, A is spent: a block ended in this call (its bytes
 * may be overwritten from the next end on) cannot be begun again, nor its
 * tensors' addresses asked for (MLO_ESTATE); another thread's acquire of A
 * waits for the hand-over and loads it again, one that holds anything is
 * refused (budget.c); B loads no other way until then.  Only a source
 * with blocks declared progressive joins (its forward promised to read a
 * block only between its begin and end), or one without blocks (nothing
 * of it is overwritten before its release).  A failed copy ends the join
 * early: nothing more is copied, B loads on demand as ever, and A
 * is evicted at its release (its block freed after the copies queued).
 *
 * Every function runs with the pipeline lock held.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <limits.h>
#include <stdlib.h>

#define DEP_NONE (-1L)    /* overwrites nothing A reads */
#define DEP_END LONG_MAX  /* overwrites what A reads until its release */
#define MARK_NONE (-100L) /* no event after this copy */

/* One copy of B's slab bytes [src, src + len) to dst in the block. */
struct join_run {
  uint64_t src, dst, len;
  long dep;  /* the last of A's blocks whose bytes it overwrites (DEP_*) */
  long mark; /* after it: B's head event (MLO_BLOCK_PROLOGUE), block mark's, or none */
};

struct mlo_join {
  mlo_component *from, *to;
  bool mirror;          /* both stream, one layout: each of B's pieces over A's same */
  bool paced;           /* A streams: B's copies go where the link has room (issue()) */
  size_t kfirst, klast; /* a mirror join's runs: B's kept blocks [kfirst, klast); its head
                           and the head's event before them (head first) or after */
  struct join_run *runs;
  size_t nruns, next; /* runs issued: [0, next) */
  bool *ended;        /* per block of A: ended in this forward */
  size_t done;        /* A's blocks [0, done) have all ended */
  bool prog;          /* B loads block by block: per-piece events */
  bool failed;        /* a copy failed: nothing more goes, A is evicted at its release */
  mlo_event *point;   /* A's compute so far, recorded again at each step */
  mlo_event *tail;    /* after the last runs issued (a mirror join's pacing) */
  bool tail_set;
  size_t copies;
  uint64_t moved;
};

/* Where a tensor of a resident c is in its block. */
static uint64_t at_of(const mlo_component *c, const mlo_tensor *t) {
  return c->placed ? t->place : t->dev_offset;
}

static bool owns_bytes(const mlo_tensor *t) {
  return !t->target && t->nbytes;
}

/* A's bytes, as ranges with the block whose end frees them. */
struct range {
  uint64_t lo, hi;
  long dep;
};

static int by_lo(const void *x, const void *y) {
  const struct range *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

static struct range *ranges_of(const mlo_component *a, size_t *n) {
  struct range *r = mlo_calloc(a->ntensors ? a->ntensors : 1, sizeof *r);
  if (!r) return NULL;
  *n = 0;
  for (size_t i = 0; i < a->ntensors; i++) {
    const mlo_tensor *t = a->tensors[i];
    if (!owns_bytes(t)) continue;
    uint64_t lo = at_of(a, t); /* (caller-owned tensors are laid out as the prologue's) */
    r[(*n)++] = (struct range){lo, lo + t->nbytes, t->block >= 0 ? t->block : DEP_END};
  }
  qsort(r, *n, sizeof *r, by_lo);
  return r;
}

/* The last block of A whose bytes [lo, hi) overlaps (ranges sorted, apart). */
static long dep_of(const struct range *r, size_t n, uint64_t lo, uint64_t hi) {
  size_t a = 0, b = n; /* the first range ending after lo */
  while (a < b) {
    size_t m = a + (b - a) / 2;
    if (r[m].hi <= lo)
      a = m + 1;
    else
      b = m;
  }
  long dep = DEP_NONE;
  for (size_t i = a; i < n && r[i].lo < hi; i++)
    if (r[i].dep > dep) dep = r[i].dep;
  return dep;
}

/* A's bytes as ranges (sorted, apart, none empty) with the block whose end
 * frees them: a plain A's tensors where they are (ranges_of); a streamed
 * one's plan (mlo_stream_regions): its head until the release, each kept
 * block from its end, and its slots until the release too, since a
 * streamed block run again loads on demand into one. */
static struct range *a_ranges(const mlo_component *a, size_t *n) {
  if (!a->stream) return ranges_of(a, n);
  size_t nr = 0;
  struct mlo_stream_region *reg = mlo_stream_regions(a, &nr);
  struct range *r = reg ? mlo_calloc(nr + 1, sizeof *r) : NULL;
  if (!r) {
    free(reg);
    return NULL;
  }
  *n = 0;
  for (size_t i = 0; i < nr; i++) {
    long dep = reg[i].dep;
    if (dep < 0 || mlo_stream_block_streams(a, (size_t)dep)) dep = DEP_END;
    if (reg[i].hi > reg[i].lo) r[(*n)++] = (struct range){reg[i].lo, reg[i].hi, dep};
  }
  free(reg);
  qsort(r, *n, sizeof *r, by_lo);
  return r;
}

/* Where the ring starts: at the bytes A's forward frees first (its first
 * block's); where none are freed before its release (A has no blocks),
 * right after A's bytes, so that B goes into the room beside them first. */
static uint64_t ring_start(const mlo_component *a, const struct range *r, size_t n) {
  const struct range *first = NULL;
  uint64_t end = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].dep >= 0 && r[i].dep != DEP_END && (!first || r[i].dep < first->dep)) first = &r[i];
    if (r[i].hi > end) end = r[i].hi;
  }
  if (first) return first->lo; /* (sorted: the lowest of that block's) */
  uint64_t align = a->pipe->alignment ? a->pipe->alignment : 1;
  end = (end + align - 1) / align * align;
  return end < a->alloc_bytes ? end : 0;
}

/* B's ring order is its head first, as a progressive load copies it:
 * prologue, epilogue, then the blocks.  virt() is a slab offset's place in
 * that order (each region keeps its alignment: the epilogue's virtual size
 * runs to the slab's aligned end). */
struct vmap {
  uint64_t bstart, eoff, ev;
};

static struct vmap vmap_of(const mlo_component *b) {
  uint64_t src, len, dev;
  mlo_prog_extent(b, MLO_BLOCK_PROLOGUE, &src, &len, &dev);
  struct vmap m;
  m.bstart = len ? src + len : 0;
  m.eoff = b->epi.bytes ? b->epi.off : b->slab_bytes;
  m.ev = b->slab_bytes - m.eoff;
  return m;
}

static uint64_t virt(const struct vmap *m, uint64_t off) {
  if (off < m->bstart) return off;
  if (off >= m->eoff) return m->bstart + (off - m->eoff);
  return off + m->ev;
}

/* B's ring in A's block of `room` bytes from `s0`: its (virtual) bytes
 * [0, cut) at base, [cut, end) at tail.  cut is a tensor's start (or the
 * slab's end), the latest that leaves [s0, room) for what comes before it;
 * [0, cut) then ends at room and [cut, end) right before base, so B is one
 * range, [room - end, room), aligned (a fingerprint of it sums its bytes
 * and nothing of A's: mlo.torch's write check). */
struct ring {
  uint64_t base, cut, tail;
};

static struct ring ring_of(const mlo_component *b, const struct vmap *vm, uint64_t s0,
                           uint64_t room) {
  uint64_t len = b->slab_bytes;
  if (s0 <= room && len <= room - s0) /* no wrap */
    return (struct ring){s0, len, 0};
  uint64_t lim = s0 <= room ? room - s0 : 0, best = 0;
  for (size_t i = 0; i < b->ntensors; i++) {
    const mlo_tensor *t = b->tensors[i];
    uint64_t v = virt(vm, t->dev_offset);
    if (owns_bytes(t) && v <= lim && v > best) best = v;
  }
  return (struct ring){room - best, best, room - len}; /* len <= room (checked) */
}

static uint64_t mapped(uint64_t v, const struct ring *rg) {
  return v < rg->cut ? rg->base + v : rg->tail + (v - rg->cut);
}

/* The copies of B's piece (split at the wrap), with the mark after the last. */
static void add_piece(struct mlo_join *j, const mlo_component *b, const struct vmap *vm, long piece,
                      const struct ring *rg, const struct range *r, size_t nr, long mark) {
  uint64_t src, len, dev;
  if (!mlo_prog_extent(b, piece, &src, &len, &dev)) return;
  uint64_t v = virt(vm, src), vend = v + len;
  while (v < vend) {
    uint64_t stop = v < rg->cut && rg->cut < vend ? rg->cut : vend;
    uint64_t dst = mapped(v, rg);
    j->runs[j->nruns++] =
        (struct join_run){src, dst, stop - v, dep_of(r, nr, dst, dst + (stop - v)), MARK_NONE};
    src += stop - v;
    v = stop;
  }
  if (mark != MARK_NONE) {
    if (!len) /* an empty piece: its event still goes, after what came before */
      j->runs[j->nruns++] = (struct join_run){0, 0, 0, DEP_NONE, MARK_NONE};
    j->runs[j->nruns - 1].mark = mark;
  }
}

/* The runs in the order B's forward needs them, placed; false: out of
 * memory. */
static bool plan_runs(struct mlo_join *j, const struct vmap *vm, const struct ring *rg,
                      struct range *r, size_t nr) {
  mlo_component *b = j->to;
  /* each piece twice at most (the wrap), plus an empty head's mark */
  j->runs = mlo_calloc(2 * (b->nblocks + 2) + 2, sizeof *j->runs);
  if (!j->runs) return false;
  bool any = false;
  for (size_t k = 0; k < b->nblocks; k++) any = any || b->spans[k].bytes;
  bool marks = j->prog && any;
  /* the head (prologue and epilogue), then each block behind its event */
  add_piece(j, b, vm, MLO_BLOCK_PROLOGUE, rg, r, nr, MARK_NONE);
  add_piece(j, b, vm, MLO_BLOCK_EPILOGUE, rg, r, nr, marks ? MLO_BLOCK_PROLOGUE : MARK_NONE);
  for (size_t k = 0; k < b->nblocks; k++)
    add_piece(j, b, vm, (long)k, rg, r, nr, marks && b->spans[k].bytes ? (long)k : MARK_NONE);
  for (size_t i = 0; i < b->ntensors; i++) { /* where each tensor is, from the hand-over */
    mlo_tensor *t = b->tensors[i];
    if (owns_bytes(t)) t->place = mapped(virt(vm, t->dev_offset), rg);
  }
  return true;
}

/* Two streamed components with one layout (mlo_stream_same_layout): each
 * of B's pieces goes where A has the same piece.  A's kept blocks end in
 * the order its forward runs them, so B's kept blocks flow in behind them,
 * as the link has room (issue()); its head (prologue, epilogue), which A
 * reads until its release, goes then.  The rest is B's own load, handed
 * over as it stands: its slots' first fills and the kept blocks not copied
 * yet go as a load at its acquire issues them, between each other in its
 * forward's order (mlo_stream_start, progressive.c).  No ring, no tensor
 * placed: B's own plan's offsets are A's. */
static bool plan_mirror(struct mlo_join *j, const struct range *r, size_t nr) {
  mlo_component *b = j->to;
  j->runs = mlo_calloc(b->nblocks + 4, sizeof *j->runs); /* kept blocks, the head, its mark */
  if (!j->runs) return false;
  uint64_t src, len, dev;
  struct join_run head[3];
  size_t nhead = 0;
  long hdep = DEP_NONE; /* the last of A's blocks the head overwrites */
  for (long piece = MLO_BLOCK_PROLOGUE; piece >= MLO_BLOCK_EPILOGUE; piece--)
    if (mlo_prog_extent(b, piece, &src, &len, &dev) && len) {
      long d = dep_of(r, nr, dev, dev + len);
      head[nhead++] = (struct join_run){src, dev, len, d, MARK_NONE};
      if (d > hdep) hdep = d;
    }
  head[nhead++] = (struct join_run){0, 0, 0, hdep, MLO_BLOCK_PROLOGUE}; /* its event */
  /* the head first where A's forward frees its room (B into a block A
   * does not stream through: its acquire then waits for nothing) */
  bool first = hdep != DEP_END;
  if (first)
    for (size_t i = 0; i < nhead; i++) j->runs[j->nruns++] = head[i];
  j->kfirst = j->nruns;
  for (size_t k = 0; k < b->nblocks; k++) /* kept blocks, each behind its event */
    if (mlo_prog_extent(b, (long)k, &src, &len, &dev) && len)
      j->runs[j->nruns++] =
          (struct join_run){src, dev, len, dep_of(r, nr, dev, dev + len), (long)k};
  j->klast = j->nruns;
  if (!first)
    for (size_t i = 0; i < nhead; i++) j->runs[j->nruns++] = head[i];
  return true;
}

static void join_free(struct mlo_join *j) {
  if (!j) return;
  mlo_plat_event_destroy(mlo_dev_plat(j->from), j->point);
  mlo_plat_event_destroy(mlo_dev_plat(j->from), j->tail);
  free(j->runs);
  free(j->ended);
  free(j);
}

/* b: a slab of its own, moved whole into a block; or, both streaming, its
 * plan's kept blocks and head, piece over piece. */
bool mlo_join_can_take(const mlo_component *b) {
  return !mlo_res_is_resident(b) && b->materialized && b->slab && !b->on_disk && !b->partial &&
         !b->has_mutable && b->block_bytes == b->slab_bytes && b->slab_bytes;
}

bool mlo_join_start(mlo_component *a, mlo_component *b) {
  mlo_pipeline *pipe = a->pipe;
  const mlo_offload_settings *s = &pipe->settings;
  if (a->join || b->join || a == b || a->dev != b->dev || pipe->sharded || s->copy_back ||
      s->per_tensor_copies || mlo_dev_plat(a)->caps.max_block_bytes)
    return false;
  /* a: resident in one block of its own layout (or its streamed plan's),
   * held by its forward alone, nothing to write back at its end; with
   * blocks, declared progressive (its forward reads a block only between
   * its begin and end: a streamed one's kept blocks otherwise have an
   * address all along).  Without blocks, all it has is read until its
   * release: B goes beside it first, over it only then. */
  if (!mlo_res_is_resident(a) || !a->block || a->users != 1 || mlo_disk_pending(a) ||
      a->has_mutable || (a->nblocks && !a->progressive))
    return false;
  if (!mlo_join_can_take(b)) return false;
  /* b streaming: its plan's pieces at their offsets, over a's of the same
   * layout (two experts) or into a block it fits (a mirror either way) */
  uint64_t room = a->alloc_bytes; /* whole alignment units, as every block (slab.c) */
  /* (into a plain block: exactly the one the budget counts for a, since b
   * is counted as its footprint from the hand-over) */
  bool mirror = b->stream != NULL;
  if (mirror &&
      (a->stream ? !mlo_stream_same_layout(a, b)
                 : mlo_stream_footprint(b) != mlo_res_bytes(a) || mlo_stream_footprint(b) > room))
    return false;
  if (!mirror && b->slab_bytes > room) return false;
  struct mlo_join *j = mlo_calloc(1, sizeof *j);
  if (!j) return false;
  j->from = a;
  j->to = b;
  j->mirror = mirror;
  j->paced = a->stream != NULL; /* its copies share the link with a's refills */
  j->prog = mlo_prog_applies(b) && b->nblocks;
  size_t nr = 0;
  struct range *r = a_ranges(a, &nr);
  struct vmap vm = {0};
  struct ring rg = {0};
  if (r && !mirror) {
    vm = vmap_of(b);
    rg = ring_of(b, &vm, ring_start(a, r, nr), room);
  }
  bool ok = r && (j->ended = mlo_calloc(a->nblocks ? a->nblocks : 1, sizeof *j->ended)) &&
            (mirror ? plan_mirror(j, r, nr) : plan_runs(j, &vm, &rg, r, nr));
  free(r);
  /* without blocks, a frees nothing before its release: joined only where
   * its block has room beside it that b goes into now */
  bool early = a->nblocks;
  for (size_t i = 0; ok && i < j->nruns && !early; i++)
    early = j->runs[i].len && j->runs[i].dep == DEP_NONE;
  ok = ok && early && !(j->prog && mlo_prog_join_prepare(b)) &&
       !PCALL(b, mlo_plat_event_create(mlo_dev_plat(b), &j->point));
  if (!ok) {
    join_free(j);
    return false;
  }
  a->join = b->join = j;
  mlo_res_join_began(b);
  return true;
}

mlo_component *mlo_join_source(const mlo_component *c) {
  return c->join->from;
}

mlo_component *mlo_join_target(const mlo_component *c) {
  return c->join->to;
}

/* A copy goes over a block only once it and every block before it ended
 * (ready()), so what may be overwritten is what has ended. */
bool mlo_join_gone(const mlo_component *a, long block) {
  const struct mlo_join *j = a->join;
  /* a streamed block's slots take nothing of B's before A's release: it may
   * run again, loaded on demand as ever */
  return j && j->from == a && block >= 0 && (size_t)block < a->nblocks && j->ended[block] &&
         !mlo_stream_block_streams(a, (size_t)block);
}

/* Nothing more goes: b loads on demand; a keeps its spent state until its
 * release evicts it. */
static void fail(struct mlo_join *j, int rc) {
  mlo_component *b = j->to;
  mlo_logf(MLO_LOG_DEBUG, "joined switch %s -> %s ended early (%s): %s loads on demand",
           j->from->name, b->name, mlo_strerror(rc), b->name);
  j->failed = true;
  b->stats.h2d_bytes += j->moved; /* the copies made crossed the link all the same */
  b->stats.copy_calls += j->copies;
  if (j->prog) mlo_prog_evicted(b);
  if (b->join == j) {
    b->join = NULL;
    mlo_res_trace(b, MLO_TRACE_EVICT, 0); /* the load its start traced ends, nothing placed */
  }
}

static bool ready(const struct mlo_join *j, const struct join_run *r) {
  return r->dep == DEP_NONE || (r->dep != DEP_END && r->dep < (long)j->done);
}

/* A mirror join's copies share the copy queue, FIFO, with A's own slots'
 * refills, which A's forward waits for: one of B's pieces goes at a block
 * end only once B's last one has landed and at most one refill of A's is
 * still in flight, so a refill waits behind one of B's blocks at most, and
 * only while the link keeps up.  On a link busy with A's streaming few go,
 * and the rest are B's own load's to issue at A's release.  (Waiting for
 * an idle queue instead let 4 of the 40-block Wan2.2 DiT's 21 kept blocks
 * through at a link as fast as compute; this, 18, A's stall unchanged.) */
static bool link_has_room(struct mlo_join *j) {
  mlo_platform *p = mlo_dev_plat(j->from);
  if (!p->caps.events) return false; /* a query would synchronize: all at the release */
  return mlo_stream_copies_pending(j->from) <= 1 &&
         (!j->tail_set || mlo_plat_event_query(p, j->tail) == MLO_OK);
}

/* Orders what the copy queue takes next after A's compute so far (C9). */
static int fence(struct mlo_join *j) {
  mlo_platform *p = mlo_dev_plat(j->from);
  int rc = PCALL(j->to, mlo_plat_event_record_compute(p, j->point));
  return rc ? rc : PCALL(j->to, mlo_plat_copy_wait(p, j->point));
}

/* Copies runs [next, k) behind a fence, each mark's event after its run. */
static int copy_runs(struct mlo_join *j, size_t k) {
  mlo_component *a = j->from, *b = j->to;
  mlo_platform *p = mlo_dev_plat(a);
  int rc = fence(j);
  for (; j->next < k && !rc; j->next++) {
    const struct join_run *r = &j->runs[j->next];
    if (r->len) {
      rc = PCALL(b, mlo_plat_copy_h2d(p, a->block, (size_t)r->dst, (char *)b->slab + r->src,
                                      (size_t)r->len));
      if (rc) break;
      j->copies++;
      j->moved += r->len;
    }
    if (r->mark != MARK_NONE) rc = mlo_prog_join_mark(b, r->mark);
  }
  return rc;
}

/* Issues the runs that may go now, in order. */
static int issue(struct mlo_join *j) {
  size_t k = j->next;
  if (j->paced) { /* one piece, where the link has room */
    if (!link_has_room(j)) return MLO_OK;
    while (k < j->nruns && ready(j, &j->runs[k]))
      if (j->runs[k++].mark != MARK_NONE) break;
  } else {
    while (k < j->nruns && ready(j, &j->runs[k])) k++;
  }
  if (k == j->next) return MLO_OK;
  int rc = copy_runs(j, k);
  if (!rc && j->paced) {
    mlo_platform *p = mlo_dev_plat(j->from);
    if (!j->tail) rc = PCALL(j->to, mlo_plat_event_create(p, &j->tail));
    if (!rc) rc = PCALL(j->to, mlo_plat_event_record_copy(p, j->tail));
    j->tail_set = !rc;
  }
  return rc;
}

/* Issues every run up to end whatever A has ended: its compute is all
 * queued (its release). */
static int issue_all(struct mlo_join *j, size_t end) {
  return end > j->next ? copy_runs(j, end) : MLO_OK;
}

/* A mirror join at A's release: B's kept blocks not copied yet stay B's
 * load's to issue (from the first of them), its head goes now.  Always
 * after A's compute: B's own load copies into A's memory next. */
static int release_mirror(struct mlo_join *j) {
  size_t k = j->next > j->kfirst ? j->next : j->kfirst;
  size_t from = k < j->klast ? (size_t)j->runs[k].mark : j->to->nblocks;
  int rc = issue_all(j, j->kfirst); /* the head first: what of it is left */
  if (!rc) {
    if (j->next < j->klast) j->next = j->klast; /* the kept blocks left are B's load's */
    rc = j->next < j->nruns ? issue_all(j, j->nruns) : fence(j);
  }
  if (!rc) mlo_prog_join_defer(j->to, from);
  return rc;
}

void mlo_join_block_ended(mlo_component *a, size_t block) {
  struct mlo_join *j = a->join;
  if (!j || j->from != a || j->failed || block >= a->nblocks) return;
  j->ended[block] = true;
  while (j->done < a->nblocks && j->ended[j->done]) j->done++;
  int rc = issue(j);
  if (rc) fail(j, rc);
}

void mlo_join_kick(mlo_component *a) {
  struct mlo_join *j = a->join;
  if (!j || j->from != a || j->failed) return;
  int rc = issue(j);
  if (rc) fail(j, rc);
}

void mlo_join_released(mlo_component *a) {
  struct mlo_join *j = a->join;
  if (!j || j->from != a) return;
  mlo_component *b = j->to;
  if (!j->failed) {
    int rc = j->mirror ? release_mirror(j) : issue_all(j, j->nruns);
    if (!rc && j->prog) mlo_prog_join_activate(b);
    if (!rc) /* nothing changed if it fails */
      rc = mlo_res_hand_over(a, b, j->copies, j->moved, !j->mirror);
    if (!rc && j->mirror) mlo_stream_start(b); /* its first fills, kept blocks between */
    if (rc) fail(j, rc);
  }
  if (b->join == j) b->join = NULL;
  a->join = NULL;
  /* spent: what a would read may be b's bytes now (freed after the copies) */
  if (j->failed && mlo_res_is_resident(a) && mlo_res_evict(a)) mlo_res_drop(a);
  join_free(j);
}

void mlo_join_drop(mlo_component *a) {
  struct mlo_join *j = a->join;
  if (!j || j->from != a) return;
  if (!j->failed) fail(j, MLO_ESTATE);
  a->join = NULL;
  join_free(j);
}
