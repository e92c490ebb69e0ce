/*
 * load_test — N threads issue forwards on random components of one
 * Wan-shaped pipeline for a bounded time, on a device that holds only what
 * offload needs, so every DiT/encoder switch evicts (docs/reliability.md: a component
 * that is executing is never evicted under it).
 *
 * Inside every forward the component must be resident with its own bytes
 * (tu_forward_check).  Afterwards the audit must pass, and memory must come
 * back to where it started: no device bytes in use once offload is
 * disabled and everything evicted, host slabs the size they had after
 * materialization (nothing grew under load; pinned never above 1.0x of the
 * weights), and no device bytes after the pipeline is freed.  It reports
 * forwards per second; that figure is information, never asserted.
 *
 * A second run of half the length switches offload off and on under the
 * loaders (refused while anything executes), checking every hooked forward.
 *
 * Usage: load_test [THREADS [SECONDS]] (default 4 threads, 5 s).
 */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned n_threads = 4;
static double seconds = 5.0;

typedef struct {
  tu_pipe *tp;
  uint64_t deadline_ns, rng;
  unsigned forwards;
  int first_error;
  bool pauses; /* rest 1 ms every 16 forwards, so all threads are sometimes idle */
} loader;

static void *load(void *arg) {
  loader *l = arg;
  size_t n = mlo_pipeline_component_count(l->tp->pipe);
  while (mlo_now_ns() < l->deadline_ns) {
    l->rng = l->rng * 6364136223846793005ull + 1442695040888963407ull;
    mlo_component *c = mlo_pipeline_component_at(l->tp->pipe, (size_t)(l->rng >> 33) % n);
    int rc = tu_forward(l->tp, c);
    if (rc) {
      l->first_error = rc;
      break;
    }
    l->forwards++;
    if (l->pauses && l->forwards % 16 == (l->rng >> 60)) tu_sleep_ms(1);
  }
  return NULL;
}

/* Disables and re-enables offload for the run's length while the loaders
 * forward: each call is refused (MLO_EBUSY) whenever anything executes. */
typedef struct {
  tu_pipe *tp;
  uint64_t deadline_ns;
  unsigned toggles, refused;
  int first_error;
} toggler;

static void *toggle(void *arg) {
  toggler *t = arg;
  while (mlo_now_ns() < t->deadline_ns && !t->first_error) {
    bool on = mlo_offload_is_enabled(t->tp->pipe);
    int rc = on ? mlo_offload_disable(t->tp->pipe) : mlo_offload_enable(t->tp->pipe, NULL);
    if (rc == MLO_OK)
      t->toggles++;
    else if (rc == MLO_EBUSY)
      t->refused++;
    else
      t->first_error = rc;
    tu_sleep_ms(1);
  }
  return NULL;
}

/* Joins the loaders; fails on the first error; the forwards they ran. */
static unsigned join_loaders(loader *ls, pthread_t *th, tu_pipe *tp, bool each_must_run) {
  unsigned total = 0;
  for (unsigned i = 0; i < n_threads; i++) {
    pthread_join(th[i], NULL);
    if (ls[i].first_error)
      fail_msg("thread %u: a forward returned %s: %s", i, mlo_err_name(ls[i].first_error),
               mlo_pipeline_errmsg(tp->pipe));
    if (each_must_run && !ls[i].forwards) fail_msg("thread %u never got to run a forward", i);
    total += ls[i].forwards;
  }
  return total;
}

static void test_load(void **state) {
  (void)state;
  /* Capacity: exactly what offload needs for tu_wan_specs (text_encoder +
   * vae, or the larger DiT + vae), so switches must evict. */
  mlo_platform *plat = tu_platform_open("capacity=144K,jitter=0");
  tu_pipe *tp = tu_pipe_build_wan(plat);
  tp->exclusion_in_forward = true;
  assert_int_equal(tu_device_used(plat), 0);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  mlo_pipeline_stats start = tu_pstats(tp);
  assert_true(start.host_slab_bytes > 0);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));

  loader ls[16];
  pthread_t th[16];
  assert_true(n_threads >= 1 && n_threads <= 16);
  uint64_t t0 = mlo_now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9);
  for (unsigned i = 0; i < n_threads; i++) {
    ls[i] = (loader){tp, deadline, 0x2545F4914F6CDD1Dull * (i + 1), 0, 0, false};
    assert_int_equal(pthread_create(&th[i], NULL, load, &ls[i]), 0);
  }
  unsigned total = join_loaders(ls, th, tp, true);
  double wall = (double)(mlo_now_ns() - t0) / 1e9;
  tu_assert_forwards_clean(tp); /* resident + right bytes + exclusion, every forward */
  assert_int_equal(atomic_load(&tp->forwards), total);
  tu_assert_audit(tp);

  mlo_pipeline_stats end = tu_pstats(tp);
  printf("load: %u threads x %.1f s: %u forwards, %.0f forwards/s; %llu loads, %llu evictions, "
         "%.3f s waiting on loads\n",
         n_threads, wall, total, total / wall, (unsigned long long)end.total.loads,
         (unsigned long long)end.total.evictions, (double)end.total.wait_ns / 1e9);
  assert_int_equal(end.total.forwards, total);
  assert_true(end.total.evictions > 0); /* the capacity forced switching */

  /* Memory back to its starting figures. */
  assert_ok(mlo_offload_disable(tp->pipe));
  for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++)
    assert_ok(mlo_component_evict(mlo_pipeline_component_at(tp->pipe, i)));
  end = tu_pstats(tp);
  assert_int_equal(tu_device_used(plat), 0);
  assert_int_equal(end.device_bytes, 0);
  assert_int_equal(end.host_slab_bytes, start.host_slab_bytes);
  assert_int_equal(end.pinned_bytes, start.pinned_bytes);
  assert_true(end.pinned_bytes <= end.host_slab_bytes);
  tu_pipe_free(tp);
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);
}

/* The same loaders with offload switched off and on under them, on a device
 * that holds everything (unhooked forwards evict nothing). */
static void test_load_with_toggles(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=4M,jitter=0");
  tu_pipe *tp = tu_pipe_build_wan(plat);
  tp->exclusion_in_forward = true; /* checked whenever offload is on */
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  loader ls[16];
  pthread_t th[16], tt;
  uint64_t deadline = mlo_now_ns() + (uint64_t)(seconds / 2 * 1e9);
  toggler tg = {tp, deadline, 0, 0, 0};
  for (unsigned i = 0; i < n_threads; i++) {
    ls[i] = (loader){tp, deadline, 0x9E3779B97F4A7C15ull * (i + 3), 0, 0, true};
    assert_int_equal(pthread_create(&th[i], NULL, load, &ls[i]), 0);
  }
  assert_int_equal(pthread_create(&tt, NULL, toggle, &tg), 0);
  unsigned total = join_loaders(ls, th, tp, false);
  pthread_join(tt, NULL);
  if (tg.first_error) fail_msg("enable/disable returned %s", mlo_err_name(tg.first_error));
  printf("load with toggles: %u threads: %u forwards; %u enable/disable calls took, %u refused "
         "(busy)\n",
         n_threads, total, tg.toggles, tg.refused);
  tu_assert_forwards_clean(tp);
  assert_true(tg.toggles > 0);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);
}

int main(int argc, char **argv) {
  if (argc > 1) n_threads = (unsigned)strtoul(argv[1], NULL, 10);
  if (argc > 2) seconds = strtod(argv[2], NULL);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_load),
                                     cmocka_unit_test(test_load_with_toggles)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
