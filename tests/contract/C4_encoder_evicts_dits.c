/*
 * C4_encoder_evicts_dits — before an encoder runs, every DiT is offloaded,
 * then the encoder is loaded; encoders never evict each other.
 */
#include "testutil.h"

static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 3, 8192, 0},
    {"text_encoder_2", MLO_ROLE_ENCODER, 2, 4096, 0},
    {"transformer", MLO_ROLE_DIT, 4, 16384, 0},
    {"transformer_2", MLO_ROLE_DIT, 4, 16384, 0},
    {"vae", MLO_ROLE_VAE, 2, 4096, 0},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static void test_encoder_evicts_dit_not_encoders(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  mlo_component *enc = tu_comp(tp, "text_encoder"), *enc2 = tu_comp(tp, "text_encoder_2");
  mlo_component *dit = tu_comp(tp, "transformer");
  tu_model m;
  tu_enable_modelled(tp, &m);
  /* Both encoders resident together: they do not exclude each other. */
  tu_forward_modelled(tp, &m, enc);
  tu_forward_modelled(tp, &m, enc2);
  tu_model_check(&m);
  assert_true(mlo_component_is_resident(enc) && mlo_component_is_resident(enc2));
  assert_int_equal(tu_cstats(enc).evictions, 0);
  /* After a DiT, one encoder's forward brings back that encoder only. */
  tu_forward_modelled(tp, &m, dit);
  tu_forward_modelled(tp, &m, enc);
  tu_model_check(&m);
  assert_false(mlo_component_is_resident(dit));
  assert_true(mlo_component_is_resident(enc));
  assert_false(mlo_component_is_resident(enc2));
  tu_forward_modelled(tp, &m, enc2);
  tu_model_check(&m);
  assert_true(mlo_component_is_resident(enc));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Two DiTs resident at once (loaded by hand before enable): one encoder
 * forward evicts both. */
static void test_encoder_evicts_every_dit(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tp->exclusion_in_forward = true;
  mlo_component *dit = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  assert_ok(mlo_component_load(dit));
  assert_ok(mlo_component_load(dit2));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(mlo_component_is_resident(dit) && mlo_component_is_resident(dit2));
  assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder_2")));
  assert_false(mlo_component_is_resident(dit));
  assert_false(mlo_component_is_resident(dit2));
  assert_int_equal(tu_cstats(dit).evictions, 1);
  assert_int_equal(tu_cstats(dit2).evictions, 1);
  assert_int_equal(tu_cstats(dit).d2h_bytes + tu_cstats(dit2).d2h_bytes, 0);
  tu_assert_audit(tp);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoder_evicts_dit_not_encoders),
      cmocka_unit_test(test_encoder_evicts_every_dit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
