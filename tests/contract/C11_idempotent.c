/*
 * C11_idempotent — enable and disable may be called twice; the second call
 * changes nothing and moves nothing; is_enabled tells the state.
 */
#include "testutil.h"

static void assert_same_counters(const mlo_pipeline_stats *a, const mlo_pipeline_stats *b) {
  assert_int_equal(a->total.loads, b->total.loads);
  assert_int_equal(a->total.evictions, b->total.evictions);
  assert_int_equal(a->total.h2d_bytes, b->total.h2d_bytes);
  assert_int_equal(a->total.d2h_bytes, b->total.d2h_bytes);
  assert_int_equal(a->total.copy_calls, b->total.copy_calls);
  assert_int_equal(a->device_bytes, b->device_bytes);
}

static void test_enable_twice_disable_twice(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  assert_false(mlo_offload_is_enabled(tp->pipe));
  assert_ok(mlo_offload_disable(tp->pipe)); /* disabling a disabled pipeline */
  assert_false(mlo_offload_is_enabled(tp->pipe));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(mlo_offload_is_enabled(tp->pipe));
  mlo_pipeline_stats first = tu_pstats(tp);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_offload_settings defaults = MLO_OFFLOAD_SETTINGS_INIT;
  assert_ok(mlo_offload_enable(tp->pipe, &defaults)); /* the same settings, spelled out */
  assert_true(mlo_offload_is_enabled(tp->pipe));
  mlo_pipeline_stats second = tu_pstats(tp);
  assert_same_counters(&first, &second);
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_false(mlo_offload_is_enabled(tp->pipe));
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_false(mlo_offload_is_enabled(tp->pipe));
  mlo_pipeline_stats third = tu_pstats(tp);
  assert_same_counters(&first, &third);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A cycle enable -> DiT -> disable -> enable: the second enable loads the
 * encoders again (C2) and leaves the DiT where it is; a third enable moves
 * nothing. */
static void test_reenable_after_work(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *dit = tu_comp(tp, "transformer");
  tu_model m;
  tu_enable_modelled(tp, &m);
  tu_forward_modelled(tp, &m, dit);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_model_check(&m);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  tu_model_enable(&m);
  tu_model_check(&m);
  assert_true(mlo_component_is_resident(dit));
  mlo_pipeline_stats before = tu_pstats(tp);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_pipeline_stats after = tu_pstats(tp);
  assert_same_counters(&before, &after);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_enable_twice_disable_twice),
      cmocka_unit_test(test_reenable_after_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
