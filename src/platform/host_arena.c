/*
 * host_arena.c — the host-backed device's memory: one arena reserved at
 * open and carved first-fit, as a GPU's caching allocator carves its pool
 * (a range once touched stays mapped, so a reused block never page-faults),
 * frees ordered after the copies queued before them (as cudaFreeAsync), and
 * the scrubber thread that fills released ranges with 0xA5 off the copy
 * queue.  host.c has the rest of the platform.
 */
#include "base/sysio.h"
#include "platform/host_internal.h"

#include "base/log.h"

#include <stdlib.h>
#include <string.h>

/* Called with the lock held; NULL if handle is not a live block. */
struct host_range *mlo_host_find_live(struct host_ctx *ctx, const void *handle) {
  for (struct host_range *b = ctx->live; b; b = b->next)
    if (ctx->arena + b->off == handle) return b;
  return NULL;
}

static void unlink_range(struct host_range **list, struct host_range *b) {
  if (b->prev)
    b->prev->next = b->next;
  else
    *list = b->next;
  if (b->next) b->next->prev = b->prev;
  b->prev = b->next = NULL;
}

/* Merges b with its right neighbour when both are free, adjacent, not
 * being scrubbed and alike (a dirty range merged into clean room would have
 * the scrubber fill — and fault in — room nobody used); the neighbour's node
 * goes. */
static void merge_right(struct host_ctx *ctx, struct host_range *b) {
  struct host_range *n = b->next;
  if (!n || b->scrubbing || n->scrubbing || b->dirty != n->dirty || b->off + b->len != n->off)
    return;
  b->len += n->len;
  if (n->free_seq > b->free_seq) b->free_seq = n->free_seq;
  unlink_range(&ctx->free_list, n);
  free(n);
}

/* Puts a range on the free list in offset order and coalesces it. */
static void insert_free(struct host_ctx *ctx, struct host_range *b) {
  struct host_range *prev = NULL, *cur = ctx->free_list;
  while (cur && cur->off < b->off) {
    prev = cur;
    cur = cur->next;
  }
  b->prev = prev;
  b->next = cur;
  if (cur) cur->prev = b;
  if (prev)
    prev->next = b;
  else
    ctx->free_list = b;
  merge_right(ctx, b);
  if (prev) merge_right(ctx, prev);
}

/* Poisons released ranges once nothing queued before their release can
 * touch them; never on the copy engine, never under the lock. */
void *mlo_host_scrubber_main(void *arg) {
  struct host_ctx *ctx = arg;
  pthread_mutex_lock(&ctx->lock);
  for (;;) {
    struct host_range *b = ctx->free_list;
    while (b && !(b->dirty && !b->scrubbing && b->free_seq <= ctx->completed_seq)) b = b->next;
    if (!b) {
      if (ctx->stopping) break;
      pthread_cond_wait(&ctx->done_cv, &ctx->lock);
      continue;
    }
    b->scrubbing = true;
    char *mem = ctx->arena + b->off;
    size_t len = b->len;
    pthread_mutex_unlock(&ctx->lock);
    if (ctx->opt.poison) memset(mem, HOST_POISON_BYTE, len);
    HOST_ASAN_POISON(mem, len);
    pthread_mutex_lock(&ctx->lock);
    b->scrubbing = false;
    b->dirty = false;
    merge_right(ctx, b);
    if (b->prev) merge_right(ctx, b->prev);
    pthread_cond_broadcast(&ctx->done_cv);
  }
  pthread_mutex_unlock(&ctx->lock);
  return NULL;
}

static bool any_scrubbing(const struct host_ctx *ctx) {
  for (const struct host_range *b = ctx->free_list; b; b = b->next)
    if (b->scrubbing) return true;
  return false;
}

/* First fit from the low end: a run of adjacent free ranges (dirty or
 * clean alike: the new owner overwrites what it uses) that none is being
 * scrubbed.  A fit that would reach past the memory already touched while
 * a range below it is being scrubbed waits for the scrubber instead: reuse
 * is ordered after the scrub, as a GPU's stream-ordered allocator orders
 * it after the free, and the stand-in device memory never grows past what
 * the allocations themselves need (it grew to the sum of every component
 * when first fit skipped the ranges in scrubbing).  Lock held. */
static bool carve(struct host_ctx *ctx, size_t padded, struct host_range *blk) {
  for (;;) {
    bool scrubbing = any_scrubbing(ctx);
    for (struct host_range *f = ctx->free_list; f; f = f->next) {
      size_t have = 0;
      for (struct host_range *g = f; g && !g->scrubbing && have < padded; g = g->next) {
        if (g != f && g->prev->off + g->prev->len != g->off) break;
        have += g->len;
      }
      if (have < padded) continue;
      if (scrubbing && f->off + padded > ctx->touched_end) break; /* wait, do not grow */
      blk->off = f->off;
      blk->len = padded;
      for (size_t need = padded; need;) { /* whole ranges, then part of the last */
        struct host_range *g = f;
        f = f->next;
        if (g->len <= need) {
          need -= g->len;
          unlink_range(&ctx->free_list, g);
          free(g);
        } else {
          g->off += need;
          g->len -= need;
          need = 0;
        }
      }
      return true;
    }
    if (!scrubbing) return false;
    pthread_cond_wait(&ctx->done_cv, &ctx->lock);
  }
}

int mlo_host_dev_alloc(void *vctx, size_t bytes, void **block) {
  struct host_ctx *ctx = vctx;
  *block = NULL;
  if (bytes > SIZE_MAX - 2 * HOST_ALIGN) return MLO_ENOMEM_DEVICE;
  size_t padded = bytes ? (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN : HOST_ALIGN;
  /* The node is allocated first: running out of host memory for it is
   * MLO_ENOMEM (host), never a device too small. */
  struct host_range *blk = mlo_calloc(1, sizeof *blk);
  if (!blk) return MLO_ENOMEM;
  pthread_mutex_lock(&ctx->lock);
  if (bytes > ctx->opt.capacity - ctx->live_bytes || !carve(ctx, padded, blk)) {
    pthread_mutex_unlock(&ctx->lock);
    free(blk);
    return MLO_ENOMEM_DEVICE;
  }
  ctx->live_bytes += bytes;
  if (blk->off + blk->len > ctx->touched_end) ctx->touched_end = blk->off + blk->len;
  blk->bytes = bytes;
  blk->next = ctx->live;
  if (ctx->live) ctx->live->prev = blk;
  ctx->live = blk;
  HOST_ASAN_UNPOISON(ctx->arena + blk->off, padded);
  pthread_mutex_unlock(&ctx->lock);
  *block = ctx->arena + blk->off;
  return MLO_OK;
}

int mlo_host_dev_free(void *vctx, void *block, size_t bytes) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  struct host_range *b = mlo_host_find_live(ctx, block);
  if (!b) {
    pthread_mutex_unlock(&ctx->lock);
    mlo_logf(MLO_LOG_ERROR, "host platform: dev_free of %p, which is not a live block", block);
    return MLO_EINVAL;
  }
  if (b->bytes != bytes)
    mlo_logf(MLO_LOG_WARN, "host platform: dev_free of a %zu-byte block as %zu bytes", b->bytes,
             bytes);
  unlink_range(&ctx->live, b);
  ctx->live_bytes -= b->bytes;
  b->free_seq = ctx->submitted_seq; /* stream-ordered: after everything queued so far */
  b->dirty = ctx->scrub;
  b->scrubbing = false;
  insert_free(ctx, b);
  pthread_cond_broadcast(&ctx->done_cv);
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

int mlo_host_get_memory(void *vctx, uint64_t *total, uint64_t *free_bytes) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  *total = ctx->opt.capacity;
  *free_bytes = ctx->opt.capacity - ctx->live_bytes;
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

bool mlo_host_scrub_pending(const struct host_ctx *ctx) {
  for (const struct host_range *b = ctx->free_list; b; b = b->next)
    if (b->dirty) return true;
  return false;
}

void mlo_host_free_ranges(struct host_range *b) {
  while (b) {
    struct host_range *next = b->next;
    free(b);
    b = next;
  }
}
