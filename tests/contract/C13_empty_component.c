/*
 * C13_empty_component — a component with no tensors, or with only
 * references to other components' tensors, causes no transfer and no
 * platform call: not on forward, not on acquire/release, not on enable.
 */
#include "platform/platform.h"
#include "testutil.h"

static tu_pipe *build(mlo_platform *plat) {
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *empty = NULL, *refs = NULL, *empty_enc = NULL, *empty_vae = NULL;
  assert_ok(mlo_component_add(tp->pipe, "scheduler", MLO_ROLE_OTHER, &empty));
  assert_ok(mlo_component_add(tp->pipe, "lora_view", MLO_ROLE_OTHER, &refs));
  assert_ok(mlo_component_add(tp->pipe, "tokenizer_encoder", MLO_ROLE_ENCODER, &empty_enc));
  assert_ok(mlo_component_add(tp->pipe, "audio_vae", MLO_ROLE_VAE, &empty_vae));
  mlo_component *dit = tu_comp(tp, "transformer");
  tu_add_alias(tp, refs, "w0", mlo_component_find_tensor(dit, "t0"));
  tu_add_alias(tp, refs, "w1", mlo_component_find_tensor(dit, "t1"));
  assert_int_equal(mlo_component_bytes(empty), 0);
  assert_int_equal(mlo_component_bytes(refs), 0);
  return tp;
}

static int noop(mlo_component *comp, void *user) {
  (void)comp;
  (void)user;
  return 0;
}

/* forward + acquire/release of comp: zero platform calls, zero counters. */
static void assert_costs_nothing(tu_pipe *tp, mlo_component *comp) {
  uint64_t calls = mlo_plat_call_count(tp->plat);
  mlo_pipeline_stats before = tu_pstats(tp);
  for (int i = 0; i < 3; i++) assert_ok(mlo_component_forward(comp, noop, NULL));
  assert_ok(mlo_component_acquire(comp));
  assert_ok(mlo_component_release(comp));
  assert_ok(mlo_component_try_acquire(comp));
  assert_ok(mlo_component_release(comp));
  uint64_t after_calls = mlo_plat_call_count(tp->plat);
  if (after_calls != calls)
    fail_msg("%s: %llu platform calls", mlo_component_name(comp),
             (unsigned long long)(after_calls - calls));
  mlo_pipeline_stats after = tu_pstats(tp);
  assert_int_equal(after.total.h2d_bytes, before.total.h2d_bytes);
  assert_int_equal(after.total.d2h_bytes, before.total.d2h_bytes);
  assert_int_equal(after.total.copy_calls, before.total.copy_calls);
  assert_int_equal(after.total.evictions, before.total.evictions);
  mlo_component_stats s = tu_cstats(comp);
  assert_int_equal(s.h2d_bytes + s.d2h_bytes + s.copy_calls + s.platform_calls, 0);
}

static void test_empty_components_cost_nothing(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  /* Encoders resident, no DiT: nothing any of these could evict. */
  assert_costs_nothing(tp, tu_comp(tp, "scheduler"));
  assert_costs_nothing(tp, tu_comp(tp, "lora_view"));
  assert_costs_nothing(tp, tu_comp(tp, "tokenizer_encoder"));
  assert_costs_nothing(tp, tu_comp(tp, "audio_vae"));
  /* With the DiT resident, its references read its device bytes. */
  assert_ok(tu_forward(tp, tu_comp(tp, "transformer")));
  assert_costs_nothing(tp, tu_comp(tp, "scheduler"));
  assert_costs_nothing(tp, tu_comp(tp, "lora_view"));
  assert_costs_nothing(tp, tu_comp(tp, "audio_vae"));
  assert_true(mlo_component_is_resident(tu_comp(tp, "transformer")));
  assert_non_null(
      mlo_tensor_device_ptr(mlo_component_find_tensor(tu_comp(tp, "lora_view"), "w0")) ||
      !tp->device_pointers);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Without offload, the same: nothing to load, nothing to call. */
static void test_empty_components_cost_nothing_disabled(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(plat);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  assert_costs_nothing(tp, tu_comp(tp, "scheduler"));
  assert_costs_nothing(tp, tu_comp(tp, "lora_view"));
  assert_costs_nothing(tp, tu_comp(tp, "tokenizer_encoder"));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Enabling a pipeline whose only encoder is empty calls the platform for
 * the VAE alone. */
static void test_enable_with_empty_encoder(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *enc = NULL, *dit = NULL, *vae = NULL;
  assert_ok(mlo_component_add(tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &enc));
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  tu_add_tensor(tp, dit, "w", 4096, 0);
  assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &vae));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_int_equal(tu_pstats(tp).total.h2d_bytes, 0);
  mlo_component_stats s = tu_cstats(enc);
  assert_int_equal(s.platform_calls + s.copy_calls + s.h2d_bytes, 0);
  assert_ok(tu_forward(tp, dit));
  s = tu_cstats(enc);
  assert_int_equal(s.platform_calls + s.copy_calls + s.h2d_bytes + s.d2h_bytes, 0);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_empty_components_cost_nothing),
      cmocka_unit_test(test_empty_components_cost_nothing_disabled),
      cmocka_unit_test(test_enable_with_empty_encoder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
