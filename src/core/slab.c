/*
 * slab.c — a component's host storage: the layout of its device block and
 * the one host slab its tensors are packed into.
 *
 * Layout: tensors with storage of their own (not aliases), those the
 * library owns first, each at an aligned offset; their bytes are the slab,
 * so a load is one large copy of the slab (docs/architecture.md).  External tensors
 * (caller-owned or sharded host storage, C7) follow in the device block
 * only: their host copy stays where the owner put it and is copied from
 * there, one copy each.
 *
 * Materialization reads file-backed tensors once, straight into the slab
 * (no intermediate whole-file buffer), through loader.c's reader pool.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include "base/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

static bool is_external(const mlo_tensor *t) {
  return t->flags & MLO_TENSOR_EXTERNAL;
}

/* Where a tensor of nbytes goes after `end`: aligned, and within one
 * segment where the device builds blocks from segments (seg != 0). */
static uint64_t place(uint64_t end, uint64_t align, uint64_t seg, uint64_t nbytes) {
  uint64_t off = nbytes ? align_up(end, align) : 0;
  if (seg && nbytes && nbytes <= seg && off / seg != (off + nbytes - 1) / seg)
    off = (off / seg + 1) * seg;
  return off;
}

/* Computes the layout (internal.h).  The slab holds the tensors the
 * library owns in the order the forward runs them (blocks.c): the
 * prologue, each block, the epilogue, so a block is one contiguous range;
 * external tensors follow in the device block only.  On a platform whose
 * blocks are built from segments (caps.max_block_bytes) a tensor that
 * would straddle a segment boundary starts the next segment. */
int mlo_slab_layout(mlo_component *c, bool assign, bool want_spans, mlo_layout *out) {
  uint64_t align = c->pipe->alignment, end = 0;
  uint64_t seg = mlo_dev_plat(c)->caps.max_block_bytes;
  memset(out, 0, sizeof *out);
  size_t nb, n = mlo_blocks_sort(c, &nb);
  const struct mlo_keyed *ks = c->scratch;
  struct mlo_span *spans = NULL, ignored;
  mlo_tensor **order = NULL;
  if ((want_spans || assign) && !(spans = mlo_calloc(nb ? nb : 1, sizeof *spans)))
    return MLO_ENOMEM;
  if (assign && !(order = mlo_malloc((n ? n : 1) * sizeof *order))) {
    free(spans);
    return MLO_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) { /* the slab, piece by piece */
    int p = ks[i].piece;
    struct mlo_span *s = p == MLO_BLOCK_PROLOGUE   ? &out->pro
                         : p == MLO_BLOCK_EPILOGUE ? &out->epi
                         : spans                   ? &spans[p]
                                                   : &ignored;
    mlo_tensor *t = ks[i].t;
    uint64_t off = place(end, align, seg, t->nbytes);
    if (assign) {
      t->dev_offset = off;
      t->block = p;
      order[i] = t;
    }
    if (t->nbytes) {
      if (!s->bytes) s->off = off;
      end = off + t->nbytes;
      s->bytes = end - s->off;
    }
    s->tensors++;
    ignored = (struct mlo_span){0, 0, 0};
  }
  uint64_t at = 0; /* an empty piece sits where it would start */
  for (size_t i = 0; spans && i < nb + 2; i++) {
    struct mlo_span *s = i == 0 ? &out->pro : i == nb + 1 ? &out->epi : &spans[i - 1];
    if (!s->bytes) s->off = at;
    at = s->off + s->bytes;
  }
  /* Both end in whole alignment units: a component's block can then take
   * another's slab laid as a ring, each tensor aligned (join.c). */
  end = align_up(end, align);
  out->slab_bytes = end;
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (t->target || !is_external(t)) continue;
    uint64_t off = place(end, align, seg, t->nbytes);
    if (assign) {
      t->dev_offset = off;
      t->block = MLO_BLOCK_PROLOGUE;
    }
    if (t->nbytes) end = off + t->nbytes;
  }
  out->block_bytes = align_up(end, align);
  out->nblocks = nb;
  out->spans = spans;
  out->order = order;
  out->norder = n;
  return MLO_OK;
}

uint64_t mlo_comp_bytes(const mlo_component *c) {
  mlo_layout lay;
  uint64_t total = c->block_bytes;
  if (!c->materialized && mlo_slab_layout((mlo_component *)c, false, false, &lay) == MLO_OK)
    total = lay.block_bytes; /* without spans or assignment it cannot fail */
  return total;
}

void mlo_layout_free(mlo_layout *lay) {
  free(lay->spans);
  free(lay->order);
  lay->spans = NULL;
  lay->order = NULL;
}

/* The progress callback, read once under the lock: set_progress from
 * another thread during a load takes effect at the next one. */
typedef struct {
  mlo_progress_fn fn;
  void *user;
} progress_sink;

/* Caller-owned tensors are copied from where the caller keeps them (C7);
 * where the platform can page-lock memory in place and pinning is on, they
 * are (never SHARDED ones: a distributed tensor's storage is not ours to
 * pin, as the specification says of DTensors).  Registration is
 * page-granular (cudaHostRegister pins whole pages, and a second range on
 * a page already registered is refused as already registered), so tensors
 * whose pages meet are registered once, as one run over the union of their
 * pages, as the disk tier's runs are (disk.c, pin_runs): read-only only
 * where every tensor in the run is.  What stays pageable is added to
 * *pageable. */
static bool may_register(const mlo_tensor *t) {
  return !t->target && is_external(t) && t->nbytes && !(t->flags & MLO_TENSOR_SHARDED);
}

/* read-only where nothing is ever copied back into it (issue 25.2: a
 * write-back into memory CUDA registered read-only fails) */
static bool wants_ro(const mlo_component *c, const mlo_tensor *t) {
  return !(t->flags & MLO_TENSOR_MUTABLE) && !c->pipe->settings.copy_back;
}

static int by_source(const void *a, const void *b) {
  const char *x = (*(mlo_tensor *const *)a)->src_data, *y = (*(mlo_tensor *const *)b)->src_data;
  return x < y ? -1 : x > y;
}

/* The tensors whose source lies in run r. */
static bool in_run(const struct mlo_ext_run *r, const mlo_tensor *t) {
  const char *p = t->src_data;
  return t->registered && p >= r->base && p < r->base + r->bytes;
}

static void register_external(mlo_component *c, uint64_t *pageable) {
  mlo_pipeline *pipe = c->pipe;
  bool may = pipe->pin_host && pipe->platform->caps.host_register && !mlo_env_flag("MLO_NO_PINNED");
  mlo_tensor **list = NULL;
  size_t n = 0;
  if (may && !c->ext_runs && c->ntensors && (list = mlo_malloc(c->ntensors * sizeof *list)) &&
      !(c->ext_runs = mlo_calloc(c->ntensors, sizeof *c->ext_runs))) {
    free(list);
    list = NULL;
  }
  for (size_t i = 0; list && i < c->ntensors; i++)
    if (may_register(c->tensors[i]) && !c->tensors[i]->registered) list[n++] = c->tensors[i];
  if (n) qsort(list, n, sizeof *list, by_source);
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = 0, hi = 0, covered = 0;
  bool ro = true, whole = true;
  for (size_t i = 0, first = 0; i <= n; i++) {
    uintptr_t a = 0, b = 0, src = i < n ? (uintptr_t)list[i]->src_data : 0;
    if (i < n) {
      a = src / page * page;
      b = (src + (uintptr_t)list[i]->nbytes + page - 1) / page * page;
    }
    if (i > first && (i == n || a >= hi)) { /* the run [first, i) shares no page with i */
      /* Read-only applies to whole pages: where the run's tensors leave
       * bytes of its pages uncovered (a neighbour's, in the same heap
       * page), it is registered writable, so that a copy into that
       * neighbour is not refused; only memory that cannot be registered
       * so (a read-only mapping, whose neighbours are read-only too) is
       * registered read-only after all. */
      bool as_ro = ro && whole && covered == hi;
      c->stats.platform_calls++;
      bool ok =
          mlo_plat_host_register(pipe->platform, (void *)lo, (size_t)(hi - lo), as_ro) == MLO_OK;
      if (!ok && ro && !as_ro) {
        c->stats.platform_calls++;
        ok = mlo_plat_host_register(pipe->platform, (void *)lo, (size_t)(hi - lo), true) == MLO_OK;
        as_ro = ok;
      }
      ro = as_ro;
      if (ok) c->ext_runs[c->next_runs++] = (struct mlo_ext_run){(char *)lo, hi - lo, ro};
      for (size_t k = first; k < i; k++) {
        list[k]->registered = ok;
        list[k]->registered_ro = ok && ro;
      }
      first = i;
    }
    if (i == n) break;
    if (i == first) {
      lo = a;
      hi = b;
      ro = true;
      whole = src == a; /* from the start of its first page */
      covered = src;
    } else if (b > hi) {
      hi = b;
    }
    if (src > covered) whole = false; /* a gap between two tensors: someone else's bytes */
    if (src + (uintptr_t)list[i]->nbytes > covered) covered = src + (uintptr_t)list[i]->nbytes;
    ro = ro && wants_ro(c, list[i]);
  }
  free(list);
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (!t->target && is_external(t) && t->nbytes && !t->registered) *pageable += t->nbytes;
  }
}

/* Unregisters every run of caller memory (nothing queued reads it: the
 * platform drains its copies first). */
static void unregister_external(mlo_component *c) {
  for (size_t r = 0; r < c->next_runs; r++) {
    c->stats.platform_calls++;
    mlo_plat_host_unregister(c->pipe->platform, c->ext_runs[r].base);
  }
  for (size_t i = 0; i < c->ntensors; i++) {
    c->tensors[i]->registered = false;
    c->tensors[i]->registered_ro = false;
  }
  free(c->ext_runs);
  c->ext_runs = NULL;
  c->next_runs = 0;
}

/* What materializing one component builds, step by step (below). */
typedef struct {
  uint64_t slab_bytes, block_bytes;
  void *slab;
  bool pinned, want_pin;
  void *shared;       /* the node-shared mapping's handle, or NULL */
  bool together;      /* a failure every node rank reached: undone together */
  mlo_tensor **files; /* the tensors this rank reads from files */
  size_t nfiles;
  uint64_t file_bytes;
  mlo_layout lay; /* the pieces: published with the slab */
  bool *filled;   /* on disk and streaming: which blocks its slab holds (none yet) */
} slab_build;

/* A segmented device (caps.max_block_bytes) cannot hold a tensor larger
 * than one segment. */
static int check_segments(mlo_component *c) {
  uint64_t seg = mlo_dev_plat(c)->caps.max_block_bytes;
  for (size_t i = 0; seg && i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    if (!t->target && t->nbytes > seg) {
      char a[32], b[32];
      return mlo_fail(c->pipe, MLO_EUNSUPPORTED,
                      "%s: tensor '%s' (%s) is larger than this device's largest allocation "
                      "(%s): no block can hold it",
                      c->name, t->name, mlo_format_size(t->nbytes, a, sizeof a),
                      mlo_format_size(seg, b, sizeof b));
    }
  }
  return MLO_OK;
}

#define CHECK_HEADER_CAP ((uint64_t)64 << 20)
#define CHECK_SAMPLES 16          /* pages of a file's data folded besides its header */
#define CHECK_PAGE ((size_t)4096) /* each sample's bytes */

/* Folds what a file must hold alike on every rank: its header, the bytes
 * [0, end) up to the first tensor's (at most CHECK_HEADER_CAP of them), and
 * CHECK_SAMPLES pages of its data spread evenly from there to its end (the
 * first and the last among them).  Same-layout checkpoints with other
 * weights (a fine-tune, another step of a training run) differ in nearly
 * every page; a few damaged bytes are caught only where a sample falls. */
static int fold_file(const char *path, uint64_t end, uint64_t *h, char *why, size_t whylen) {
  int fd = -1;
  mlo_file_id id;
  int rc = mlo_open_regular(path, &fd, &id, why, whylen);
  if (rc) return rc;
  if (end > id.size) end = id.size;
  uint64_t data = end; /* the data's first byte */
  if (end > CHECK_HEADER_CAP) end = CHECK_HEADER_CAP;
  /* on the heap: a pipeline may be opened on a thread with a small stack,
   * and thread-local storage is carved from every thread's stack */
  const size_t cap = 64 << 10;
  unsigned char *buf = mlo_malloc(cap);
  if (!buf) rc = mlo_errf(why, whylen, MLO_ENOMEM, "out of host memory");
  for (uint64_t at = 0; at < end && !rc; at += cap) {
    size_t n = end - at < cap ? (size_t)(end - at) : cap;
    if (mlo_pread_full(fd, buf, n, at) != 0)
      rc = mlo_errf(why, whylen, MLO_EIO, "%s: cannot read its header: %s", path,
                    errno ? strerror(errno) : "the file shrank");
    else
      *h = mlo_fnv1a(*h, buf, n);
  }
  uint64_t span = id.size > data ? id.size - data : 0;
  size_t page = span < CHECK_PAGE ? (size_t)span : CHECK_PAGE;
  /* a sample is its page alone: read-ahead around each would read the
   * node's checkpoint well past once (the pages a rank reads here are
   * cached for the rank whose share they are) */
  if (page) posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  for (int i = 0; i < CHECK_SAMPLES && page && !rc; i++) {
    uint64_t at = data + (span - page) / (CHECK_SAMPLES - 1) * (uint64_t)i;
    if (i == CHECK_SAMPLES - 1) at = id.size - page;
    if (mlo_pread_full(fd, buf, page, at) != 0)
      rc = mlo_errf(why, whylen, MLO_EIO, "%s: cannot read its data at byte %llu: %s", path,
                    (unsigned long long)at, errno ? strerror(errno) : "the file shrank");
    else
      *h = mlo_fnv1a(*h, buf, page);
  }
  free(buf);
  close(fd);
  return rc;
}

/* Folds every byte of the file at path, which must still be the file id
 * describes (checked on the descriptor after the reads, as the disk tier
 * does). */
static int fold_content(const char *path, const mlo_file_id *id, uint64_t *h, char *why,
                        size_t whylen) {
  int fd = -1;
  mlo_file_id now;
  int rc = mlo_open_regular(path, &fd, &now, why, whylen);
  if (rc) return rc;
  const size_t cap = 1 << 20;
  unsigned char *buf = mlo_file_id_equal(&now, id) ? mlo_malloc(cap) : NULL;
  if (!mlo_file_id_equal(&now, id))
    rc = mlo_errf(why, whylen, MLO_EIO, "'%s' changed since its tensors were declared", path);
  else if (!buf)
    rc = mlo_errf(why, whylen, MLO_ENOMEM, "out of host memory");
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  for (uint64_t at = 0; at < now.size && !rc; at += cap) {
    size_t n = now.size - at < cap ? (size_t)(now.size - at) : cap;
    if (mlo_pread_full(fd, buf, n, at) != 0)
      rc = mlo_errf(why, whylen, MLO_EIO, "%s: cannot read it at byte %llu: %s", path,
                    (unsigned long long)at, errno ? strerror(errno) : "the file shrank");
    else
      *h = mlo_fnv1a(*h, buf, n);
  }
  if (!rc) rc = mlo_fd_id_recheck(fd, path, id, why, whylen);
  free(buf);
  close(fd);
  return rc;
}

/* What of each of c's files (once each, in the order its tensors name
 * them) a digest folds: its header and sampled pages; its identity as
 * declared (device, inode, size, modification and change time: ranks
 * naming the same file agree); or all of its bytes. */
enum fold_mode { FOLD_SAMPLED, FOLD_IDENTITY, FOLD_CONTENT };

static int fold_files(const mlo_component *c, enum fold_mode mode, uint64_t *h, char *why,
                      size_t whylen) {
  for (size_t i = 0; i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    if (!t->src_file) continue;
    bool seen = false;
    uint64_t end = t->src_offset;
    for (size_t j = 0; j < c->ntensors && !seen; j++) {
      const mlo_tensor *o = c->tensors[j];
      if (!o->src_file || strcmp(o->src_file, t->src_file)) continue;
      if (j < i) seen = true;
      if (o->src_offset < end) end = o->src_offset;
    }
    if (seen) continue;
    int rc = MLO_OK;
    if (mode == FOLD_SAMPLED)
      rc = fold_file(t->src_file, end, h, why, whylen);
    else if (mode == FOLD_IDENTITY)
      *h = mlo_fnv1a(*h, &t->src_id, sizeof t->src_id);
    else
      rc = fold_content(t->src_file, &t->src_id, h, why, whylen);
    if (rc) return rc;
  }
  return MLO_OK;
}

/* What every rank sharing this component's slab must hold alike, as one
 * digest: the slab's size and layout, each tensor's name, dtype, shape,
 * bytes and place in its file, each file's size, header and sampled data
 * pages.  Ranks that opened different checkpoints (another scale, another
 * preset, a damaged header, other weights in the same layout) then fail
 * together at the agreement, before one slab is shared
 * between them, instead of computing on each other's bytes or waiting in
 * MPI_Win_free for a window of another size. */
static int shared_check(const mlo_component *c, const slab_build *b, uint64_t *check, char *why,
                        size_t whylen) {
  uint64_t h = mlo_fnv1a(MLO_FNV_BASIS, &b->slab_bytes, sizeof b->slab_bytes);
  h = mlo_fnv1a(h, &b->block_bytes, sizeof b->block_bytes);
  for (size_t i = 0; i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    uint64_t fields[6] = {(uint64_t)t->dtype,
                          (uint64_t)t->ndim,
                          t->nbytes,
                          t->dev_offset,
                          t->src_file ? t->src_offset : 0,
                          t->src_file ? t->src_id.size : 0};
    h = mlo_fnv1a(h, t->name, strlen(t->name) + 1);
    h = mlo_fnv1a(h, fields, sizeof fields);
    h = mlo_fnv1a(h, t->shape, sizeof t->shape[0] * (size_t)t->ndim);
  }
  int rc = fold_files(c, FOLD_SAMPLED, &h, why, whylen);
  if (rc) return rc;
  *check = h;
  return MLO_OK;
}

/* The host slab: one per node, shared by its ranks (after every rank
 * arrived at this component holding the same checkpoint for it), or this
 * process's own from the platform. */
/* Every node rank at this component holding the same checkpoint for it,
 * in the same tier (its slab shared, or on disk: each rank then reads its
 * slice of the same files). */
static int agree(mlo_component *c, const slab_build *b) {
  mlo_pipeline *pipe = c->pipe;
  uint64_t check = 0;
  char why[400] = "";
  int mine = shared_check(c, b, &check, why, sizeof why); /* a failure is every rank's to hear */
  if (!mine) mine = mlo_check_device_gather(pipe, why, sizeof why);
  check ^= c->want_disk ? 0x9e3779b97f4a7c15ull : 0;
  int rc = mlo_collective(pipe, c, COLL_MATERIALIZE, check, mine, mine ? why : NULL, NULL);
  if (rc != MLO_ESTATE || !strstr(pipe->errmsg, " differ at ")) return rc;
  char said[sizeof pipe->errmsg];
  snprintf(said, sizeof said, "%s", pipe->errmsg);
  return mlo_fail(pipe, rc,
                  "%s: the ranks do not hold the same checkpoint for it (its tensors, their "
                  "layout, or their files' sizes, headers or sampled data differ, or their "
                  "host plans put it in another tier): %s",
                  c->name, said);
}

/* Ranks whose samples agree share a slab only over the same bytes: where
 * they name the same files (one identity) that is so; where they name
 * different copies (another path, another disk), each hashes its own copy
 * in full and they share only if the hashes agree.  Sampled pages cannot
 * see a few bytes changed between samples (issue 44, F10). */
static int agree_content(mlo_component *c) {
  mlo_pipeline *pipe = c->pipe;
  uint64_t ident = MLO_FNV_BASIS;
  char why[400] = "";
  fold_files(c, FOLD_IDENTITY, &ident, why, sizeof why); /* reads nothing: cannot fail */
  int rc = mlo_collective(pipe, c, COLL_SAME_FILES, ident, MLO_OK, NULL, NULL);
  if (rc != MLO_ESTATE || !strstr(pipe->errmsg, " differ at ")) return rc;
  mlo_logf(MLO_LOG_INFO,
           "%s: the ranks name different copies of its files; each hashes its own in full "
           "before they share one slab",
           c->name);
  uint64_t content = MLO_FNV_BASIS;
  int mine = fold_files(c, FOLD_CONTENT, &content, why, sizeof why);
  rc = mlo_collective(pipe, c, COLL_CONTENT, content, mine, mine ? why : NULL, NULL);
  if (rc != MLO_ESTATE || !strstr(pipe->errmsg, " differ at ")) return rc;
  char said[sizeof pipe->errmsg];
  snprintf(said, sizeof said, "%s", pipe->errmsg);
  return mlo_fail(pipe, rc,
                  "%s: the ranks do not hold the same checkpoint for it (their copies of its "
                  "files differ in content, each hashed in full): %s",
                  c->name, said);
}

static int alloc_slab(mlo_component *c, slab_build *b) {
  mlo_pipeline *pipe = c->pipe;
  if (!b->slab_bytes) return MLO_OK;
  int rc;
  if (pipe->comm) {
    if ((rc = agree(c, b)) || (rc = agree_content(c))) return rc;
    char err[256];
    rc = mlo_dist_shared_alloc(pipe->comm, (size_t)b->slab_bytes, &b->slab, &b->shared, err,
                               sizeof err);
    if (rc) return mlo_fail(pipe, rc, "%s: node-shared slab: %s", c->name, err);
  } else {
    rc = mlo_plat_host_alloc(pipe->platform, b->slab_bytes, b->want_pin, &b->slab, &b->pinned);
    if (rc)
      return mlo_fail(pipe, rc, "%s: cannot allocate a %llu-byte host slab", c->name,
                      (unsigned long long)b->slab_bytes);
  }
  b->files = mlo_malloc(c->ntensors * sizeof *b->files);
  if (!b->files) return mlo_fail(pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
  return MLO_OK;
}

/* Writes what does not come from files (padding, caller memory, zeros) and
 * lists the tensors that do.  A shared slab is written by node rank 0; a
 * simulated device's slab is address space only, never written, and no
 * file is read (a projection of 60 GB reads headers alone). */
static void fill_slab(mlo_component *c, slab_build *b) {
  if (c->pipe->platform->caps.simulated) return;
  bool writer = !b->shared || mlo_dist_node_rank(c->pipe->comm) == 0;
  uint64_t cursor = 0;
  for (size_t i = 0; i < b->lay.norder; i++) { /* in layout order: padding runs forward */
    mlo_tensor *t = b->lay.order[i];
    if (!t->nbytes) continue;
    char *dst = (char *)b->slab + t->dev_offset;
    if (writer) memset((char *)b->slab + cursor, 0, t->dev_offset - cursor); /* padding */
    cursor = t->dev_offset + t->nbytes;
    if (t->src_file) {
      b->files[b->nfiles++] = t;
      b->file_bytes += t->nbytes;
    } else if (writer && t->src_data) {
      memcpy(dst, t->src_data, t->nbytes);
    } else if (writer) {
      memset(dst, 0, t->nbytes);
    }
  }
}

/* A shared slab's file bytes are split among the node's ranks: this rank
 * keeps the tensors whose first byte falls in its 1/n of the running total
 * (layout order, the same on every rank), so the node reads the
 * checkpoint once, in parallel. */
static void take_my_share(mlo_component *c, slab_build *b) {
  if (!b->shared || !b->nfiles) return;
  uint64_t n = (uint64_t)mlo_dist_node_size(c->pipe->comm);
  uint64_t r = (uint64_t)mlo_dist_node_rank(c->pipe->comm), at = 0, mine_bytes = 0;
  size_t mine = 0;
  for (size_t i = 0; i < b->nfiles; i++) {
    uint64_t share =
        n && b->file_bytes ? (uint64_t)((double)at / (double)b->file_bytes * (double)n) : 0;
    at += b->files[i]->nbytes;
    if ((share < n ? share : n - 1) != r) continue;
    mine_bytes += b->files[i]->nbytes;
    b->files[mine++] = b->files[i];
  }
  b->nfiles = mine;
  b->file_bytes = mine_bytes;
}

/* Reads this rank's files into the slab; with a shared slab, every rank
 * then learns of any rank's failure and waits for all parts. */
static int read_files(mlo_component *c, slab_build *b) {
  mlo_pipeline *pipe = c->pipe;
  c->slab = b->slab; /* the loader reads through c->slab */
  progress_sink ps;
  pthread_mutex_lock(&pipe->lock);
  ps.fn = pipe->progress;
  ps.user = pipe->progress_user;
  pthread_mutex_unlock(&pipe->lock);
  int rc = MLO_OK;
  bool share = b->shared && mlo_dist_node_size(pipe->comm) > 1; /* the others read the rest */
  if (b->nfiles) rc = mlo_load_files(c, b->files, b->nfiles, b->file_bytes, share, ps.fn, ps.user);
  if (b->shared) {
    char mine[200];
    snprintf(mine, sizeof mine, "%.190s", rc ? pipe->errmsg : "");
    int arc = mlo_collective(pipe, c, COLL_LOADED, 0, rc, rc ? mine : NULL, &b->together);
    if (!rc) rc = arc;
  }
  return rc;
}

/* Whether the slab is pinned in place (host_register): a node-shared one
 * always (nothing else can pin it), and one that fell back to pageable
 * memory when the platform could not allocate it pinned (cudaHostAlloc
 * refused: registering the pageable memory may still work). */
static bool pin_in_place(const mlo_component *c, const slab_build *b) {
  const mlo_platform *p = c->pipe->platform;
  if (!b->want_pin || !p->caps.host_register) return false;
  return b->shared ||
         (!b->pinned && b->slab && b->slab_bytes && !c->want_disk && !p->caps.simulated);
}

/* The component's storage, now complete, published under the lock: each
 * tensor's host bytes, the slab's kind, the pipeline's counters. */
static void publish(mlo_component *c, slab_build *b) {
  mlo_pipeline *pipe = c->pipe;
  bool registered = false, disk = c->want_disk;
  if (pin_in_place(c, b)) {
    c->stats.platform_calls++;
    bool ro = !c->has_mutable && !pipe->settings.copy_back; /* mutable tensors come back here */
    registered =
        mlo_plat_host_register(pipe->platform, b->slab, (size_t)b->slab_bytes, ro) == MLO_OK;
    if (b->shared) b->pinned = registered; /* else pinned stays how it was allocated (freeing) */
    c->slab_registered_ro = registered && ro;
  }
  /* on disk: the ring's, pinned */
  uint64_t pageable = b->pinned || registered || disk ? 0 : b->slab_bytes;
  register_external(c, &pageable);
  pthread_mutex_lock(&pipe->lock);
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (!t->target && !is_external(t))
      t->host = disk ? NULL : t->nbytes ? (char *)b->slab + t->dev_offset : b->slab;
  }
  c->slab_bytes = b->slab_bytes;
  c->slab_pinned = b->pinned;
  c->slab_shared = b->shared;
  c->slab_registered = registered;
  pipe->dist.read_bytes += b->file_bytes;
  if (b->shared) pipe->dist.shared_bytes += b->slab_bytes;
  c->block_bytes = b->block_bytes;
  free(c->spans);
  c->spans = b->lay.spans;
  b->lay.spans = NULL;
  mlo_layout_free(&b->lay);
  c->nblocks = b->lay.nblocks;
  c->pro = b->lay.pro;
  c->epi = b->lay.epi;
  c->pageable_bytes = pageable;
  c->materialized = true;
  c->on_disk = disk;
  c->state = MLO_RES_HOST;
  if (disk) { /* a partial one's streamed blocks come into its slab when planned */
    pipe->disk_bytes += b->slab_bytes;
    c->slab = b->slab;
    c->partial = b->slab != NULL;
    c->filled = b->filled;
    pthread_mutex_unlock(&pipe->lock);
    return;
  }
  if (b->slab_bytes) c->stats.platform_calls++;
  pipe->host_slab_bytes += b->slab_bytes;
  if (b->pinned || registered) pipe->pinned_bytes += b->slab_bytes;
  pthread_mutex_unlock(&pipe->lock);
}

static void log_materialized(const mlo_component *c, const slab_build *b, uint64_t t0) {
  if (!b->slab_bytes) return;
  if (!b->pinned && !c->slab_registered && c->pipe->pin_host && c->pipe->platform->caps.pinned_host)
    mlo_logf(MLO_LOG_INFO, "%s: host slab is pageable (pinning unavailable or disabled)", c->name);
  if (!mlo_log_enabled(MLO_LOG_INFO)) return;
  double secs = (double)(mlo_now_ns() - t0) / 1e9;
  char size[32];
  mlo_logf(MLO_LOG_INFO, "materialized %s: %s, %zu tensors, %s, %.3f s (%.2f GB/s)", c->name,
           mlo_format_size(b->slab_bytes, size, sizeof size), c->own_count,
           b->nfiles                            ? "read from files"
           : !c->pipe->platform->caps.simulated ? "from memory"
                                                : "simulated",
           secs, secs > 0 ? (double)b->slab_bytes / secs / 1e9 : 0.0);
}

/* Undoes a failed build: a shared slab is freed only if every node rank
 * failed at the same step (MPI_Win_free waits for all of them). */
static void undo(mlo_component *c, slab_build *b) {
  c->slab = NULL;
  free(b->files);
  if (b->shared && b->together)
    mlo_dist_shared_free(c->pipe->comm, b->shared);
  else if (b->shared)
    mlo_logf(MLO_LOG_ERROR, "%s: node-shared slab left mapped: %s", c->name, c->pipe->errmsg);
  else if (b->slab)
    mlo_plat_host_free(c->pipe->platform, b->slab, b->slab_bytes, b->pinned);
}

int mlo_slab_materialize(mlo_component *c) {
  if (c->materialized) return MLO_OK;
  int rc = check_segments(c);
  if (rc) return rc;
  uint64_t t0 = mlo_now_ns();
  slab_build b = {.together = true,
                  .want_pin = c->pipe->pin_host && !mlo_env_flag("MLO_NO_PINNED")};
  mlo_layout lay;
  pthread_mutex_lock(&c->pipe->lock); /* the layout sorts in c->scratch */
  rc = mlo_slab_layout(c, true, true, &lay);
  pthread_mutex_unlock(&c->pipe->lock);
  if (rc) return mlo_fail(c->pipe, rc, "out of host memory laying out '%s'", c->name);
  b.block_bytes = lay.block_bytes;
  b.slab_bytes = lay.slab_bytes;
  b.lay = lay;
  if (c->want_disk) { /* the disk tier: its files are its host copy */
    /* one that streams: a slab of address space, its streamed blocks read
     * into it once planned (pageable: only those pages are touched and
     * page-locked) */
    if (c->want_partial && b.slab_bytes) {
      rc = mlo_plat_host_alloc(c->pipe->platform, b.slab_bytes, false, &b.slab, &b.pinned);
      b.filled = mlo_calloc(b.lay.nblocks ? b.lay.nblocks : 1, sizeof *b.filled);
      if (rc || !b.filled) {
        if (!rc) mlo_plat_host_free(c->pipe->platform, b.slab, b.slab_bytes, false);
        free(b.filled);
        mlo_layout_free(&b.lay);
        return mlo_fail(c->pipe, MLO_ENOMEM, "%s: cannot reserve a %llu-byte host slab", c->name,
                        (unsigned long long)b.slab_bytes);
      }
    }
    if (c->pipe->comm && b.slab_bytes && !(rc = agree(c, &b))) /* ranks: the same files, sliced */
      rc = agree_content(c);
    if (rc || (rc = mlo_disk_prepare(c, &b.lay))) {
      if (b.slab) mlo_plat_host_free(c->pipe->platform, b.slab, b.slab_bytes, false);
      free(b.filled);
      mlo_layout_free(&b.lay);
      return rc;
    }
    publish(c, &b);
    return MLO_OK;
  }
  if (!(rc = alloc_slab(c, &b))) {
    fill_slab(c, &b);
    take_my_share(c, &b);
    rc = read_files(c, &b);
  }
  if (rc) {
    undo(c, &b);
    mlo_layout_free(&b.lay);
    return rc;
  }
  free(b.files);
  b.files = NULL;
  publish(c, &b);
  log_materialized(c, &b, t0);
  return MLO_OK;
}

void mlo_slab_allow_writeback(mlo_component *c) {
  mlo_platform *p = c->pipe->platform;
  for (size_t r = 0; r < c->next_runs; r++) {
    struct mlo_ext_run *run = &c->ext_runs[r];
    if (!run->ro) continue;
    c->stats.platform_calls += 2;
    mlo_plat_host_unregister(p, run->base);
    /* else pageable: copied below link speed, still right */
    bool ok = mlo_plat_host_register(p, run->base, run->bytes, false) == MLO_OK;
    for (size_t i = 0; i < c->ntensors; i++) {
      mlo_tensor *t = c->tensors[i];
      if (!in_run(run, t)) continue;
      t->registered = ok;
      t->registered_ro = false;
      if (!ok) c->pageable_bytes += t->nbytes;
    }
    run->ro = false;
    if (!ok) /* gone: the last one takes its place, looked at next */
      c->ext_runs[r--] = c->ext_runs[--c->next_runs];
  }
  if (c->slab_registered_ro) {
    c->stats.platform_calls += 2;
    mlo_plat_host_unregister(p, c->slab);
    c->slab_registered = mlo_plat_host_register(p, c->slab, (size_t)c->slab_bytes, false) == MLO_OK;
    c->slab_registered_ro = false;
    if (!c->slab_registered) {
      c->pipe->pinned_bytes -= c->slab_bytes;
      if (c->slab_shared) c->slab_pinned = false; /* a fallback's says how it was allocated */
      c->pageable_bytes += c->slab_bytes;
    }
  }
}

void mlo_slab_free(mlo_component *c) {
  unregister_external(c);
  if (c->on_disk) {
    mlo_disk_free_partial(c);
    free(c->disk_files);
    c->disk_files = NULL;
    c->ndisk_files = 0;
    c->pipe->disk_bytes -= c->slab_bytes;
    c->on_disk = false;
    c->materialized = false;
    return;
  }
  if (!c->slab) return;
  /* page-locked: allocated so, or registered (a shared or fallback slab) */
  bool locked = c->slab_pinned || (c->slab_registered && !c->slab_shared);
  if (c->slab_registered) {
    c->stats.platform_calls++;
    mlo_plat_host_unregister(c->pipe->platform, c->slab);
  }
  if (c->slab_shared) {
    mlo_dist_shared_free(c->pipe->comm, c->slab_shared); /* the node frees it together */
    c->pipe->dist.shared_bytes -= c->slab_bytes;
  } else {
    mlo_plat_host_free(c->pipe->platform, c->slab, c->slab_bytes, c->slab_pinned);
  }
  c->slab_shared = NULL;
  c->slab_registered = false;
  c->pipe->host_slab_bytes -= c->slab_bytes;
  if (locked) c->pipe->pinned_bytes -= c->slab_bytes;
  c->slab = NULL;
  c->materialized = false;
}

int mlo_component_materialize(mlo_component *c) {
  if (!c) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  bool done = c->materialized; /* lets delegates load inside their enable */
  pthread_mutex_unlock(&c->pipe->lock);
  if (done) return MLO_OK;
  MLO_LOCK_OR(&c->pipe->setup_lock, mlo_reentered(c->pipe));
  int rc = mlo_slab_materialize(c);
  pthread_mutex_unlock(&c->pipe->setup_lock);
  return rc;
}

int mlo_pipeline_materialize(mlo_pipeline *pipe) {
  if (!pipe) return MLO_EINVAL;
  mlo_pipeline_warn_guessed(pipe);
  MLO_LOCK_OR(&pipe->setup_lock, mlo_reentered(pipe));
  int rc = MLO_OK;
  for (size_t i = 0; i < pipe->ncomps && !rc; i++) rc = mlo_slab_materialize(pipe->comps[i]);
  pthread_mutex_unlock(&pipe->setup_lock);
  return rc;
}

/* The pieces of c in the order they run, as laid out (materialized or
 * not): the public view of its layout. */
int mlo_component_blocks(mlo_component *c, mlo_block_info *out, size_t cap, size_t *count) {
  if (!c || (cap && !out)) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  /* a materialized component keeps its pieces; another is laid out now */
  mlo_layout lay = {.nblocks = c->nblocks, .pro = c->pro, .epi = c->epi, .spans = c->spans};
  int rc = c->materialized ? MLO_OK : mlo_slab_layout(c, false, true, &lay);
  if (!rc) {
    if (count) *count = lay.nblocks + 2;
    /* prologue, the blocks, epilogue: in the order they run */
    for (size_t i = 0; i < cap && i < lay.nblocks + 2; i++) {
      const struct mlo_span *s = i == 0                 ? &lay.pro
                                 : i == lay.nblocks + 1 ? &lay.epi
                                                        : &lay.spans[i - 1];
      out[i] = (mlo_block_info){sizeof *out,
                                i == 0                 ? MLO_BLOCK_PROLOGUE
                                : i == lay.nblocks + 1 ? MLO_BLOCK_EPILOGUE
                                                       : (int)(i - 1),
                                s->off, s->bytes, s->tensors};
    }
    if (!c->materialized) mlo_layout_free(&lay);
  } else {
    rc = mlo_fail(pipe, rc, "out of host memory laying out '%s'", c->name);
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}
