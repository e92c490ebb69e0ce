/*
 * C2_enable_residency — enable makes every encoder and VAE device-resident
 * and leaves each DiT where it is (on the host, or on the device if the
 * caller loaded it by hand) until its first forward.
 */
#include "testutil.h"

static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 3, 4096, 0},
    {"text_encoder_2", MLO_ROLE_ENCODER, 2, 2048, 0},
    {"transformer", MLO_ROLE_DIT, 4, 8192, 0},
    {"transformer_2", MLO_ROLE_DIT, 4, 8192, 0},
    {"vae", MLO_ROLE_VAE, 2, 2048, 0},
    {"audio_vae", MLO_ROLE_VAE, 1, 1024, 0},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static void test_encoders_and_vaes_resident(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tu_model m;
  tu_enable_modelled(tp, &m);
  tu_model_check(&m);
  uint64_t resident_bytes = 0;
  for (size_t i = 0; i < NSPECS; i++) {
    mlo_component *comp = tu_comp(tp, specs[i].name);
    if (specs[i].role == MLO_ROLE_DIT) {
      /* enable materializes: the DiT waits in its host slab. */
      assert_int_equal(mlo_component_residency(comp), MLO_RES_HOST);
    } else {
      assert_true(mlo_component_is_resident(comp));
      resident_bytes += mlo_component_bytes(comp);
    }
  }
  assert_int_equal(tu_pstats(tp).device_bytes, resident_bytes);
  tu_assert_audit(tp);
  /* What enable loaded is what the components hold. */
  assert_ok(mlo_platform_synchronize(plat));
  for (size_t i = 0; i < NSPECS; i++) {
    if (specs[i].role == MLO_ROLE_DIT) continue;
    char why[256] = "";
    if (!tu_device_content_ok(tp, tu_comp(tp, specs[i].name), why, sizeof why)) fail_msg("%s", why);
  }
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_hand_loaded_dit_stays(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  mlo_component *dit = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  assert_ok(mlo_component_load(dit));
  assert_true(mlo_component_is_resident(dit));
  mlo_component_stats before = tu_cstats(dit);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(mlo_component_is_resident(dit));
  assert_false(mlo_component_is_resident(dit2));
  mlo_component_stats after = tu_cstats(dit);
  assert_int_equal(after.loads, before.loads);
  assert_int_equal(after.evictions, before.evictions);
  assert_int_equal(after.h2d_bytes, before.h2d_bytes);
  assert_true(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
  /* Its first forward is where the contract starts applying to it. */
  assert_ok(tu_forward(tp, dit));
  assert_int_equal(tu_cstats(dit).loads, before.loads);
  assert_false(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
  tu_assert_audit(tp);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A DiT that was loaded before enable is evicted by the next encoder. */
static void test_encoder_forward_after_enable_evicts_hand_loaded_dit(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  mlo_component *dit = tu_comp(tp, "transformer");
  assert_ok(mlo_component_load(dit));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder")));
  assert_false(mlo_component_is_resident(dit));
  assert_int_equal(tu_cstats(dit).evictions, 1);
  tu_assert_audit(tp);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoders_and_vaes_resident),
      cmocka_unit_test(test_hand_loaded_dit_stays),
      cmocka_unit_test(test_encoder_forward_after_enable_evicts_hand_loaded_dit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
