/*
 * workload.h — the reference workload used by `mlo run` and the benches
 * (docs/cli.md, "The reference workload").  It is a benchmark workload, not a model: for each
 * 2-D weight W (out x in) of a component it computes Y = X * W^T for T
 * deterministic tokens in f32 (bf16/f16 widened, f32 accumulation) on the
 * platform's BLAS, and folds Y into a 64-bit digest; other tensors are
 * folded directly.  An offloaded run's digest must equal an all-resident
 * run's, bit for bit, on the same platform.
 *
 * One backend per platform (host: OpenBLAS; cuda: cuBLAS; opencl: CLBlast
 * or our own kernel) behind this small table; mlo_workload_open picks the
 * one matching mlo_platform_name().  The workload is not part of libmlo: it
 * is a static library of the tool, the benchmarks and the tests
 * (docs/modules.md), and its device back-ends are modules.
 */
#ifndef MLO_WORKLOAD_H
#define MLO_WORKLOAD_H

#include "mlo/mlo.h"

#include <stdint.h>

typedef struct mlo_workload mlo_workload;

struct mlo_workload_ops {
  const char *platform; /* matches mlo_platform_name() */
  int (*create)(mlo_platform *p, void **ctx);
  void (*destroy)(void *ctx);
  /* Y = X * W^T where W is the (out x in) tensor at (block, offset) on the
   * device, X is the (tokens x in) deterministic input (seeded by `seed`),
   * ordered on the platform's compute queue.  Folds Y into *digest
   * (mlo_digest_fold over Y's f32 bytes in row-major order). */
  int (*gemm_digest)(void *ctx, void *block, size_t offset, mlo_dtype dtype, int64_t out,
                     int64_t in, int tokens, uint64_t seed, uint64_t *digest);
  /* Folds a tensor's raw device bytes into *digest (non-2-D tensors). */
  int (*bytes_digest)(void *ctx, void *block, size_t offset, uint64_t nbytes, uint64_t *digest);
  /* Optional.  A backend with flush may defer the folds of the two calls
   * above (the device keeps computing while the host goes on, so forwards
   * return, and components are released and evicted, with work in flight —
   * as in a real engine); *digest must stay valid, and is final, only after
   * flush, which folds everything pending in the order it was issued.
   * NULL: folds are done before the calls return. */
  int (*flush)(void *ctx);
  /* Optional, for a backend that models compute instead of doing it (the
   * simulated platform's): a forward is this one call, which spends ns of
   * the device's time (mlo_workload_set_model_time) and folds it into
   * *digest.  With it, the two digest calls above are never made. */
  int (*model_forward)(void *ctx, uint64_t ns, uint64_t *digest);
};

extern const struct mlo_workload_ops mlo_workload_host_ops;
extern const struct mlo_workload_ops mlo_workload_sim_ops;
/* The back-end for a platform name: built in (host, sim) or from its module
 * (libmlo-workload-NAME.so, loaded now).  MLO_ENODEV with the reason in err. */
int mlo_workload_backend(const char *platform_name, const struct mlo_workload_ops **ops, char *err,
                         size_t errlen);

/* 64-bit FNV-1a-style fold used by every backend, so digests compare.  It
 * folds 8-byte little-endian words, then a byte-wise tail: folding a buffer
 * in pieces gives the same digest only if every piece but the last is a
 * multiple of 8 bytes (f32 rows of even length are). */
uint64_t mlo_digest_fold(uint64_t digest, const void *bytes, size_t len);
/* The deterministic input X[t][k] for a seed: identical on every backend. */
float mlo_workload_input(uint64_t seed, int64_t t, int64_t k);

/* ------------------------------------------------------------------------
 * The workload as callers use it (tools/mlo, bench): one per platform,
 * a per-forward digest of a component, and the reference schedule.
 * ---------------------------------------------------------------------- */

/* Default tokens T per role: an encoder sees a short prompt, a DiT the
 * latent tokens, a VAE a few latent frames. */
#define MLO_WORKLOAD_TOKENS_ENCODER 16
#define MLO_WORKLOAD_TOKENS_DIT 32
#define MLO_WORKLOAD_TOKENS_VAE 8
#define MLO_WORKLOAD_TOKENS_OTHER 8
#define MLO_WORKLOAD_TOKENS_MAX 4096

/* Opens the backend for a platform (by mlo_platform_name): host and sim are
 * built in, a device's is loaded from its module (libmlo-workload-cuda.so,
 * libmlo-workload-opencl.so).  MLO_ENODEV, with the reason in err (the
 * module missing, or its BLAS library), if there is none.  The platform must
 * outlive it. */
int mlo_workload_open(mlo_platform *platform, mlo_workload **out, char *err, size_t errlen);
/* A pipeline of several devices (mlo_pipeline_options.devices): the
 * backend on one more of them, of the first's kind; each forward then runs
 * on its component's device (mlo_component_platform).  The platform must
 * outlive the workload. */
#define MLO_WORKLOAD_MAX_DEVICES 16
int mlo_workload_add_device(mlo_workload *w, mlo_platform *platform, char *err, size_t errlen);
/* NULL is a no-op. */
void mlo_workload_close(mlo_workload *w);
/* Tokens T for forwards of components with this role (1..TOKENS_MAX). */
int mlo_workload_set_tokens(mlo_workload *w, mlo_role role, int tokens);
int mlo_workload_tokens(const mlo_workload *w, mlo_role role);
/* On a backend that models compute (the simulated platform): one forward
 * of comp takes ns.  A component never given a time takes 0.  MLO_EINVAL
 * on a backend that computes for real (its time is what it is). */
int mlo_workload_set_model_time(mlo_workload *w, const mlo_component *comp, uint64_t ns);

/* One forward of a resident component (call it inside a forward callback or
 * between acquire and release): every tensor the component owns, in index
 * order, gemm for 2-D F32/F16/BF16 weights, raw bytes otherwise.  Tensors
 * that only reference another component's storage are skipped (C6).
 * *digest receives this forward's digest. */
int mlo_workload_component_digest(mlo_workload *w, mlo_component *comp, uint64_t seed,
                                  uint64_t *digest);
/* A hooked forward (mlo_component_forward) running the above with seed =
 * step, then folding (step, forward digest) into *run_digest, so the order
 * of forwards changes the run digest. */
int mlo_workload_forward(mlo_workload *w, mlo_component *comp, uint64_t step, uint64_t *run_digest);

/* The reference schedule of `mlo run`: every encoder once (index order),
 * the DiT(s) for `steps` steps, every VAE once; OTHER components are not
 * run.  Two DiTs split as Wan2.2's experts do: the first (high-noise) for
 * the first `first_steps` steps, the second after (the caller computes the
 * split from the pipeline's scheduler: mlo_denoise_first_expert_steps);
 * more than two share the steps evenly in index order. */
typedef struct {
  mlo_component *comp;
  uint64_t step; /* the call's ordinal: the seed and the digest's step */
} mlo_workload_call;
/* Builds the call list (free() it).  MLO_EINVAL for steps < 1 or
 * first_steps outside [0, steps]. */
int mlo_workload_schedule(mlo_pipeline *pipe, int steps, int first_steps, mlo_workload_call **calls,
                          size_t *count);
/* Called after each forward of a run (progress display): done of total
 * forwards, comp the one that just ran. */
typedef void (*mlo_workload_step_fn)(size_t done, size_t total, const mlo_component *comp,
                                     void *user);
/* Runs the calls in order; *digest gets the run digest.  Stops at the first
 * failure; *failed (if given) is the component that failed. */
int mlo_workload_run(mlo_workload *w, const mlo_workload_call *calls, size_t count,
                     uint64_t *digest, mlo_workload_step_fn step_fn, void *user,
                     mlo_component **failed);

/* Device bytes each mode needs at its peak, from the declared roles:
 * all-resident = every component; model-level offload = the larger of
 * (VAEs + encoders), resident together after enable, and (VAEs + the
 * largest DiT).  *largest gets the component whose own size bounds the
 * model-level figure from below (the largest DiT or encoder), may be NULL. */
uint64_t mlo_workload_all_resident_bytes(mlo_pipeline *pipe);
uint64_t mlo_workload_model_offload_bytes(mlo_pipeline *pipe, mlo_component **largest);
/* The budget policy's least budget: the largest component alone (every
 * other one can be evicted while it runs); *largest gets it, may be NULL. */
uint64_t mlo_workload_largest_bytes(mlo_pipeline *pipe, mlo_component **largest);
/* The budget policy's least budget when it streams what it can
 * (docs/streaming.md): the largest of each component's
 * mlo_component_stream_least; *which (may be NULL) gets that component. */
uint64_t mlo_workload_stream_least_bytes(mlo_pipeline *pipe, mlo_component **which);

#endif
