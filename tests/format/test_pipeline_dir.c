/*
 * test_pipeline_dir.c — opening diffusers pipeline directories, component
 * folders and single files (mlo_pipeline_open_path), and refusing broken
 * ones: each way a directory can be wrong has its own message, naming the
 * folder and the file, and a failed open hands out nothing.
 *
 * The fixture is a small hand-built pipeline: a transformer in two shards
 * with a weight map, a text encoder in one file, a vae, a tokenizer and a
 * scheduler without weights, an absent [null, null] entry and a
 * configuration value, as real model_index.json files have.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"

#include "format/safetensors.h"
#include "mlo/checkpoint.h"

#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];
static mlo_platform *plat;
static char err[1024];

#define SHARD1 "diffusion_pytorch_model-00001-of-00002.safetensors"
#define SHARD2 "diffusion_pytorch_model-00002-of-00002.safetensors"
#define INDEX "diffusion_pytorch_model.safetensors.index.json"

static void put(const char *rel, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  tu_write_text(path, text);
}

static void mkdir_rel(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  assert_int_equal(mkdir(path, 0755), 0);
}

/* A safetensors file with the given tensors, each [rows, 4] bf16. */
static void put_st(const char *rel, const char *const *names, const int *rows) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  mlo_st_writer *w;
  assert_ok(mlo_st_writer_create(&w));
  static uint8_t data[4096];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
  for (int i = 0; names[i]; i++) {
    int64_t shape[2] = {rows[i], 4};
    assert_ok(mlo_st_writer_add(w, names[i], MLO_DTYPE_BF16, 2, shape, data, (uint64_t)rows[i] * 8,
                                true));
  }
  assert_ok(mlo_st_writer_write(w, path, err, sizeof err));
  mlo_st_writer_free(w);
}

static void put_index(const char *folder, const char *weight_map) {
  char rel[256], text[2048];
  snprintf(rel, sizeof rel, "%s/%s", folder, INDEX);
  snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 80}, \"weight_map\": %s}",
           weight_map);
  put(rel, text);
}

#define GOOD_MAP                                                                                   \
  "{\"a.weight\": \"" SHARD1 "\", \"b.weight\": \"" SHARD1 "\", \"c.weight\": \"" SHARD2 "\"}"

static const char *const good_index =
    "{\"_class_name\": \"WanPipeline\", \"_diffusers_version\": \"0.35.1\","
    " \"boundary_ratio\": 0.875,"
    " \"image_encoder\": [null, null],"
    " \"scheduler\": [\"diffusers\", \"UniPCMultistepScheduler\"],"
    " \"text_encoder\": [\"transformers\", \"UMT5EncoderModel\"],"
    " \"tokenizer\": [\"transformers\", \"T5TokenizerFast\"],"
    " \"transformer\": [\"diffusers\", \"WanTransformer3DModel\"],"
    " \"vae\": [\"diffusers\", \"AutoencoderKLWan\"]}";

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/mlo_pipedir_XXXXXX");
  if (!mkdtemp(root)) return -1;
  put("model_index.json", good_index);
  mkdir_rel("transformer");
  mkdir_rel("text_encoder");
  mkdir_rel("vae");
  mkdir_rel("tokenizer");
  mkdir_rel("scheduler");
  put("tokenizer/tokenizer_config.json", "{}");
  put("scheduler/scheduler_config.json", "{}");
  put("transformer/config.json", "{\"_class_name\": \"WanTransformer3DModel\"}");
  put_st("transformer/" SHARD1, (const char *[]){"a.weight", "b.weight", NULL}, (int[]){2, 3});
  put_st("transformer/" SHARD2, (const char *[]){"c.weight", NULL}, (int[]){5});
  put_index("transformer", GOOD_MAP);
  put_st("text_encoder/model.safetensors", (const char *[]){"shared.weight", "norm", NULL},
         (int[]){8, 1});
  put_st("vae/diffusion_pytorch_model.safetensors", (const char *[]){"conv.weight", NULL},
         (int[]){4});
  plat = NULL;
  return mlo_platform_open("host", &plat, NULL, 0) == MLO_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  mlo_platform_close(plat);
  return nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int open_at(const char *rel, const mlo_open_options *oo, mlo_pipeline **out) {
  char path[512];
  snprintf(path, sizeof path, "%s%s%s", root, rel[0] ? "/" : "", rel);
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  err[0] = '\0';
  *out = (mlo_pipeline *)(uintptr_t)1; /* must be reset to NULL on failure */
  return mlo_pipeline_open_path(&po, path, oo, out, err, sizeof err);
}

/* Opening must fail with status and a message holding every substring. */
static void expect_fail(const char *rel, const mlo_open_options *oo, int status, const char *s1,
                        const char *s2) {
  mlo_pipeline *pipe;
  int rc = open_at(rel, oo, &pipe);
  if (rc != status)
    fail_msg("status %s, expected %s (%s)", mlo_err_name(rc), mlo_err_name(status), err);
  assert_null(pipe);
  if (!strstr(err, s1) || (s2 && !strstr(err, s2)))
    fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err, s1, s2 ? s2 : "");
}

static uint64_t sum_nbytes(mlo_component *c) {
  uint64_t sum = 0;
  for (size_t i = 0; i < mlo_component_tensor_count(c); i++)
    sum += mlo_tensor_nbytes(mlo_component_tensor_at(c, i));
  return sum;
}

static void test_opens_pipeline(void **state) {
  (void)state;
  mlo_pipeline *pipe;
  assert_ok(open_at("", NULL, &pipe));
  /* scheduler, tokenizer and the [null, null] entry are not components */
  assert_int_equal(mlo_pipeline_component_count(pipe), 3);
  mlo_component *te = mlo_pipeline_component_at(pipe, 0),
                *dit = mlo_pipeline_find(pipe, "transformer");
  assert_string_equal(mlo_component_name(te), "text_encoder");
  assert_int_equal(mlo_component_role(te), MLO_ROLE_ENCODER);
  /* the classes name the roles (UMT5EncoderModel, WanTransformer3DModel) */
  assert_int_equal(mlo_component_role_source(te), MLO_ROLE_FROM_CLASS);
  assert_non_null(dit);
  assert_int_equal(mlo_component_role(dit), MLO_ROLE_DIT);
  assert_int_equal(mlo_component_role(mlo_pipeline_find(pipe, "vae")), MLO_ROLE_VAE);
  assert_int_equal(mlo_component_tensor_count(dit), 3); /* both shards */
  assert_int_equal(sum_nbytes(dit), (2 + 3 + 5) * 8);
  assert_int_equal(sum_nbytes(te), (8 + 1) * 8);
  assert_int_equal(mlo_component_residency(dit), MLO_RES_UNMATERIALIZED); /* nothing read */
  /* the declared ranges hold the bytes written */
  assert_ok(mlo_pipeline_materialize(pipe));
  const uint8_t *c = mlo_tensor_host_data(mlo_component_find_tensor(dit, "c.weight"));
  assert_non_null(c);
  for (int i = 0; i < 40; i++) assert_int_equal(c[i], (uint8_t)(i * 7 + 1));
  mlo_pipeline_free(pipe);
}

static void test_role_overrides(void **state) {
  (void)state;
  mlo_role_override ov[] = {{"vae", MLO_ROLE_OTHER}, {"text_encoder", MLO_ROLE_ENCODER}};
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.overrides = ov, oo.override_count = 2;
  mlo_pipeline *pipe;
  assert_ok(open_at("", &oo, &pipe));
  mlo_component *vae = mlo_pipeline_find(pipe, "vae"),
                *te = mlo_pipeline_find(pipe, "text_encoder");
  assert_int_equal(mlo_component_role(vae), MLO_ROLE_OTHER);
  assert_int_equal(mlo_component_role_source(vae), MLO_ROLE_FROM_OVERRIDE);
  assert_int_equal(mlo_component_role_source(te), MLO_ROLE_FROM_OVERRIDE);
  assert_int_equal(mlo_component_role_source(mlo_pipeline_find(pipe, "transformer")),
                   MLO_ROLE_FROM_CLASS);
  mlo_pipeline_free(pipe);
  mlo_role_override typo = {"transfomer", MLO_ROLE_DIT};
  oo.overrides = &typo, oo.override_count = 1;
  expect_fail("", &oo, MLO_ENOTFOUND, "transfomer", "not a component");
  mlo_role_override autorole = {"vae", MLO_ROLE_AUTO};
  oo.overrides = &autorole;
  expect_fail("", &oo, MLO_EINVAL, "concrete role", NULL);
  /* a weightless folder is not a component either */
  mlo_role_override tok = {"tokenizer", MLO_ROLE_ENCODER};
  oo.overrides = &tok;
  expect_fail("", &oo, MLO_ENOTFOUND, "tokenizer", NULL);
}

static void test_single_file_and_folder(void **state) {
  (void)state;
  mlo_pipeline *pipe;
  assert_ok(open_at("text_encoder/model.safetensors", NULL, &pipe));
  assert_int_equal(mlo_pipeline_component_count(pipe), 1);
  mlo_component *c = mlo_pipeline_component_at(pipe, 0);
  assert_string_equal(mlo_component_name(c), "model");
  assert_int_equal(mlo_component_tensor_count(c), 2);
  mlo_pipeline_free(pipe);

  mlo_role_override ov = {"te", MLO_ROLE_ENCODER};
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.single_name = "te", oo.overrides = &ov, oo.override_count = 1;
  assert_ok(open_at("text_encoder/model.safetensors", &oo, &pipe));
  c = mlo_pipeline_component_at(pipe, 0);
  assert_string_equal(mlo_component_name(c), "te");
  assert_int_equal(mlo_component_role(c), MLO_ROLE_ENCODER);
  assert_int_equal(mlo_component_role_source(c), MLO_ROLE_FROM_OVERRIDE);
  mlo_pipeline_free(pipe);

  /* a component folder alone: named after the folder, sharded set included */
  assert_ok(open_at("transformer", NULL, &pipe));
  c = mlo_pipeline_component_at(pipe, 0);
  assert_string_equal(mlo_component_name(c), "transformer");
  assert_int_equal(mlo_component_role(c), MLO_ROLE_DIT);
  assert_int_equal(mlo_component_tensor_count(c), 3);
  mlo_pipeline_free(pipe);
  expect_fail("no-such-thing", NULL, MLO_ENOTFOUND, "no-such-thing", NULL);
}

static void test_missing_shard(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/transformer/" SHARD2, root);
  assert_int_equal(unlink(path), 0);
  expect_fail("", NULL, MLO_EFORMAT, "shard " SHARD2, "missing");
}

static void test_bad_index_json(void **state) {
  (void)state;
  put("transformer/" INDEX, "{\"weight_map\": {\"a.weight\": ");
  expect_fail("", NULL, MLO_EFORMAT, INDEX, "not valid JSON");
  put("transformer/" INDEX, "{\"weight_map\": [\"" SHARD1 "\"]}");
  expect_fail("", NULL, MLO_EFORMAT, INDEX, "\"weight_map\" is present, not an object");
  put("transformer/" INDEX, "[1, 2]");
  expect_fail("", NULL, MLO_EFORMAT, INDEX, "not a JSON object");
  put_index("transformer", "{\"a.weight\": \"../vae/x.safetensors\"}");
  expect_fail("", NULL, MLO_EFORMAT, "../vae/x.safetensors", "not a file name");
  put_index("transformer", "{\"a.weight\": 3}");
  expect_fail("", NULL, MLO_EFORMAT, "a.weight", "not a file name string");
}

static void test_tensor_in_two_shards(void **state) {
  (void)state;
  put_st("transformer/" SHARD2, (const char *[]){"c.weight", "a.weight", NULL}, (int[]){5, 2});
  expect_fail("", NULL, MLO_EFORMAT, "'a.weight' is in shard " SHARD2, "two shards");
}

static void test_tensor_missing_from_shard(void **state) {
  (void)state;
  put_index("transformer", "{\"a.weight\": \"" SHARD1 "\", \"b.weight\": \"" SHARD1
                           "\", \"c.weight\": \"" SHARD2 "\", \"ghost\": \"" SHARD2 "\"}");
  expect_fail("", NULL, MLO_EFORMAT, "'ghost'", "missing from its shard " SHARD2);
  put_index("transformer", "{\"a.weight\": \"" SHARD1 "\", \"c.weight\": \"" SHARD2 "\"}");
  expect_fail("", NULL, MLO_EFORMAT, "'b.weight'", "not in the weight map");
}

static void test_stray_shard(void **state) {
  (void)state;
  put_st("transformer/diffusion_pytorch_model-00003-of-00003.safetensors",
         (const char *[]){"z", NULL}, (int[]){1});
  expect_fail("", NULL, MLO_EFORMAT, "stray file diffusion_pytorch_model-00003-of-00003", INDEX);
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.allow_stray = true;
  mlo_pipeline *pipe;
  assert_ok(open_at("", &oo, &pipe));
  assert_int_equal(mlo_component_tensor_count(mlo_pipeline_find(pipe, "transformer")), 3);
  mlo_pipeline_free(pipe);
  /* an unsharded file of the same family is a stray too; another variant's is not */
  char path[512];
  snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model-00003-of-00003.safetensors",
           root);
  unlink(path);
  put_st("transformer/diffusion_pytorch_model.fp16.safetensors", (const char *[]){"z", NULL},
         (int[]){1});
  assert_ok(open_at("", NULL, &pipe));
  mlo_pipeline_free(pipe);
  put_st("transformer/diffusion_pytorch_model.safetensors", (const char *[]){"z", NULL},
         (int[]){1});
  expect_fail("", NULL, MLO_EFORMAT, "stray file diffusion_pytorch_model.safetensors", NULL);
}

static void test_component_folder_missing(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/vae", root);
  assert_int_equal(nftw(path, remove_entry, 8, FTW_DEPTH | FTW_PHYS), 0);
  expect_fail("", NULL, MLO_ENOTFOUND, "component 'vae' (AutoencoderKLWan)", "folder");
  /* present but without weights: an error for a VAE, not a silent skip */
  mkdir_rel("vae");
  expect_fail("", NULL, MLO_EFORMAT, "'vae'", "no safetensors weights");
}

static void test_model_index_malformed(void **state) {
  (void)state;
  put("model_index.json", "{\"transformer\": [\"diffusers\", ");
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "not valid JSON");
  put("model_index.json", "[[\"diffusers\", \"WanTransformer3DModel\"]]");
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "not a JSON object");
  put("model_index.json", "{\"transformer\": [\"diffusers\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "\"transformer\"", "not a 2-element");
  put("model_index.json", "{\"transformer\": [\"diffusers\", \"X\", \"Y\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "\"transformer\"", "not a 2-element");
  put("model_index.json", "{\"transformer\": [\"diffusers\", null]}");
  expect_fail("", NULL, MLO_EFORMAT, "\"transformer\"", "not a 2-element");
  put("model_index.json", "{\"../vae\": [\"diffusers\", \"AutoencoderKL\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "\"../vae\"", "not a folder name");
  put("model_index.json", "{\"_class_name\": \"X\", \"tokenizer\": [\"t\", \"T5Tokenizer\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "lists no component", NULL);
}

static void test_ambiguous_files(void **state) {
  (void)state;
  put_st("text_encoder/other.safetensors", (const char *[]){"x", NULL}, (int[]){1});
  /* the known name wins over another stem */
  mlo_pipeline *pipe;
  assert_ok(open_at("", NULL, &pipe));
  mlo_pipeline_free(pipe);
  put_st("text_encoder/diffusion_pytorch_model.safetensors", (const char *[]){"x", NULL},
         (int[]){1});
  expect_fail("", NULL, MLO_EFORMAT, "text_encoder: ambiguous", "model.safetensors");
}

static void test_variants(void **state) {
  (void)state;
  put_st("text_encoder/model.fp16-00001-of-00002.safetensors", (const char *[]){"h1", NULL},
         (int[]){1});
  put_st("text_encoder/model.fp16-00002-of-00002.safetensors", (const char *[]){"h2", NULL},
         (int[]){1});
  put("text_encoder/model.safetensors.index.fp16.json",
      "{\"weight_map\": {\"h1\": \"model.fp16-00001-of-00002.safetensors\","
      " \"h2\": \"model.fp16-00002-of-00002.safetensors\"}}");
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.variant = "fp16";
  mlo_pipeline *pipe;
  assert_ok(open_at("", &oo, &pipe));
  mlo_component *te = mlo_pipeline_find(pipe, "text_encoder");
  assert_int_equal(mlo_component_tensor_count(te), 2);
  assert_non_null(mlo_component_find_tensor(te, "h2"));
  /* the transformer has no fp16 files and falls back to its plain ones */
  assert_int_equal(mlo_component_tensor_count(mlo_pipeline_find(pipe, "transformer")), 3);
  mlo_pipeline_free(pipe);
  /* without a variant the plain file is used; the fp16 set is no stray */
  assert_ok(open_at("", NULL, &pipe));
  assert_non_null(mlo_component_find_tensor(mlo_pipeline_find(pipe, "text_encoder"), "norm"));
  mlo_pipeline_free(pipe);
  oo.variant = "fp8";
  expect_fail("", &oo, MLO_ENOTFOUND, "variant 'fp8'", NULL);

  /* A folder holding only one variant's files uses them, sharded or not
   * (docs/formats.md): the plain text encoder removed, the fp16 shards
   * load without --variant; the same for an unsharded fp16 file. */
  char plain[512];
  snprintf(plain, sizeof plain, "%s/text_encoder/model.safetensors", root);
  assert_int_equal(unlink(plain), 0);
  assert_ok(open_at("", NULL, &pipe));
  te = mlo_pipeline_find(pipe, "text_encoder");
  assert_int_equal(mlo_component_tensor_count(te), 2);
  assert_non_null(mlo_component_find_tensor(te, "h1"));
  mlo_pipeline_free(pipe);
  put_st("vae/diffusion_pytorch_model.fp16.safetensors", (const char *[]){"half", NULL},
         (int[]){2});
  snprintf(plain, sizeof plain, "%s/vae/diffusion_pytorch_model.safetensors", root);
  assert_int_equal(unlink(plain), 0);
  assert_ok(open_at("", NULL, &pipe));
  assert_non_null(mlo_component_find_tensor(mlo_pipeline_find(pipe, "vae"), "half"));
  mlo_pipeline_free(pipe);
  /* PyTorch's own weight map beside them is no variant of safetensors */
  put("vae/diffusion_pytorch_model.bin.index.json", "{\"weight_map\": {}}");
  assert_ok(open_at("", NULL, &pipe));
  assert_non_null(mlo_component_find_tensor(mlo_pipeline_find(pipe, "vae"), "half"));
  mlo_pipeline_free(pipe);
  /* two variants and no plain weights: which is meant is not guessed */
  put_st("vae/diffusion_pytorch_model.bf16.safetensors", (const char *[]){"b", NULL}, (int[]){2});
  expect_fail("", NULL, MLO_EFORMAT, "two variants", "--variant");
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

/* ---- hostile directories (hardening) ----------------------------------- */

static void put_bytes(const char *rel, const char *bytes, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
}

static void replace_with_fifo(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  unlink(path);
  assert_int_equal(mkfifo(path, 0600), 0);
}

/* A FIFO where a file belongs: opening must fail at once, naming it (a
 * blocking open would hang here; alarm turns a hang into a failure). */
static void test_fifo_never_hangs(void **state) {
  (void)state;
  static const char *const where[] = {"model_index.json", "transformer/" INDEX,
                                      "transformer/" SHARD1,
                                      "vae/diffusion_pytorch_model.safetensors"};
  for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
    assert_int_equal(teardown(NULL), 0);
    assert_int_equal(setup(NULL), 0);
    replace_with_fifo(where[i]);
    alarm(20);
    expect_fail("", NULL, MLO_EIO, strrchr(where[i], '/') ? strrchr(where[i], '/') + 1 : where[i],
                "FIFO");
    alarm(0);
  }
  /* a component folder opened alone: its config.json is only a class hint */
  assert_int_equal(teardown(NULL), 0);
  assert_int_equal(setup(NULL), 0);
  replace_with_fifo("transformer/config.json");
  alarm(20);
  mlo_pipeline *pipe;
  assert_ok(open_at("transformer", NULL, &pipe));
  alarm(0);
  mlo_pipeline_free(pipe);
}

/* model_index.json and weight maps: JSON as Python's json (diffusers)
 * reads it, and names that are C strings. */
static void test_index_json_strict(void **state) {
  (void)state;
  static const char bom[] = "\xEF\xBB\xBF{\"vae\": [\"diffusers\", \"AutoencoderKLWan\"]}";
  put_bytes("model_index.json", bom, sizeof bom - 1);
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "not valid JSON at byte 0");
  put("model_index.json", "{\"vae\": [\"diffusers\", \"AutoencoderKLWan\"]} trailing");
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "trailing characters");
  static const char nul[] = "{\"vae\": [\"diffusers\", \"AutoencoderKLWan\"]}\0{\"x\": 1}";
  put_bytes("model_index.json", nul, sizeof nul - 1);
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "trailing characters");
  put("model_index.json", "{\"vae\\u0000x\": [\"diffusers\", \"AutoencoderKLWan\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "\\u0000");
  put("model_index.json", "{\"vae\": [\"diffusers\", \"Autoencoder\\u0000KLWan\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "\\u0000");
  put("model_index.json", "{\"vae\": [\"diffusers\", \"A\"], \"vae\": [\"diffusers\", \"B\"]}");
  expect_fail("", NULL, MLO_EFORMAT, "model_index.json", "'vae' appears twice");
  put("model_index.json", good_index);
  put_index("transformer", "{\"a.weight\": \"" SHARD1 "\\u0000\", \"b.weight\": \"" SHARD1 "\"}");
  expect_fail("", NULL, MLO_EFORMAT, INDEX, "\\u0000");
  put_index("transformer", GOOD_MAP " x");
  expect_fail("", NULL, MLO_EFORMAT, INDEX, "expected ',' or '}'");
  /* a good entry, then a bad one: the names collected so far are freed
   * (LeakSanitizer checks this path in the ASan run) */
  put_index("transformer",
            "{\"a.weight\": \"" SHARD1 "\", \"b.weight\": \"" SHARD2 "\", \"c\": 3}");
  expect_fail("", NULL, MLO_EFORMAT, "'c'", "not a file name string");
}

/* A shard swapped after its header was validated is refused at
 * materialize, not loaded: another valid shard, or a link to a device. */
static void test_shard_swapped_after_open(void **state) {
  (void)state;
  char shard[512], other[512];
  snprintf(shard, sizeof shard, "%s/transformer/" SHARD2, root);
  snprintf(other, sizeof other, "%s/other.safetensors", root);
  for (int how = 0; how < 2; how++) {
    mlo_pipeline *pipe;
    assert_ok(open_at("", NULL, &pipe));
    if (how == 0) { /* the same tensors and sizes, another file */
      put_st("other.safetensors", (const char *[]){"c.weight", NULL}, (int[]){5});
      assert_int_equal(rename(other, shard), 0);
    } else { /* input only: /dev/zero is read, never written */
      assert_int_equal(unlink(shard), 0);
      assert_int_equal(symlink("/dev/zero", shard), 0);
    }
    mlo_component *t = mlo_pipeline_find(pipe, "transformer");
    assert_status(mlo_component_materialize(t), MLO_EIO);
    const char *msg = mlo_pipeline_errmsg(pipe);
    if (!strstr(msg, SHARD2) || !strstr(msg, how == 0 ? "changed since" : "character device"))
      fail_msg("message \"%s\"", msg);
    assert_int_equal(mlo_component_residency(t), MLO_RES_UNMATERIALIZED);
    mlo_pipeline_free(pipe);
    unlink(shard);
    put_st("transformer/" SHARD2, (const char *[]){"c.weight", NULL}, (int[]){5});
  }
}

/* Opening works on a thread with a small stack (no 64 KiB buffers). */
static void *open_on_thread(void *arg) {
  mlo_pipeline *pipe = NULL;
  *(int *)arg = open_at("transformer", NULL, &pipe);
  mlo_pipeline_free(pipe);
  return NULL;
}

static void test_small_stack(void **state) {
  (void)state;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  /* 64 KiB; ASan's threads need more room of their own (redzones, its TLS),
   * so the plain build is the one that shows a 64 KiB buffer overflowing. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  pthread_attr_setstacksize(&attr, 512u << 10);
#else
  pthread_attr_setstacksize(&attr, 64u << 10);
#endif
  pthread_t th;
  int rc = -1;
  assert_int_equal(pthread_create(&th, &attr, open_on_thread, &rc), 0);
  pthread_join(th, NULL);
  pthread_attr_destroy(&attr);
  assert_ok(rc);
}

/* 100,000 tensors in one header: declared, found by name, a duplicate
 * refused (the name index is a hash table, not a linear scan). */
static void test_many_tensors(void **state) {
  (void)state;
  enum { N = 100000 };
  mlo_st_writer *w;
  assert_ok(mlo_st_writer_create(&w));
  static const uint8_t two[2] = {1, 2};
  int64_t shape[1] = {1};
  char name[32];
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "blocks.%d.w", i);
    assert_ok(mlo_st_writer_add(w, name, MLO_DTYPE_BF16, 1, shape, two, 2, true));
  }
  char path[512];
  snprintf(path, sizeof path, "%s/many.safetensors", root);
  assert_ok(mlo_st_writer_write(w, path, err, sizeof err));
  mlo_st_writer_free(w);
  mlo_pipeline *pipe;
  assert_ok(open_at("many.safetensors", NULL, &pipe));
  mlo_component *c = mlo_pipeline_component_at(pipe, 0);
  assert_int_equal(mlo_component_tensor_count(c), N);
  assert_non_null(mlo_component_find_tensor(c, "blocks.77777.w"));
  assert_null(mlo_component_find_tensor(c, "blocks.100000.w"));
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = "blocks.31337.w";
  assert_status(mlo_tensor_add(c, &d, NULL), MLO_EEXIST);
  mlo_pipeline_free(pipe);
}

/* pipeline_dir [TEST]: one test by name. */
int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      T(test_opens_pipeline),
      T(test_role_overrides),
      T(test_single_file_and_folder),
      T(test_missing_shard),
      T(test_bad_index_json),
      T(test_tensor_in_two_shards),
      T(test_tensor_missing_from_shard),
      T(test_stray_shard),
      T(test_component_folder_missing),
      T(test_model_index_malformed),
      T(test_ambiguous_files),
      T(test_variants),
      T(test_fifo_never_hangs),
      T(test_index_json_strict),
      T(test_shard_swapped_after_open),
      T(test_small_stack),
      T(test_many_tensors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
