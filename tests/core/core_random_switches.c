/*
 * core_random_switches — a thousand seeded random switches with jitter=1
 * and event ordering never let a forward read stale bytes, and residency
 * and counters follow the contract model at every step; the deliberately
 * unordered mode (MLO_SYNC_UNSAFE_NONE) is caught by the same check.
 */
#include "testutil.h"

#include <stdlib.h>

static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 3, 4096, 0},
    {"text_encoder_2", MLO_ROLE_ENCODER, 2, 2048, 0},
    {"transformer", MLO_ROLE_DIT, 4, 8192, 0},
    {"transformer_2", MLO_ROLE_DIT, 4, 8192, 0},
    {"vae", MLO_ROLE_VAE, 2, 4096, 0},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static void test_thousand_switches(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  tu_model m;
  tu_enable_modelled(tp, &m);
  srand(1000);
  for (int i = 0; i < 1000; i++) {
    mlo_component *comp = tu_comp(tp, specs[(size_t)rand() % NSPECS].name);
    if (rand() % 4 == 0) {
      assert_ok(mlo_component_acquire(comp));
      char why[256] = "";
      if (!tu_device_content_ok(tp, comp, why, sizeof why)) fail_msg("step %d: %s", i, why);
      assert_ok(mlo_component_release(comp));
    } else {
      int rc = tu_forward(tp, comp);
      if (rc)
        fail_msg("step %d (%s): %s; %s", i, mlo_component_name(comp), mlo_err_name(rc),
                 tp->first_failure);
    }
    tu_model_forward(&m, comp);
    if (i % 50 == 0) tu_model_check(&m);
  }
  tu_model_check(&m);
  tu_assert_forwards_clean(tp);
  assert_int_equal(tu_pstats(tp).total.d2h_bytes, 0);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_unordered_mode_is_caught(void **state) {
  (void)state;
  if (TU_TSAN) skip();
  const tu_comp_spec big[] = {{"text_encoder", MLO_ROLE_ENCODER, 2, 128 * 1024, 0},
                              {"transformer", MLO_ROLE_DIT, 2, 128 * 1024, 0},
                              {"vae", MLO_ROLE_VAE, 1, 4096, 0}};
  mlo_platform *plat = tu_platform_open("bw=50M,jitter=1,seed=7");
  tu_pipe *tp = tu_pipe_build(plat, big, 3);
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.sync = MLO_SYNC_UNSAFE_NONE;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  for (int i = 0; i < 30 && atomic_load(&tp->bad_content) == 0; i++)
    (void)tu_forward(tp, tu_comp(tp, big[i % 2].name));
  assert_true(atomic_load(&tp->bad_content) >= 1);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_thousand_switches),
      cmocka_unit_test(test_unordered_mode_is_caught),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
