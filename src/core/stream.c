/*
 * stream.c — block streaming: a component larger than its room on the
 * device runs with part of its blocks resident and the rest passed through
 * a few device buffers ("slots"), each block's copy issued on the copy
 * queue while the blocks before it compute (docs/streaming.md).
 *
 * A streamed component's device block (its footprint) is laid out as
 *
 *   [prologue][resident blocks...][epilogue][external tensors][slot 0]...[slot n-1]
 *
 * and a load copies the resident part block by block (progressive.c, at
 * the offsets mlo_stream_piece_offset gives) and then fills the slots with
 * the first streamed blocks.  The caller's forward says where it is with
 * mlo_block_begin/mlo_block_end; the rules are the component's (C8, C9):
 *
 *  - begin waits, on the compute queue, for the event recorded after the
 *    block's copy into its slot (C8);
 *  - end records an event on the compute queue; the copy that next reuses
 *    the slot waits for it on the copy queue first, so a slot is never
 *    overwritten while compute still reads it (C9);
 *  - eviction frees the whole footprint stream-ordered, as for any
 *    component, so nothing is freed under a running copy.
 *
 * At each end the slot just freed takes the next streamed block in the
 * order the forward runs them; after the last one it takes the first of
 * the next forward when the declared schedule calls this component again
 * next (or no schedule is declared), so a DiT step's first blocks land
 * while the previous step's last blocks compute.  A begin for a block not
 * in a slot (blocks run out of order) loads it on demand into the slot
 * needed last.
 *
 * Every function runs with the pipeline lock held, except where begin
 * waits, which drops it (the slot is marked in use first, so nothing
 * reuses it meanwhile).
 */
#include "base/sysio.h"
#include "core/internal.h"
#include "core/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAMED UINT64_MAX /* dev_off of a block that is not resident */

struct stream_slot {
  uint64_t dev_off;
  long blk;           /* the block it holds or is loading; -1: none */
  int users;          /* begins not ended: several threads may run one block */
  pthread_t *holders; /* the thread of each (users entries) */
  size_t hcap;
  bool waited;      /* compute has waited for its load already */
  bool has_free_ev; /* free_ev recorded since the slot was last filled */
  mlo_event *load_ev, *free_ev;
};

struct mlo_stream {
  uint64_t room;       /* the budget it was planned for */
  uint64_t footprint;  /* device bytes while resident */
  uint64_t resident;   /* of which the resident part (copied at load) */
  uint64_t slot_bytes; /* each slot: the largest streamed block, aligned */
  uint64_t pro_dev, epi_dev, ext_dev, ext_start;
  uint64_t *dev_off; /* per block: where it is resident, or STREAMED */
  size_t *order;     /* the streamed blocks in the order they run */
  size_t *pos;       /* per block: its place in order (streamed ones) */
  size_t nstreamed, nresident;
  uint64_t streamed_bytes; /* moved per forward */
  struct stream_slot *slots;
  size_t nslots;
  size_t next; /* the place in order of the next block to issue */
};

static uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

uint64_t mlo_stream_room(const mlo_component *c) {
  return c->stream ? c->stream->room : 0;
}

/* Whether block b passes through the slots (c has a plan, b is not kept). */
static bool block_streams(const mlo_component *c, size_t b) {
  return c->stream && c->stream->dev_off[b] == STREAMED;
}

bool mlo_stream_block_streams(const mlo_component *c, size_t b) {
  return block_streams(c, b);
}

uint64_t mlo_stream_resident_bytes(const mlo_component *c) {
  uint64_t n = c->pro.bytes + c->epi.bytes;
  for (size_t b = 0; b < c->nblocks; b++) n += block_streams(c, b) ? 0 : c->spans[b].bytes;
  return n;
}

bool mlo_stream_streams(const mlo_component *c, const mlo_tensor *t) {
  return t->block >= 0 && block_streams(c, (size_t)t->block);
}

uint64_t mlo_stream_footprint(const mlo_component *c) {
  return c->stream ? c->stream->footprint : 0;
}

uint64_t mlo_res_bytes(const mlo_component *c) {
  if (c->placed) return c->placed_bytes; /* the block a joined switch handed it, whole */
  return c->stream ? c->stream->footprint : c->block_bytes;
}

void mlo_stream_drop(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  if (!st) return;
  for (size_t i = 0; i < st->nslots; i++) {
    mlo_plat_event_destroy(c->pipe->platform, st->slots[i].load_ev);
    mlo_plat_event_destroy(c->pipe->platform, st->slots[i].free_ev);
    free(st->slots[i].holders);
  }
  free(st->slots);
  free(st->dev_off);
  free(st->order);
  free(st->pos);
  free(st);
  c->stream = NULL;
}

typedef struct {
  size_t b;
  uint64_t bytes; /* aligned */
} sized;

static int by_size_desc(const void *pa, const void *pb) {
  const sized *a = pa, *b = pb;
  if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
  return a->b < b->b ? -1 : a->b > b->b; /* the earlier block stays first */
}

/* What a plan chooses from: the fixed part (prologue, epilogue, external
 * tensors, and blocks with a mutable tensor, which must reach the host at
 * eviction from where they live: keep[] marks them), each aligned; the
 * other blocks largest first. */
typedef struct {
  mlo_layout lay;
  bool *keep;
  sized *by;
  size_t nfree;
  uint64_t fixed;
} shape;

static void shape_free(shape *sh) {
  mlo_layout_free(&sh->lay);
  free(sh->keep);
  free(sh->by);
}

/* Lock held; MLO_ENOMEM. */
static int shape_of(mlo_component *c, shape *sh) {
  memset(sh, 0, sizeof *sh);
  uint64_t a = c->pipe->alignment;
  int rc = mlo_slab_layout(c, false, true, &sh->lay); /* sorts c->scratch: pieces known */
  if (rc) return rc;
  size_t nb = sh->lay.nblocks;
  sh->keep = mlo_calloc(nb ? nb : 1, sizeof *sh->keep);
  sh->by = mlo_calloc(nb ? nb : 1, sizeof *sh->by);
  if (!sh->keep || !sh->by) {
    shape_free(sh);
    return MLO_ENOMEM;
  }
  for (size_t i = 0; i < sh->lay.norder; i++)
    if (c->scratch[i].piece >= 0 && (c->scratch[i].t->flags & MLO_TENSOR_MUTABLE))
      sh->keep[c->scratch[i].piece] = true;
  uint64_t ext_start = align_up(sh->lay.slab_bytes, a);
  uint64_t ext = sh->lay.block_bytes > ext_start ? sh->lay.block_bytes - ext_start : 0;
  sh->fixed = align_up(sh->lay.pro.bytes, a) + align_up(sh->lay.epi.bytes, a) + align_up(ext, a);
  for (size_t b = 0; b < nb; b++) {
    uint64_t bytes = align_up(sh->lay.spans[b].bytes, a);
    if (sh->keep[b])
      sh->fixed += bytes;
    else
      sh->by[sh->nfree++] = (sized){b, bytes};
  }
  qsort(sh->by, sh->nfree, sizeof *sh->by, by_size_desc);
  return MLO_OK;
}

/* The most blocks kept (the first r of by) with the footprint within
 * room, more streamed than slots; SIZE_MAX if none.  *least: the least
 * footprint of any r (UINT64_MAX: the component cannot stream).  Every r
 * is tried: each block kept saves its bytes at every forward, and the
 * slots shrink to the largest block still streamed, so the footprint is
 * not monotonic in r. */
static size_t choose(const shape *sh, size_t nslots, uint64_t room, uint64_t *least) {
  size_t best = SIZE_MAX;
  uint64_t kept = 0;
  *least = UINT64_MAX;
  for (size_t r = 0; r + nslots < sh->nfree; r++) {
    uint64_t total = sh->fixed + kept + (uint64_t)nslots * sh->by[r].bytes;
    if (total < *least) *least = total;
    if (total <= room) best = r;
    kept += sh->by[r].bytes;
  }
  return best;
}

/* Which of the blocks as large as a slot stream.  choose() fixes how many
 * (the first best of by[] stay), and any that many serve alike: the same
 * bytes move per forward, into the same footprint.  What differs is when
 * the link can move them.  Streamed blocks bunched together (the last ones
 * of a DiT, say) leave the link idle while the kept blocks before them
 * compute, since only the slots can be filled ahead, and then make the
 * compute wait for one copy after another; spread evenly over the forward,
 * each streamed block's copy has the kept blocks' compute before it to
 * land in, so the copies run end to end while compute runs.  by[] lists
 * blocks of one size in the order the forward runs them. */
static void spread(shape *sh, size_t best) {
  size_t g0 = best, g1 = best;
  uint64_t size = sh->by[best].bytes;
  while (g0 > 0 && sh->by[g0 - 1].bytes == size) g0--;
  while (g1 < sh->nfree && sh->by[g1].bytes == size) g1++;
  size_t n = g1 - g0, s = g1 - best; /* s of these n stream: n >= s >= 1 */
  for (size_t i = g0; i < g1; i++) sh->keep[sh->by[i].b] = true;
  for (size_t k = 0; k < s; k++) /* the k-th at the middle of the k-th of s equal parts */
    sh->keep[sh->by[g0 + (2 * k + 1) * n / (2 * s)].b] = false;
}

/* keep[] once the plan keeps the first best of by[], spread. */
static void keep_best(shape *sh, size_t best) {
  for (size_t r = 0; r < best; r++) sh->keep[sh->by[r].b] = true;
  spread(sh, best);
}

/* The footprint's offsets once the blocks in keep[] stay: returns where
 * the slots start. */
static uint64_t place_resident(const mlo_component *c, struct mlo_stream *st, const bool *keep) {
  uint64_t a = c->pipe->alignment, at = 0;
  st->pro_dev = 0;
  at = align_up(c->pro.bytes, a);
  for (size_t b = 0; b < c->nblocks; b++) {
    st->dev_off[b] = keep[b] ? at : STREAMED;
    if (keep[b]) at = align_up(at + c->spans[b].bytes, a);
  }
  st->epi_dev = at;
  at = align_up(at + c->epi.bytes, a);
  st->ext_dev = at;
  at = align_up(at + (c->block_bytes - st->ext_start), a);
  return at;
}

uint64_t mlo_stream_streamed_bytes(mlo_component *c, uint64_t room, size_t nslots) {
  shape sh;
  if (shape_of(c, &sh) != MLO_OK) return UINT64_MAX;
  uint64_t least, bytes = UINT64_MAX;
  size_t best = choose(&sh, nslots, room, &least);
  if (best != SIZE_MAX) { /* the blocks the plan streams: keep_best's choice */
    keep_best(&sh, best);
    bytes = 0;
    for (size_t b = 0; b < sh.lay.nblocks; b++) bytes += sh.keep[b] ? 0 : sh.lay.spans[b].bytes;
  }
  shape_free(&sh);
  return bytes;
}

uint64_t mlo_component_streamed_bytes(mlo_component *c, uint64_t room) {
  if (!c) return 0;
  MLO_LOCK_OR(&c->pipe->lock, 0);
  mlo_layout lay;
  mlo_slab_layout(c, false, false, &lay);
  uint64_t bytes =
      lay.block_bytes <= room ? 0 : mlo_stream_streamed_bytes(c, room, MLO_STREAM_SLOTS);
  pthread_mutex_unlock(&c->pipe->lock);
  return bytes;
}

uint64_t mlo_component_stream_least(mlo_component *c) {
  if (!c) return 0;
  MLO_LOCK_OR(&c->pipe->lock, 0);
  shape sh;
  uint64_t whole = c->materialized ? c->block_bytes : 0, least = UINT64_MAX;
  if (shape_of(c, &sh) == MLO_OK) {
    whole = sh.lay.block_bytes;
    choose(&sh, MLO_STREAM_SLOTS, 0, &least);
    shape_free(&sh);
  } else if (!whole) {
    whole = c->bytes_bound; /* out of memory: a bound, never less */
  }
  pthread_mutex_unlock(&c->pipe->lock);
  return least < whole ? least : whole;
}

int mlo_stream_plan(mlo_component *c, uint64_t room, size_t nslots) {
  mlo_pipeline *pipe = c->pipe;
  char x[32], y[32];
  if (mlo_res_is_resident(c))
    return mlo_fail(pipe, MLO_ESTATE, "'%s' is resident: its plan cannot change", c->name);
  mlo_stream_drop(c);
  if (nslots < 1) nslots = 1;
  if (!c->materialized) return mlo_fail(pipe, MLO_ESTATE, "%s: not materialized", c->name);
  const char *why = NULL;
  if (c->nblocks <= nslots)
    why = c->nblocks ? "it has too few blocks to stream" : "no blocks were found in it";
  else if (pipe->platform->caps.max_block_bytes)
    why = "this device builds blocks from segments, and streaming needs whole ones";
  else if (pipe->sharded && (c->on_disk || c->partial || c->want_disk))
    /* its reads from files would be every rank's: the disk tier shards */
    why = "sharded loads read a component on disk whole, in slices";
  else if (pipe->settings.copy_back || pipe->settings.per_tensor_copies)
    why = "copy_back and per_tensor_copies move whole components";
  if (why)
    return mlo_fail(pipe, MLO_ENOMEM_DEVICE,
                    "a budget of %s cannot hold '%s' (%s), and it cannot stream: %s",
                    mlo_format_size(room, y, sizeof y), c->name,
                    mlo_format_size(c->block_bytes, x, sizeof x), why);
  shape sh;
  struct mlo_stream *st = NULL;
  if (shape_of(c, &sh) != MLO_OK)
    return mlo_fail(pipe, MLO_ENOMEM, "out of host memory planning '%s'", c->name);
  if ((st = mlo_calloc(1, sizeof *st))) {
    st->dev_off = mlo_calloc(c->nblocks, sizeof *st->dev_off);
    st->order = mlo_calloc(c->nblocks, sizeof *st->order);
    st->pos = mlo_calloc(c->nblocks, sizeof *st->pos);
    st->slots = mlo_calloc(nslots, sizeof *st->slots);
  }
  if (!st || !st->dev_off || !st->order || !st->pos || !st->slots) {
    shape_free(&sh);
    c->stream = st;
    mlo_stream_drop(c);
    return mlo_fail(pipe, MLO_ENOMEM, "out of host memory planning '%s'", c->name);
  }
  uint64_t least;
  size_t best = choose(&sh, nslots, room, &least);
  if (best == SIZE_MAX) {
    shape_free(&sh);
    c->stream = st;
    mlo_stream_drop(c);
    if (least == UINT64_MAX)
      return mlo_fail(pipe, MLO_ENOMEM_DEVICE,
                      "a budget of %s cannot hold '%s' (%s), and it cannot stream: too few of "
                      "its blocks are free of mutable tensors",
                      mlo_format_size(room, y, sizeof y), c->name,
                      mlo_format_size(c->block_bytes, x, sizeof x));
    char z[32];
    return mlo_fail(pipe, MLO_ENOMEM_DEVICE,
                    "a budget of %s cannot hold '%s' (%s), and streaming it needs at least %s "
                    "(its prologue, epilogue and %zu slots of its largest block)",
                    mlo_format_size(room, y, sizeof y), c->name,
                    mlo_format_size(c->block_bytes, x, sizeof x),
                    mlo_format_size(least, z, sizeof z), nslots);
  }
  keep_best(&sh, best);
  st->ext_start = align_up(c->slab_bytes, pipe->alignment);
  if (st->ext_start > c->block_bytes) st->ext_start = c->block_bytes;
  uint64_t slots_at = place_resident(c, st, sh.keep);
  st->slot_bytes = sh.by[best].bytes;
  st->nslots = nslots;
  st->resident = slots_at;
  st->footprint = slots_at + (uint64_t)nslots * st->slot_bytes;
  for (size_t b = 0; b < c->nblocks; b++) {
    if (!sh.keep[b]) {
      st->pos[b] = st->nstreamed;
      st->order[st->nstreamed++] = b;
      st->streamed_bytes += c->spans[b].bytes;
    } else {
      st->nresident++;
    }
  }
  for (size_t i = 0; i < nslots; i++)
    st->slots[i] = (struct stream_slot){.dev_off = slots_at + i * st->slot_bytes, .blk = -1};
  shape_free(&sh);
  st->room = room;
  c->stream = st;
  char z[32];
  mlo_logf(MLO_LOG_INFO,
           "%s streams: %zu of %zu blocks resident, %zu through %zu slots of %s (%s on the "
           "device, %s moved per forward)",
           c->name, st->nresident, c->nblocks, st->nstreamed, nslots,
           mlo_format_size(st->slot_bytes, x, sizeof x),
           mlo_format_size(st->footprint, y, sizeof y),
           mlo_format_size(st->streamed_bytes, z, sizeof z));
  return MLO_OK;
}

/* ---- the joined switch's view (join.c) ---------------------------------- */

bool mlo_stream_same_layout(const mlo_component *a, const mlo_component *b) {
  const struct mlo_stream *x = a->stream, *y = b->stream;
  if (!x || !y || x->footprint != y->footprint || a->nblocks != b->nblocks ||
      x->nslots != y->nslots || x->slot_bytes != y->slot_bytes || x->pro_dev != y->pro_dev ||
      x->epi_dev != y->epi_dev || x->ext_dev != y->ext_dev || x->nstreamed != y->nstreamed)
    return false;
  for (size_t i = 0; i < x->nslots; i++)
    if (x->slots[i].dev_off != y->slots[i].dev_off) return false;
  for (size_t k = 0; k < a->nblocks; k++)
    if (x->dev_off[k] != y->dev_off[k]) return false;
  return true; /* every piece at one offset, each region as large (place_resident) */
}

struct mlo_stream_region *mlo_stream_regions(const mlo_component *a, size_t *count) {
  const struct mlo_stream *st = a->stream;
  struct mlo_stream_region *out = mlo_calloc(3 + a->nblocks + st->nslots, sizeof *out);
  if (!out) return NULL;
  size_t n = 0;
  long last = st->nstreamed ? (long)st->order[st->nstreamed - 1] : -1;
  /* the head: read until the release */
  out[n++] = (struct mlo_stream_region){st->pro_dev, st->pro_dev + a->pro.bytes, -2};
  out[n++] = (struct mlo_stream_region){st->epi_dev, st->epi_dev + a->epi.bytes, -2};
  out[n++] =
      (struct mlo_stream_region){st->ext_dev, st->ext_dev + (a->block_bytes - st->ext_start), -2};
  for (size_t k = 0; k < a->nblocks; k++) /* a kept block: free once it ended */
    if (st->dev_off[k] != STREAMED)
      out[n++] =
          (struct mlo_stream_region){st->dev_off[k], st->dev_off[k] + a->spans[k].bytes, (long)k};
  for (size_t i = 0; i < st->nslots; i++) /* a slot: once the last streamed block ended */
    out[n++] = (struct mlo_stream_region){st->slots[i].dev_off,
                                          st->slots[i].dev_off + st->slot_bytes, last};
  *count = n;
  return out;
}

size_t mlo_stream_copies_pending(const mlo_component *a) {
  const struct mlo_stream *st = a->stream;
  size_t n = 0;
  for (size_t i = 0; i < st->nslots; i++) {
    const struct stream_slot *s = &st->slots[i];
    if (s->blk >= 0 && s->load_ev && mlo_plat_event_query(a->pipe->platform, s->load_ev) != MLO_OK)
      n++;
  }
  return n;
}

/* ---- loads ------------------------------------------------------------- */

bool mlo_stream_piece_offset(const mlo_component *c, long b, uint64_t *off) {
  const struct mlo_stream *st = c->stream;
  if (b == MLO_BLOCK_PROLOGUE)
    *off = st->pro_dev;
  else if (b == MLO_BLOCK_EPILOGUE)
    *off = st->epi_dev;
  else if (st->dev_off[b] != STREAMED)
    *off = st->dev_off[b];
  else
    return false;
  return true;
}

/* Copies block b into slot s on the copy queue, after the compute that
 * last read the slot (C9), and records the slot's load event (C8). */
static int issue(mlo_component *c, struct stream_slot *s, size_t b) {
  mlo_platform *p = c->pipe->platform;
  int rc = MLO_OK;
  s->blk = -1;
  if (!s->load_ev) rc = PCALL(c, mlo_plat_event_create(p, &s->load_ev));
  if (!rc && s->has_free_ev) rc = PCALL(c, mlo_plat_copy_wait(p, s->free_ev));
  if (!rc) s->has_free_ev = false;
  uint64_t len = c->spans[b].bytes;
  if (!rc && len) {
    rc = PCALL(c, mlo_plat_copy_h2d(p, c->block, (size_t)s->dev_off,
                                    (char *)c->slab + c->spans[b].off, (size_t)len));
    if (!rc) { /* counted once queued: it crosses the link even if its event fails */
      c->stats.h2d_bytes += len;
      c->stats.copy_calls++;
    }
  }
  if (!rc) rc = PCALL(c, mlo_plat_event_record_copy(p, s->load_ev));
  if (rc) return rc;
  s->blk = (long)b;
  s->waited = false;
  c->stats.block_loads++;
  mlo_res_trace(c, MLO_TRACE_BLOCK_LOAD, len);
  return MLO_OK;
}

static struct stream_slot *slot_of(struct mlo_stream *st, size_t b) {
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].blk == (long)b) return &st->slots[i];
  return NULL;
}

/* Issues the next streamed block into slot s if it is due: not in a slot
 * already, and (past the last block) only when this component is what the
 * schedule calls next.  A failure leaves the slot empty: the block's begin
 * loads it on demand and reports the error there. */
static void refill(mlo_component *c, struct stream_slot *s, size_t after_pos) {
  struct mlo_stream *st = c->stream;
  mlo_pipeline *pipe = c->pipe;
  size_t q = st->order[st->next];
  /* the kept blocks the forward runs before q (the rest of this forward's
   * where q is the next one's) go first; a failure is their begin's */
  if (mlo_prog_issue_upto(c, st->next <= after_pos ? c->nblocks : q))
    mlo_logf(MLO_LOG_DEBUG, "%s: kept blocks before %zu not issued: %s", c->name, q, pipe->errmsg);
  if (slot_of(st, q)) return;
  if (st->next <= after_pos && pipe->nsched && mlo_sched_next_use(pipe, c) != 0) return;
  if (issue(c, s, q) != MLO_OK) {
    mlo_logf(MLO_LOG_DEBUG, "%s: block %zu not issued ahead: %s", c->name, q, pipe->errmsg);
    s->blk = -1;
    return;
  }
  st->next = (st->next + 1) % st->nstreamed;
}

/* Empty slots: after a load allocated them, or an eviction freed them. */
static void reset_slots(struct mlo_stream *st) {
  for (size_t i = 0; i < st->nslots; i++) {
    struct stream_slot *s = &st->slots[i];
    s->blk = -1;
    s->users = 0;
    s->waited = s->has_free_ev = false;
  }
  st->next = 0;
}

size_t mlo_stream_load_limit(const mlo_component *c) {
  return c->stream && c->stream->nstreamed ? c->stream->order[0] : c->nblocks;
}

/* The slots' first fills, each after the kept blocks the forward runs
 * before it; then the kept blocks up to the first streamed block no slot
 * holds (a load block by block; a whole load has issued them all). */
void mlo_stream_start(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  size_t i = 0;
  reset_slots(st);
  for (; i < st->nslots && i < st->nstreamed; i++) {
    mlo_prog_issue_upto(c, st->order[i]); /* a failure is the block's begin's */
    if (issue(c, &st->slots[i], st->order[i]) != MLO_OK) break; /* on demand, then */
    st->next = (i + 1) % st->nstreamed;
  }
  mlo_prog_issue_upto(c, i < st->nstreamed ? st->order[i] : c->nblocks);
}

void mlo_stream_acquired(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  if (!st || c->users != 1 || !mlo_res_is_resident(c)) return;
  /* a forward starts at the first streamed blocks: those are what the
   * slots should hold now (they do where the last forward ran on into
   * this one, or the load just filled them) */
  size_t want = st->nslots < st->nstreamed ? st->nslots : st->nstreamed;
  for (size_t k = 0; k < want; k++) {
    size_t b = st->order[k];
    if (slot_of(st, b)) continue;
    struct stream_slot *s = NULL;
    for (size_t i = 0; i < st->nslots && !s; i++)
      if (!st->slots[i].users && (st->slots[i].blk < 0 || st->pos[st->slots[i].blk] >= want))
        s = &st->slots[i];
    if (!s || issue(c, s, b) != MLO_OK) break; /* on demand, then */
  }
  st->next = want % st->nstreamed;
}

void mlo_stream_evicted(mlo_component *c) {
  if (c->stream) reset_slots(c->stream);
}

/* Records the end of the compute that read slot s (C9): the next copy
 * into it waits for this event. */
static int record_free(mlo_component *c, struct stream_slot *s) {
  mlo_platform *p = c->pipe->platform;
  int rc = s->free_ev ? MLO_OK : PCALL(c, mlo_plat_event_create(p, &s->free_ev));
  if (!rc) rc = PCALL(c, mlo_plat_event_record_compute(p, s->free_ev));
  if (!rc) s->has_free_ev = true;
  return rc;
}

/* Ends slot s's begins by this thread (all of them with all_threads):
 * the compute that read it ends here. */
static void end_left(mlo_component *c, struct stream_slot *s, bool all_threads) {
  pthread_t self = pthread_self();
  int left = s->users;
  for (int k = s->users - 1; k >= 0; k--)
    if (all_threads || pthread_equal(s->holders[k], self)) s->holders[k] = s->holders[--s->users];
  if (s->users == left) return;
  mlo_logf(MLO_LOG_WARN, "%s: block %ld was begun and never ended; ended at the release", c->name,
           s->blk);
  if (!s->users && record_free(c, s) != MLO_OK) { /* no event: order it the blunt way */
    c->stats.platform_calls++;
    mlo_plat_synchronize(c->pipe->platform);
  }
}

void mlo_stream_released(mlo_component *c, bool last) {
  struct mlo_stream *st = c->stream;
  if (!st || !mlo_res_is_resident(c)) return;
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].users) end_left(c, &st->slots[i], last);
  pthread_cond_broadcast(&c->pipe->idle); /* a thread may wait for a slot */
}

int mlo_stream_audit(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  if (!st || c->users) return MLO_OK;
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].users)
      return mlo_fail(c->pipe, MLO_ESTATE, "audit: block %ld of '%s' is begun with no holder",
                      st->slots[i].blk, c->name);
  return MLO_OK;
}

int mlo_stream_tensor_offset(const mlo_component *c, const mlo_tensor *t, uint64_t *off) {
  const struct mlo_stream *st = c->stream;
  if (!t->nbytes) { /* no bytes: laid out at 0, as in a whole block */
    *off = 0;
    return MLO_OK;
  }
  if (t->flags & MLO_TENSOR_EXTERNAL) {
    *off = st->ext_dev + t->dev_offset - st->ext_start;
    return MLO_OK;
  }
  if (t->block == MLO_BLOCK_PROLOGUE) {
    *off = st->pro_dev + t->dev_offset - c->pro.off;
    return MLO_OK;
  }
  if (t->block == MLO_BLOCK_EPILOGUE) {
    *off = st->epi_dev + t->dev_offset - c->epi.off;
    return MLO_OK;
  }
  size_t b = (size_t)t->block;
  if (st->dev_off[b] != STREAMED) {
    *off = st->dev_off[b] + t->dev_offset - c->spans[b].off;
    return MLO_OK;
  }
  for (size_t i = 0; i < st->nslots; i++) {
    const struct stream_slot *s = &st->slots[i];
    if (s->blk == (long)b && s->users) {
      *off = s->dev_off + t->dev_offset - c->spans[b].off;
      return MLO_OK;
    }
  }
  return mlo_fail(c->pipe, MLO_ESTATE,
                  "tensor '%s' of '%s' is in block %zu, which streams: its device copy exists "
                  "only between mlo_block_begin and mlo_block_end",
                  t->name, c->name, b);
}

/* ---- the forward's side ------------------------------------------------ */

/* The slots' holders are lists as a component's are (guard.c). */
static bool holds_a_slot(const struct mlo_stream *st) {
  for (size_t i = 0; i < st->nslots; i++)
    if (mlo_holders_has(st->slots[i].holders, st->slots[i].users)) return true;
  return false;
}

/* The slot to load block b into on demand: a free one, else the one whose
 * block is needed last from b on. */
static struct stream_slot *victim(struct mlo_stream *st, size_t b) {
  struct stream_slot *best = NULL;
  size_t best_d = 0;
  for (size_t i = 0; i < st->nslots; i++) {
    struct stream_slot *s = &st->slots[i];
    if (s->users) continue;
    size_t d =
        s->blk < 0 ? SIZE_MAX : (st->pos[s->blk] + st->nstreamed - st->pos[b]) % st->nstreamed;
    if (!best || d > best_d) {
      best = s;
      best_d = d;
    }
  }
  return best;
}

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
  if (!rc && !block_streams(c, block)) rc = begin_kept(c, block);
  if (rc || !block_streams(c, block) || !mlo_res_is_resident(c)) { /* nothing to move */
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  struct mlo_stream *st = c->stream;
  struct stream_slot *s;
  for (;;) { /* the block's slot (shared with other threads running it), or one to load it in */
    if ((s = slot_of(st, block))) break;
    if ((s = victim(st, block))) { /* out of the order the slots were filled in: on demand */
      if ((rc = issue(c, s, block)))
        rc = mlo_fail(pipe, rc, "%s: loading block %zu failed (%s)", c->name, block,
                      mlo_strerror(rc));
      else
        st->next = (st->pos[block] + 1) % st->nstreamed; /* the forward's order from here */
      break;
    }
    /* Every slot holds a block begun elsewhere.  A thread that holds one
     * must not wait (two such threads would wait for each other); one that
     * holds none waits for an end, which every holder can reach. */
    if (holds_a_slot(st)) {
      rc = mlo_fail(pipe, MLO_EBUSY,
                    "block %zu of '%s': all %zu slots hold blocks begun and not ended, one of "
                    "them by this thread",
                    block, c->name, st->nslots);
      break;
    }
    pthread_cond_wait(&pipe->idle, &pipe->lock); /* c stays resident: this thread holds it */
  }
  if (!rc && (rc = mlo_holders_add(&s->holders, &s->hcap, &s->users)))
    rc = mlo_fail(pipe, rc, "out of host memory beginning block %zu of '%s'", block, c->name);
  if (rc) {
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  bool pending = !s->waited;
  mlo_event *ev = s->load_ev;
  mlo_sync_mode sync = pipe->enabled ? pipe->settings.sync : MLO_SYNC_EVENT;
  pthread_mutex_unlock(&pipe->lock);
  if (sync == MLO_SYNC_UNSAFE_NONE || (!pending && sync == MLO_SYNC_EVENT)) return MLO_OK;
  mlo_platform *p = pipe->platform;
  uint64_t t0 = mlo_plat_now(p);
  rc = mlo_res_compute_wait(p, ev, sync);
  uint64_t t1 = mlo_plat_now(p);
  pthread_mutex_lock(&pipe->lock);
  mlo_res_count_wait(c, t0, t1, true);
  c->stats.block_wait_ns += t1 - t0;
  if (!rc) s->waited = true;
  if (rc) { /* not begun after all: nothing of this thread's compute read the slot */
    mlo_holders_drop(s->holders, &s->users);
    if (!s->users) pthread_cond_broadcast(&pipe->idle);
    rc = mlo_fail(pipe, rc, "%s: waiting for block %zu failed", c->name, block);
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_block_end(mlo_component *c, size_t block) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = check_block(c, block, "end");
  if (!rc && !block_streams(c, block)) rc = end_kept(c, block);
  if (rc || !block_streams(c, block) || !mlo_res_is_resident(c)) { /* nothing to move */
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  struct mlo_stream *st = c->stream;
  struct stream_slot *s = slot_of(st, block);
  if (!s || !s->users) {
    rc = mlo_fail(pipe, MLO_ESTATE, "block %zu of '%s' ended without a begin", block, c->name);
  } else if (!mlo_holders_has(s->holders, s->users)) { /* its slot is another thread's */
    rc = mlo_fail(pipe, MLO_ESTATE,
                  "block %zu of '%s' ended on a thread that did not begin it (the thread that "
                  "began it still reads its slot)",
                  block, c->name);
  } else if (s->users > 1) {
    mlo_holders_drop(s->holders, &s->users); /* others still run it */
  } else if ((rc = record_free(c, s))) {     /* it stays begun: the release ends it */
    rc = mlo_fail(pipe, rc, "%s: recording the end of block %zu failed", c->name, block);
  } else {
    mlo_holders_drop(s->holders, &s->users);
    refill(c, s, st->pos[block]);
    pthread_cond_broadcast(&pipe->idle); /* a thread may wait for a slot */
    if (pipe->policy && pipe->policy->block_ended)
      pipe->policy->block_ended(pipe, c, block); /* the next component may join (join.c) */
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_component_stream_info(mlo_component *c, mlo_stream_info *out) {
  if (!c || !out) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  const struct mlo_stream *st = c->stream;
  size_t blocks = c->materialized ? c->nblocks : 0;
  *out = (mlo_stream_info){
      .size = sizeof *out,
      .blocks = blocks,
      .resident_blocks = st ? st->nresident : blocks,
      .streamed_blocks = st ? st->nstreamed : 0,
      .slots = st ? st->nslots : 0,
      .slot_bytes = st ? st->slot_bytes : 0,
      .device_bytes = mlo_res_bytes(c),
      .streamed_bytes = st ? st->streamed_bytes : 0,
      /* this residency's loads, or the next one's */
      .progressive = mlo_prog_active(c) || (c->materialized ? mlo_prog_applies(c) : c->progressive),
  };
  pthread_mutex_unlock(&c->pipe->lock);
  return MLO_OK;
}
