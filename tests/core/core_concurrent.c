/*
 * core_concurrent — two threads run a DiT and an encoder (mutually
 * exclusive) over and over; neither ever sees its own component evicted or
 * wrong mid-forward, the two callbacks never overlap, and the audit is clean
 * inside every forward (docs/reliability.md: a component that is executing is never
 * evicted under it).  A third thread runs the VAE, which may overlap with
 * either.
 */
#include "testutil.h"

#include <pthread.h>

#define ITERATIONS 150

typedef struct {
  tu_pipe *tp;
  mlo_component *comp;
  atomic_int *running_exclusive; /* DiT/encoder callbacks in flight */
  atomic_int *overlaps;
  bool exclusive;
  int failures;
} runner;

static int checked_callback(mlo_component *comp, void *user) {
  runner *r = user;
  if (r->exclusive && atomic_fetch_add(r->running_exclusive, 1) != 0)
    atomic_fetch_add(r->overlaps, 1);
  int bad = tu_forward_check(comp, r->tp); /* at start */
  for (volatile int spin = 0; spin < 2000; spin++) {
  }
  bad |= tu_forward_check(comp, r->tp); /* and at the end */
  if (r->exclusive) atomic_fetch_sub(r->running_exclusive, 1);
  return bad;
}

static void *run(void *arg) {
  runner *r = arg;
  for (int i = 0; i < ITERATIONS; i++)
    if (mlo_component_forward(r->comp, checked_callback, r) != MLO_OK) r->failures++;
  return NULL;
}

static void run_concurrently(mlo_sync_mode sync) {
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.sync = sync;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  atomic_int running = 0, overlaps = 0;
  runner runners[3] = {
      {tp, tu_comp(tp, "transformer"), &running, &overlaps, true, 0},
      {tp, tu_comp(tp, "text_encoder"), &running, &overlaps, true, 0},
      {tp, tu_comp(tp, "vae"), &running, &overlaps, false, 0},
  };
  pthread_t th[3];
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, run, &runners[i]), 0);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++) assert_int_equal(runners[i].failures, 0);
  assert_int_equal(atomic_load(&overlaps), 0);
  assert_int_equal(atomic_load(&tp->forwards), 2 * 3 * ITERATIONS);
  tu_assert_forwards_clean(tp);
  mlo_pipeline_stats s = tu_pstats(tp);
  assert_int_equal(s.total.forwards, 3 * ITERATIONS);
  assert_int_equal(s.total.d2h_bytes, 0);
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_concurrent_event_sync(void **state) {
  (void)state;
  run_concurrently(MLO_SYNC_EVENT);
}

static void test_concurrent_device_sync(void **state) {
  (void)state;
  run_concurrently(MLO_SYNC_DEVICE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_event_sync),
      cmocka_unit_test(test_concurrent_device_sync),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
