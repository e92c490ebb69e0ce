/*
 * workload.c — the platform-independent half of the reference workload
 * (docs/cli.md, "The reference workload"): the digest, the deterministic input, picking a
 * backend for a platform, walking a component's tensors, and the schedule
 * `mlo run` executes.  The backends (host_blas.c, cuda, opencl) only do the
 * arithmetic on device memory; everything that decides what a digest covers
 * lives here so that every platform folds the same things in the same order.
 */
#include "base/sysio.h"
#include "workload/workload.h"

#include "base/hash.h"
#include "base/log.h"
#include "platform/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mlo_workload {
  const struct mlo_workload_ops *ops;
  void *ctx;
  mlo_platform *platform;
  int tokens[4]; /* indexed by mlo_role (DIT, ENCODER, VAE, OTHER) */
  struct model_time {
    const mlo_component *comp;
    uint64_t ns;
  } * times; /* a modelling backend's forward times, by component */
  size_t ntimes;
  /* a pipeline of several devices: the backend on each device after the
   * first (mlo_workload_add_device); a forward runs on its component's */
  struct {
    mlo_platform *platform;
    void *ctx;
  } more[MLO_WORKLOAD_MAX_DEVICES - 1];
  size_t nmore;
};

/* The backend context of comp's device. */
static void *ctx_of(const mlo_workload *w, const mlo_component *comp) {
  mlo_platform *p = mlo_component_platform(comp);
  for (size_t i = 0; i < w->nmore; i++)
    if (w->more[i].platform == p) return w->more[i].ctx;
  return w->ctx;
}

/* The back-end for a platform: host and sim are built in; a device's is
 * the module libmlo-workload-<platform>.so (its BLAS library, cuBLAS or
 * CLBlast, comes with it and with nothing else). */
int mlo_workload_backend(const char *platform_name, const struct mlo_workload_ops **ops, char *err,
                         size_t errlen) {
  static const struct mlo_workload_ops *const builtin[] = {&mlo_workload_host_ops,
                                                           &mlo_workload_sim_ops};
  for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
    if (platform_name && !strcmp(builtin[i]->platform, platform_name)) {
      *ops = builtin[i];
      return MLO_OK;
    }
  if (!platform_name || !*platform_name || strlen(platform_name) > 32 ||
      strspn(platform_name, "abcdefghijklmnopqrstuvwxyz0123456789") != strlen(platform_name))
    return mlo_errf(err, errlen, MLO_ENODEV, "no reference workload for platform '%s'",
                    platform_name ? platform_name : "");
  char file[48];
  snprintf(file, sizeof file, "workload-%s", platform_name);
  const struct mlo_module *m = NULL;
  char why[1536] = "";
  int rc = mlo_module_load(file, MLO_MODULE_WORKLOAD, &m, NULL, why, sizeof why);
  if (rc)
    return mlo_errf(err, errlen, rc, "no reference workload for platform '%s': %s", platform_name,
                    why);
  const struct mlo_workload_ops *found = m->impl;
  if (!found || !found->platform || strcmp(found->platform, platform_name))
    return mlo_errf(err, errlen, MLO_ENODEV, "module %s does not serve platform '%s'", file,
                    platform_name);
  /* what mlo_workload_open and a forward call without a check: a module's
   * table is checked before the first call through it */
  const char *missing = !found->create         ? "create"
                        : !found->destroy      ? "destroy"
                        : found->model_forward ? NULL
                        : !found->gemm_digest  ? "gemm_digest"
                        : !found->bytes_digest ? "bytes_digest"
                                               : NULL;
  if (missing)
    return mlo_errf(err, errlen, MLO_ENODEV, "module libmlo-%s.so: its ops table has no %s", file,
                    missing);
  *ops = found;
  return MLO_OK;
}

int mlo_workload_open(mlo_platform *platform, mlo_workload **out, char *err, size_t errlen) {
  if (!out) return MLO_EINVAL;
  *out = NULL;
  if (!platform) return MLO_EINVAL;
  const struct mlo_workload_ops *ops = NULL;
  int rc = mlo_workload_backend(mlo_platform_name(platform), &ops, err, errlen);
  if (rc) return rc;
  mlo_workload *w = mlo_calloc(1, sizeof *w);
  if (!w) return MLO_ENOMEM;
  w->ops = ops;
  w->platform = platform;
  w->tokens[MLO_ROLE_DIT] = MLO_WORKLOAD_TOKENS_DIT;
  w->tokens[MLO_ROLE_ENCODER] = MLO_WORKLOAD_TOKENS_ENCODER;
  w->tokens[MLO_ROLE_VAE] = MLO_WORKLOAD_TOKENS_VAE;
  w->tokens[MLO_ROLE_OTHER] = MLO_WORKLOAD_TOKENS_OTHER;
  rc = ops->create(platform, &w->ctx);
  if (rc) {
    free(w);
    return mlo_errf(err, errlen, rc, "the %s workload could not start: %s",
                    mlo_platform_name(platform), mlo_strerror(rc));
  }
  *out = w;
  return MLO_OK;
}

int mlo_workload_add_device(mlo_workload *w, mlo_platform *platform, char *err, size_t errlen) {
  if (!w || !platform) return MLO_EINVAL;
  if (w->nmore + 1 >= MLO_WORKLOAD_MAX_DEVICES)
    return mlo_errf(err, errlen, MLO_EINVAL, "the workload runs on at most %d devices",
                    MLO_WORKLOAD_MAX_DEVICES);
  if (strcmp(mlo_platform_name(platform), mlo_platform_name(w->platform)))
    return mlo_errf(err, errlen, MLO_EINVAL, "the workload's devices are of one kind: %s, not %s",
                    mlo_platform_name(w->platform), mlo_platform_name(platform));
  void *ctx = NULL;
  int rc = w->ops->create(platform, &ctx);
  if (rc)
    return mlo_errf(err, errlen, rc, "the %s workload could not start on a device: %s",
                    mlo_platform_name(platform), mlo_strerror(rc));
  w->more[w->nmore].platform = platform;
  w->more[w->nmore++].ctx = ctx;
  return MLO_OK;
}

void mlo_workload_close(mlo_workload *w) {
  if (!w) return;
  for (size_t i = 0; i < w->nmore; i++) w->ops->destroy(w->more[i].ctx);
  w->ops->destroy(w->ctx);
  free(w->times);
  free(w);
}

int mlo_workload_set_model_time(mlo_workload *w, const mlo_component *comp, uint64_t ns) {
  if (!w || !comp || !w->ops->model_forward) return MLO_EINVAL;
  for (size_t i = 0; i < w->ntimes; i++)
    if (w->times[i].comp == comp) {
      w->times[i].ns = ns;
      return MLO_OK;
    }
  struct model_time *grown = mlo_realloc(w->times, (w->ntimes + 1) * sizeof *grown);
  if (!grown) return MLO_ENOMEM;
  w->times = grown;
  w->times[w->ntimes++] = (struct model_time){comp, ns};
  return MLO_OK;
}

static uint64_t model_time(const mlo_workload *w, const mlo_component *comp) {
  for (size_t i = 0; i < w->ntimes; i++)
    if (w->times[i].comp == comp) return w->times[i].ns;
  return 0;
}

static bool role_index_ok(mlo_role role) {
  return role >= MLO_ROLE_DIT && role <= MLO_ROLE_OTHER;
}

int mlo_workload_set_tokens(mlo_workload *w, mlo_role role, int tokens) {
  if (!w || !role_index_ok(role) || tokens < 1 || tokens > MLO_WORKLOAD_TOKENS_MAX)
    return MLO_EINVAL;
  w->tokens[role] = tokens;
  return MLO_OK;
}

int mlo_workload_tokens(const mlo_workload *w, mlo_role role) {
  if (!w || !role_index_ok(role)) return 0;
  return w->tokens[role];
}

static bool is_gemm_dtype(mlo_dtype d) {
  return d == MLO_DTYPE_F32 || d == MLO_DTYPE_F16 || d == MLO_DTYPE_BF16;
}

/* One tensor's contribution to a forward's digest. */
static int tensor_digest(mlo_workload *w, void *ctx, const mlo_tensor *t, int tokens, uint64_t seed,
                         uint64_t *digest) {
  uint64_t nbytes = mlo_tensor_nbytes(t);
  if (nbytes == 0) return MLO_OK;
  void *block = NULL;
  size_t offset = 0;
  int rc = mlo_tensor_device(t, &block, &offset);
  if (rc) return rc;
  const int64_t *shape = mlo_tensor_shape(t);
  if (mlo_tensor_ndim(t) == 2 && is_gemm_dtype(mlo_tensor_dtype(t)))
    return w->ops->gemm_digest(ctx, block, offset, mlo_tensor_dtype(t), shape[0], shape[1], tokens,
                               seed, digest);
  return w->ops->bytes_digest(ctx, block, offset, nbytes, digest);
}

/* A tensor of the forward: its piece's place in the order the forward runs
 * them (prologue 0, block b at 1+b, epilogue last), then its name. */
typedef struct {
  const mlo_tensor *t;
  size_t piece;
} piece_tensor;

static int by_piece_then_name(const void *a, const void *b) {
  const piece_tensor *x = a, *y = b;
  if (x->piece != y->piece) return x->piece < y->piece ? -1 : 1;
  return strcmp(mlo_tensor_name(x->t), mlo_tensor_name(y->t));
}

static size_t piece_of(const mlo_tensor *t, size_t nblocks) {
  int b = mlo_tensor_block(t);
  return b == MLO_BLOCK_PROLOGUE ? 0 : b == MLO_BLOCK_EPILOGUE ? nblocks + 1 : (size_t)b + 1;
}

/* A modelling backend's forward: its time shared among the pieces by
 * their bytes, each block's between its begin and end where it streams. */
static int model_pieces(mlo_workload *w, mlo_component *comp, bool streamed, uint64_t *h) {
  uint64_t ns = model_time(w, comp);
  size_t n = 0;
  int rc = mlo_component_blocks(comp, NULL, 0, &n);
  if (rc) return rc;
  mlo_block_info *info = mlo_calloc(n, sizeof *info);
  if (!info) return MLO_ENOMEM;
  if ((rc = mlo_component_blocks(comp, info, n, NULL))) {
    free(info);
    return rc;
  }
  uint64_t total = 0, spent = 0, done = 0;
  for (size_t i = 0; i < n; i++) total += info[i].bytes;
  for (size_t i = 0; i < n && !rc; i++) {
    done += info[i].bytes;
    uint64_t upto = total ? (uint64_t)((double)ns * (double)done / (double)total) : ns;
    if (i + 1 == n) upto = ns;
    bool block = streamed && info[i].block >= 0;
    if (block) rc = mlo_block_begin(comp, (size_t)info[i].block);
    if (!rc) rc = w->ops->model_forward(ctx_of(w, comp), upto - spent, h);
    if (block) {
      int erc = mlo_block_end(comp, (size_t)info[i].block);
      if (!rc) rc = erc;
    }
    spent = upto;
  }
  free(info);
  return rc;
}

/* Issues a forward's folds into *h (deferred where the backend defers).
 * Tensors are folded piece by piece in the order the forward runs them
 * (blocks.c), each piece's in name order, not declaration order: the same
 * weights give the same digest however files split them (sharded or not,
 * shards in any order), and whether the component streams or not.  A
 * streamed component's blocks are begun before their tensors are read and
 * ended after (mlo_block_begin), as a real forward does. */
static int component_digest_into(mlo_workload *w, mlo_component *comp, uint64_t seed, uint64_t *h) {
  mlo_stream_info si;
  int rc = mlo_component_stream_info(comp, &si);
  if (rc) return rc;
  bool streamed = si.streamed_blocks > 0 || si.progressive; /* its blocks say where they are */
  if (w->ops->model_forward) return model_pieces(w, comp, streamed, h);
  mlo_role role = mlo_component_role(comp);
  int tokens = role_index_ok(role) ? w->tokens[role] : w->tokens[MLO_ROLE_OTHER];
  size_t n = mlo_component_tensor_count(comp), k = 0;
  size_t nblocks = mlo_component_block_count(comp);
  piece_tensor *own = mlo_malloc((n ? n : 1) * sizeof *own);
  if (!own) return MLO_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const mlo_tensor *t = mlo_component_tensor_at(comp, i);
    /* a reference is not ours to read; a shared tensor is folded under
     * each of its names (its storage is read once per name, moved once) */
    if (t && mlo_tensor_owner(t) == comp) own[k++] = (piece_tensor){t, piece_of(t, nblocks)};
  }
  qsort(own, k, sizeof *own, by_piece_then_name);
  size_t open = 0; /* the block begun (its piece), 0 for none */
  for (size_t i = 0; i < k && !rc; i++) {
    size_t p = own[i].piece;
    if (streamed && p != open) {
      if (open) rc = mlo_block_end(comp, open - 1);
      open = 0;
      if (!rc && p >= 1 && p <= nblocks && !(rc = mlo_block_begin(comp, p - 1))) open = p;
    }
    if (!rc) rc = tensor_digest(w, ctx_of(w, comp), own[i].t, tokens, seed, h);
  }
  if (open) {
    int erc = mlo_block_end(comp, open - 1);
    if (!rc) rc = erc;
  }
  free(own);
  return rc;
}

/* Every device's deferred folds (the first failure's status). */
static int flush(mlo_workload *w) {
  if (!w->ops->flush) return MLO_OK;
  int rc = w->ops->flush(w->ctx);
  for (size_t i = 0; i < w->nmore; i++) {
    int r = w->ops->flush(w->more[i].ctx);
    if (!rc) rc = r;
  }
  return rc;
}

int mlo_workload_component_digest(mlo_workload *w, mlo_component *comp, uint64_t seed,
                                  uint64_t *digest) {
  if (!w || !comp || !digest) return MLO_EINVAL;
  uint64_t h = MLO_FNV_BASIS;
  int rc = component_digest_into(w, comp, seed, &h);
  int frc = flush(w); /* h is the backend's until then, failure or not */
  if (!rc) rc = frc;
  if (rc) return rc;
  *digest = h;
  return MLO_OK;
}

struct forward_args {
  mlo_workload *w;
  uint64_t seed;
  uint64_t *digest; /* final after the backend's flush when deferred */
  bool deferred;
  int status; /* the library status behind a callback failure */
};

static int forward_cb(mlo_component *comp, void *user) {
  struct forward_args *a = user;
  *a->digest = MLO_FNV_BASIS;
  a->status = a->deferred ? component_digest_into(a->w, comp, a->seed, a->digest)
                          : mlo_workload_component_digest(a->w, comp, a->seed, a->digest);
  return a->status ? 1 : 0;
}

/* One hooked forward; its digest lands in *digest (at flush, if deferred). */
static int forward_into(mlo_workload *w, mlo_component *comp, uint64_t step, bool deferred,
                        uint64_t *digest) {
  struct forward_args a = {w, step, digest, deferred, MLO_OK};
  int rc = mlo_component_forward(comp, forward_cb, &a);
  /* Report the workload's own status rather than the generic
   * MLO_ECALLBACK, so a caller sees e.g. MLO_ENOMEM. */
  if (rc == MLO_ECALLBACK && a.status) return a.status;
  return rc;
}

int mlo_workload_forward(mlo_workload *w, mlo_component *comp, uint64_t step,
                         uint64_t *run_digest) {
  if (!w || !comp || !run_digest) return MLO_EINVAL;
  uint64_t d = 0;
  int rc = forward_into(w, comp, step, false, &d);
  if (rc) return rc;
  uint64_t pair[2] = {step, d};
  *run_digest = mlo_digest_fold(*run_digest, pair, sizeof pair);
  return MLO_OK;
}

/* Collects the components of one role in index order. */
static size_t components_of(mlo_pipeline *pipe, mlo_role role, mlo_component **out) {
  size_t n = mlo_pipeline_component_count(pipe), k = 0;
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    if (mlo_component_role(c) == role) {
      if (out) out[k] = c;
      k++;
    }
  }
  return k;
}

/* Which DiT runs step s of `steps` (see the header for the rule). */
static size_t dit_for_step(size_t ndit, int s, int steps, int first_steps) {
  if (ndit <= 1) return 0;
  if (ndit == 2) return s < first_steps ? 0 : 1;
  return (size_t)s * ndit / (size_t)steps;
}

int mlo_workload_schedule(mlo_pipeline *pipe, int steps, int first_steps, mlo_workload_call **calls,
                          size_t *count) {
  if (!pipe || !calls || !count || steps < 1 || first_steps < 0 || first_steps > steps)
    return MLO_EINVAL;
  *calls = NULL;
  *count = 0;
  size_t ncomp = mlo_pipeline_component_count(pipe);
  mlo_component **dits = mlo_calloc(ncomp ? ncomp : 1, sizeof *dits);
  mlo_workload_call *list = mlo_calloc(ncomp + (size_t)steps, sizeof *list);
  if (!dits || !list) {
    free(dits);
    free(list);
    return MLO_ENOMEM;
  }
  size_t ndit = components_of(pipe, MLO_ROLE_DIT, dits), k = 0;
  for (size_t i = 0; i < ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    if (mlo_component_role(c) == MLO_ROLE_ENCODER) list[k++].comp = c;
  }
  for (int s = 0; ndit && s < steps; s++)
    list[k++].comp = dits[dit_for_step(ndit, s, steps, first_steps)];
  for (size_t i = 0; i < ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    if (mlo_component_role(c) == MLO_ROLE_VAE) list[k++].comp = c;
  }
  for (size_t i = 0; i < k; i++) list[i].step = i;
  free(dits);
  *calls = list;
  *count = k;
  return MLO_OK;
}

int mlo_workload_run(mlo_workload *w, const mlo_workload_call *calls, size_t count,
                     uint64_t *digest, mlo_workload_step_fn step_fn, void *user,
                     mlo_component **failed) {
  if (failed) *failed = NULL;
  if (!w || (!calls && count) || !digest) return MLO_EINVAL;
  /* Each forward's digest is folded by the backend when its results are
   * back (a deferring backend keeps the device busy across forwards);
   * the run's digest folds them in order once all are in. */
  uint64_t *fd = mlo_calloc(count ? count : 1, sizeof *fd);
  if (!fd) return MLO_ENOMEM;
  int rc = MLO_OK;
  for (size_t i = 0; i < count && !rc; i++) {
    rc = forward_into(w, calls[i].comp, calls[i].step, true, &fd[i]);
    if (rc && failed) *failed = calls[i].comp;
    if (!rc && step_fn) step_fn(i + 1, count, calls[i].comp, user);
  }
  int frc = flush(w); /* fd is the backend's until then */
  if (!rc) rc = frc;
  uint64_t h = MLO_FNV_BASIS;
  for (size_t i = 0; i < count && !rc; i++) {
    uint64_t pair[2] = {calls[i].step, fd[i]};
    h = mlo_digest_fold(h, pair, sizeof pair);
  }
  free(fd);
  if (rc) return rc;
  *digest = h;
  return MLO_OK;
}

/* The library's own rules (mlo_pipeline_get_needs), not repeated here. */
static mlo_pipeline_needs needs_of(mlo_pipeline *pipe) {
  mlo_pipeline_needs n = {.size = sizeof n};
  if (pipe) mlo_pipeline_get_needs(pipe, UINT64_MAX, &n);
  return n;
}

uint64_t mlo_workload_all_resident_bytes(mlo_pipeline *pipe) {
  return needs_of(pipe).all_resident;
}

uint64_t mlo_workload_largest_bytes(mlo_pipeline *pipe, mlo_component **largest) {
  uint64_t best = 0;
  mlo_component *big = NULL;
  size_t n = pipe ? mlo_pipeline_component_count(pipe) : 0;
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    if (!big || mlo_component_bytes(c) > best) {
      big = c;
      best = mlo_component_bytes(c);
    }
  }
  if (largest) *largest = big;
  return best;
}

uint64_t mlo_workload_stream_least_bytes(mlo_pipeline *pipe, mlo_component **which) {
  mlo_pipeline_needs n = needs_of(pipe);
  if (which) *which = (mlo_component *)n.policy_least_by[MLO_POLICY_BUDGET];
  return n.policy_least[MLO_POLICY_BUDGET];
}

uint64_t mlo_workload_model_offload_bytes(mlo_pipeline *pipe, mlo_component **largest) {
  mlo_pipeline_needs n = needs_of(pipe);
  if (largest) *largest = (mlo_component *)n.policy_least_by[MLO_POLICY_STRICT];
  return n.policy_least[MLO_POLICY_STRICT];
}
