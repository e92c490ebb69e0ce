/*
 * C9_no_free_race — device storage is not freed or reused while a compute
 * that uses it may still run: a conflicting forward on another thread waits
 * (or try_acquire says EBUSY), a hand eviction of a held component is
 * refused.  Mutable tensors are written back on eviction, completely before
 * the eviction returns, and survive an evict/reload.  With blocking_d2h=1
 * the platform declares the XPU rule.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  tu_pipe *tp;
  mlo_component *comp;
  atomic_int *clock;   /* shared sequence counter */
  atomic_int entered;  /* 1 once the callback runs */
  atomic_int *release; /* the holder leaves its callback when this is 1 */
  int start, end;      /* clock values at callback start/end */
  int rc;
} worker;

/* The holder's callback: checks its bytes, waits to be told to leave, and
 * checks again (poisoned memory would show an eviction under it). */
static int hold_callback(mlo_component *comp, void *user) {
  worker *w = user;
  w->start = atomic_fetch_add(w->clock, 1);
  int bad = tu_forward_check(comp, w->tp);
  atomic_store(&w->entered, 1);
  for (int i = 0; i < 5000 && w->release && !atomic_load(w->release); i++) tu_sleep_ms(1);
  bad |= tu_forward_check(comp, w->tp);
  w->end = atomic_fetch_add(w->clock, 1);
  return bad;
}

static void *run_forward(void *arg) {
  worker *w = arg;
  w->rc = mlo_component_forward(w->comp, hold_callback, w);
  return NULL;
}

static void test_conflicting_forward_waits(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  tp->audit_in_forward = true;
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  atomic_int clock = 0, release = 0;
  worker a = {.tp = tp, .comp = tu_comp(tp, "text_encoder"), .clock = &clock, .release = &release};
  worker b = {.tp = tp, .comp = tu_comp(tp, "transformer"), .clock = &clock};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, run_forward, &a), 0);
  while (!atomic_load(&a.entered)) tu_sleep_ms(1);
  assert_int_equal(pthread_create(&tb, NULL, run_forward, &b), 0);
  tu_sleep_ms(30); /* room for a wrong implementation to evict under a */
  int b_entered_early = atomic_load(&b.entered);
  bool enc_resident = mlo_component_is_resident(a.comp);
  int try_rc = mlo_component_try_acquire(b.comp);
  if (try_rc == MLO_OK) mlo_component_release(b.comp);
  atomic_store(&release, 1);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  assert_false(b_entered_early);
  assert_true(enc_resident);
  assert_status(try_rc, MLO_EBUSY);
  assert_ok(a.rc);
  assert_ok(b.rc);
  assert_true(b.start > a.end);
  assert_false(mlo_component_is_resident(a.comp));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Offload disabled, a component held by another thread: evicting it by
 * hand is refused and it stays resident. */
static void test_hand_evict_of_held_component_refused(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  tu_holder h;
  tu_holder_start(&h, tu_comp(tp, "transformer"));
  int rc = mlo_component_evict(h.comp);
  bool resident = mlo_component_is_resident(h.comp);
  char why[256] = "";
  bool content = tu_device_content_ok(tp, h.comp, why, sizeof why);
  tu_holder_finish(&h);
  assert_ok(h.rc_acquire);
  assert_ok(h.rc_release);
  assert_status(rc, MLO_EBUSY);
  assert_true(resident);
  if (!content) fail_msg("%s", why);
  assert_ok(mlo_component_evict(h.comp)); /* released: now it may go */
  assert_false(mlo_component_is_resident(h.comp));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* The encoder has two 1 KiB mutable buffers: eviction writes back exactly
 * those bytes, the host copy is current when the eviction returns, and the
 * reload shows the new values. */
static void check_write_back(const char *overrides) {
  mlo_platform *plat = tu_platform_open(overrides);
  mlo_platform_caps caps;
  mlo_platform_get_caps(plat, &caps);
  if (overrides) assert_true(caps.blocking_d2h);
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 4, 1024, 2},
                                {"transformer", MLO_ROLE_DIT, 2, 4096, 0},
                                {"vae", MLO_ROLE_VAE, 1, 1024, 0}};
  tu_pipe *tp = tu_pipe_build(plat, specs, 3);
  mlo_component *enc = tu_comp(tp, "text_encoder"), *dit = tu_comp(tp, "transformer");
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  for (int round = 0; round < 3; round++) {
    assert_ok(mlo_component_acquire(enc)); /* compute writes the buffers */
    for (unsigned i = 2; i < 4; i++) {
      char name[8];
      snprintf(name, sizeof name, "t%u", i);
      char seed_name[32];
      snprintf(seed_name, sizeof seed_name, "%s round %d", name, round);
      tu_mutate(tp, mlo_component_find_tensor(enc, name), tu_seed("text_encoder", seed_name));
    }
    assert_ok(mlo_component_release(enc));
    mlo_component_stats before = tu_cstats(enc);
    assert_ok(tu_forward(tp, dit)); /* evicts the encoder */
    mlo_component_stats after = tu_cstats(enc);
    assert_false(mlo_component_is_resident(enc));
    assert_int_equal(after.d2h_bytes - before.d2h_bytes, 2 * 1024);
    char why[256] = "";
    if (!tu_host_content_ok(tp, enc, why, sizeof why)) fail_msg("after eviction: %s", why);
    assert_ok(tu_forward(tp, enc)); /* reload: checks the new bytes */
  }
  assert_int_equal(tu_cstats(dit).d2h_bytes, 0);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_mutable_written_back(void **state) {
  (void)state;
  check_write_back(NULL);
}

static void test_mutable_written_back_blocking_d2h(void **state) {
  (void)state;
  check_write_back("blocking_d2h=1");
}

/* A mutable tensor in caller-owned memory (EXTERNAL): the write-back lands
 * in the caller's buffer.  Under the XPU rule (blocking_d2h) it has landed
 * when the evicting call returns, so the caller can read its own buffer
 * directly; otherwise mlo_tensor_host_data() is the point where it has. */
static void check_external_write_back(const char *overrides, bool blocking) {
  mlo_platform *plat = tu_platform_open(overrides);
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 1, 1024, 0},
                                {"transformer", MLO_ROLE_DIT, 1, 4096, 0},
                                {"vae", MLO_ROLE_VAE, 1, 1024, 0}};
  tu_pipe *tp = tu_pipe_build(plat, specs, 3);
  mlo_component *enc = tu_comp(tp, "text_encoder");
  enum { CACHE_BYTES = 64 * 1024 };
  uint8_t *cache = malloc(CACHE_BYTES);
  assert_non_null(cache);
  uint32_t seed = tu_seed("caller", "kv cache");
  tu_fill_pattern(cache, CACHE_BYTES, seed);
  mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
  desc.name = "kv_cache";
  desc.dtype = MLO_DTYPE_U8;
  desc.ndim = 1;
  desc.shape[0] = CACHE_BYTES;
  desc.flags = MLO_TENSOR_EXTERNAL | MLO_TENSOR_MUTABLE | MLO_TENSOR_BUFFER;
  desc.data = cache;
  mlo_tensor *t = NULL;
  assert_ok(mlo_tensor_add(enc, &desc, &t));
  tp->recs[tp->nrecs++] = (tu_tensor_rec){t, enc, seed, CACHE_BYTES, false};
  /* By hand (offload off) so that nothing queued after the write-back
   * waits on the copy queue before the eviction returns. */
  for (int round = 0; round < 4; round++) {
    assert_ok(mlo_component_acquire(enc));
    uint32_t next = tu_seed("caller", round % 2 ? "kv odd" : "kv even") + (uint32_t)round;
    tu_mutate(tp, t, next);
    assert_ok(mlo_component_release(enc));
    assert_ok(mlo_component_evict(enc));
    if (blocking) {
      size_t at = tu_pattern_mismatch(cache, CACHE_BYTES, next);
      if (at != CACHE_BYTES) fail_msg("round %d: caller buffer stale at byte %zu", round, at);
    }
    assert_ptr_equal(mlo_tensor_host_data(t), cache);
    assert_int_equal(tu_pattern_mismatch(cache, CACHE_BYTES, next), CACHE_BYTES);
    assert_ok(tu_forward(tp, enc)); /* reloaded from the caller's buffer */
  }
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  free(cache);
  mlo_platform_close(plat);
}

static void test_external_write_back(void **state) {
  (void)state;
  check_external_write_back(NULL, false);
}

static void test_external_write_back_blocking_d2h(void **state) {
  (void)state;
  check_external_write_back("blocking_d2h=1,bw=200M", true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conflicting_forward_waits),
      cmocka_unit_test(test_hand_evict_of_held_component_refused),
      cmocka_unit_test(test_mutable_written_back),
      cmocka_unit_test(test_mutable_written_back_blocking_d2h),
      cmocka_unit_test(test_external_write_back),
      cmocka_unit_test(test_external_write_back_blocking_d2h),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
