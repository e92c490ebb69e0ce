/*
 * C14_disable_moves_nothing — removing the hooks copies nothing in either
 * direction and changes no residency; callers get whatever residency the
 * pipeline had, not the original one.
 */
#include "testutil.h"

static void check_disable_after(const char *last_forward, const tu_comp_spec *specs, size_t n) {
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, n);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  if (last_forward) assert_ok(tu_forward(tp, tu_comp(tp, last_forward)));
  bool resident[TU_MAX_COMPS];
  for (size_t i = 0; i < n; i++)
    resident[i] = mlo_component_is_resident(tu_comp(tp, specs[i].name));
  mlo_pipeline_stats before = tu_pstats(tp);
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_platform_synchronize(plat));
  mlo_pipeline_stats after = tu_pstats(tp);
  assert_int_equal(after.total.h2d_bytes, before.total.h2d_bytes);
  assert_int_equal(after.total.d2h_bytes, before.total.d2h_bytes);
  assert_int_equal(after.total.copy_calls, before.total.copy_calls);
  assert_int_equal(after.total.loads, before.total.loads);
  assert_int_equal(after.total.evictions, before.total.evictions);
  assert_int_equal(after.device_bytes, before.device_bytes);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(mlo_component_is_resident(tu_comp(tp, specs[i].name)), resident[i]);
  /* No hook is left: forwards now evict nothing. */
  for (size_t i = 0; i < n; i++) assert_ok(tu_forward(tp, tu_comp(tp, specs[i].name)));
  assert_int_equal(tu_pstats(tp).total.evictions, before.total.evictions);
  for (size_t i = 0; i < n; i++) assert_true(mlo_component_is_resident(tu_comp(tp, specs[i].name)));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_disable_after_enable(void **state) {
  (void)state;
  check_disable_after(NULL, tu_wan_specs, 4);
}

static void test_disable_with_dit_resident(void **state) {
  (void)state;
  check_disable_after("transformer_2", tu_wan_specs, 4);
}

/* Mutable tensors resident at disable are not written back by it. */
static void test_disable_with_mutable_resident(void **state) {
  (void)state;
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 3, 1024, 2},
                                {"transformer", MLO_ROLE_DIT, 2, 4096, 1},
                                {"vae", MLO_ROLE_VAE, 1, 1024, 1}};
  check_disable_after("transformer", specs, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_disable_after_enable),
      cmocka_unit_test(test_disable_with_dit_resident),
      cmocka_unit_test(test_disable_with_mutable_resident),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
