/*
 * stream_plan.c — the geometry of block streaming: which blocks of a
 * component stay resident within its room and which pass through slots,
 * where each piece sits in the footprint
 *
 *   [prologue][resident blocks...][epilogue][external tensors][slot 0]...[slot n-1]
 *
 * and the queries the other movers place their copies by (the progressive
 * load's offsets, the disk reader's, a joined switch's regions).  The
 * slots at run time are stream.c's (docs/streaming.md).
 *
 * Every function runs with the pipeline lock held.
 */
#include "core/stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    mlo_plat_event_destroy(mlo_dev_plat(c), st->slots[i].load_ev);
    mlo_plat_event_destroy(mlo_dev_plat(c), st->slots[i].free_ev);
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
  uint64_t least = mlo_stream_least(c);
  pthread_mutex_unlock(&c->pipe->lock);
  return least;
}

uint64_t mlo_stream_least(mlo_component *c) {
  shape sh;
  uint64_t whole = c->materialized ? c->block_bytes : 0, least = UINT64_MAX;
  if (shape_of(c, &sh) == MLO_OK) {
    whole = sh.lay.block_bytes;
    choose(&sh, MLO_STREAM_SLOTS, 0, &least);
    shape_free(&sh);
  } else if (!whole) {
    whole = c->bytes_bound; /* out of memory: a bound, never less */
  }
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
  else if (mlo_dev_plat(c)->caps.max_block_bytes)
    why = "this device builds blocks from segments, and streaming needs whole ones";
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
    if (s->blk >= 0 && s->load_ev && mlo_plat_event_query(mlo_dev_plat(a), s->load_ev) != MLO_OK)
      n++;
  }
  return n;
}

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

/* What mlo_component_stream_info reports of c's plan (its progressive
 * field is the caller's). */
void mlo_stream_describe(const mlo_component *c, mlo_stream_info *out) {
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
  };
}
