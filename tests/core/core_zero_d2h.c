/*
 * core_zero_d2h — eviction of read-only weights copies nothing back
 * (docs/architecture.md): over a long schedule the device-to-host byte count stays
 * at zero while evictions happen all the time, and the host slabs keep
 * their content.  The baseline (copy_back) does copy back, so the counter
 * is live.
 */
#include "testutil.h"

#include <stdlib.h>

static const char *schedule_names[] = {"text_encoder", "transformer", "transformer_2", "vae"};

static void run_schedule(tu_pipe *tp, unsigned steps, unsigned seed) {
  srand(seed);
  for (unsigned i = 0; i < steps; i++) {
    /* Encoder, a few DiT steps of each stage, VAE: a video schedule. */
    const char *name = schedule_names[(i % 7 == 0) ? 0 : (i % 7 == 6) ? 3 : 1 + rand() % 2];
    assert_ok(tu_forward(tp, tu_comp(tp, name)));
  }
}

static void test_read_only_evictions_copy_nothing(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  run_schedule(tp, 400, 21);
  mlo_pipeline_stats s = tu_pstats(tp);
  assert_true(s.total.evictions > 100);
  assert_int_equal(s.total.d2h_bytes, 0);
  for (size_t i = 0; i < 4; i++) {
    mlo_component *comp = tu_comp(tp, tu_wan_specs[i].name);
    char why[256] = "";
    if (!tu_host_content_ok(tp, comp, why, sizeof why)) fail_msg("%s", why);
  }
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_copy_back_baseline_copies(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.copy_back = true;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  run_schedule(tp, 40, 22);
  mlo_pipeline_stats s = tu_pstats(tp);
  assert_true(s.total.evictions > 0);
  assert_true(s.total.d2h_bytes > 0);
  /* Each eviction writes back at most the component's bytes. */
  for (size_t i = 0; i < 4; i++) {
    mlo_component *comp = tu_comp(tp, tu_wan_specs[i].name);
    mlo_component_stats c = tu_cstats(comp);
    assert_true(c.d2h_bytes <= c.evictions * mlo_component_bytes(comp));
    char why[256] = "";
    if (!tu_host_content_ok(tp, comp, why, sizeof why)) fail_msg("%s", why);
  }
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_only_evictions_copy_nothing),
      cmocka_unit_test(test_copy_back_baseline_copies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
