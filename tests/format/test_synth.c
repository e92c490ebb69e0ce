/*
 * test_synth.c — the preset generator: every preset writes at a tiny scale
 * and opens back as the pipeline it imitates (components, roles, shards,
 * byte totals); sizes follow the scale; weights are deterministic, finite
 * and small; a finished directory is reused and a changed one rewritten
 * without leaving strays.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"

#include "mlo/checkpoint.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TINY 1e-4 /* 4-10 MB per preset */

static char root[256];
static mlo_platform *plat;
static char err[1024];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/mlo_synth_XXXXXX");
  if (!mkdtemp(root)) return -1;
  mlo_set_log(NULL, NULL, MLO_LOG_ERROR); /* the role guesses warn by design */
  return mlo_platform_open("host", &plat, NULL, 0) == MLO_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  mlo_platform_close(plat);
  return nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void sub(char *buf, size_t len, const char *a, const char *b) {
  snprintf(buf, len, "%s/%s%s%s", root, a, b ? "/" : "", b ? b : "");
}

static mlo_pipeline *open_dir(const char *dir) {
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *pipe = NULL;
  int rc = mlo_pipeline_open_path(&po, dir, NULL, &pipe, err, sizeof err);
  if (rc != MLO_OK) fail_msg("open %s: %s: %s", dir, mlo_err_name(rc), err);
  return pipe;
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static int config_int(const char *dir, const char *comp, const char *key) {
  char path[512], buf[8192];
  snprintf(path, sizeof path, "%s/%s/config.json", dir, comp);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *cfg = cJSON_Parse(buf);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  assert_true(cJSON_IsNumber(v));
  int value = v->valueint;
  cJSON_Delete(cfg);
  return value;
}

static void test_presets_listed(void **state) {
  (void)state;
  const char *want[] = {"wan2.2-t2v", "flux", "qwen-image", "sd3"};
  const mlo_synth_preset_info *p = mlo_synth_presets();
  size_t n = 0;
  for (; p[n].name; n++) assert_true(strlen(p[n].description) > 10);
  assert_int_equal(n, 4);
  for (size_t i = 0; i < 4; i++) assert_string_equal(p[i].name, want[i]);
}

/* Full sizes are the real models' (bf16), and every scale lands within
 * 25% of scale x full size from tens of MB up. */
static void test_scale_accuracy(void **state) {
  (void)state;
  const char *names[] = {"wan2.2-t2v", "flux", "qwen-image", "sd3"};
  const double lo_gb[] = {64, 31, 54, 25}, hi_gb[] = {72, 36, 61, 30};
  const double scales[] = {1e-3, 3e-3, 1e-2, 0.03, 0.1, 0.5, 2.0};
  for (int i = 0; i < 4; i++) {
    uint64_t full;
    assert_ok(mlo_synth_bytes(names[i], 1.0, &full));
    if (full / 1e9 < lo_gb[i] || full / 1e9 > hi_gb[i])
      fail_msg("%s full size %.2f GB", names[i], full / 1e9);
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
      uint64_t b;
      assert_ok(mlo_synth_bytes(names[i], scales[k], &b));
      double ratio = (double)b / (scales[k] * (double)full);
      if (ratio < 0.75 || ratio > 1.25)
        fail_msg("%s at %g: %.3f x the target", names[i], scales[k], ratio);
    }
  }
  uint64_t b;
  assert_status(mlo_synth_bytes("nope", 0.1, &b), MLO_ENOTFOUND);
  assert_status(mlo_synth_bytes("flux", 0, &b), MLO_EINVAL);
  assert_status(mlo_synth_bytes("flux", 4.5, &b), MLO_EINVAL);
  assert_status(mlo_synth_bytes("flux", NAN, &b), MLO_EINVAL);
  assert_status(mlo_synth_write("flux", root, -1, NULL, NULL, err, sizeof err), MLO_EINVAL);
  assert_status(mlo_synth_write("nope", root, 0.1, NULL, NULL, err, sizeof err), MLO_ENOTFOUND);
  assert_non_null(strstr(err, "nope"));
}

typedef struct {
  const char *preset;
  const char *names[6];
  mlo_role roles[6];
  const char *sharded; /* a component written in shards */
  const char *stem;
} expect_t;

static const expect_t expected[] = {
    {"wan2.2-t2v",
     {"text_encoder", "transformer", "transformer_2", "vae"},
     {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_DIT, MLO_ROLE_VAE},
     "transformer_2",
     "diffusion_pytorch_model"},
    {"flux",
     {"text_encoder", "text_encoder_2", "transformer", "vae"},
     {MLO_ROLE_ENCODER, MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE},
     "text_encoder_2",
     "model"},
    {"qwen-image",
     {"text_encoder", "transformer", "vae"},
     {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE},
     "transformer",
     "diffusion_pytorch_model"},
    {"sd3",
     {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"},
     {MLO_ROLE_ENCODER, MLO_ROLE_ENCODER, MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE},
     "text_encoder_3",
     "model"},
};

static void check_preset(const expect_t *x) {
  char dir[512], path[600];
  sub(dir, sizeof dir, x->preset, NULL);
  if (mlo_synth_write(x->preset, dir, TINY, NULL, NULL, err, sizeof err) != MLO_OK)
    fail_msg("write %s: %s", x->preset, err);
  uint64_t want;
  assert_ok(mlo_synth_bytes(x->preset, TINY, &want));
  assert_true(want > 1000000 && want < 20000000);
  snprintf(path, sizeof path, "%s/%s/%s-00002-of-", dir, x->sharded, x->stem);
  size_t len = strlen(path);
  snprintf(path + len, sizeof path - len, "%05d.safetensors", 2);
  assert_true(exists(path)); /* at least two shards */
  mlo_pipeline *pipe = open_dir(dir);
  size_t n = 0;
  while (n < 6 && x->names[n]) n++;
  assert_int_equal(mlo_pipeline_component_count(pipe), n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    assert_string_equal(mlo_component_name(c), x->names[i]);
    assert_int_equal(mlo_component_role(c), x->roles[i]);
    /* every preset's classes are real diffusers/transformers classes */
    assert_int_equal(mlo_component_role_source(c), MLO_ROLE_FROM_CLASS);
    assert_true(mlo_component_tensor_count(c) > 10);
    for (size_t t = 0; t < mlo_component_tensor_count(c); t++)
      total += mlo_tensor_nbytes(mlo_component_tensor_at(c, t));
  }
  assert_int_equal(total, want);
  mlo_pipeline_free(pipe);
}

static void test_every_preset_opens(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof expected / sizeof *expected; i++) check_preset(&expected[i]);
}

/* The Wan DiT's tensors follow diffusers' WanTransformer3DModel: 15 outside
 * the blocks, 27 per block, shapes from its config.json. */
static void test_wan_structure(void **state) {
  (void)state;
  char dir[512];
  sub(dir, sizeof dir, "wan", NULL);
  assert_ok(mlo_synth_write("wan2.2-t2v", dir, TINY, NULL, NULL, err, sizeof err));
  int layers = config_int(dir, "transformer", "num_layers");
  int64_t h = (int64_t)config_int(dir, "transformer", "num_attention_heads") *
              config_int(dir, "transformer", "attention_head_dim");
  int ffn = config_int(dir, "transformer", "ffn_dim");
  mlo_pipeline *pipe = open_dir(dir);
  mlo_component *dit = mlo_pipeline_find(pipe, "transformer_2");
  assert_int_equal(mlo_component_tensor_count(dit), 15 + 27 * (size_t)layers);
  mlo_tensor *q = mlo_component_find_tensor(dit, "blocks.0.attn2.to_q.weight");
  mlo_tensor *up = mlo_component_find_tensor(dit, "blocks.0.ffn.net.0.proj.weight");
  mlo_tensor *sst = mlo_component_find_tensor(dit, "scale_shift_table");
  assert_non_null(q), assert_non_null(up), assert_non_null(sst);
  assert_int_equal(mlo_tensor_shape(q)[0], h), assert_int_equal(mlo_tensor_shape(q)[1], h);
  assert_int_equal(mlo_tensor_shape(up)[0], ffn);
  assert_int_equal(mlo_tensor_dtype(q), MLO_DTYPE_BF16);
  assert_int_equal(mlo_tensor_dtype(sst), MLO_DTYPE_F32); /* kept in fp32, as diffusers does */
  assert_non_null(mlo_component_find_tensor(mlo_pipeline_find(pipe, "text_encoder"),
                                            "encoder.block.0.layer.1.DenseReluDense.wi_1.weight"));
  /* The two experts share names and shapes but not weights, so a forward
   * that read the wrong one would change the run's digest. */
  mlo_component *dit1 = mlo_pipeline_find(pipe, "transformer");
  assert_ok(mlo_component_materialize(dit1));
  assert_ok(mlo_component_materialize(dit));
  mlo_tensor *q1 = mlo_component_find_tensor(dit1, "blocks.0.attn2.to_q.weight");
  assert_int_equal(mlo_tensor_nbytes(q1), mlo_tensor_nbytes(q));
  assert_memory_not_equal(mlo_tensor_host_data(q1), mlo_tensor_host_data(q), mlo_tensor_nbytes(q));
  mlo_pipeline_free(pipe);
}

static void check_values(mlo_component *c, size_t *nonzero) {
  for (size_t t = 0; t < mlo_component_tensor_count(c); t++) {
    mlo_tensor *x = mlo_component_tensor_at(c, t);
    const uint8_t *p = mlo_tensor_host_data(x);
    bool f32 = mlo_tensor_dtype(x) == MLO_DTYPE_F32;
    uint64_t n = mlo_tensor_nbytes(x) / (f32 ? 4 : 2);
    for (uint64_t i = 0; i < n; i++) {
      uint32_t bits = f32 ? (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                                (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24
                          : ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16;
      float v;
      memcpy(&v, &bits, sizeof v);
      if (!isfinite(v) || fabsf(v) > 0.0315f)
        fail_msg("%s[%llu] = %g", mlo_tensor_name(x), (unsigned long long)i, v);
      *nonzero += v != 0;
    }
  }
}

static void test_weights_deterministic_and_small(void **state) {
  (void)state;
  char a[512], b[512], fa[600], fb[600];
  sub(a, sizeof a, "a", NULL), sub(b, sizeof b, "b", NULL);
  assert_ok(mlo_synth_write("flux", a, TINY, NULL, NULL, err, sizeof err));
  assert_ok(mlo_synth_write("flux", b, TINY, NULL, NULL, err, sizeof err));
  snprintf(fa, sizeof fa, "%s/transformer/diffusion_pytorch_model-00001-of-00002.safetensors", a);
  snprintf(fb, sizeof fb, "%s/transformer/diffusion_pytorch_model-00001-of-00002.safetensors", b);
  FILE *x = fopen(fa, "rb"), *y = fopen(fb, "rb");
  assert_non_null(x), assert_non_null(y);
  int ca, cb;
  size_t bytes = 0;
  do {
    ca = fgetc(x), cb = fgetc(y), bytes++;
    assert_int_equal(ca, cb);
  } while (ca != EOF);
  fclose(x), fclose(y);
  assert_true(bytes > 100000);
  mlo_pipeline *pipe = open_dir(a);
  assert_ok(mlo_pipeline_materialize(pipe));
  size_t nonzero = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++)
    check_values(mlo_pipeline_component_at(pipe, i), &nonzero);
  assert_true(nonzero > 1000000);
  mlo_pipeline_free(pipe);
}

static void count_progress(const char *file, uint64_t done, uint64_t total, void *user) {
  uint64_t *last = user;
  assert_non_null(file);
  assert_true(done <= total && done >= last[0]);
  last[0] = done, last[1] = total;
}

static void test_cache_and_rewrite(void **state) {
  (void)state;
  char dir[512], shard[600], stray[600];
  sub(dir, sizeof dir, "c", NULL);
  uint64_t prog[2] = {0, 0}, want;
  assert_ok(mlo_synth_write("sd3", dir, TINY, count_progress, prog, err, sizeof err));
  assert_ok(mlo_synth_bytes("sd3", TINY, &want));
  assert_int_equal(prog[0], want), assert_int_equal(prog[1], want);
  assert_true(mlo_synth_is_complete("sd3", dir, TINY));
  assert_false(mlo_synth_is_complete("sd3", dir, 2 * TINY));
  assert_false(mlo_synth_is_complete("flux", dir, TINY));
  snprintf(shard, sizeof shard, "%s/transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
           dir);
  struct stat before, after;
  assert_int_equal(stat(shard, &before), 0);
  prog[0] = 0;
  assert_ok(mlo_synth_write("sd3", dir, TINY, count_progress, prog, err, sizeof err));
  assert_int_equal(stat(shard, &after), 0);
  assert_int_equal(before.st_ino, after.st_ino); /* reused, not rewritten */
  assert_int_equal(prog[0], 0);
  /* a missing file is no cache hit */
  assert_int_equal(unlink(shard), 0);
  assert_false(mlo_synth_is_complete("sd3", dir, TINY));
  assert_ok(mlo_synth_write("sd3", dir, TINY, NULL, NULL, err, sizeof err));
  assert_true(exists(shard));
  /* another preset over it: the old files go, the new pipeline opens clean */
  assert_ok(mlo_synth_write("wan2.2-t2v", dir, TINY, NULL, NULL, err, sizeof err));
  snprintf(stray, sizeof stray, "%s/text_encoder_2/model.safetensors", dir);
  assert_false(exists(stray));
  snprintf(stray, sizeof stray, "%s/text_encoder_3", dir);
  assert_false(exists(stray)); /* emptied folders are removed too */
  mlo_pipeline *pipe = open_dir(dir);
  assert_int_equal(mlo_pipeline_component_count(pipe), 4);
  mlo_pipeline_free(pipe);
  /* a folder the generator did not make is refused, and left alone */
  char foreign[512], file[600];
  sub(foreign, sizeof foreign, "foreign", NULL);
  assert_int_equal(mkdir(foreign, 0755), 0);
  snprintf(file, sizeof file, "%s/keep.txt", foreign);
  FILE *f = fopen(file, "w");
  fputs("mine", f);
  fclose(f);
  assert_status(mlo_synth_write("flux", foreign, TINY, NULL, NULL, err, sizeof err), MLO_EEXIST);
  assert_non_null(strstr(err, "not empty"));
  snprintf(file, sizeof file, "%s/model_index.json", foreign);
  assert_false(exists(file));
}

/* A planted stamp that lists files behind a symlink out of the folder:
 * the generator removes only regular files inside its folder, and never
 * writes through a link it finds there. */
static void test_links_never_followed(void **state) {
  (void)state;
  char dir[300], outside[300], secret[400], path[2048];
  sub(dir, sizeof dir, "gen", NULL);
  sub(outside, sizeof outside, "outside", NULL);
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(mkdir(outside, 0755), 0);
  snprintf(secret, sizeof secret, "%s/secret", outside);
  tu_write_text(secret, "not the generator's");
  snprintf(path, sizeof path, "%s/lnk", dir);
  assert_int_equal(symlink(outside, path), 0);
  snprintf(path, sizeof path, "%s/alias.json", dir);
  assert_int_equal(symlink(secret, path), 0);
  snprintf(path, sizeof path, "%s/.mlo-synth.json", dir);
  tu_write_text(path, "{\"generator\": \"mlo synth\", \"version\": 1, \"preset\": \"flux\","
                      " \"scale\": 1, \"complete\": true,"
                      " \"files\": [\"lnk/secret\", \"alias.json\", \"../outside/secret\"]}");
  tu_log_capture_begin();
  assert_ok(mlo_synth_write("sd3", dir, TINY, NULL, NULL, err, sizeof err));
  tu_log_capture_end();
  assert_true(exists(secret)); /* not removed through lnk/ nor through ../ */
  struct stat st;
  snprintf(path, sizeof path, "%s/alias.json", dir);
  assert_int_equal(lstat(path, &st), 0); /* a listed link is left, not followed */
  assert_true(S_ISLNK(st.st_mode));
  mlo_pipeline_free(open_dir(dir));
  /* a link planted where the generator writes a shard: refused, not written through */
  char sub_dir[400];
  snprintf(sub_dir, sizeof sub_dir, "%s/transformer", dir);
  snprintf(path, sizeof path, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", sub_dir);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(symlink(secret, path), 0);
  assert_false(mlo_synth_is_complete("sd3", dir, TINY)); /* a link is no shard */
  tu_log_capture_begin();
  int rc = mlo_synth_write("sd3", dir, TINY, NULL, NULL, err, sizeof err);
  tu_log_capture_end();
  assert_status(rc, MLO_EIO);
  assert_non_null(strstr(err, "refusing to write through it"));
  FILE *f = fopen(secret, "r");
  char buf[64] = "";
  assert_non_null(fgets(buf, sizeof buf, f));
  fclose(f);
  assert_string_equal(buf, "not the generator's");
  /* a whole component folder replaced by a link out of the folder */
  snprintf(path, sizeof path, "rm -rf '%s' && ln -s '%s' '%s'", sub_dir, outside, sub_dir);
  assert_int_equal(system(path), 0);
  assert_status(mlo_synth_write("sd3", dir, TINY, NULL, NULL, err, sizeof err), MLO_EIO);
  snprintf(path, sizeof path, "%s/config.json", outside);
  assert_false(exists(path));
}

/* mlo_synth_open declares exactly what mlo_synth_write writes: the same
 * components in the same order with the same roles, the same tensors
 * (names, dtypes, shapes, bytes), no source, and the schedule the written
 * directory's configs give. */
static void test_declared_equals_written(void **state) {
  (void)state;
  for (const mlo_synth_preset_info *p = mlo_synth_presets(); p->name; p++) {
    char dir[512];
    sub(dir, sizeof dir, p->name, NULL);
    assert_ok(mlo_synth_write(p->name, dir, TINY, NULL, NULL, err, sizeof err));
    mlo_pipeline *written = open_dir(dir), *declared = NULL;
    mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
    po.platform = plat;
    mlo_denoise_schedule sd = MLO_DENOISE_SCHEDULE_INIT, sw = MLO_DENOISE_SCHEDULE_INIT;
    assert_ok(mlo_synth_open(&po, p->name, TINY, &declared, &sd, err, sizeof err));
    assert_ok(mlo_denoise_schedule_read(dir, &sw, err, sizeof err));
    assert_int_equal(sd.kind, sw.kind);
    assert_true(sd.shift == sw.shift && sd.boundary_ratio == sw.boundary_ratio);
    assert_string_equal(sd.class_name, sw.class_name);
    size_t n = mlo_pipeline_component_count(written);
    assert_int_equal(mlo_pipeline_component_count(declared), n);
    for (size_t i = 0; i < n; i++) {
      mlo_component *a = mlo_pipeline_component_at(written, i);
      mlo_component *b = mlo_pipeline_component_at(declared, i);
      assert_string_equal(mlo_component_name(a), mlo_component_name(b));
      assert_int_equal(mlo_component_role(a), mlo_component_role(b));
      assert_int_equal(mlo_component_role_source(b), MLO_ROLE_FROM_CLASS);
      assert_int_equal(mlo_component_tensor_bytes(a), mlo_component_tensor_bytes(b));
      size_t nt = mlo_component_tensor_count(a);
      assert_int_equal(mlo_component_tensor_count(b), nt);
      for (size_t k = 0; k < nt; k++) {
        const mlo_tensor *ta = mlo_component_tensor_at(a, k);
        const mlo_tensor *tb = mlo_component_find_tensor(b, mlo_tensor_name(ta));
        assert_non_null(tb);
        assert_int_equal(mlo_tensor_dtype(ta), mlo_tensor_dtype(tb));
        assert_int_equal(mlo_tensor_ndim(ta), mlo_tensor_ndim(tb));
        for (int d = 0; d < mlo_tensor_ndim(ta); d++)
          assert_int_equal(mlo_tensor_shape(ta)[d], mlo_tensor_shape(tb)[d]);
        assert_null(mlo_tensor_file(tb, NULL));
      }
    }
    mlo_pipeline_free(written);
    mlo_pipeline_free(declared);
  }
  /* refusals leave nothing behind */
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *out = (mlo_pipeline *)&po;
  assert_status(mlo_synth_open(&po, "nope", 1.0, &out, NULL, err, sizeof err), MLO_ENOTFOUND);
  assert_null(out);
  assert_non_null(strstr(err, "nope"));
  assert_status(mlo_synth_open(&po, "flux", 0.0, &out, NULL, err, sizeof err), MLO_EINVAL);
  assert_null(out);
}

/* NAME:full-depth: the real model at scale 1, within 25% of the target at
 * every scale, and the real layer count at any scale (Wan2.2's DiTs have
 * 40 blocks, its UMT5 encoder 24), written and declared alike; the stamp
 * tells it from the plain preset, and no other suffix is a preset. */
static void test_full_depth(void **state) {
  (void)state;
  for (const mlo_synth_preset_info *p = mlo_synth_presets(); p->name; p++) {
    char deep[64];
    snprintf(deep, sizeof deep, "%s:full-depth", p->name);
    uint64_t full, plain;
    assert_ok(mlo_synth_bytes(deep, 1.0, &full));
    assert_ok(mlo_synth_bytes(p->name, 1.0, &plain));
    assert_int_equal(full, plain);
    assert_string_equal(mlo_synth_preset_of(deep), p->name); /* what mlo plan plans */
    assert_string_equal(mlo_synth_preset_of(p->name), p->name);
    const double scales[] = {1e-3, 1e-2, 0.1};
    for (size_t k = 0; k < 3; k++) {
      uint64_t b;
      assert_ok(mlo_synth_bytes(deep, scales[k], &b));
      double ratio = (double)b / (scales[k] * (double)full);
      if (ratio < 0.75 || ratio > 1.25)
        fail_msg("%s at %g: %.3f x the target", deep, scales[k], ratio);
    }
  }
  char dir[512];
  sub(dir, sizeof dir, "deep", NULL);
  assert_ok(mlo_synth_write("wan2.2-t2v:full-depth", dir, TINY, NULL, NULL, err, sizeof err));
  assert_true(mlo_synth_is_complete("wan2.2-t2v:full-depth", dir, TINY));
  assert_false(mlo_synth_is_complete("wan2.2-t2v", dir, TINY));
  mlo_pipeline *written = open_dir(dir), *declared = NULL;
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  assert_ok(mlo_synth_open(&po, "wan2.2-t2v:full-depth", TINY, &declared, NULL, err, sizeof err));
  const char *names[] = {"transformer", "transformer_2", "text_encoder"};
  const size_t want[] = {40, 40, 24};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(mlo_component_block_count(mlo_pipeline_find(written, names[i])), want[i]);
    assert_int_equal(mlo_component_block_count(mlo_pipeline_find(declared, names[i])), want[i]);
  }
  mlo_pipeline_free(written);
  mlo_pipeline_free(declared);
  /* the plain preset at this scale is shallow: a DiT of two blocks */
  assert_ok(mlo_synth_open(&po, "wan2.2-t2v", TINY, &declared, NULL, err, sizeof err));
  assert_true(mlo_component_block_count(mlo_pipeline_find(declared, "transformer")) < 5);
  mlo_pipeline_free(declared);
  uint64_t b;
  const char *bad[] = {"wan2.2-t2v:", "wan2.2-t2v:full-dept", "wan2.2-t2v:full-depth:full-depth",
                       "wan2.2-t2v-full-depth", ":full-depth"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (mlo_synth_bytes(bad[i], 0.01, &b) != MLO_ENOTFOUND || mlo_synth_preset_of(bad[i]))
      fail_msg("'%s' taken", bad[i]);
  assert_null(mlo_synth_preset_of(NULL));
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_presets_listed),
      T(test_scale_accuracy),
      T(test_every_preset_opens),
      T(test_wan_structure),
      T(test_weights_deterministic_and_small),
      T(test_cache_and_rewrite),
      T(test_links_never_followed),
      T(test_declared_equals_written),
      T(test_full_depth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
