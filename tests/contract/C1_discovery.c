/*
 * C1_discovery — enable discovers DiTs, encoders and VAEs from the roles the
 * pipeline declares; a pipeline without a DiT or an encoder is refused
 * before anything changes; name guesses (MLO_ROLE_AUTO) warn once and never
 * override a declaration.
 */
#include "testutil.h"

#include <string.h>

/* Every component of tp is still UNMATERIALIZED and nothing was counted. */
static void assert_untouched(tu_pipe *tp) {
  size_t n = mlo_pipeline_component_count(tp->pipe);
  for (size_t i = 0; i < n; i++) {
    mlo_component *comp = mlo_pipeline_component_at(tp->pipe, i);
    assert_int_equal(mlo_component_residency(comp), MLO_RES_UNMATERIALIZED);
  }
  mlo_pipeline_stats s = tu_pstats(tp);
  assert_int_equal(s.total.loads, 0);
  assert_int_equal(s.total.h2d_bytes, 0);
  assert_int_equal(s.device_bytes, 0);
  assert_int_equal(tu_device_used(tp->plat), 0);
}

static void test_declared_roles_drive_enable(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  for (size_t i = 0; i < 4; i++) {
    mlo_component *comp = tu_comp(tp, tu_wan_specs[i].name);
    assert_int_equal(mlo_component_role(comp), tu_wan_specs[i].role);
    assert_int_equal(mlo_component_role_source(comp), MLO_ROLE_FROM_DECLARATION);
  }
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(mlo_offload_is_enabled(tp->pipe));
  assert_true(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
  assert_true(mlo_component_is_resident(tu_comp(tp, "vae")));
  assert_false(mlo_component_is_resident(tu_comp(tp, "transformer")));
  assert_false(mlo_component_is_resident(tu_comp(tp, "transformer_2")));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Builds specs, enables, and expects a refusal naming what is missing. */
static void expect_refusal(const tu_comp_spec *specs, size_t n, const char *missing) {
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, n);
  assert_status(mlo_offload_enable(tp->pipe, NULL), MLO_EUNSUPPORTED);
  const char *msg = mlo_pipeline_errmsg(tp->pipe);
  assert_non_null(msg);
  if (!tu_contains_ci(msg, missing))
    fail_msg("refusal message \"%s\" does not say that no %s is declared", msg, missing);
  assert_false(mlo_offload_is_enabled(tp->pipe));
  assert_untouched(tp);
  /* Still refused the second time, and still nothing changed. */
  assert_status(mlo_offload_enable(tp->pipe, NULL), MLO_EUNSUPPORTED);
  assert_untouched(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_no_dit_refused(void **state) {
  (void)state;
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 2, 1024, 0},
                                {"vae", MLO_ROLE_VAE, 1, 1024, 0}};
  expect_refusal(specs, 2, "dit");
}

static void test_no_encoder_refused(void **state) {
  (void)state;
  const tu_comp_spec specs[] = {{"transformer", MLO_ROLE_DIT, 2, 1024, 0},
                                {"vae", MLO_ROLE_VAE, 1, 1024, 0}};
  expect_refusal(specs, 2, "encoder");
}

/* Names that a heuristic would call DiT and encoder, declared OTHER: the
 * declaration wins, so the pipeline has neither and is refused. */
static void test_declared_other_is_not_guessed(void **state) {
  (void)state;
  const tu_comp_spec specs[] = {{"transformer", MLO_ROLE_OTHER, 1, 1024, 0},
                                {"text_encoder", MLO_ROLE_OTHER, 1, 1024, 0},
                                {"vae", MLO_ROLE_VAE, 1, 1024, 0}};
  expect_refusal(specs, 3, "dit");
}

static void test_auto_guesses_and_warns_once(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_AUTO, 1, 1024, 0},
                                {"transformer", MLO_ROLE_AUTO, 1, 1024, 0},
                                {"vae", MLO_ROLE_AUTO, 1, 1024, 0},
                                {"scheduler", MLO_ROLE_AUTO, 0, 0, 0}};
  const mlo_role want[] = {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE, MLO_ROLE_OTHER};
  tu_log_capture_begin();
  for (size_t i = 0; i < 4; i++) tu_add_component(tp, &specs[i]);
  for (size_t i = 0; i < 4; i++) {
    mlo_component *comp = tu_comp(tp, specs[i].name);
    assert_int_equal(mlo_component_role(comp), want[i]);
    assert_int_equal(mlo_component_role_source(comp), MLO_ROLE_FROM_HEURISTIC);
  }
  /* Guessed roles are enough for enable (the directory-on-disk path); the
   * one warning comes when they start to matter, naming every guess. */
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  unsigned warnings = tu_log_warnings();
  bool names_all = tu_log_contains("text_encoder (encoder)") &&
                   tu_log_contains("transformer (dit)") && tu_log_contains("vae (vae)") &&
                   tu_log_contains("scheduler (other)") && tu_log_contains("--role");
  tu_log_capture_end();
  assert_int_equal(warnings, 1);
  assert_true(names_all);
  assert_true(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
  assert_false(mlo_component_is_resident(tu_comp(tp, "transformer")));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Declarations whose names suggest the opposite role: no warning, and the
 * contract follows the declaration. */
static void test_declaration_never_overridden(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  const tu_comp_spec specs[] = {{"transformer", MLO_ROLE_ENCODER, 2, 1024, 0},
                                {"text_encoder", MLO_ROLE_DIT, 2, 1024, 0},
                                {"unet", MLO_ROLE_VAE, 1, 1024, 0}};
  tu_log_capture_begin();
  for (size_t i = 0; i < 3; i++) tu_add_component(tp, &specs[i]);
  unsigned warnings = tu_log_warnings();
  tu_log_capture_end();
  assert_int_equal(warnings, 0);
  mlo_component *enc = tu_comp(tp, "transformer"), *dit = tu_comp(tp, "text_encoder");
  mlo_component *vae = tu_comp(tp, "unet");
  assert_int_equal(mlo_component_role(enc), MLO_ROLE_ENCODER);
  assert_int_equal(mlo_component_role(dit), MLO_ROLE_DIT);
  assert_int_equal(mlo_component_role(vae), MLO_ROLE_VAE);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(mlo_component_is_resident(enc));
  assert_true(mlo_component_is_resident(vae));
  assert_false(mlo_component_is_resident(dit));
  assert_ok(tu_forward(tp, dit));
  assert_false(mlo_component_is_resident(enc));
  assert_true(mlo_component_is_resident(vae));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_override_and_refusal_while_enabled(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *extra = NULL;
  assert_ok(mlo_component_add(tp->pipe, "image_encoder", MLO_ROLE_AUTO, &extra));
  assert_int_equal(mlo_component_role(extra), MLO_ROLE_ENCODER);
  assert_ok(mlo_component_set_role(extra, MLO_ROLE_OTHER, MLO_ROLE_FROM_OVERRIDE));
  assert_int_equal(mlo_component_role(extra), MLO_ROLE_OTHER);
  assert_int_equal(mlo_component_role_source(extra), MLO_ROLE_FROM_OVERRIDE);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_status(mlo_component_set_role(extra, MLO_ROLE_DIT, MLO_ROLE_FROM_OVERRIDE), MLO_ESTATE);
  assert_int_equal(mlo_component_role(extra), MLO_ROLE_OTHER);
  assert_int_equal(mlo_component_role_source(extra), MLO_ROLE_FROM_OVERRIDE);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_duplicate_name_refused(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *dup = NULL;
  assert_status(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &dup), MLO_EEXIST);
  assert_int_equal(mlo_pipeline_component_count(tp->pipe), 4);
  assert_int_equal(mlo_component_role(tu_comp(tp, "vae")), MLO_ROLE_VAE);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_role_guess_table(void **state) {
  (void)state;
  static const struct {
    const char *name, *class_name;
    mlo_role role;
  } cases[] = {
      {"transformer", NULL, MLO_ROLE_DIT},
      {"transformer_2", NULL, MLO_ROLE_DIT},
      {"dit", NULL, MLO_ROLE_DIT},
      {"unet", NULL, MLO_ROLE_DIT},
      {"text_encoder", NULL, MLO_ROLE_ENCODER},
      {"text_encoder_3", NULL, MLO_ROLE_ENCODER},
      {"image_encoder", NULL, MLO_ROLE_ENCODER},
      {"mllm", NULL, MLO_ROLE_ENCODER},
      {"vae", NULL, MLO_ROLE_VAE},
      {"audio_vae", NULL, MLO_ROLE_VAE},
      {"scheduler", NULL, MLO_ROLE_OTHER},
      {"tokenizer", NULL, MLO_ROLE_OTHER},
      {"transformer", "WanTransformer3DModel", MLO_ROLE_DIT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mlo_role got = mlo_role_guess(cases[i].name, cases[i].class_name);
    if (got != cases[i].role)
      fail_msg("mlo_role_guess(%s) = %s, want %s", cases[i].name, mlo_role_name(got),
               mlo_role_name(cases[i].role));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_declared_roles_drive_enable),
      cmocka_unit_test(test_no_dit_refused),
      cmocka_unit_test(test_no_encoder_refused),
      cmocka_unit_test(test_declared_other_is_not_guessed),
      cmocka_unit_test(test_auto_guesses_and_warns_once),
      cmocka_unit_test(test_declaration_never_overridden),
      cmocka_unit_test(test_override_and_refusal_while_enabled),
      cmocka_unit_test(test_duplicate_name_refused),
      cmocka_unit_test(test_role_guess_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
