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

/* Computes the layout; with assign, stores each tensor's dev_offset.  On a
 * platform whose blocks are built from segments (caps.max_block_bytes) a
 * tensor that would straddle a segment boundary starts the next segment. */
uint64_t mlo_slab_layout(mlo_component *c, bool assign, uint64_t *slab_bytes) {
  uint64_t align = c->pipe->alignment, end = 0;
  uint64_t seg = c->pipe->platform->caps.max_block_bytes;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < c->ntensors; i++) {
      mlo_tensor *t = c->tensors[i];
      if (t->target || is_external(t) != (pass == 1)) continue;
      uint64_t off = t->nbytes ? align_up(end, align) : 0;
      if (seg && t->nbytes && t->nbytes <= seg && off / seg != (off + t->nbytes - 1) / seg)
        off = (off / seg + 1) * seg;
      if (assign) t->dev_offset = off;
      if (t->nbytes) end = off + t->nbytes;
    }
    if (pass == 0 && slab_bytes) *slab_bytes = end;
  }
  return end;
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
 * pin, as the specification says of DTensors).  What stays pageable is
 * added to *pageable. */
static void register_external(mlo_component *c, uint64_t *pageable) {
  mlo_pipeline *pipe = c->pipe;
  bool may = pipe->pin_host && pipe->platform->caps.host_register && !mlo_env_flag("MLO_NO_PINNED");
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (t->target || !is_external(t) || !t->nbytes) continue;
    if (may && !(t->flags & MLO_TENSOR_SHARDED) && !t->registered) {
      c->stats.platform_calls++;
      t->registered =
          mlo_plat_host_register(pipe->platform, (void *)t->src_data, (size_t)t->nbytes) == MLO_OK;
    }
    if (!t->registered) *pageable += t->nbytes;
  }
}

int mlo_slab_materialize(mlo_component *c) {
  mlo_pipeline *pipe = c->pipe;
  if (c->materialized) return MLO_OK;
  uint64_t seg = pipe->platform->caps.max_block_bytes;
  for (size_t i = 0; seg && i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    if (!t->target && t->nbytes > seg) {
      char a[32], b[32];
      return mlo_fail(pipe, MLO_EUNSUPPORTED,
                      "%s: tensor '%s' (%s) is larger than this device's largest allocation "
                      "(%s): no block can hold it",
                      c->name, t->name, mlo_format_size(t->nbytes, a, sizeof a),
                      mlo_format_size(seg, b, sizeof b));
    }
  }
  uint64_t t0 = mlo_now_ns();
  uint64_t slab_bytes = 0;
  uint64_t block_bytes = mlo_slab_layout(c, true, &slab_bytes);
  void *slab = NULL;
  bool pinned = false;
  int rc = MLO_OK;
  mlo_tensor **files = NULL;
  size_t nfiles = 0;
  uint64_t file_bytes = 0;
  void *shared = NULL;
  bool together = true; /* a failure that every node rank reached: undone together */
  bool want_pin = pipe->pin_host && !mlo_env_flag("MLO_NO_PINNED");
  if (slab_bytes && pipe->comm) {
    /* One slab per node: every rank at this component, then one mapping */
    if ((rc = mlo_collective(pipe, c, COLL_MATERIALIZE, MLO_OK, NULL, NULL))) return rc;
    char err[256];
    rc = mlo_dist_shared_alloc(pipe->comm, (size_t)slab_bytes, &slab, &shared, err, sizeof err);
    if (rc) return mlo_fail(pipe, rc, "%s: node-shared slab: %s", c->name, err);
  } else if (slab_bytes) {
    rc = mlo_plat_host_alloc(pipe->platform, slab_bytes, want_pin, &slab, &pinned);
    if (rc)
      return mlo_fail(pipe, rc == MLO_ENOMEM ? MLO_ENOMEM : rc,
                      "%s: cannot allocate a %llu-byte host slab", c->name,
                      (unsigned long long)slab_bytes);
  }
  if (slab_bytes) {
    files = mlo_malloc(c->ntensors * sizeof *files);
    if (!files) {
      rc = mlo_fail(pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
      goto out_free_slab;
    }
  }
  uint64_t cursor = 0;
  /* A simulated device's slabs are address space only: nothing to fill,
   * no file to read (a projection of 60 GB reads headers alone). */
  bool fill = !pipe->platform->caps.simulated;
  /* A shared slab: node rank 0 writes what is not read from files; the
   * file bytes are split among the node's ranks below. */
  bool writer = !shared || mlo_dist_node_rank(pipe->comm) == 0;
  for (size_t i = 0; i < c->ntensors && fill; i++) {
    mlo_tensor *t = c->tensors[i];
    if (t->target || is_external(t) || !t->nbytes) continue;
    char *dst = (char *)slab + t->dev_offset;
    if (writer) memset((char *)slab + cursor, 0, t->dev_offset - cursor); /* padding */
    cursor = t->dev_offset + t->nbytes;
    if (t->src_file) {
      files[nfiles++] = t;
      file_bytes += t->nbytes;
    } else if (writer && t->src_data) {
      memcpy(dst, t->src_data, t->nbytes);
    } else if (writer) {
      memset(dst, 0, t->nbytes);
    }
  }
  if (shared && nfiles) {
    /* This rank's 1/n of the file bytes: the tensors whose first byte falls
     * in its share of the running total (declaration order, the same on
     * every rank), so the node reads the checkpoint once, in parallel. */
    uint64_t n = (uint64_t)mlo_dist_node_size(pipe->comm);
    uint64_t r = (uint64_t)mlo_dist_node_rank(pipe->comm), at = 0, mine_bytes = 0;
    size_t mine = 0;
    for (size_t i = 0; i < nfiles; i++) {
      uint64_t share =
          n && file_bytes ? (uint64_t)((double)at / (double)file_bytes * (double)n) : 0;
      at += files[i]->nbytes;
      if ((share < n ? share : n - 1) != r) continue;
      mine_bytes += files[i]->nbytes;
      files[mine++] = files[i];
    }
    nfiles = mine;
    file_bytes = mine_bytes;
  }
  c->slab = slab; /* the loader reads through c->slab */
  progress_sink ps;
  pthread_mutex_lock(&pipe->lock);
  ps.fn = pipe->progress;
  ps.user = pipe->progress_user;
  pthread_mutex_unlock(&pipe->lock);
  if (nfiles) rc = mlo_load_files(c, files, nfiles, file_bytes, ps.fn, ps.user);
  if (shared) { /* every rank learns of any rank's failure, and waits for all parts */
    char mine[200];
    snprintf(mine, sizeof mine, "%.190s", rc ? pipe->errmsg : "");
    int arc = mlo_collective(pipe, c, COLL_LOADED, rc, rc ? mine : NULL, &together);
    if (!rc) rc = arc;
  }
  if (rc) goto out_free_slab;
  free(files);
  bool registered = false;
  if (shared && want_pin && pipe->platform->caps.host_register) { /* pinned in place */
    c->stats.platform_calls++;
    registered = mlo_plat_host_register(pipe->platform, slab, (size_t)slab_bytes) == MLO_OK;
    pinned = registered;
  }
  uint64_t pageable = pinned ? 0 : slab_bytes;
  register_external(c, &pageable);
  pthread_mutex_lock(&pipe->lock);
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (!t->target && !is_external(t)) t->host = t->nbytes ? (char *)slab + t->dev_offset : slab;
  }
  c->slab_bytes = slab_bytes;
  c->slab_pinned = pinned;
  c->slab_shared = shared;
  c->slab_registered = registered;
  pipe->dist.read_bytes += file_bytes;
  if (shared) pipe->dist.shared_bytes += slab_bytes;
  c->block_bytes = block_bytes;
  c->pageable_bytes = pageable;
  c->materialized = true;
  c->state = MLO_RES_HOST;
  if (slab_bytes) c->stats.platform_calls++;
  pipe->host_slab_bytes += slab_bytes;
  if (pinned) pipe->pinned_bytes += slab_bytes;
  pthread_mutex_unlock(&pipe->lock);
  if (slab_bytes && !pinned && pipe->pin_host && pipe->platform->caps.pinned_host)
    mlo_logf(MLO_LOG_INFO, "%s: host slab is pageable (pinning unavailable or disabled)", c->name);
  if (slab_bytes && mlo_log_enabled(MLO_LOG_INFO)) {
    double secs = (double)(mlo_now_ns() - t0) / 1e9;
    char size[32];
    mlo_logf(MLO_LOG_INFO, "materialized %s: %s, %zu tensors, %s, %.3f s (%.2f GB/s)", c->name,
             mlo_format_size(slab_bytes, size, sizeof size), c->own_count,
             nfiles ? "read from files"
             : fill ? "from memory"
                    : "simulated",
             secs, secs > 0 ? (double)slab_bytes / secs / 1e9 : 0.0);
  }
  return MLO_OK;

out_free_slab:
  c->slab = NULL;
  free(files);
  if (shared && together)
    mlo_dist_shared_free(pipe->comm, shared); /* every rank failed here too */
  else if (shared) /* the agreement failed: the others may not be here to free it */
    mlo_logf(MLO_LOG_ERROR, "%s: node-shared slab left mapped: %s", c->name, pipe->errmsg);
  else if (slab)
    mlo_plat_host_free(pipe->platform, slab, slab_bytes, pinned);
  return rc;
}

void mlo_slab_free(mlo_component *c) {
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (!t->registered) continue;
    c->stats.platform_calls++;
    mlo_plat_host_unregister(c->pipe->platform, (void *)t->src_data);
    t->registered = false;
  }
  if (!c->slab) return;
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
  if (c->slab_pinned) c->pipe->pinned_bytes -= c->slab_bytes;
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
