/*
 * C8_no_compute_race — before a hooked forward starts, everything it reads
 * is complete on the device.  On the host platform copies land late at
 * random (jitter=1) and slowly (bw=), and every forward checks every byte it
 * reads.  The same check must catch the race when ordering is switched off
 * (MLO_SYNC_UNSAFE_NONE): that proves the detector can see one.
 */
#include "testutil.h"

#include <stdlib.h>

/* 256 KiB per switching component so that a throttled copy takes ms. */
static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 4, 64 * 1024, 0},
    {"transformer", MLO_ROLE_DIT, 4, 64 * 1024, 0},
    {"transformer_2", MLO_ROLE_DIT, 4, 64 * 1024, 0},
    {"vae", MLO_ROLE_VAE, 1, 4096, 0},
};

/* Runs n forwards in a seeded random order; returns the forwards that saw
 * wrong bytes. */
static unsigned run_switches(const char *overrides, mlo_sync_mode sync, unsigned n, unsigned seed) {
  mlo_platform *plat = tu_platform_open(overrides);
  tu_pipe *tp = tu_pipe_build(plat, specs, 4);
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.sync = sync;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  srand(seed);
  for (unsigned i = 0; i < n; i++) {
    /* Alternate switching components so most forwards need a load. */
    const char *name = specs[(i % 2) ? 0 : 1 + (unsigned)rand() % 2].name;
    int rc = tu_forward(tp, tu_comp(tp, name));
    if (sync != MLO_SYNC_UNSAFE_NONE) assert_ok(rc);
  }
  assert_int_equal(atomic_load(&tp->forwards), n);
  assert_int_equal(atomic_load(&tp->not_resident), 0);
  unsigned bad = atomic_load(&tp->bad_content);
  if (sync != MLO_SYNC_UNSAFE_NONE && bad) fail_msg("%u stale reads: %s", bad, tp->first_failure);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  return bad;
}

static void test_event_sync_never_stale(void **state) {
  (void)state;
  run_switches(NULL, MLO_SYNC_EVENT, 200, 11);
}

static void test_device_sync_never_stale(void **state) {
  (void)state;
  run_switches(NULL, MLO_SYNC_DEVICE, 100, 12);
}

static void test_throttled_event_sync_never_stale(void **state) {
  (void)state;
  run_switches("bw=50M,jitter=1", MLO_SYNC_EVENT, 24, 13);
}

/* The detector works: without ordering, a slow copy is read too early. */
static void test_unsafe_none_is_caught(void **state) {
  (void)state;
  if (TU_TSAN) skip();
  unsigned bad = run_switches("bw=50M,jitter=1", MLO_SYNC_UNSAFE_NONE, 24, 14);
  assert_true(bad >= 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_sync_never_stale),
      cmocka_unit_test(test_device_sync_never_stale),
      cmocka_unit_test(test_throttled_event_sync_never_stale),
      cmocka_unit_test(test_unsafe_none_is_caught),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
