/*
 * C17_acquire_release — entry points other than forward (a VAE's decode, an
 * encoder's encode) get the same treatment through acquire/release:
 * eviction of the conflicting components, residency while held, EBUSY from
 * try_acquire while another thread holds a conflicting component, and
 * EDEADLK for a thread that would wait on itself.
 */
#include "testutil.h"

#include <pthread.h>

static void test_acquire_applies_the_rule(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *enc = tu_comp(tp, "text_encoder"), *dit = tu_comp(tp, "transformer");
  mlo_component *dit2 = tu_comp(tp, "transformer_2"), *vae = tu_comp(tp, "vae");
  tu_model m;
  tu_enable_modelled(tp, &m);
  mlo_component *schedule[] = {dit, enc, dit2, vae, dit, enc, vae};
  for (size_t i = 0; i < sizeof schedule / sizeof schedule[0]; i++) {
    mlo_component *comp = schedule[i];
    uint64_t forwards = tu_cstats(comp).forwards;
    assert_ok(mlo_component_acquire(comp));
    tu_model_forward(&m, comp);
    /* While held: resident, right bytes, the rule applied, audit clean. */
    assert_true(mlo_component_is_resident(comp));
    char why[256] = "";
    if (!tu_device_content_ok(tp, comp, why, sizeof why)) fail_msg("%s", why);
    if (!tu_exclusion_ok(tp, comp, why, sizeof why)) fail_msg("%s", why);
    tu_assert_audit(tp);
    assert_ok(mlo_component_release(comp));
    tu_model_check(&m);
    assert_true(tu_cstats(comp).forwards >= forwards);
  }
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Another thread holds `held`; try_acquire(want) must say EBUSY and leave
 * both where they were. */
static void check_try_acquire_busy(const char *held, const char *want) {
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_component *comp = tu_comp(tp, want);
  tu_holder h;
  tu_holder_start(&h, tu_comp(tp, held));
  bool was_resident = mlo_component_is_resident(comp);
  int rc = mlo_component_try_acquire(comp);
  if (rc == MLO_OK) mlo_component_release(comp);
  bool resident_now = mlo_component_is_resident(comp);
  bool held_resident = mlo_component_is_resident(h.comp);
  tu_holder_finish(&h);
  assert_ok(h.rc_acquire);
  assert_ok(h.rc_release);
  assert_status(rc, MLO_EBUSY);
  assert_int_equal(resident_now, was_resident);
  assert_true(held_resident);
  /* Once released, the same call succeeds. */
  assert_ok(mlo_component_try_acquire(comp));
  assert_ok(mlo_component_release(comp));
  assert_false(mlo_component_is_resident(h.comp));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_try_acquire_dit_while_encoder_held(void **state) {
  (void)state;
  check_try_acquire_busy("text_encoder", "transformer");
}

static void test_try_acquire_encoder_while_dit_held(void **state) {
  (void)state;
  check_try_acquire_busy("transformer", "text_encoder");
}

static void test_try_acquire_dit_while_other_dit_held(void **state) {
  (void)state;
  check_try_acquire_busy("transformer_2", "transformer");
}

static void test_same_thread_conflict_is_deadlock(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *enc = tu_comp(tp, "text_encoder"), *dit = tu_comp(tp, "transformer");
  mlo_component *dit2 = tu_comp(tp, "transformer_2"), *vae = tu_comp(tp, "vae");
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(mlo_component_acquire(dit));
  mlo_pipeline_stats before = tu_pstats(tp);
  assert_status(mlo_component_acquire(enc), MLO_EDEADLK);
  assert_status(mlo_component_acquire(dit2), MLO_EDEADLK);
  assert_status(mlo_component_try_acquire(enc), MLO_EDEADLK);
  mlo_pipeline_stats after = tu_pstats(tp);
  assert_int_equal(after.total.h2d_bytes, before.total.h2d_bytes);
  assert_int_equal(after.total.evictions, before.total.evictions);
  assert_true(mlo_component_is_resident(dit));
  /* Not conflicting: the VAE, and the DiT itself again (nested). */
  assert_ok(mlo_component_acquire(vae));
  assert_ok(mlo_component_release(vae));
  assert_ok(mlo_component_acquire(dit));
  assert_ok(mlo_component_release(dit));
  assert_ok(mlo_component_release(dit));
  /* Encoders do not conflict with each other. */
  assert_ok(mlo_component_acquire(enc));
  assert_ok(mlo_component_acquire(vae));
  assert_status(mlo_component_acquire(dit), MLO_EDEADLK);
  assert_ok(mlo_component_release(vae));
  assert_ok(mlo_component_release(enc));
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_release_without_acquire_refused(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_component *vae = tu_comp(tp, "vae");
  assert_true(mlo_component_release(vae) != MLO_OK);
  assert_ok(mlo_component_acquire(vae));
  assert_ok(mlo_component_release(vae));
  assert_true(mlo_component_release(vae) != MLO_OK);
  /* The unbalanced release did not leave it "held": a DiT still loads. */
  assert_ok(mlo_component_try_acquire(tu_comp(tp, "transformer")));
  assert_ok(mlo_component_release(tu_comp(tp, "transformer")));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_acquire_applies_the_rule),
      cmocka_unit_test(test_try_acquire_dit_while_encoder_held),
      cmocka_unit_test(test_try_acquire_encoder_while_dit_held),
      cmocka_unit_test(test_try_acquire_dit_while_other_dit_held),
      cmocka_unit_test(test_same_thread_conflict_is_deadlock),
      cmocka_unit_test(test_release_without_acquire_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
