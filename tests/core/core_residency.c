/*
 * core_residency — the residency state machine as mlo_component_residency
 * reports it (UNMATERIALIZED -> HOST -> LOADING/DEVICE -> HOST), and the
 * counters (loads, evictions, h2d/d2h bytes, device bytes) matching a
 * known schedule exactly, by hand and under the hooks.
 */
#include "testutil.h"

#include <string.h>

static void assert_resident_state(mlo_component *comp) {
  mlo_residency r = mlo_component_residency(comp);
  assert_true(r == MLO_RES_LOADING || r == MLO_RES_DEVICE);
  assert_true(mlo_component_is_resident(comp));
}

static void test_states_by_hand(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *dit = tu_comp(tp, "transformer");
  mlo_tensor *t0 = mlo_component_find_tensor(dit, "t0");
  assert_int_equal(mlo_component_residency(dit), MLO_RES_UNMATERIALIZED);
  assert_false(mlo_component_is_resident(dit));
  assert_null(mlo_tensor_host_data(t0));
  assert_ok(mlo_component_materialize(dit));
  assert_int_equal(mlo_component_residency(dit), MLO_RES_HOST);
  assert_non_null(mlo_tensor_host_data(t0));
  assert_ok(mlo_component_materialize(dit)); /* idempotent */
  void *block = NULL;
  size_t offset = 0;
  assert_status(mlo_tensor_device(t0, &block, &offset), MLO_ESTATE);
  for (int round = 1; round <= 3; round++) {
    assert_ok(mlo_component_load(dit));
    assert_resident_state(dit);
    assert_ok(mlo_component_load(dit)); /* already resident: nothing moves */
    assert_ok(mlo_platform_synchronize(plat));
    assert_ok(mlo_tensor_device(t0, &block, &offset));
    assert_non_null(block);
    mlo_component_stats s = tu_cstats(dit);
    assert_int_equal(s.loads, round);
    assert_int_equal(s.h2d_bytes, (uint64_t)round * mlo_component_bytes(dit));
    assert_int_equal(tu_pstats(tp).device_bytes, mlo_component_bytes(dit));
    assert_ok(mlo_component_evict(dit));
    assert_int_equal(mlo_component_residency(dit), MLO_RES_HOST);
    assert_ok(mlo_component_evict(dit)); /* already evicted */
    s = tu_cstats(dit);
    assert_int_equal(s.evictions, round);
    assert_int_equal(s.d2h_bytes, 0);
    assert_int_equal(tu_pstats(tp).device_bytes, 0);
  }
  assert_int_equal(mlo_component_residency(tu_comp(tp, "vae")), MLO_RES_UNMATERIALIZED);
  /* load on an unmaterialized component materializes it first. */
  assert_ok(mlo_component_load(tu_comp(tp, "vae")));
  assert_resident_state(tu_comp(tp, "vae"));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_load_all_and_peak(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  uint64_t all = 0;
  for (size_t i = 0; i < 4; i++) all += mlo_component_bytes(tu_comp(tp, tu_wan_specs[i].name));
  assert_ok(mlo_pipeline_load_all(tp->pipe));
  mlo_pipeline_stats s = tu_pstats(tp);
  assert_int_equal(s.device_bytes, all);
  assert_int_equal(s.peak_device_bytes, all);
  assert_int_equal(s.total.loads, 4);
  assert_int_equal(s.total.h2d_bytes, all);
  assert_true(tu_device_used(plat) >= all);
  for (size_t i = 0; i < 4; i++) assert_ok(tu_forward(tp, tu_comp(tp, tu_wan_specs[i].name)));
  s = tu_pstats(tp);
  assert_int_equal(s.total.loads, 4); /* all resident: forwards load nothing */
  assert_int_equal(s.total.forwards, 4);
  mlo_pipeline_reset_stats(tp->pipe);
  s = tu_pstats(tp);
  assert_int_equal(s.total.loads + s.total.h2d_bytes + s.total.forwards, 0);
  assert_int_equal(s.device_bytes, all); /* residency is not a counter */
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A fixed schedule under the hooks, with the counts worked out by hand:
 * enable (enc, vae), dit1 (-enc), dit1, dit2 (-dit1), enc (-dit2), vae,
 * dit2 (-enc). */
static void test_known_schedule_counts(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *enc = tu_comp(tp, "text_encoder"), *dit = tu_comp(tp, "transformer");
  mlo_component *dit2 = tu_comp(tp, "transformer_2"), *vae = tu_comp(tp, "vae");
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_component *schedule[] = {dit, dit, dit2, enc, vae, dit2};
  for (size_t i = 0; i < 6; i++) assert_ok(tu_forward(tp, schedule[i]));
  struct {
    mlo_component *comp;
    uint64_t loads, evictions, forwards;
  } want[] = {{enc, 2, 2, 1}, {dit, 1, 1, 2}, {dit2, 2, 1, 2}, {vae, 1, 0, 1}};
  for (size_t i = 0; i < 4; i++) {
    mlo_component_stats s = tu_cstats(want[i].comp);
    const char *name = mlo_component_name(want[i].comp);
    if (s.loads != want[i].loads || s.evictions != want[i].evictions ||
        s.forwards != want[i].forwards)
      fail_msg("%s: loads %llu evictions %llu forwards %llu, want %llu %llu %llu", name,
               (unsigned long long)s.loads, (unsigned long long)s.evictions,
               (unsigned long long)s.forwards, (unsigned long long)want[i].loads,
               (unsigned long long)want[i].evictions, (unsigned long long)want[i].forwards);
    assert_int_equal(s.h2d_bytes, want[i].loads * mlo_component_bytes(want[i].comp));
    assert_int_equal(s.d2h_bytes, 0);
  }
  mlo_pipeline_stats ps = tu_pstats(tp);
  assert_int_equal(ps.device_bytes, mlo_component_bytes(dit2) + mlo_component_bytes(vae));
  assert_int_equal(ps.total.loads, 6);
  assert_int_equal(ps.total.evictions, 4);
  assert_true(ps.peak_device_bytes >= ps.device_bytes);
  assert_true(ps.peak_device_bytes <=
              mlo_component_bytes(enc) + mlo_component_bytes(dit2) + mlo_component_bytes(vae));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_states_by_hand),
      cmocka_unit_test(test_load_all_and_peak),
      cmocka_unit_test(test_known_schedule_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
