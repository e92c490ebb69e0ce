/*
 * blocks.c — a component as the sequence its forward runs: a prologue
 * (embeddings, time and text projections), the repeated blocks, an
 * epilogue (final norm, output projection).  Block streaming (stream.c)
 * moves a component block by block, so the slab (slab.c) lays each block
 * out as one contiguous range, in the order the forward runs them.
 *
 * Where a tensor belongs is found from its name, for the layouts the
 * project reads (docs/streaming.md): `blocks.N.` (Wan), `transformer_blocks.N.`
 * (Flux's double-stream blocks, SD3, Qwen-Image), `single_transformer_blocks.N.`
 * and `single_blocks.N.` (Flux's single-stream blocks, which run after the
 * double-stream ones), `double_blocks.N.` (Flux's own names), `layers.N.`
 * (CLIP, Llama-style encoders), `block.N.` (T5's `encoder.block.N.`) and
 * GGUF's `blk.N.`, anywhere in the name (a single file's
 * `model.diffusion_model.` prefix is no matter).  A caller that knows better
 * declares a tensor's block (mlo_tensor_set_block); then the names are not
 * read for that component at all.
 *
 * The key of a tensor (kind, group, prefix, number) is computed once, when
 * the tensor is declared; the layout sorts by it.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

/* The words that number blocks, with the order their groups run in: a
 * lower rank runs first (Flux: double-stream blocks, then single-stream). */
static const struct {
  const char *word;
  unsigned char rank;
} block_words[] = {
    {"blocks", 0},        {"transformer_blocks", 0},
    {"double_blocks", 0}, {"layers", 0},
    {"block", 0},         {"blk", 0},
    {"single_blocks", 1}, {"single_transformer_blocks", 1},
};

/* Names (a segment's start) of what runs after the blocks. */
static const char *const epilogue_words[] = {
    "norm_out", "proj_out", "final_layer", "norm_final", "final_norm",        "output_norm",
    "lm_head",  "head",     "output",      "out_norm",   "scale_shift_table",
};

/* Whether name[at..] starts with word followed by '.', '_' or the end. */
static bool segment_is(const char *name, size_t at, const char *word, char after) {
  size_t n = strlen(word);
  if (strncmp(name + at, word, n)) return false;
  char c = name[at + n];
  return after ? c == after : (c == '.' || c == '_' || c == '\0');
}

void mlo_block_key_of(const char *name, struct mlo_block_key *k) {
  *k = (struct mlo_block_key){MLO_PIECE_PROLOGUE, 0, 0, 0};
  for (size_t at = 0;; at++) { /* each segment's start */
    if (at == 0 || name[at - 1] == '.') {
      for (size_t w = 0; w < sizeof block_words / sizeof block_words[0]; w++) {
        if (!segment_is(name, at, block_words[w].word, '.')) continue;
        const char *d = name + at + strlen(block_words[w].word) + 1;
        size_t nd = strspn(d, "0123456789");
        if (!nd || nd > 9 || d[nd] != '.') continue; /* "blocks.x.", "blocks.12" */
        k->kind = MLO_PIECE_BLOCK;
        k->rank = block_words[w].rank;
        k->plen = (uint32_t)(d - name);
        k->num = (uint32_t)strtoul(d, NULL, 10);
        return;
      }
      for (size_t w = 0; w < sizeof epilogue_words / sizeof epilogue_words[0]; w++)
        if (segment_is(name, at, epilogue_words[w], 0) && k->kind == MLO_PIECE_PROLOGUE)
          k->kind = MLO_PIECE_EPILOGUE; /* a block's own "norm_out" is the block's: keep looking */
    }
    if (!name[at]) return;
  }
}

/* The key the layout uses: declared blocks replace names for the whole
 * component (a tensor not declared is the prologue's). */
static struct mlo_block_key effective_key(const mlo_component *c, const mlo_tensor *t) {
  if (!c->blocks_declared) return t->bkey;
  if (!t->block_declared) return (struct mlo_block_key){MLO_PIECE_PROLOGUE, 0, 0, 0};
  if (t->declared_block == MLO_BLOCK_PROLOGUE)
    return (struct mlo_block_key){MLO_PIECE_PROLOGUE, 0, 0, 0};
  if (t->declared_block == MLO_BLOCK_EPILOGUE)
    return (struct mlo_block_key){MLO_PIECE_EPILOGUE, 0, 0, 0};
  return (struct mlo_block_key){MLO_PIECE_BLOCK, 0, 0, (uint32_t)t->declared_block};
}

typedef struct mlo_keyed keyed;

/* Two keys of the same block compare equal; blocks in the order they run. */
static int key_cmp(const keyed *a, const keyed *b) {
  if (a->key.kind != b->key.kind) return a->key.kind < b->key.kind ? -1 : 1;
  if (a->key.kind != MLO_PIECE_BLOCK) return 0;
  if (a->key.rank != b->key.rank) return a->key.rank < b->key.rank ? -1 : 1;
  size_t la = a->key.plen, lb = b->key.plen;
  int s = memcmp(a->t->name, b->t->name, la < lb ? la : lb);
  if (s) return s;
  if (la != lb) return la < lb ? -1 : 1;
  if (a->key.num != b->key.num) return a->key.num < b->key.num ? -1 : 1;
  return 0;
}

static int keyed_cmp(const void *pa, const void *pb) {
  const keyed *a = pa, *b = pb;
  int s = key_cmp(a, b);
  if (s) return s;
  return a->index < b->index ? -1 : a->index > b->index;
}

/* Sorting needs no allocation (tensor.c keeps c->scratch as large as the
 * tensor list), so a component's size can always be answered. */
size_t mlo_blocks_sort(const mlo_component *c, size_t *nblocks) {
  keyed *ks = c->scratch;
  size_t k = 0;
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (t->target || (t->flags & MLO_TENSOR_EXTERNAL)) continue;
    ks[k++] = (keyed){t, effective_key(c, t), i, 0};
  }
  if (k) qsort(ks, k, sizeof *ks, keyed_cmp);
  size_t blocks = 0;
  for (size_t i = 0; i < k; i++) {
    if (ks[i].key.kind == MLO_PIECE_BLOCK)
      ks[i].piece = i && ks[i - 1].key.kind == MLO_PIECE_BLOCK && !key_cmp(&ks[i - 1], &ks[i])
                        ? ks[i - 1].piece
                        : (int)blocks++;
    else
      ks[i].piece = ks[i].key.kind == MLO_PIECE_PROLOGUE ? MLO_BLOCK_PROLOGUE : MLO_BLOCK_EPILOGUE;
  }
  *nblocks = blocks;
  return k;
}

/* ---- the API ----------------------------------------------------------- */

int mlo_tensor_set_block(mlo_tensor *t, int block) {
  if (!t) return MLO_EINVAL;
  mlo_component *c = t->comp;
  mlo_pipeline *pipe = c->pipe;
  if (block < MLO_BLOCK_EPILOGUE || block > MLO_BLOCK_MAX)
    return mlo_fail(pipe, MLO_EINVAL,
                    "%s: tensor '%s': block %d (0..%d, or the prologue or epilogue)", c->name,
                    t->name, block, MLO_BLOCK_MAX);
  int rc = mlo_lock_both(pipe);
  if (rc) return rc;
  if (t->target)
    rc = mlo_fail(pipe, MLO_EINVAL, "%s: '%s' is an alias: its target's block applies", c->name,
                  t->name);
  else if (c->materialized)
    rc = mlo_fail(pipe, MLO_ESTATE,
                  "%s: blocks are laid out at materialization; declare '%s' before", c->name,
                  t->name);
  else {
    t->block_declared = true;
    t->declared_block = block;
    c->blocks_declared = true;
  }
  mlo_unlock_both(pipe);
  return rc;
}

/* The pieces as the layout would make them now (slab offsets need the
 * layout: mlo_component_blocks). */
size_t mlo_component_block_count(const mlo_component *c) {
  if (!c) return 0;
  MLO_LOCK_OR(&c->pipe->lock, 0);
  size_t nb = c->nblocks;
  if (!c->materialized) mlo_blocks_sort(c, &nb);
  pthread_mutex_unlock(&c->pipe->lock);
  return nb;
}

int mlo_tensor_block(const mlo_tensor *t) {
  if (!t) return MLO_BLOCK_PROLOGUE;
  if (t->target) t = t->target;
  mlo_component *c = t->comp;
  MLO_LOCK_OR(&c->pipe->lock, MLO_BLOCK_PROLOGUE);
  int b = MLO_BLOCK_PROLOGUE;
  if (c->materialized) {
    b = t->block;
  } else if (!(t->flags & MLO_TENSOR_EXTERNAL)) {
    size_t nb, n = mlo_blocks_sort(c, &nb);
    for (size_t i = 0; i < n; i++)
      if (c->scratch[i].t == t) b = c->scratch[i].piece;
  }
  pthread_mutex_unlock(&c->pipe->lock);
  return b;
}
