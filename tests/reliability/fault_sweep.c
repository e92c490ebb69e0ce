/*
 * fault_sweep — every platform call of an enable / forward / disable cycle
 * fails in turn, and each failure must be survivable (docs/reliability.md).
 *
 * For each configuration (sync modes, the literal per-tensor/copy-back
 * baseline, the XPU blocking-d2h rule) the cycle is run once on a counting
 * fault platform to learn how many calls of each kind it makes; then, for
 * every kind and every N in 1..count, a fresh pipeline runs the cycle with
 * the Nth call of that kind failing.  Each point must:
 *   - return the status a device gives for that failure (never crash or
 *     hang: a watchdog alarm ends a stuck point and names it),
 *   - leave mlo_pipeline_audit clean and the platform's used bytes equal to
 *     the pipeline's resident bytes,
 *   - succeed on a retry of the same cycle (the fault fires once), with the
 *     same digest of device bytes as a clean run,
 *   - release every device byte when the pipeline is freed.
 * Under the budget policy a failure inside a prefetch is not the caller's:
 * the cycle goes on and must still end with the clean digest, the
 * forwards seeing the right bytes (the prefetch is issued again or the
 * forward loads on demand).
 * A last phase fails each call made by mlo_pipeline_free itself: it cannot
 * report an error, so it must still release everything.  Leaks are caught
 * by LeakSanitizer in the sanitizer build (make test-asan).
 */
#include "testutil.h"

#include "platform/fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WATCHDOG_S 30 /* one sweep point; generous for sanitizer builds */

/* A Wan-shaped pipeline with the paths faults can hit beyond plain loads:
 * mutable buffers (write-back on eviction) and an external tensor (a copy of
 * its own on every load). */
static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 3, 16 * 1024, 0},
    {"transformer", MLO_ROLE_DIT, 4, 32 * 1024, 1},
    {"transformer_2", MLO_ROLE_DIT, 4, 32 * 1024, 0},
    {"vae", MLO_ROLE_VAE, 2, 8 * 1024, 1},
};
#define NSPECS (sizeof specs / sizeof specs[0])

typedef struct {
  const char *name;
  const char *host_opts; /* options for the inner host platform */
  mlo_sync_mode sync;
  bool per_tensor, copy_back;
  unsigned k, m;   /* forwards of the first and second DiT */
  uint64_t budget; /* non-zero: the budget policy with prefetch, this budget */
} sweep_cfg;

static const sweep_cfg configs[] = {
    {"event", "capacity=1M,jitter=1", MLO_SYNC_EVENT, false, false, 3, 2, 0},
    {"device", "capacity=1M,jitter=0", MLO_SYNC_DEVICE, false, false, 2, 2, 0},
    {"literal", "capacity=1M,jitter=0", MLO_SYNC_DEVICE, true, true, 2, 1, 0},
    {"blocking_d2h", "capacity=1M,jitter=0,blocking_d2h=1", MLO_SYNC_EVENT, false, true, 2, 1, 0},
    /* room for VAE + both DiTs (prefetch hides the DiT switch), and for one
     * DiT + the VAE + a little (every switch evicts) */
    {"budget", "capacity=1M,jitter=1", MLO_SYNC_EVENT, false, false, 3, 2, 300 * 1024},
    {"budget_tight", "capacity=1M,jitter=0", MLO_SYNC_EVENT, false, false, 2, 2, 160 * 1024},
};

/* A single configuration / kind / point to replay (argv), or all. */
static const char *only_cfg, *only_kind;
static uint64_t only_n;

static bool selected(const sweep_cfg *cfg, mlo_fault_kind kind, uint64_t n) {
  return (!only_cfg || !strcmp(only_cfg, cfg->name)) &&
         (!only_kind || !strcmp(only_kind, mlo_fault_kind_name(kind))) && (!only_n || only_n == n);
}

/* What the current sweep point is, for the watchdog's message. */
static char point_name[160];

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "fault_sweep: watchdog: a sweep point hung: ";
  ssize_t w = write(2, msg, sizeof msg - 1);
  w = write(2, point_name, strlen(point_name));
  w = write(2, "\n", 1);
  (void)w;
  _exit(3);
}

typedef struct {
  tu_pipe *tp;
  uint64_t digest;
} cycle_state;

static uint64_t fold(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* The forward: the content check of testutil, then a digest of every
 * device byte the component holds. */
static int check_and_fold(mlo_component *comp, cycle_state *cs) {
  tu_pipe *tp = cs->tp;
  if (tu_forward_check(comp, tp)) return 1;
  cs->digest = fold(cs->digest, mlo_component_name(comp), strlen(mlo_component_name(comp)));
  for (size_t i = 0; i < tp->nrecs; i++) {
    const tu_tensor_rec *r = &tp->recs[i];
    if (r->comp != comp) continue;
    uint8_t *buf = malloc(r->bytes);
    if (!buf) return 1;
    int rc = tu_read_device(tp, r->tensor, buf, r->bytes);
    if (!rc) cs->digest = fold(cs->digest, buf, r->bytes);
    free(buf);
    if (rc) return 1;
  }
  return 0;
}

/* The checks read device memory through the platform where blocks are not
 * pointers: those calls are the test's, not the library's, so the fault
 * platform neither counts nor fails them. */
static int digest_forward(mlo_component *comp, void *user) {
  cycle_state *cs = user;
  mlo_fault_pause(cs->tp->plat, true);
  int bad = check_and_fold(comp, cs);
  mlo_fault_pause(cs->tp->plat, false);
  return bad;
}

/* One prompt: enable; encoder; DiT1 x k; DiT2 x m; the VAE through
 * acquire/release (C17), its bytes folded like a forward's; disable.
 * First failure wins. */
static int run_prompt(tu_pipe *tp, const sweep_cfg *cfg, cycle_state *cs_out) {
  cycle_state cs = *cs_out;
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.sync = cfg->sync;
  s.per_tensor_copies = cfg->per_tensor;
  s.copy_back = cfg->copy_back;
  if (cfg->budget) {
    s.policy = MLO_POLICY_BUDGET;
    s.budget_bytes = cfg->budget;
  }
  int rc = mlo_offload_enable(tp->pipe, &s);
  if (!rc) rc = mlo_component_forward(tu_comp(tp, "text_encoder"), digest_forward, &cs);
  for (unsigned i = 0; i < cfg->k && !rc; i++)
    rc = mlo_component_forward(tu_comp(tp, "transformer"), digest_forward, &cs);
  for (unsigned i = 0; i < cfg->m && !rc; i++)
    rc = mlo_component_forward(tu_comp(tp, "transformer_2"), digest_forward, &cs);
  mlo_component *vae = tu_comp(tp, "vae");
  if (!rc && !(rc = mlo_component_acquire(vae))) {
    int bad = digest_forward(vae, &cs);
    rc = mlo_component_release(vae);
    if (bad && !rc) rc = MLO_ECALLBACK;
  }
  if (!rc) rc = mlo_offload_disable(tp->pipe);
  *cs_out = cs;
  return rc;
}

/* The swept cycle is two prompts: the second finds a DiT resident and
 * reloads the encoder over it, which the first never does. */
static int run_cycle(tu_pipe *tp, const sweep_cfg *cfg, uint64_t *digest) {
  cycle_state cs = {tp, 14695981039346656037ull};
  int rc = run_prompt(tp, cfg, &cs);
  if (!rc) rc = run_prompt(tp, cfg, &cs);
  *digest = cs.digest;
  return rc;
}

static mlo_platform *open_fault(const sweep_cfg *cfg) {
  char inner[384], spec[512];
  if (tu_platform_is_host())
    tu_merge_host_spec(tu_platform_base_spec(), cfg->host_opts, inner, sizeof inner);
  else
    snprintf(inner, sizeof inner, "%s", tu_platform_base_spec());
  snprintf(spec, sizeof spec, "fault:kind=any,nth=0,inner=%s", inner);
  mlo_platform *plat = NULL;
  char err[256] = "";
  int rc = mlo_platform_open(spec, &plat, err, sizeof err);
  if (rc == MLO_ENODEV) skip();
  if (rc) fail_msg("mlo_platform_open(\"%s\") -> %s: %s", spec, mlo_err_name(rc), err);
  assert_true(mlo_fault_is(plat));
  return plat;
}

static tu_pipe *build_pipe(const sweep_cfg *cfg, mlo_platform *plat) {
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  /* A caller-owned tensor: copied from where the caller keeps it (C7). */
  tu_add_tensor(tp, tu_comp(tp, "text_encoder"), "external", 4096, MLO_TENSOR_EXTERNAL);
  tp->audit_in_forward = true;
  tp->exclusion_in_forward = !cfg->budget; /* under a budget, the budget decides */
  if (cfg->budget) {
    mlo_schedule_entry e[] = {{tu_comp(tp, "text_encoder"), 1},
                              {tu_comp(tp, "transformer"), cfg->k},
                              {tu_comp(tp, "transformer_2"), cfg->m},
                              {tu_comp(tp, "vae"), 1}};
    assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, 4));
  }
  return tp;
}

/* Device bytes the platform has handed out equal the pipeline's resident
 * blocks, and the audit is clean. */
static void assert_consistent(tu_pipe *tp, const char *when) {
  int rc = mlo_pipeline_audit(tp->pipe);
  if (rc) fail_msg("%s: %s: audit: %s", point_name, when, mlo_pipeline_errmsg(tp->pipe));
  mlo_pipeline_stats ps = tu_pstats(tp);
  uint64_t used = tu_device_used(tp->plat);
  if (used != ps.device_bytes)
    fail_msg("%s: %s: platform has %llu device bytes in use, pipeline accounts %llu", point_name,
             when, (unsigned long long)used, (unsigned long long)ps.device_bytes);
}

/* The state teardown is swept from: a cycle done, offload disabled, and a
 * load still in flight (queued copies read the encoder's host slab), so a
 * teardown that frees slabs without draining the copies is caught (under
 * ASan: a read of freed memory by the copy engine). */
static tu_pipe *before_teardown(const sweep_cfg *cfg, mlo_platform *plat) {
  tu_pipe *tp = build_pipe(cfg, plat);
  uint64_t digest = 0;
  assert_ok(run_cycle(tp, cfg, &digest));
  mlo_component *enc = tu_comp(tp, "text_encoder");
  if (cfg->budget && mlo_component_is_resident(enc)) assert_ok(mlo_component_evict(enc));
  assert_false(mlo_component_is_resident(enc));
  assert_ok(mlo_component_load(enc));
  return tp;
}

typedef struct {
  uint64_t clean_digest;
  uint64_t counts[MLO_FAULT_KINDS];      /* calls of a clean cycle */
  uint64_t free_counts[MLO_FAULT_KINDS]; /* calls of mlo_pipeline_free after it */
} baseline;

static void measure_baseline(const sweep_cfg *cfg, baseline *b) {
  snprintf(point_name, sizeof point_name, "%s: clean run", cfg->name);
  mlo_platform *plat = open_fault(cfg);
  tu_pipe *tp = build_pipe(cfg, plat);
  mlo_fault_arm(plat, MLO_FAULT_ANY, 0);
  alarm(WATCHDOG_S);
  assert_ok(run_cycle(tp, cfg, &b->clean_digest));
  mlo_fault_counts(plat, b->counts);
  tu_assert_forwards_clean(tp);
  assert_consistent(tp, "after a clean cycle");
  uint64_t again = 0;
  assert_ok(run_cycle(tp, cfg, &again)); /* the digest depends on content only */
  assert_int_equal(again, b->clean_digest);
  tu_pipe_free(tp);
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);

  plat = open_fault(cfg);
  tp = before_teardown(cfg, plat);
  mlo_fault_arm(plat, MLO_FAULT_ANY, 0);
  tu_pipe_free(tp);
  mlo_fault_counts(plat, b->free_counts);
  alarm(0);
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);
}

static unsigned absorbed_points; /* faults in a prefetch, which the cycle survives */

/* One point: the nth call of kind fails during the cycle. */
static void sweep_point(const sweep_cfg *cfg, const baseline *b, mlo_fault_kind kind,
                        uint64_t nth) {
  snprintf(point_name, sizeof point_name, "%s: %s #%llu of %llu", cfg->name,
           mlo_fault_kind_name(kind), (unsigned long long)nth, (unsigned long long)b->counts[kind]);
  alarm(WATCHDOG_S);
  mlo_platform *plat = open_fault(cfg);
  tu_pipe *tp = build_pipe(cfg, plat);
  mlo_fault_arm(plat, kind, nth);
  uint64_t digest = 0;
  int rc = run_cycle(tp, cfg, &digest);
  if (!mlo_fault_fired(plat)) fail_msg("%s: the fault never fired", point_name);
  int want = mlo_fault_status(kind);
  if (rc == MLO_OK && cfg->budget) { /* it hit a prefetch: the cycle went on, correctly */
    tu_assert_forwards_clean(tp);
    if (digest != b->clean_digest) fail_msg("%s: a failed prefetch changed the digest", point_name);
    absorbed_points++;
  } else if (rc != want) {
    fail_msg("%s: the cycle returned %s (%s), expected %s", point_name, mlo_err_name(rc),
             mlo_pipeline_errmsg(tp->pipe), mlo_err_name(want));
  } else if (!mlo_pipeline_errmsg(tp->pipe)[0]) {
    fail_msg("%s: no error message", point_name);
  }
  assert_consistent(tp, "after the fault");
  tu_reset_observations(tp);
  rc = run_cycle(tp, cfg, &digest);
  if (rc)
    fail_msg("%s: the retry returned %s: %s", point_name, mlo_err_name(rc),
             mlo_pipeline_errmsg(tp->pipe));
  tu_assert_forwards_clean(tp);
  if (digest != b->clean_digest)
    fail_msg("%s: the retry's digest %016llx differs from a clean run's %016llx", point_name,
             (unsigned long long)digest, (unsigned long long)b->clean_digest);
  assert_consistent(tp, "after the retry");
  tu_pipe_free(tp);
  if (tu_device_used(plat))
    fail_msg("%s: %llu device bytes still in use after the pipeline was freed", point_name,
             (unsigned long long)tu_device_used(plat));
  mlo_platform_close(plat);
  alarm(0);
}

/* One point of the teardown: the nth call of kind made by
 * mlo_pipeline_free fails.  Nothing can be reported; nothing may leak. */
static void sweep_free_point(const sweep_cfg *cfg, mlo_fault_kind kind, uint64_t nth) {
  snprintf(point_name, sizeof point_name, "%s: pipeline_free: %s #%llu", cfg->name,
           mlo_fault_kind_name(kind), (unsigned long long)nth);
  alarm(WATCHDOG_S);
  mlo_platform *plat = open_fault(cfg);
  tu_pipe *tp = before_teardown(cfg, plat);
  mlo_fault_arm(plat, kind, nth);
  tu_pipe_free(tp);
  if (!mlo_fault_fired(plat)) fail_msg("%s: the fault never fired", point_name);
  if (tu_device_used(plat))
    fail_msg("%s: %llu device bytes still in use after the pipeline was freed", point_name,
             (unsigned long long)tu_device_used(plat));
  mlo_platform_close(plat);
  alarm(0);
}

static unsigned total_points[MLO_FAULT_KINDS], total_free_points;

static void sweep_config(const sweep_cfg *cfg) {
  baseline b;
  memset(&b, 0, sizeof b);
  measure_baseline(cfg, &b);
  printf("%-13s calls per cycle:", cfg->name);
  for (unsigned k = 0; k < MLO_FAULT_KINDS; k++)
    printf(" %s=%llu", mlo_fault_kind_name((mlo_fault_kind)k), (unsigned long long)b.counts[k]);
  printf("; in pipeline_free:");
  for (unsigned k = 0; k < MLO_FAULT_KINDS; k++)
    printf(" %s=%llu", mlo_fault_kind_name((mlo_fault_kind)k),
           (unsigned long long)b.free_counts[k]);
  printf("\n");
  if (only_cfg && strcmp(only_cfg, cfg->name)) return;
  for (unsigned k = 0; k < MLO_FAULT_KINDS; k++) {
    /* Every kind the cycle makes must be there to sweep: a zero count
     * would mean the sweep silently covers less than it claims. */
    if (k != MLO_FAULT_SYNC || cfg->sync == MLO_SYNC_DEVICE) assert_true(b.counts[k] > 0);
    for (uint64_t n = 1; n <= b.counts[k]; n++)
      if (selected(cfg, (mlo_fault_kind)k, n)) {
        sweep_point(cfg, &b, (mlo_fault_kind)k, n);
        total_points[k]++;
      }
    for (uint64_t n = 1; n <= b.free_counts[k]; n++)
      if (selected(cfg, (mlo_fault_kind)k, n)) {
        sweep_free_point(cfg, (mlo_fault_kind)k, n);
        total_free_points++;
      }
  }
}

static void test_fault_sweep(void **state) {
  (void)state;
  signal(SIGALRM, watchdog);
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) sweep_config(&configs[i]);
  unsigned total = 0;
  printf("fault points swept:");
  for (unsigned k = 0; k < MLO_FAULT_KINDS; k++) {
    printf(" %s=%u", mlo_fault_kind_name((mlo_fault_kind)k), total_points[k]);
    total += total_points[k];
  }
  printf(" (total %u), in pipeline_free %u; %u in a prefetch, survived\n", total, total_free_points,
         absorbed_points);
  if (!only_cfg) assert_true(absorbed_points > 0); /* the prefetch paths were reached */
}

/* Teardown while a load is still reading the host slab, and the drain
 * before the slabs are freed fails: the slab must not be freed under the
 * copy (under ASan the copy engine would read freed memory). */
static void test_teardown_inflight_sync_fault(void **state) {
  (void)state;
  static const tu_comp_spec one[] = {{"text_encoder", MLO_ROLE_ENCODER, 4, 256 * 1024, 0}};
  const sweep_cfg cfg = {"teardown", "capacity=8M,jitter=1,bw=1G", MLO_SYNC_EVENT, 0, 0, 0, 0, 0};
  for (int round = 0; round < 20; round++) {
    mlo_platform *plat = open_fault(&cfg);
    tu_pipe *tp = tu_pipe_build(plat, one, 1);
    assert_ok(mlo_component_load(tu_comp(tp, "text_encoder"))); /* ~1 ms of copying at 1 GB/s */
    mlo_fault_arm(plat, MLO_FAULT_SYNC, 1);
    tu_pipe_free(tp);
    assert_true(mlo_fault_fired(plat));
    assert_int_equal(tu_device_used(plat), 0);
    mlo_platform_close(plat);
  }
}

/* The spec parser: inner= takes the rest, junk is refused with a message. */
static void test_fault_spec(void **state) {
  (void)state;
  mlo_platform *p = NULL;
  char err[256] = "";
  assert_ok(mlo_platform_open("fault:kind=copy,nth=2,inner=host:capacity=1M,jitter=0", &p, err,
                              sizeof err));
  assert_true(mlo_fault_is(p));
  assert_string_equal(mlo_platform_name(p), "host"); /* the workload picks by name */
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.total_bytes, 1u << 20); /* the inner options reached the inner */
  mlo_platform_close(p);
  /* A spec that names no call to fail would never fire: refused. */
  static const char *const bad[] = {
      "fault",
      "fault:kind=copy",
      "fault:nth=3",
      "fault:inner=host",
      "fault:kind=disk",
      "fault:nth=-1",
      "fault:nth=1e3",
      "fault:nth=",
      "fault:inner=",
      "fault:inner=nosuch",
      "fault:inner=fault",
      "fault:colour=red",
      "fault:kind=copy,x",
      "fault:nth=99999999999999999999999",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    int rc = mlo_platform_open(bad[i], &p, err, sizeof err);
    if (rc == MLO_OK) fail_msg("%s was accepted", bad[i]);
    assert_null(p);
    if (!err[0]) fail_msg("%s: refused without a message", bad[i]);
  }
}

/* fault_sweep [CONFIG [KIND [N]]] replays part of the sweep, e.g. the point
 * a failure message names: fault_sweep event sync 9. */
int main(int argc, char **argv) {
  only_cfg = argc > 1 ? argv[1] : NULL;
  only_kind = argc > 2 ? argv[2] : NULL;
  only_n = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_spec),
      cmocka_unit_test(test_fault_sweep),
      cmocka_unit_test(test_teardown_inflight_sync_fault),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
