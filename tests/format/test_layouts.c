/*
 * test_layouts.c — the layouts the real tools write, through the library
 * (tests/format/real/: files diffusers, transformers, safetensors and gguf
 * wrote; generate.py).  The CLI tests compare the same fixtures with the
 * reference readers' views; here the library calls themselves: variant
 * choice in a hub folder, roles from class names and from the file names
 * users download, pipelines assembled from separate files, and the
 * weights' bytes beside the device bytes.
 *
 *   test_layouts REAL_DIR
 */
#include "testutil.h"

#include "mlo/checkpoint.h"

#include <stdio.h>
#include <string.h>

static const char *real_dir;
static mlo_platform *plat;

static int open_path(const char *rel, const char *variant, mlo_pipeline **out, char *err,
                     size_t errlen) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", real_dir, rel);
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.variant = variant;
  return mlo_pipeline_open_path(&po, path, &oo, out, err, errlen);
}

static mlo_dtype first_dtype(mlo_pipeline *pipe, const char *comp) {
  return mlo_tensor_dtype(mlo_component_tensor_at(mlo_pipeline_find(pipe, comp), 0));
}

static void test_hub_folder_picks_plain_or_variant(void **state) {
  (void)state;
  char err[512];
  mlo_pipeline *pipe = NULL;
  assert_ok(open_path("wan22-hub", NULL, &pipe, err, sizeof err));
  assert_int_equal(first_dtype(pipe, "transformer"), MLO_DTYPE_F32);
  mlo_pipeline_free(pipe);
  assert_ok(open_path("wan22-hub", "fp16", &pipe, err, sizeof err));
  assert_int_equal(first_dtype(pipe, "transformer"), MLO_DTYPE_F16);
  assert_int_equal(first_dtype(pipe, "vae"), MLO_DTYPE_F16);
  mlo_pipeline_free(pipe);
  /* variant shards under a variant weight map */
  assert_ok(open_path("wan22-fp16-sharded", "fp16", &pipe, err, sizeof err));
  assert_int_equal(first_dtype(pipe, "vae"), MLO_DTYPE_F16);
  mlo_pipeline_free(pipe);
  /* and without --variant, the only (variant) files there are used */
  assert_ok(open_path("wan22-fp16-sharded", NULL, &pipe, err, sizeof err));
  assert_int_equal(mlo_pipeline_component_count(pipe), 4);
  mlo_pipeline_free(pipe);
  assert_int_equal(open_path("wan22-hub", "bf16", &pipe, err, sizeof err), MLO_ENOTFOUND);
  assert_null(pipe);
}

static void test_roles_from_classes(void **state) {
  (void)state;
  char err[512];
  mlo_pipeline *pipe = NULL;
  assert_ok(open_path("flux", NULL, &pipe, err, sizeof err));
  static const struct {
    const char *name;
    mlo_role role;
  } want[] = {{"text_encoder", MLO_ROLE_ENCODER},   /* CLIPTextModel */
              {"text_encoder_2", MLO_ROLE_ENCODER}, /* T5EncoderModel */
              {"transformer", MLO_ROLE_DIT},        /* FluxTransformer2DModel */
              {"vae", MLO_ROLE_VAE}};               /* AutoencoderKL */
  for (size_t i = 0; i < 4; i++) {
    mlo_component *c = mlo_pipeline_find(pipe, want[i].name);
    assert_non_null(c);
    assert_int_equal(mlo_component_role(c), want[i].role);
    assert_int_equal(mlo_component_role_source(c), MLO_ROLE_FROM_CLASS);
  }
  mlo_pipeline_free(pipe);
  mlo_role r;
  static const char *const dits[] = {"WanTransformer3DModel", "QwenImageTransformer2DModel",
                                     "SD3Transformer2DModel", "UNet2DConditionModel",
                                     "HunyuanVideoTransformer3DModel"};
  static const char *const encs[] = {
      "UMT5EncoderModel", "CLIPTextModelWithProjection",   "Qwen2_5_VLForConditionalGeneration",
      "LlamaForCausalLM", "CLIPVisionModelWithProjection", "Gemma2Model"};
  static const char *const vaes[] = {"AutoencoderKLWan", "AutoencoderKLQwenImage", "AutoencoderDC",
                                     "ConsistencyDecoderVAE", "VQModel"};
  for (size_t i = 0; i < 5; i++) {
    assert_ok(mlo_role_from_class(dits[i], &r));
    assert_int_equal(r, MLO_ROLE_DIT);
  }
  for (size_t i = 0; i < 6; i++) {
    assert_ok(mlo_role_from_class(encs[i], &r));
    assert_int_equal(r, MLO_ROLE_ENCODER);
  }
  for (size_t i = 0; i < 5; i++) {
    assert_ok(mlo_role_from_class(vaes[i], &r));
    assert_int_equal(r, MLO_ROLE_VAE);
  }
  assert_int_equal(mlo_role_from_class("StableDiffusionSafetyChecker", &r), MLO_ENOTFOUND);
  assert_int_equal(mlo_role_from_class("MysteryModel", &r), MLO_ENOTFOUND);
}

static void test_roles_from_file_names(void **state) {
  (void)state;
  static const struct {
    const char *name;
    mlo_role role;
  } cases[] = {
      {"flux1-dev", MLO_ROLE_DIT},
      {"flux1-schnell-Q4_K_S", MLO_ROLE_DIT},
      {"wan2.2_t2v_high_noise_14B_fp16", MLO_ROLE_DIT},
      {"wan2.2_i2v_low_noise_14B_fp8_scaled", MLO_ROLE_DIT},
      {"qwen_image_fp8_e4m3fn", MLO_ROLE_DIT},
      {"sd3.5_large", MLO_ROLE_DIT},
      {"hunyuan_video_t2v_720p_bf16", MLO_ROLE_DIT},
      {"umt5_xxl_fp8_e4m3fn_scaled", MLO_ROLE_ENCODER},
      {"t5xxl_fp16", MLO_ROLE_ENCODER},
      {"clip_l", MLO_ROLE_ENCODER},
      {"clip_g", MLO_ROLE_ENCODER},
      {"qwen_2.5_vl_7b_fp8_scaled", MLO_ROLE_ENCODER},
      {"llava_llama3_fp8_scaled", MLO_ROLE_ENCODER},
      {"ae", MLO_ROLE_VAE},
      {"wan2.1_vae", MLO_ROLE_VAE},
      {"wan_2.1_vae", MLO_ROLE_VAE},
      {"qwen_image_vae", MLO_ROLE_VAE},
      {"sdxl_vae", MLO_ROLE_VAE},
      {"safety_checker", MLO_ROLE_OTHER},
      {"model", MLO_ROLE_OTHER},
      {"aesthetic_scores", MLO_ROLE_OTHER}, /* "ae" only as a whole word */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (mlo_role_guess(cases[i].name, NULL) != cases[i].role)
      fail_msg("%s: guessed %s, expected %s", cases[i].name,
               mlo_role_name(mlo_role_guess(cases[i].name, NULL)), mlo_role_name(cases[i].role));
}

static void test_pipeline_from_files(void **state) {
  (void)state;
  char p[4][512], err[768];
  snprintf(p[0], sizeof p[0], "%s/single/wan2.2_t2v_high_noise_14B_Q4_K_M.gguf", real_dir);
  snprintf(p[1], sizeof p[1], "%s/single/umt5_xxl_fp8_e4m3fn_scaled.safetensors", real_dir);
  snprintf(p[2], sizeof p[2], "%s/single/wan2.1_vae.safetensors", real_dir);
  snprintf(p[3], sizeof p[3], "%s/wan22/transformer_2", real_dir); /* a component folder */
  mlo_component_file files[] = {{"transformer", MLO_ROLE_AUTO, p[0]},
                                {"transformer_2", MLO_ROLE_DIT, p[3]},
                                {"t5", MLO_ROLE_AUTO, p[1]},
                                {"vae", MLO_ROLE_AUTO, p[2]}};
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *pipe = NULL;
  if (mlo_pipeline_open_files(&po, files, 4, NULL, &pipe, err, sizeof err)) fail_msg("%s", err);
  static const mlo_role roles[] = {MLO_ROLE_DIT, MLO_ROLE_DIT, MLO_ROLE_ENCODER, MLO_ROLE_VAE};
  for (size_t i = 0; i < 4; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    assert_string_equal(mlo_component_name(c), files[i].name); /* the order given */
    assert_int_equal(mlo_component_role(c), roles[i]);
    assert_true(mlo_component_tensor_bytes(c) <= mlo_component_bytes(c));
  }
  /* the auto roles are guesses (said), the given one a declaration */
  assert_int_equal(mlo_component_role_source(mlo_pipeline_component_at(pipe, 0)),
                   MLO_ROLE_FROM_HEURISTIC);
  assert_int_equal(mlo_component_role_source(mlo_pipeline_component_at(pipe, 1)),
                   MLO_ROLE_FROM_DECLARATION);
  /* GGUF's block types survive as themselves */
  mlo_tensor *q =
      mlo_component_find_tensor(mlo_pipeline_component_at(pipe, 0), "blocks.0.self_attn.q.weight");
  assert_int_equal(mlo_tensor_dtype(q), MLO_DTYPE_Q4_K);
  assert_int_equal(mlo_tensor_nbytes(q), 16 * 144);
  assert_ok(mlo_pipeline_materialize(pipe));
  mlo_pipeline_free(pipe);
  /* refusals: a name twice, a whole pipeline as a component, a missing file */
  mlo_component_file twice[] = {{"a", MLO_ROLE_AUTO, p[1]}, {"a", MLO_ROLE_AUTO, p[2]}};
  assert_int_equal(mlo_pipeline_open_files(&po, twice, 2, NULL, &pipe, err, sizeof err),
                   MLO_EEXIST);
  assert_null(pipe);
  char whole[512];
  snprintf(whole, sizeof whole, "%s/wan22", real_dir);
  mlo_component_file dir[] = {{"x", MLO_ROLE_AUTO, whole}};
  assert_int_equal(mlo_pipeline_open_files(&po, dir, 1, NULL, &pipe, err, sizeof err), MLO_EINVAL);
  assert_non_null(strstr(err, "model_index.json"));
  mlo_component_file missing[] = {{"x", MLO_ROLE_AUTO, "/nonexistent/mlo/file.gguf"}};
  assert_int_equal(mlo_pipeline_open_files(&po, missing, 1, NULL, &pipe, err, sizeof err),
                   MLO_ENOTFOUND);
  assert_int_equal(mlo_pipeline_open_files(&po, files, 0, NULL, &pipe, err, sizeof err),
                   MLO_EINVAL);
}

static void test_tensor_and_device_bytes(void **state) {
  (void)state;
  char err[512];
  mlo_pipeline *pipe = NULL;
  assert_ok(open_path("flux", NULL, &pipe, err, sizeof err));
  mlo_component *vae = mlo_pipeline_find(pipe, "vae");
  uint64_t sum = 0;
  for (size_t i = 0; i < mlo_component_tensor_count(vae); i++)
    sum += mlo_tensor_nbytes(mlo_component_tensor_at(vae, i));
  assert_int_equal(mlo_component_tensor_bytes(vae), sum);
  /* 92 small tensors, each aligned to 256 B on the device */
  assert_true(mlo_component_bytes(vae) > sum);
  assert_true(mlo_component_bytes(vae) < sum + 256 * mlo_component_tensor_count(vae));
  const char *file = mlo_tensor_file(mlo_component_tensor_at(vae, 0), NULL);
  assert_non_null(file);
  assert_non_null(strstr(file, "vae/diffusion_pytorch_model.safetensors"));
  mlo_pipeline_free(pipe);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s REAL_DIR\n", argv[0]);
    return 2;
  }
  real_dir = argv[1];
  char err[256];
  if (mlo_platform_open("host", &plat, err, sizeof err)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hub_folder_picks_plain_or_variant),
      cmocka_unit_test(test_roles_from_classes),
      cmocka_unit_test(test_roles_from_file_names),
      cmocka_unit_test(test_pipeline_from_files),
      cmocka_unit_test(test_tensor_and_device_bytes),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  mlo_platform_close(plat);
  return rc;
}
