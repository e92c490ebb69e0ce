/*
 * C16_single_owner — at most one offload strategy owns a pipeline's hooks:
 * while the generic hooks are installed, exclusion groups, delegates, other
 * settings and hand residency changes are refused and change nothing.
 */
#include "testutil.h"

static int noop_enable(void *self, mlo_pipeline *pipe, const mlo_offload_settings *s) {
  (void)pipe;
  (void)s;
  (*(int *)self)++;
  return MLO_OK;
}
static int noop_disable(void *self, mlo_pipeline *pipe) {
  (void)pipe;
  (*(int *)self)++;
  return MLO_OK;
}
static const mlo_delegate_ops ops = {noop_enable, noop_disable};

static void test_generic_owner_refuses_others(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  assert_ok(tu_forward(tp, tu_comp(tp, "transformer")));
  mlo_pipeline_stats before = tu_pstats(tp);
  bool resident[4];
  for (size_t i = 0; i < 4; i++)
    resident[i] = mlo_component_is_resident(tu_comp(tp, tu_wan_specs[i].name));

  mlo_group *group = NULL;
  assert_status(mlo_group_create(tp->pipe, "g", &group), MLO_EOWNED);
  assert_null(group);
  int calls = 0;
  assert_status(mlo_pipeline_set_delegate(tp->pipe, &ops, &calls), MLO_ESTATE);
  mlo_offload_settings other = settings;
  other.sync = MLO_SYNC_DEVICE;
  assert_status(mlo_offload_enable(tp->pipe, &other), MLO_EOWNED);
  other = settings;
  other.copy_back = true;
  assert_status(mlo_offload_enable(tp->pipe, &other), MLO_EOWNED);
  assert_status(mlo_component_load(tu_comp(tp, "text_encoder")), MLO_ESTATE);
  assert_status(mlo_component_evict(tu_comp(tp, "vae")), MLO_ESTATE);
  assert_status(mlo_pipeline_load_all(tp->pipe), MLO_ESTATE);

  assert_int_equal(calls, 0);
  assert_true(mlo_offload_is_enabled(tp->pipe));
  for (size_t i = 0; i < 4; i++)
    assert_int_equal(mlo_component_is_resident(tu_comp(tp, tu_wan_specs[i].name)), resident[i]);
  mlo_pipeline_stats after = tu_pstats(tp);
  assert_int_equal(after.total.h2d_bytes, before.total.h2d_bytes);
  assert_int_equal(after.total.evictions, before.total.evictions);
  /* The original owner is intact: same settings are still accepted, and
   * its rule still applies. */
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder")));
  assert_false(mlo_component_is_resident(tu_comp(tp, "transformer")));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_group_needs_delegate(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_group *group = NULL;
  assert_status(mlo_group_create(tp->pipe, "g", &group), MLO_EOWNED);
  assert_null(group);
  int calls = 0;
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &calls));
  assert_ok(mlo_group_create(tp->pipe, "g", &group));
  assert_non_null(group);
  assert_ok(mlo_group_add(group, tu_comp(tp, "transformer")));
  mlo_group_free(group);
  mlo_group_free(NULL);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* With a delegate owning the pipeline, the generic path's settings check
 * still applies: different settings while enabled are refused. */
static void test_delegate_owner_refuses_other_settings(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  int calls = 0;
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &calls));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_offload_settings other = MLO_OFFLOAD_SETTINGS_INIT;
  other.distributed = true;
  assert_status(mlo_offload_enable(tp->pipe, &other), MLO_EOWNED);
  assert_int_equal(calls, 1);
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_int_equal(calls, 2);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generic_owner_refuses_others),
      cmocka_unit_test(test_group_needs_delegate),
      cmocka_unit_test(test_delegate_owner_refuses_other_settings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
