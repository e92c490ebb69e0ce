/*
 * core_hardening.c — regression tests for the failures the adversarial
 * review found in the core (issue "Hardening"): callbacks that call back in,
 * enable while a component executes, tensors added during materialization,
 * byte totals that wrap, holders released on another thread or outliving
 * their pipeline, groups freed after disable, and a progress callback
 * swapped during a load.  Each test fails on the code before the fix
 * (a hang is turned into a failure by alarm()).
 */
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- callbacks that call back into their own pipeline (MLO_EDEADLK) ----- */

typedef struct {
  mlo_pipeline *pipe;
  int enable_rc, stats_rc;
  unsigned calls;
} reentry;

static void trace_reenters(const mlo_trace_event *ev, void *user) {
  (void)ev;
  reentry *r = user;
  mlo_pipeline_stats st;
  if (r->calls++ == 0) r->stats_rc = mlo_pipeline_get_stats(r->pipe, &st); /* lock is held */
}

static void progress_reenters(const mlo_component *c, uint64_t done, uint64_t total, void *user) {
  (void)c, (void)done, (void)total;
  reentry *r = user;
  mlo_pipeline_stats st;
  if (r->calls++) return;
  r->enable_rc = mlo_offload_enable(r->pipe, NULL);   /* setup_lock is held */
  r->stats_rc = mlo_pipeline_get_stats(r->pipe, &st); /* allowed: the lock is free */
}

static int delegate_enable_reenters(void *self, mlo_pipeline *pipe, const mlo_offload_settings *s) {
  (void)s;
  reentry *r = self;
  r->enable_rc = mlo_offload_enable(pipe, NULL);
  return 0;
}
static int delegate_disable(void *self, mlo_pipeline *pipe) {
  (void)self, (void)pipe;
  return 0;
}

static reentry *log_reentry;
static void log_reenters(mlo_log_level level, const char *msg, void *user) {
  (void)level, (void)msg, (void)user;
  if (!log_reentry || log_reentry->calls++) return;
  /* The log may be called with the pipeline's lock held: refused, no hang. */
  log_reentry->stats_rc = (int)mlo_pipeline_component_count(log_reentry->pipe);
  mlo_set_log(log_reenters, NULL, MLO_LOG_WARN); /* the log's own lock is free */
}

static void test_callbacks_reenter(void **state) {
  (void)state;
  alarm(30);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  reentry r = {tp->pipe, 0, 0, 0};
  /* trace: called with the pipeline lock held */
  mlo_pipeline_set_trace(tp->pipe, trace_reenters, &r);
  assert_ok(mlo_component_load(tu_comp(tp, "vae")));
  mlo_pipeline_set_trace(tp->pipe, NULL, NULL);
  assert_int_equal(r.stats_rc, MLO_EDEADLK);
  assert_ok(mlo_component_evict(tu_comp(tp, "vae")));
  tu_pipe_free(tp);

  /* progress: called with setup_lock held (a file-backed tensor reports) */
  char path[] = "/tmp/mlo_reenter_XXXXXX";
  static uint8_t bytes[4096];
  tu_temp_file(path, bytes, sizeof bytes);
  tp = tu_pipe_build_wan(plat);
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = "from_file";
  d.dtype = MLO_DTYPE_U8;
  d.ndim = 1;
  d.shape[0] = sizeof bytes;
  d.file = path;
  assert_ok(mlo_tensor_add(tu_comp(tp, "vae"), &d, NULL));
  r = (reentry){tp->pipe, 0, 0, 0};
  mlo_pipeline_set_progress(tp->pipe, progress_reenters, &r);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  assert_int_equal(r.enable_rc, MLO_EDEADLK);
  assert_ok(r.stats_rc);
  assert_false(mlo_offload_is_enabled(tp->pipe));
  tu_pipe_free(tp);
  unlink(path);

  /* a delegate's enable calling enable */
  tp = tu_pipe_build_wan(plat);
  static const mlo_delegate_ops ops = {delegate_enable_reenters, delegate_disable};
  r = (reentry){tp->pipe, 0, 0, 0};
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &r));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_int_equal(r.enable_rc, MLO_EDEADLK);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_pipe_free(tp);

  /* the log callback: a warning logged under the pipeline lock */
  tp = tu_pipe_new(plat, true);
  r = (reentry){tp->pipe, 0, 0, 0};
  log_reentry = &r;
  r.stats_rc = -1;
  mlo_set_log(log_reenters, NULL, MLO_LOG_WARN);
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_AUTO, &c));
  mlo_pipeline_warn_guessed(tp->pipe); /* warns with the pipeline lock held */
  mlo_set_log(NULL, NULL, MLO_LOG_WARN);
  log_reentry = NULL;
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.stats_rc, 0); /* refused (0, "nothing"), not a hang */
  assert_int_equal(mlo_pipeline_component_count(tp->pipe), 1);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  alarm(0);
}

/* ---- enable while a component executes unhooked ------------------------- */

static void test_enable_while_executing(void **state) {
  (void)state;
  alarm(30);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *dit = tu_comp(tp, "transformer"), *te = tu_comp(tp, "text_encoder");
  assert_ok(mlo_component_acquire(dit)); /* offload off: nothing excludes it */
  assert_status(mlo_offload_enable(tp->pipe, NULL), MLO_EBUSY);
  if (!strstr(mlo_pipeline_errmsg(tp->pipe), "transformer"))
    fail_msg("message \"%s\" does not name the executing component", mlo_pipeline_errmsg(tp->pipe));
  assert_false(mlo_offload_is_enabled(tp->pipe));
  assert_ok(mlo_component_release(dit));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(tu_forward(tp, te));
  assert_ok(tu_forward(tp, dit));
  tu_assert_audit(tp);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  alarm(0);
}

/* Threads forward (with nested acquires) while another enables and
 * disables: no hang, no broken exclusion, only documented statuses. */
typedef struct {
  tu_pipe *tp;
  unsigned seed;
  atomic_bool *stop;
  atomic_uint *bad;
} stress_arg;

static void *stress_forwarder(void *v) {
  stress_arg *a = v;
  static const char *const names[] = {"text_encoder", "transformer", "transformer_2"};
  mlo_component *vae = tu_comp(a->tp, "vae");
  for (int i = 0; i < 300 && !atomic_load(a->stop); i++) {
    a->seed = a->seed * 1103515245u + 12345u;
    mlo_component *c = tu_comp(a->tp, names[(a->seed >> 16) % 3]);
    int rc = mlo_component_acquire(c);
    if (rc) {
      atomic_fetch_add(a->bad, 1);
      continue;
    }
    int nested = mlo_component_acquire(vae); /* the VAE conflicts with nothing */
    if (nested == MLO_OK) mlo_component_release(vae);
    if (nested != MLO_OK) atomic_fetch_add(a->bad, 1);
    if (mlo_component_release(c)) atomic_fetch_add(a->bad, 1);
  }
  return NULL;
}

static void test_enable_disable_under_load(void **state) {
  (void)state;
  alarm(120);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_pipeline_set_audit(tp->pipe, true);
  atomic_bool stop = false;
  atomic_uint bad = 0;
  enum { N = 4 };
  stress_arg args[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    args[i] = (stress_arg){tp, 7u * (unsigned)i + 1, &stop, &bad};
    assert_int_equal(pthread_create(&th[i], NULL, stress_forwarder, &args[i]), 0);
  }
  /* Switch it off and on under the workers: each call either takes or is
   * refused as busy; how many take depends on the machine's timing, so it
   * is not asserted (race_sweep and load_test count them). */
  for (int i = 0; i < 400; i++) {
    bool on = mlo_offload_is_enabled(tp->pipe);
    int rc = on ? mlo_offload_disable(tp->pipe) : mlo_offload_enable(tp->pipe, NULL);
    if (rc != MLO_OK && rc != MLO_EBUSY) fail_msg("toggle -> %s", mlo_err_name(rc));
  }
  atomic_store(&stop, true);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  assert_int_equal(atomic_load(&bad), 0);
  /* with nothing running, both directions take */
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(mlo_offload_is_enabled(tp->pipe));
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_false(mlo_offload_is_enabled(tp->pipe));
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  alarm(0);
}

/* ---- a tensor added while another thread materializes the component ----- */

typedef struct {
  mlo_component *comp;
  atomic_int phase; /* 1: materialize is reading */
  int rc_add;
} adder;

static void progress_pauses(const mlo_component *c, uint64_t done, uint64_t total, void *user) {
  (void)c, (void)done, (void)total;
  adder *a = user;
  if (atomic_load(&a->phase) == 0) {
    atomic_store(&a->phase, 1);
    tu_sleep_ms(100); /* the adder runs now, against the half-read slab */
  }
}

static void *add_during_materialize(void *v) {
  adder *a = v;
  while (atomic_load(&a->phase) == 0) tu_sleep_ms(1);
  static uint8_t more[64];
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = "added_late";
  d.dtype = MLO_DTYPE_U8;
  d.ndim = 1;
  d.shape[0] = sizeof more;
  d.data = more;
  a->rc_add = mlo_tensor_add(a->comp, &d, NULL);
  return NULL;
}

static void test_add_tensor_during_materialize(void **state) {
  (void)state;
  alarm(30);
  char path[] = "/tmp/mlo_addmat_XXXXXX";
  static uint8_t bytes[1 << 16];
  tu_temp_file(path, bytes, sizeof bytes);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &c));
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = "w";
  d.dtype = MLO_DTYPE_U8;
  d.ndim = 1;
  d.shape[0] = sizeof bytes;
  d.file = path;
  assert_ok(mlo_tensor_add(c, &d, NULL));
  adder a = {c, 0, MLO_OK};
  mlo_pipeline_set_progress(tp->pipe, progress_pauses, &a);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, add_during_materialize, &a), 0);
  assert_ok(mlo_component_materialize(c));
  pthread_join(th, NULL);
  /* It waited for the load and then found the component materialized. */
  assert_int_equal(a.rc_add, MLO_ESTATE);
  assert_int_equal(mlo_component_tensor_count(c), 1);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  unlink(path);
  alarm(0);
}

/* ---- byte totals that would wrap ---------------------------------------- */

static void test_byte_total_cannot_wrap(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &c));
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.dtype = MLO_DTYPE_U8;
  d.ndim = 1;
  d.shape[0] = ((int64_t)1 << 61) - 4096; /* valid alone, zero-filled (no source) */
  d.name = "a";
  assert_ok(mlo_tensor_add(c, &d, NULL));
  d.name = "b";
  assert_ok(mlo_tensor_add(c, &d, NULL)); /* together just under the 2^62 cap */
  d.name = "c";
  d.shape[0] = INT64_MAX; /* valid alone as a description, not in a component */
  assert_status(mlo_tensor_add(c, &d, NULL), MLO_EINVAL);
  d.name = "d";
  d.shape[0] = (int64_t)1 << 61;
  assert_status(mlo_tensor_add(c, &d, NULL), MLO_EINVAL); /* the sum would pass 2^62 */
  if (!strstr(mlo_pipeline_errmsg(tp->pipe), "'d'")) fail_msg("%s", mlo_pipeline_errmsg(tp->pipe));
  assert_int_equal(mlo_component_tensor_count(c), 2);
  uint64_t bytes = mlo_component_bytes(c);
  assert_true(bytes >= ((uint64_t)1 << 62) - 8192 && bytes < ((uint64_t)1 << 62));
  /* materializing 4 EiB fails as host memory, cleanly */
  assert_status(mlo_component_materialize(c), MLO_ENOMEM);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* ---- holders: release on another thread, free while held --------------- */

static void *release_elsewhere(void *v) {
  *(int *)((void **)v)[1] = mlo_component_release(((void **)v)[0]);
  return NULL;
}

static void test_release_on_another_thread(void **state) {
  (void)state;
  alarm(30);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_component *dit = tu_comp(tp, "transformer"), *te = tu_comp(tp, "text_encoder");
  assert_ok(mlo_component_acquire(dit));
  /* this thread holds the DiT: the encoder would wait forever */
  assert_status(mlo_component_acquire(te), MLO_EDEADLK);
  int rc = -1;
  void *args[2] = {dit, &rc};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, release_elsewhere, args), 0);
  pthread_join(th, NULL);
  assert_ok(rc);
  /* released on the other thread: no stale "held" entry is left here */
  assert_ok(mlo_component_acquire(te));
  assert_ok(mlo_component_release(te));
  tu_assert_audit(tp);

  /* freed while held: no holder record outlives the pipeline */
  assert_ok(mlo_component_acquire(dit));
  tu_pipe_free(tp);
  tp = tu_pipe_build_wan(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(mlo_component_acquire(tu_comp(tp, "text_encoder")));
  assert_ok(mlo_component_release(tu_comp(tp, "text_encoder")));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  alarm(0);
}

/* ---- groups after disable, progress swapped during a load --------------- */

typedef struct {
  mlo_group *group;
  mlo_component *a, *b;
} group_delegate;

static int group_enable(void *self, mlo_pipeline *pipe, const mlo_offload_settings *s) {
  (void)s;
  group_delegate *g = self;
  int rc = mlo_group_create(pipe, "pair", &g->group);
  if (!rc) rc = mlo_group_add(g->group, g->a);
  if (!rc) rc = mlo_group_add(g->group, g->b);
  return rc;
}
static int group_disable(void *self, mlo_pipeline *pipe) {
  (void)self, (void)pipe;
  return 0; /* leaves the group to its owner, who frees it later */
}

static void test_group_free_after_disable(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  group_delegate g = {NULL, tu_comp(tp, "transformer"), tu_comp(tp, "transformer_2")};
  static const mlo_delegate_ops ops = {group_enable, group_disable};
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &g));
  tu_log_capture_begin();
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_log_capture_end();
  /* the hooks are gone: both members may be resident at once */
  assert_ok(mlo_component_load(g.a));
  assert_ok(mlo_component_load(g.b));
  assert_status(mlo_group_add(g.group, tu_comp(tp, "vae")), MLO_ESTATE);
  mlo_group_free(g.group); /* the header's promise: freed by its owner (ASan: no UAF) */
  /* enabled again, the delegate builds a new group the same way */
  assert_ok(mlo_component_evict(g.a));
  assert_ok(mlo_component_evict(g.b));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(tu_forward(tp, g.a));
  assert_false(mlo_component_is_resident(g.b));
  tu_log_capture_begin();
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_log_capture_end();
  mlo_group_free(g.group);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static atomic_uint progress_calls;
static void count_progress(const mlo_component *c, uint64_t done, uint64_t total, void *user) {
  (void)c, (void)done, (void)total, (void)user;
  atomic_fetch_add(&progress_calls, 1);
}

typedef struct {
  mlo_pipeline *pipe;
  atomic_bool stop;
} toggler;

static void *toggle_progress(void *v) {
  toggler *t = v;
  while (!atomic_load(&t->stop)) {
    mlo_pipeline_set_progress(t->pipe, count_progress, NULL);
    mlo_pipeline_set_progress(t->pipe, NULL, NULL);
  }
  return NULL;
}

/* set_progress from another thread while files are read: the callback
 * pointer is read once (TSan checks the rest). */
static void test_set_progress_during_materialize(void **state) {
  (void)state;
  char path[] = "/tmp/mlo_progress_XXXXXX";
  static uint8_t bytes[1 << 12];
  tu_temp_file(path, bytes, sizeof bytes);
  mlo_platform *plat = tu_platform_open(NULL);
  for (int round = 0; round < 20; round++) {
    tu_pipe *tp = tu_pipe_new(plat, true);
    mlo_component *c = NULL;
    assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &c));
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.dtype = MLO_DTYPE_U8;
    d.ndim = 1;
    d.shape[0] = 64;
    d.file = path;
    char name[16];
    for (int i = 0; i < 64; i++) { /* 64 tensors: 64 progress reports */
      snprintf(name, sizeof name, "t%d", i);
      d.name = name;
      d.file_offset = (uint64_t)i * 64;
      assert_ok(mlo_tensor_add(c, &d, NULL));
    }
    toggler t = {tp->pipe, false};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, toggle_progress, &t), 0);
    assert_ok(mlo_component_materialize(c));
    atomic_store(&t.stop, true);
    pthread_join(th, NULL);
    tu_pipe_free(tp);
  }
  mlo_platform_close(plat);
  unlink(path);
}

/* core_hardening [TEST]: one test by name (a hang elsewhere stays out). */
int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_callbacks_reenter),
      cmocka_unit_test(test_enable_while_executing),
      cmocka_unit_test(test_enable_disable_under_load),
      cmocka_unit_test(test_add_tensor_during_materialize),
      cmocka_unit_test(test_byte_total_cannot_wrap),
      cmocka_unit_test(test_release_on_another_thread),
      cmocka_unit_test(test_group_free_after_disable),
      cmocka_unit_test(test_set_progress_during_materialize),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
