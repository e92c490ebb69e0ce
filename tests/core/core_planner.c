/*
 * core_planner.c — the BUDGET policy's decisions (docs/planner.md) against
 * sequences computed by hand: Belady's victims with a declared schedule,
 * least recently used without one, ties, a schedule shorter than the
 * request, calls off the schedule, a schedule learned from the calls,
 * prefetch that never displaces what is
 * executing or acquired, a prefetch that fails, waiting for room held by
 * another thread, zero copies in the steady state when everything fits, and
 * the settings' validation.
 *
 * The components are four one-tensor components of 64 KiB, so a budget of
 * 128 KiB holds exactly two; the trace records every load and eviction as
 * "+P" / "-P", and each test compares that string with the hand-made one.
 */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#define KB64 (64 * 1024)

static const tu_comp_spec four[] = {
    {"P", MLO_ROLE_ENCODER, 1, KB64, 0},
    {"Q", MLO_ROLE_DIT, 1, KB64, 0},
    {"R", MLO_ROLE_DIT, 1, KB64, 0},
    {"S", MLO_ROLE_VAE, 1, KB64, 0},
};

typedef struct {
  char moves[1024];
  unsigned prefetch_events;
} recorder;

static void record(const mlo_trace_event *ev, void *user) {
  recorder *r = user;
  const char *sign = ev->kind == MLO_TRACE_LOAD_BEGIN ? "+"
                     : ev->kind == MLO_TRACE_EVICT    ? "-"
                                                      : NULL;
  if (ev->kind == MLO_TRACE_PREFETCH) r->prefetch_events++;
  if (!sign) return;
  size_t len = strlen(r->moves);
  snprintf(r->moves + len, sizeof r->moves - len, "%s%s%s", len ? " " : "", sign,
           mlo_component_name(ev->comp));
}

typedef struct {
  mlo_platform *plat;
  tu_pipe *tp;
  recorder rec;
} fixture;

/* These components, traced, offload enabled with the budget policy. */
static void setup_with(fixture *f, const tu_comp_spec *specs, size_t n, const char *host_opts,
                       uint64_t budget, bool prefetch) {
  memset(f, 0, sizeof *f);
  f->plat = tu_platform_open(host_opts);
  f->tp = tu_pipe_build(f->plat, specs, n);
  f->tp->audit_in_forward = true;
  mlo_pipeline_set_trace(f->tp->pipe, record, &f->rec);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = budget;
  s.prefetch = prefetch;
  assert_ok(mlo_offload_enable(f->tp->pipe, &s));
}

/* The four 64 KiB components. */
static void setup(fixture *f, const char *host_opts, uint64_t budget, bool prefetch) {
  setup_with(f, four, 4, host_opts, budget, prefetch);
}

static void teardown(fixture *f) {
  mlo_pipeline_set_trace(f->tp->pipe, NULL, NULL);
  tu_pipe_free(f->tp);
  mlo_platform_close(f->plat);
}

static void schedule(fixture *f, const char *names) {
  mlo_schedule_entry e[16];
  size_t n = 0;
  for (const char *p = names; *p; p++)
    e[n++] = (mlo_schedule_entry){tu_comp(f->tp, (char[2]){*p, 0}), 1};
  assert_ok(mlo_pipeline_set_schedule(f->tp->pipe, e, n));
}

static void run(fixture *f, const char *names) {
  for (const char *p = names; *p; p++)
    assert_ok(tu_forward(f->tp, tu_comp(f->tp, (char[2]){*p, 0})));
  tu_assert_forwards_clean(f->tp);
  tu_assert_audit(f->tp);
}

static void expect_moves(fixture *f, const char *want) {
  if (strcmp(f->rec.moves, want)) fail_msg("moves\n  got:  %s\n  want: %s", f->rec.moves, want);
  f->rec.moves[0] = '\0';
}

/* P Q R P S with room for two.  Making room for R (P next in 1 call, Q in
 * 4) evicts Q; for S (P in 1, R in 3) evicts R; next request, for Q (P in
 * 2, S in 3) evicts S; then as before. */
static void test_belady_by_hand(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M", 2 * KB64, false);
  schedule(&f, "PQRPS");
  run(&f, "PQRPS");
  expect_moves(&f, "+P +Q -Q +R -R +S");
  run(&f, "PQRPS");
  expect_moves(&f, "-S +Q -Q +R -R +S");
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(f.tp->pipe, &st));
  assert_int_equal(st.total.loads, 7); /* least recently used needs 8 (below) */
  assert_int_equal(st.total.prefetches, 0);
  assert_int_equal(st.budget_bytes, 2 * KB64);
  assert_true(st.peak_device_bytes <= 2 * KB64);
  teardown(&f);
}

/* Sizes decide before distance: X (128 KiB) is used after Y (64 KiB), so
 * Belady would evict X for Z; but Y alone frees the room and is half the
 * bytes to bring back, so Y goes, then Z for Y's return. */
static void test_smallest_that_frees_enough(void **state) {
  (void)state;
  static const tu_comp_spec specs[] = {
      {"X", MLO_ROLE_DIT, 1, 2 * KB64, 0},
      {"Y", MLO_ROLE_ENCODER, 1, KB64, 0},
      {"Z", MLO_ROLE_DIT, 1, KB64, 0},
  };
  fixture f;
  setup_with(&f, specs, 3, "capacity=1M", 3 * KB64, false);
  schedule(&f, "XYZY");
  run(&f, "XYZY");
  expect_moves(&f, "+X +Y -Y +Z -Z +Y");
  teardown(&f);
}

/* The same calls with nothing declared: least recently used. */
static void test_lru_without_schedule(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M", 2 * KB64, true);
  run(&f, "PQRPS");
  expect_moves(&f, "+P +Q -P +R -Q +P -R +S");
  run(&f, "PQRPS");
  expect_moves(&f, "-S +Q -P +R -Q +P -R +S");
  teardown(&f);
}

/* X and Y are never scheduled (next use: never), so both tie at infinity
 * and the older goes first; then Y (never) before P (2 calls away); then Q
 * (2 away) before P (1 away). */
static void test_ties_and_unscheduled(void **state) {
  (void)state;
  static const tu_comp_spec specs[] = {
      {"P", MLO_ROLE_ENCODER, 1, KB64, 0}, {"Q", MLO_ROLE_DIT, 1, KB64, 0},
      {"R", MLO_ROLE_DIT, 1, KB64, 0},     {"X", MLO_ROLE_OTHER, 1, KB64, 0},
      {"Y", MLO_ROLE_OTHER, 1, KB64, 0},
  };
  fixture f;
  setup_with(&f, specs, 5, "capacity=1M", 2 * KB64, false);
  schedule(&f, "PQR");
  run(&f, "XYPQR");
  expect_moves(&f, "+X +Y -X +P -Y +Q -Q +R");
  teardown(&f);
}

/* The schedule says Q twice, the request calls it four times and adds an
 * unscheduled call of S: every call is served correctly, and the cursor
 * resynchronizes so the next request is planned as declared. */
static void test_schedule_shorter_and_off_schedule(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M,jitter=1", 3 * KB64, true);
  mlo_schedule_entry e[] = {
      {tu_comp(f.tp, "P"), 1}, {tu_comp(f.tp, "Q"), 2}, {tu_comp(f.tp, "R"), 0}};
  assert_ok(mlo_pipeline_set_schedule(f.tp->pipe, e, 3));
  run(&f, "PQQQQSR");
  run(&f, "PQQR");
  run(&f, "RRPQ"); /* wildly off: still correct */
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(f.tp->pipe, &st));
  assert_true(st.peak_device_bytes <= 3 * KB64);
  assert_int_equal(st.total.forwards, 15);
  teardown(&f);
}

/* Prefetch: with room for three and P Q R declared, enable loads P, Q, R
 * ahead of their first calls (the first three), and no call waits on a load
 * it issued itself. */
static void test_prefetch_loads_ahead(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M,jitter=1", 3 * KB64, true);
  schedule(&f, "PQR");
  /* The schedule came after enable: the first call issues the prefetch. */
  run(&f, "P");
  expect_moves(&f, "+P +Q +R");
  assert_int_equal(f.rec.prefetch_events, 2);
  run(&f, "QRPQRPQR");
  expect_moves(&f, ""); /* everything fits: nothing moves again */
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(f.tp->pipe, &st));
  assert_int_equal(st.total.loads, 3);
  assert_int_equal(st.total.prefetches, 2);
  assert_int_equal(st.total.evictions, 0);
  teardown(&f);
}

/* Room for two, P Q R S declared.  Right after P's call Q fits beside it;
 * R (next in 1 call) may displace only what is needed after R's call and
 * one more: P (next in 3) qualifies, but P is acquired, so R waits.  Q's
 * release makes Q (next in 3) displaceable, and R loads then, with P still
 * held; nothing qualifies for S (P is next in 2, and held). */
static void test_prefetch_never_displaces_held(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M", 2 * KB64, true);
  schedule(&f, "PQRS");
  mlo_component *P = tu_comp(f.tp, "P"), *Q = tu_comp(f.tp, "Q"), *R = tu_comp(f.tp, "R");
  assert_ok(mlo_component_acquire(P)); /* prefetches Q beside it, not R */
  expect_moves(&f, "+P +Q");
  assert_false(mlo_component_is_resident(R));
  assert_ok(tu_forward(f.tp, Q));
  expect_moves(&f, "-Q +R");
  assert_true(mlo_component_is_resident(P));
  assert_ok(mlo_component_release(P));
  expect_moves(&f, "");
  run(&f, "RS");
  teardown(&f);
}

/* A prefetch does not displace a component called right after the one it
 * loads.  Room for two, P Q R declared.  At Q's release R (next) may not
 * displace P (called right after R) though P is idle; Q goes (two calls
 * after R).  Then each component is loaded once per request, always ahead
 * of its call and never over the one called after it: at P's release Q
 * displaces P (R comes between), at R's release P displaces R. */
static void test_prefetch_keeps_what_comes_right_after(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M", 2 * KB64, true);
  schedule(&f, "PQR");
  run(&f, "PQ");
  expect_moves(&f, "+P +Q -Q +R");
  run(&f, "RPQR");
  expect_moves(&f, "-P +Q -R +P");
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(f.tp->pipe, &st));
  assert_int_equal(st.total.loads, 5);
  assert_int_equal(st.total.prefetches, 4); /* all but the very first */
  teardown(&f);
}

/* A prefetch that fails — its allocation, or its copy — leaves nothing
 * behind: the audit and the accounting are clean, and the next call issues
 * it again and runs correctly. */
static void test_prefetch_fault_is_harmless(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  static const char *const specs[] = {
      "fault:kind=dev_alloc,nth=2,inner=host:capacity=1M,jitter=1",
      "fault:kind=copy,nth=2,inner=host:capacity=1M,jitter=1",
  };
  for (size_t k = 0; k < 2; k++) {
    mlo_platform *plat = tu_open_spec(specs[k]);
    tu_pipe *tp = tu_pipe_build(plat, four, 4);
    tp->audit_in_forward = true;
    mlo_schedule_entry e[] = {{tu_comp(tp, "P"), 1}, {tu_comp(tp, "Q"), 1}};
    assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, 2));
    mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
    s.policy = MLO_POLICY_BUDGET;
    s.budget_bytes = 2 * KB64;
    assert_ok(mlo_offload_enable(tp->pipe, &s)); /* prefetches P (call 1), Q (call 2: fails) */
    assert_true(mlo_component_is_resident(tu_comp(tp, "P")));
    assert_false(mlo_component_is_resident(tu_comp(tp, "Q")));
    tu_assert_audit(tp);
    mlo_pipeline_stats st;
    assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
    assert_int_equal(st.device_bytes, KB64);
    mlo_platform_memory mem;
    assert_ok(mlo_platform_get_memory(plat, &mem));
    assert_int_equal(mem.used_bytes, KB64);
    assert_ok(tu_forward(tp, tu_comp(tp, "P"))); /* issues Q's prefetch again */
    assert_ok(tu_forward(tp, tu_comp(tp, "Q")));
    tu_assert_forwards_clean(tp);
    tu_assert_audit(tp);
    mlo_component_stats q = tu_cstats(tu_comp(tp, "Q"));
    assert_int_equal(q.loads, 1);
    assert_int_equal(q.prefetches, 1);
    tu_pipe_free(tp);
    mlo_platform_close(plat);
  }
}

/* Room held by another thread is waited for (try_acquire: MLO_EBUSY); room
 * held by this thread never comes back, so that is MLO_EDEADLK; a component
 * larger than the budget is MLO_ENOMEM_DEVICE at enable. */
static void test_room_held(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M", KB64, false);
  mlo_component *P = tu_comp(f.tp, "P"), *Q = tu_comp(f.tp, "Q");
  tu_holder h;
  tu_holder_start(&h, P);
  assert_ok(h.rc_acquire);
  assert_status(mlo_component_try_acquire(Q), MLO_EBUSY);
  tu_holder_finish(&h);
  assert_ok(h.rc_release);
  assert_ok(mlo_component_acquire(P));
  assert_status(mlo_component_acquire(Q), MLO_EDEADLK);
  assert_true(tu_contains_ci(mlo_pipeline_errmsg(f.tp->pipe), "this thread holds"));
  assert_ok(mlo_component_release(P));
  assert_ok(tu_forward(f.tp, Q));
  tu_assert_audit(f.tp);
  teardown(&f);
}

static void expect_enable(mlo_platform *plat, mlo_offload_settings *s, int want, const char *msg) {
  tu_pipe *tp = tu_pipe_build(plat, four, 4);
  assert_status(mlo_offload_enable(tp->pipe, s), want);
  assert_true(tu_contains_ci(mlo_pipeline_errmsg(tp->pipe), msg));
  assert_false(mlo_offload_is_enabled(tp->pipe));
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  assert_int_equal(st.device_bytes, 0);
  tu_pipe_free(tp);
}

static void test_settings_validation(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=1M");
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = 2u << 20;
  expect_enable(plat, &s, MLO_EINVAL, "exceeds the device");
  s.budget_bytes = KB64 / 2;
  expect_enable(plat, &s, MLO_ENOMEM_DEVICE, "cannot hold");
  s.budget_bytes = 0;
  s.reserve_bytes = 1u << 20;
  expect_enable(plat, &s, MLO_ENOMEM_DEVICE, "reserve");
  s.budget_bytes = KB64;
  expect_enable(plat, &s, MLO_EINVAL, "not both");
  s = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  s.budget_bytes = KB64;
  expect_enable(plat, &s, MLO_EINVAL, "budget policy");
  s.budget_bytes = 0;
  s.policy = (mlo_policy)7;
  expect_enable(plat, &s, MLO_EINVAL, "invalid policy");

  /* A 0.1 caller's shorter struct: strict, the rest defaults. */
  tu_pipe *tp = tu_pipe_build(plat, four, 4);
  s = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  s.size = offsetof(mlo_offload_settings, policy);
  s.policy = (mlo_policy)7; /* beyond the size it gave: never read */
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  assert_int_equal(st.budget_bytes, 0);
  tu_pipe_free(tp);

  /* budget 0: free memory minus the reserve */
  tp = tu_pipe_build(plat, four, 4);
  s = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.reserve_bytes = 256 * 1024;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  assert_int_equal(st.budget_bytes, (1u << 20) - 256 * 1024);
  tu_pipe_free(tp);

  /* schedules: another pipeline's component, an empty entry */
  tp = tu_pipe_build(plat, four, 4);
  tu_pipe *other = tu_pipe_build(plat, four, 4);
  mlo_schedule_entry bad[] = {{tu_comp(other, "P"), 1}};
  assert_status(mlo_pipeline_set_schedule(tp->pipe, bad, 1), MLO_EINVAL);
  mlo_schedule_entry none[] = {{NULL, 1}};
  assert_status(mlo_pipeline_set_schedule(tp->pipe, none, 1), MLO_EINVAL);
  assert_ok(mlo_pipeline_set_schedule(tp->pipe, NULL, 0));
  tu_pipe_free(other);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Loaded by hand beyond the budget, then enabled: enable evicts down to it. */
static void test_enable_fits_budget(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=1M");
  tu_pipe *tp = tu_pipe_build(plat, four, 4);
  assert_ok(mlo_pipeline_load_all(tp->pipe));
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = 2 * KB64;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  assert_true(st.device_bytes <= 2 * KB64);
  tu_assert_audit(tp);
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  assert_int_equal(st.budget_bytes, 0);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* The one name table (policy.c): every policy's name reads back to it,
 * case-insensitively, and nothing else does. */
static void test_policy_names(void **state) {
  (void)state;
  for (int p = 0; p < MLO_POLICY_COUNT; p++) {
    const char *name = mlo_policy_name((mlo_policy)p);
    assert_string_not_equal(name, "invalid");
    mlo_policy back = (mlo_policy)-1;
    assert_ok(mlo_policy_from_name(name, &back));
    assert_int_equal(back, p);
  }
  mlo_policy out;
  assert_ok(mlo_policy_from_name("BUDGET", &out));
  assert_int_equal(out, MLO_POLICY_BUDGET);
  assert_status(mlo_policy_from_name("none", &out), MLO_EINVAL);
  assert_status(mlo_policy_from_name(NULL, &out), MLO_EINVAL);
  assert_string_equal(mlo_policy_name(MLO_POLICY_COUNT), "invalid");
}

/* A refused enable leaves the settings as they were: copy_back asked for
 * by a budget that cannot be met must not make a later eviction by hand
 * write anything back. */
static void test_refused_enable_keeps_settings(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=1M");
  tu_pipe *tp = tu_pipe_build(plat, four, 4);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.copy_back = true;
  s.budget_bytes = KB64 / 2; /* below the largest component */
  assert_status(mlo_offload_enable(tp->pipe, &s), MLO_ENOMEM_DEVICE);
  assert_false(mlo_offload_is_enabled(tp->pipe));
  mlo_component *c = tu_comp(tp, "P");
  assert_ok(mlo_component_load(c));
  assert_ok(mlo_component_evict(c));
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  assert_true(st.total.h2d_bytes > 0);
  assert_int_equal(st.total.d2h_bytes, 0);
  assert_int_equal(st.budget_bytes, 0);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* The schedule in force as "P1 Q2 R1 S1" (empty: none). */
static void expect_schedule(fixture *f, const char *want) {
  mlo_schedule_entry e[32];
  size_t n = 0;
  char got[256] = "";
  assert_ok(mlo_pipeline_get_schedule(f->tp->pipe, e, 32, &n));
  assert_true(n <= 32);
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(got);
    snprintf(got + len, sizeof got - len, "%s%s%u", i ? " " : "", mlo_component_name(e[i].comp),
             e[i].repeat);
  }
  if (strcmp(got, want)) fail_msg("schedule\n  got:  %s\n  want: %s", got, want);
}

/* Learning (mlo_pipeline_learn_schedule): the first request's calls become
 * the schedule at the next request's first call, which prefetches from
 * there on; another step count is learned at the request after it; off
 * keeps what was learned. */
static void test_learn_schedule(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M,jitter=1", 2 * KB64, true);
  assert_ok(mlo_pipeline_learn_schedule(f.tp->pipe, true));
  run(&f, "PQQRS");
  expect_schedule(&f, ""); /* the request has not ended yet */
  assert_int_equal(tu_pstats(f.tp).total.prefetches, 0);
  run(&f, "P");
  expect_schedule(&f, "P1 Q2 R1 S1");
  run(&f, "QQRS");
  uint64_t learned = tu_pstats(f.tp).total.prefetches;
  assert_true(learned > 0);
  run(&f, "PQQQRRS"); /* three steps on Q, two on R: learned at the next P */
  expect_schedule(&f, "P1 Q2 R1 S1");
  run(&f, "P");
  expect_schedule(&f, "P1 Q3 R2 S1");
  assert_ok(mlo_pipeline_learn_schedule(f.tp->pipe, false));
  run(&f, "QRSPQ");
  expect_schedule(&f, "P1 Q3 R2 S1");
  assert_true(tu_pstats(f.tp).total.prefetches > learned);
  teardown(&f);
}

/* A prompt's negative (P S before the DiTs run, then P again) does not end
 * a request: it ends at the first component after a DiT ran.  An
 * image-to-image request (S encodes, P, Q R, S decodes) begins and ends
 * with S: learned as a cycle, S's decode and the next encode one run. */
static void test_learn_request_ends(void **state) {
  (void)state;
  fixture f;
  setup(&f, "capacity=1M", 4 * KB64, false);
  assert_ok(mlo_pipeline_learn_schedule(f.tp->pipe, true));
  run(&f, "PSPQRS");
  run(&f, "P");
  expect_schedule(&f, "P1 S1 P1 Q1 R1 S1");
  assert_ok(mlo_pipeline_learn_schedule(f.tp->pipe, true)); /* again: records afresh */
  run(&f, "SPQQR"); /* the decode ends the request as begun */
  run(&f, "S");
  expect_schedule(&f, "S1 P1 Q2 R1");
  run(&f, "SPQQR"); /* recorded from the decode: the cycle */
  run(&f, "S");
  expect_schedule(&f, "S2 P1 Q2 R1");
  run(&f, "SPQQR"); /* the same cycle again: the schedule stays */
  run(&f, "S");
  expect_schedule(&f, "S2 P1 Q2 R1");
  assert_ok(mlo_pipeline_learn_schedule(f.tp->pipe, true));
  run(&f, "SPQR");
  run(&f, "S");
  expect_schedule(&f, "S1 P1 Q1 R1");
  /* while learning, a declared schedule lasts until the calls differ */
  mlo_schedule_entry e[] = {{tu_comp(f.tp, "S"), 1},
                            {tu_comp(f.tp, "P"), 1},
                            {tu_comp(f.tp, "Q"), 1},
                            {tu_comp(f.tp, "R"), 1}};
  assert_ok(mlo_pipeline_set_schedule(f.tp->pipe, e, 4));
  run(&f, "PQQR");
  run(&f, "S");
  expect_schedule(&f, "S1 P1 Q2 R1");
  size_t n = 7;
  assert_int_equal(mlo_pipeline_get_schedule(f.tp->pipe, NULL, 0, &n), MLO_OK);
  assert_int_equal(n, 4);
  assert_int_equal(mlo_pipeline_get_schedule(f.tp->pipe, NULL, 1, &n), MLO_EINVAL);
  assert_int_equal(mlo_pipeline_get_schedule(f.tp->pipe, e, 4, NULL), MLO_EINVAL);
  assert_int_equal(mlo_pipeline_learn_schedule(NULL, true), MLO_EINVAL);
  /* a request of more than 4096 runs stops learning rather than learn a
   * piece of it: P ends nothing afterwards, and the schedule stays */
  assert_ok(mlo_pipeline_learn_schedule(f.tp->pipe, true));
  run(&f, "P");
  for (int i = 0; i < 2100; i++) run(&f, "QR");
  run(&f, "PQRS");
  expect_schedule(&f, "S1 P1 Q2 R1");
  teardown(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_policy_names),
      cmocka_unit_test(test_refused_enable_keeps_settings),
      cmocka_unit_test(test_belady_by_hand),
      cmocka_unit_test(test_lru_without_schedule),
      cmocka_unit_test(test_smallest_that_frees_enough),
      cmocka_unit_test(test_ties_and_unscheduled),
      cmocka_unit_test(test_schedule_shorter_and_off_schedule),
      cmocka_unit_test(test_prefetch_loads_ahead),
      cmocka_unit_test(test_prefetch_never_displaces_held),
      cmocka_unit_test(test_prefetch_keeps_what_comes_right_after),
      cmocka_unit_test(test_prefetch_fault_is_harmless),
      cmocka_unit_test(test_room_held),
      cmocka_unit_test(test_settings_validation),
      cmocka_unit_test(test_enable_fits_budget),
      cmocka_unit_test(test_learn_schedule),
      cmocka_unit_test(test_learn_request_ends),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
