/*
 * sys_sweep.c — SQLite's way of testing failure handling: every host
 * allocation, file open and file read the library makes goes through one
 * fault point (src/base/sysio.h); this program fails each one in turn
 * across a whole cycle — platform open, pipeline directory open, inspect,
 * materialize, enable, a Wan-shaped schedule, free — and checks the answer:
 *
 *  - a failed allocation comes back as MLO_ENOMEM, a failed open or read as
 *    MLO_EIO, always with a message (never "malformed" for out-of-memory);
 *  - or, where the library could absorb it (a best-effort class lookup),
 *    the run succeeds with the same digest: nothing silently different;
 *  - a short read is not an error: every such point must succeed with the
 *    same digest (callers loop);
 *  - the audit is clean after the failure, nothing leaks (LeakSanitizer in
 *    the ASan run), and the same cycle retried without the fault succeeds
 *    with the same digest.
 *
 *   sys_sweep            every point of every kind (the suite)
 *   sys_sweep --preset P the same over a generated preset (mlo synth P at
 *                        scale 0.0002: real tensor names and layouts; slow)
 *   sys_sweep KIND N     one point, for a failure to be replayed in a debugger
 *
 * The pipeline is a small diffusers-style directory built in a temporary
 * folder: a sharded transformer with a weight map, a second transformer, a
 * text encoder and a VAE, each with a config.json.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"

#include "base/sysio.h"
#include "format/safetensors.h"
#include "synth/synth.h"
#include "mlo/checkpoint.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void put_text(const char *rel, const char *text) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  tu_write_text(path, text);
}

/* A safetensors file of n bf16 tensors [rows, 8] with bytes from seed. */
static void put_weights(const char *rel, const char *prefix, int n, int seed) {
  char path[512], name[64];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  mlo_st_writer *w;
  assert_ok(mlo_st_writer_create(&w));
  static uint8_t data[8][4096];
  for (int i = 0; i < n; i++) {
    tu_fill_pattern(data[i], sizeof data[i], (uint32_t)(seed * 16 + i));
    int64_t shape[2] = {16 + 8 * i, 8};
    snprintf(name, sizeof name, "%s.%d.weight", prefix, i);
    assert_ok(mlo_st_writer_add(w, name, MLO_DTYPE_BF16, 2, shape, data[i], (uint64_t)shape[0] * 16,
                                true));
  }
  char err[256];
  assert_ok(mlo_st_writer_write(w, path, err, sizeof err));
  mlo_st_writer_free(w);
}

static void build_dir(void) {
  snprintf(root, sizeof root, "/tmp/mlo_sys_sweep_XXXXXX");
  assert_non_null(mkdtemp(root));
  put_text("model_index.json", "{\"_class_name\": \"WanPipeline\", \"boundary_ratio\": 0.875,"
                               " \"text_encoder\": [\"transformers\", \"UMT5EncoderModel\"],"
                               " \"transformer\": [\"diffusers\", \"WanTransformer3DModel\"],"
                               " \"transformer_2\": [\"diffusers\", \"WanTransformer3DModel\"],"
                               " \"vae\": [\"diffusers\", \"AutoencoderKLWan\"]}");
  static const char *const folders[] = {"text_encoder", "transformer", "transformer_2", "vae"};
  char path[512];
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", root, folders[i]);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", folders[i]);
    put_text(path, "{\"_class_name\": \"X\"}");
  }
  put_weights("text_encoder/model.safetensors", "encoder.block", 3, 1);
  put_weights("transformer/diffusion_pytorch_model-00001-of-00002.safetensors", "blocks.a", 2, 2);
  put_weights("transformer/diffusion_pytorch_model-00002-of-00002.safetensors", "blocks.b", 2, 3);
  put_text("transformer/diffusion_pytorch_model.safetensors.index.json",
           "{\"metadata\": {}, \"weight_map\": {"
           "\"blocks.a.0.weight\": \"diffusion_pytorch_model-00001-of-00002.safetensors\","
           "\"blocks.a.1.weight\": \"diffusion_pytorch_model-00001-of-00002.safetensors\","
           "\"blocks.b.0.weight\": \"diffusion_pytorch_model-00002-of-00002.safetensors\","
           "\"blocks.b.1.weight\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"}}");
  put_weights("transformer_2/diffusion_pytorch_model.safetensors", "blocks", 2, 4);
  put_weights("vae/diffusion_pytorch_model.safetensors", "decoder.conv", 2, 5);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* ---- one cycle ----------------------------------------------------------- */

typedef struct {
  uint64_t digest;
} fold;

/* Folds every tensor's device bytes (host platform: addressable). */
static int fold_forward(mlo_component *c, void *user) {
  fold *f = user;
  for (size_t i = 0; i < mlo_component_tensor_count(c); i++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    const uint8_t *p = mlo_tensor_device_ptr(t);
    uint64_t n = mlo_tensor_nbytes(t), word;
    if (!p && n) return 1;
    for (uint64_t k = 0; k + 8 <= n; k += 8) { /* words: the preset sweep folds GBs */
      memcpy(&word, p + k, 8);
      f->digest = (f->digest ^ word) * 0x100000001b3ull;
    }
    for (uint64_t k = n & ~(uint64_t)7; k < n; k++)
      f->digest = (f->digest ^ p[k]) * 0x100000001b3ull;
  }
  return 0;
}

typedef struct {
  int rc;
  char msg[768];
  uint64_t digest;
  bool audit_ok;
} cycle_result;

static int step(cycle_result *r, mlo_pipeline *pipe, int rc) {
  if (rc && !r->msg[0]) snprintf(r->msg, sizeof r->msg, "%s", mlo_pipeline_errmsg(pipe));
  return rc;
}

static void cycle(cycle_result *r) {
  memset(r, 0, sizeof *r);
  r->audit_ok = true;
  mlo_platform *plat = NULL;
  r->rc = mlo_platform_open("host:capacity=512M,jitter=0", &plat, r->msg, sizeof r->msg);
  if (r->rc) return;
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *pipe = NULL;
  r->rc = mlo_pipeline_open_path(&po, root, NULL, &pipe, r->msg, sizeof r->msg);
  if (r->rc) goto out_close;
  uint64_t bytes = 0; /* inspect: what `mlo inspect` reads */
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++)
    bytes += mlo_component_bytes(mlo_pipeline_component_at(pipe, i));
  fold f = {0xcbf29ce484222325ull ^ bytes};
  int rc = step(r, pipe, mlo_pipeline_materialize(pipe));
  if (!rc) rc = step(r, pipe, mlo_offload_enable(pipe, NULL));
  static const char *const schedule[] = {"text_encoder", "transformer",   "transformer",
                                         "transformer",  "transformer_2", "transformer_2"};
  for (size_t i = 0; i < sizeof schedule / sizeof schedule[0] && !rc; i++)
    rc = step(r, pipe,
              mlo_component_forward(mlo_pipeline_find(pipe, schedule[i]), fold_forward, &f));
  mlo_component *vae = mlo_pipeline_find(pipe, "vae");
  if (!rc) rc = step(r, pipe, mlo_component_acquire(vae));
  if (!rc) {
    fold_forward(vae, &f);
    rc = step(r, pipe, mlo_component_release(vae));
  }
  r->audit_ok = mlo_pipeline_audit(pipe) == MLO_OK;
  r->rc = rc;
  r->digest = f.digest;
  mlo_pipeline_free(pipe);
out_close:
  mlo_platform_close(plat);
}

/* ---- the sweep ----------------------------------------------------------- */

static cycle_result clean;

static int expected_status(mlo_sysfault_kind kind) {
  return kind == MLO_SYSFAULT_ALLOC ? MLO_ENOMEM : MLO_EIO;
}

/* Fails the nth call of kind; returns whether it fired.  Problems go to
 * stderr and count in *bad. */
static bool sweep_point(mlo_sysfault_kind kind, uint64_t n, unsigned *bad, unsigned *absorbed) {
  cycle_result r;
  mlo_sysfault_arm(kind, n);
  cycle(&r);
  bool fired = mlo_sysfault_fired();
  mlo_sysfault_disarm();
  const char *k = mlo_sysfault_name(kind);
  if (!r.audit_ok) {
    fprintf(stderr, "%s #%llu: audit failed after %s\n", k, (unsigned long long)n,
            mlo_err_name(r.rc));
    ++*bad;
  }
  if (r.rc == MLO_OK) {
    if (r.digest != clean.digest) {
      fprintf(stderr, "%s #%llu: succeeded with another digest\n", k, (unsigned long long)n);
      ++*bad;
    }
    if (fired && kind != MLO_SYSFAULT_SHORT) ++*absorbed;
  } else if (!fired || kind == MLO_SYSFAULT_SHORT || r.rc != expected_status(kind) || !r.msg[0]) {
    fprintf(stderr, "%s #%llu: %s (%s), expected %s\n", k, (unsigned long long)n,
            mlo_err_name(r.rc), r.msg[0] ? r.msg : "no message",
            kind == MLO_SYSFAULT_SHORT ? "success" : mlo_err_name(expected_status(kind)));
    ++*bad;
  }
  cycle_result again; /* retried without the fault */
  cycle(&again);
  if (again.rc != MLO_OK || again.digest != clean.digest) {
    fprintf(stderr, "%s #%llu: the retry gave %s (%s)\n", k, (unsigned long long)n,
            mlo_err_name(again.rc), again.msg);
    ++*bad;
  }
  return fired;
}

/* The role warning of each cycle would fill the log: collected, not shown. */
static void quiet_log(mlo_log_level level, const char *msg, void *user) {
  (void)level, (void)msg, (void)user;
}

static void test_sweep(void **state) {
  (void)state;
  mlo_set_log(quiet_log, NULL, MLO_LOG_WARN);
  cycle(&clean);
  if (clean.rc) fail_msg("the clean cycle failed: %s (%s)", mlo_err_name(clean.rc), clean.msg);
  unsigned bad = 0;
  for (int kind = 0; kind < MLO_SYSFAULT_KINDS; kind++) {
    mlo_sysfault_arm((mlo_sysfault_kind)kind, 0); /* count only */
    cycle_result counted;
    cycle(&counted);
    uint64_t calls = mlo_sysfault_calls((mlo_sysfault_kind)kind);
    mlo_sysfault_disarm();
    assert_ok(counted.rc);
    assert_true(calls > 0);
    unsigned absorbed = 0, fired = 0;
    for (uint64_t n = 1; n <= calls; n++)
      fired += sweep_point((mlo_sysfault_kind)kind, n, &bad, &absorbed);
    printf("sys_sweep: %-5s %4llu points, %u fired, %u absorbed with the same digest\n",
           mlo_sysfault_name((mlo_sysfault_kind)kind), (unsigned long long)calls, fired, absorbed);
    /* the calls of a cycle are deterministic: every point fires */
    assert_int_equal(fired, (unsigned)calls);
  }
  mlo_set_log(NULL, NULL, MLO_LOG_WARN);
  assert_int_equal(bad, 0);
}

static int teardown(void **state) {
  (void)state;
  return nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(int argc, char **argv) {
  /* Thousands of cycles read the same files: keep them in the page cache
   * (the loader drops what it read, which would make every cycle a cold
   * read from the disk; what is swept here is failure handling). */
  setenv("MLO_KEEP_PAGE_CACHE", "1", 1);
  if (argc == 3 && !strcmp(argv[1], "--preset")) {
    snprintf(root, sizeof root, "/tmp/mlo_sys_sweep_XXXXXX");
    char err[512];
    if (!mkdtemp(root) || mlo_synth_write(argv[2], root, 0.0002, NULL, NULL, err, sizeof err)) {
      fprintf(stderr, "sys_sweep: cannot generate %s: %s\n", argv[2], err);
      return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep)};
    return cmocka_run_group_tests(tests, NULL, teardown);
  }
  build_dir();
  if (argc == 3) { /* replay one point */
    int kind = -1;
    for (int k = 0; k < MLO_SYSFAULT_KINDS; k++)
      if (!strcmp(argv[1], mlo_sysfault_name((mlo_sysfault_kind)k))) kind = k;
    if (kind < 0) return 2;
    cycle(&clean);
    unsigned bad = 0, absorbed = 0;
    bool fired = sweep_point((mlo_sysfault_kind)kind, strtoull(argv[2], NULL, 10), &bad, &absorbed);
    printf("%s #%s: %s, %u problem(s)\n", argv[1], argv[2], fired ? "fired" : "did not fire", bad);
    teardown(NULL);
    return bad ? 1 : 0;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep)};
  return cmocka_run_group_tests(tests, NULL, teardown);
}
