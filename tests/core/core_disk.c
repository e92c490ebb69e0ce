/*
 * core_disk — the disk tier (disk.c, docs/disk.md): with a host budget the
 * slabs that do not fit stay in their checkpoint files and every load
 * reads them through the staging ring.  Checked here:
 *  - a pipeline a third larger than the host budget runs schedule after schedule with
 *    every forward seeing its tensors' exact bytes on the device (copies
 *    delayed at random, jitter=1), under both policies; the slabs kept in
 *    host memory stay within the budget; the host plan keeps the component
 *    called most and leaves the encoder on disk; the counters say how many
 *    loads read how many bytes;
 *  - a host budget below what must stay in host memory (tensors not from
 *    files) is refused with the figures, and nothing is enabled;
 *  - a file changed under a component on disk is refused at its read;
 *  - a read failing at any point of a load fails that forward cleanly
 *    (nothing resident, the file named) and the next forward reads it
 *    right; short reads are no failure;
 *  - a copy failing at any point of a load leaves no staging buffer
 *    rewritten under a copy still queued out of it (the host platform's
 *    srccheck counts a source changed before its copy ran);
 *  - a pipeline freed with loads from disk in flight ends them;
 *  - a tier change waits for copies still queued on the memory it frees;
 *    strict exclusion holds while an excluded component is being read (and
 *    try_acquire says so); a load by hand returns with its copies issued;
 *    copy_back never writes into a component whose host copy is its files.
 */
#include "testutil.h"

#include "base/sysio.h"
#include "platform/fault.h"
#include "platform/platform.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char dir[256];

static int setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(dir, sizeof dir, "%s/mlo_core_disk_XXXXXX", base);
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  static const char *const files[] = {"encoder.bin", "dit_a.bin", "dit_b.bin",
                                      "vae.bin",     "big.bin",   "sdit.bin"};
  char p[512];
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    unlink(p);
  }
  rmdir(dir);
  return 0;
}

static void file_of(const char *name, char *out, size_t len) {
  snprintf(out, len, "%s/%s.bin", dir, name);
}

/* Tensors of one component in its own file, at offsets with small gaps (read
 * through), one large gap (a new read), one tensor over a 16 MiB chunk. */
static mlo_component *add_file_comp(tu_pipe *tp, const char *name, mlo_role role, size_t big) {
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, name, role, &c));
  char path[512];
  file_of(name, path, sizeof path);
  unlink(path);
  const size_t sizes[] = {4, 1000, big, 4096, 36};
  const uint64_t gaps[] = {0, 6, 200 << 10, 0, 20};
  enum { N = sizeof sizes / sizeof *sizes };
  char tname[N][32];
  uint64_t at[N], end = 12; /* a header's worth */
  for (size_t i = 0; i < N; i++) {
    snprintf(tname[i], sizeof tname[i], "blocks.%zu.w", i);
    at[i] = end + gaps[i];
    end = at[i] + sizes[i];
    tu_write_file_pattern(name, tname[i], sizes[i], path, at[i]);
  }
  for (size_t i = 0; i < N; i++) tu_add_file_tensor(tp, c, tname[i], sizes[i], path, at[i]);
  return c;
}

static tu_pipe *build(mlo_platform *plat) {
  tu_pipe *tp = tu_pipe_new(plat, true);
  add_file_comp(tp, "encoder", MLO_ROLE_ENCODER, 3u << 20);
  add_file_comp(tp, "dit_a", MLO_ROLE_DIT, (20u << 20) + 4); /* two chunks and a bit */
  add_file_comp(tp, "dit_b", MLO_ROLE_DIT, 6u << 20);
  add_file_comp(tp, "vae", MLO_ROLE_VAE, 1u << 20);
  return tp;
}

static const struct {
  const char *comp;
  unsigned repeat;
} schedule[] = {{"encoder", 1}, {"dit_a", 3}, {"dit_b", 2}, {"vae", 1}};
#define NSCHED (sizeof schedule / sizeof *schedule)

static void declare_schedule(tu_pipe *tp) {
  mlo_schedule_entry e[NSCHED];
  for (size_t i = 0; i < NSCHED; i++)
    e[i] = (mlo_schedule_entry){tu_comp(tp, schedule[i].comp), schedule[i].repeat};
  assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, NSCHED));
}

static void run_prompt(tu_pipe *tp) {
  for (size_t i = 0; i < NSCHED; i++)
    for (unsigned r = 0; r < schedule[i].repeat; r++) {
      int rc = tu_forward(tp, tu_comp(tp, schedule[i].comp));
      if (rc)
        fail_msg("forward of %s: %s (%s)", schedule[i].comp, mlo_err_name(rc),
                 mlo_pipeline_errmsg(tp->pipe));
    }
}

static uint64_t comp_bytes(mlo_component *c) {
  return mlo_component_bytes(c);
}

/* What one load of c from disk reads: its tensors and the two small gaps
 * read through (6 and 20 bytes; the 200 KiB one is skipped). */
static uint64_t read_per_load(mlo_component *c) {
  uint64_t n = 0;
  for (size_t i = 0; i < mlo_component_tensor_count(c); i++)
    n += mlo_tensor_nbytes(mlo_component_tensor_at(c, i));
  return n + 26;
}

static void check_runs(mlo_policy policy) {
  mlo_platform *plat = tu_platform_open("jitter=1");
  tu_pipe *tp = build(plat);
  declare_schedule(tp);
  mlo_component *enc = tu_comp(tp, "encoder"), *a = tu_comp(tp, "dit_a"), *b = tu_comp(tp, "dit_b"),
                *vae = tu_comp(tp, "vae");
  uint64_t total = comp_bytes(enc) + comp_bytes(a) + comp_bytes(b) + comp_bytes(vae);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = policy;
  /* a device that holds the largest and little more: every prompt loads */
  if (policy == MLO_POLICY_BUDGET) s.budget_bytes = comp_bytes(a) + (1u << 20);
  /* room for the DiT called most and the VAE: the rest (a third) on disk */
  uint64_t host = comp_bytes(a) + comp_bytes(vae) + (512u << 10);
  s.host_budget_bytes = host;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  mlo_pipeline_stats st = tu_pstats(tp);
  assert_int_equal(st.host_budget_bytes, host);
  assert_int_equal(st.host_slab_bytes, comp_bytes(a) + comp_bytes(vae));
  assert_true(st.disk_bytes > 0);
  assert_int_equal(st.host_slab_bytes + st.disk_bytes, total);
  /* the DiT called most keeps its slab; the encoder, used once, is on disk */
  assert_non_null(mlo_tensor_host_data(mlo_component_tensor_at(a, 0)));
  assert_null(mlo_tensor_host_data(mlo_component_tensor_at(enc, 0)));
  const int prompts = 3;
  for (int p = 0; p < prompts; p++) run_prompt(tp);
  /* the next prompt's encoder: its load (a prefetch, under the budget
   * policy) is complete once its forward ran, so every count below is */
  assert_ok(tu_forward(tp, enc));
  tu_assert_forwards_clean(tp);
  tu_assert_audit(tp);
  /* each load of a component on disk read its file bytes, once; every
   * prompt loads the encoder again (evicted for the DiTs) */
  mlo_component *each[] = {enc, a, b, vae};
  for (size_t i = 0; i < 4; i++) {
    mlo_component_stats cs = tu_cstats(each[i]);
    bool on_disk = mlo_tensor_host_data(mlo_component_tensor_at(each[i], 0)) == NULL;
    assert_int_equal(cs.disk_loads, on_disk ? cs.loads : 0);
    assert_int_equal(cs.disk_read_bytes, cs.disk_loads * read_per_load(each[i]));
  }
  assert_int_equal(tu_cstats(enc).disk_loads, prompts + 1);
  st = tu_pstats(tp);
  assert_true(st.staging_bytes > 0);
  assert_true(st.total.disk_wait_ns <= st.total.wait_ns);
  printf("core_disk: %s: %llu loads from disk, %.1f MiB read, %.3f s waited for the disk\n",
         mlo_policy_name(policy), (unsigned long long)st.total.disk_loads,
         (double)st.total.disk_read_bytes / 1048576.0, (double)st.total.disk_wait_ns / 1e9);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_runs_twice_the_host_budget(void **state) {
  (void)state;
  check_runs(MLO_POLICY_BUDGET);
  check_runs(MLO_POLICY_STRICT);
}

static void test_budget_below_what_must_stay_refused(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(plat);
  mlo_component *other = NULL;
  assert_ok(mlo_component_add(tp->pipe, "adapter", MLO_ROLE_OTHER, &other));
  tu_add_tensor(tp, other, "w", 1u << 20, 0); /* from memory: cannot live on disk */
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.host_budget_bytes = 512u << 10;
  int rc = mlo_offload_enable(tp->pipe, &s);
  const char *msg = mlo_pipeline_errmsg(tp->pipe);
  if (rc != MLO_ENOMEM) fail_msg("%s: %s", mlo_err_name(rc), msg);
  assert_non_null(strstr(msg, "512 KiB"));
  assert_non_null(strstr(msg, "1.00 MiB"));
  assert_non_null(strstr(msg, "'adapter'"));
  assert_non_null(strstr(msg, "not from files"));
  assert_false(mlo_offload_is_enabled(tp->pipe));
  /* a budget that holds it runs, the rest on disk */
  s.host_budget_bytes = 1u << 20;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_ok(tu_forward(tp, tu_comp(tp, "dit_a")));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_file_changed_refused_at_read(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(plat);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.host_budget_bytes = 1; /* everything on disk */
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  char path[512];
  file_of("dit_b", path, sizeof path);
  struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}}; /* another mtime */
  assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
  mlo_component *b = tu_comp(tp, "dit_b");
  int rc = mlo_component_forward(b, tu_forward_check, tp);
  const char *msg = mlo_pipeline_errmsg(tp->pipe);
  if (rc != MLO_EIO) fail_msg("%s: %s", mlo_err_name(rc), msg);
  assert_non_null(strstr(msg, "dit_b.bin"));
  assert_non_null(strstr(msg, "changed since"));
  assert_false(mlo_component_is_resident(b));
  uint64_t resident = 0; /* the failed load holds no device memory */
  for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(tp->pipe, i);
    if (mlo_component_is_resident(c)) resident += mlo_component_bytes(c);
  }
  assert_int_equal(tu_pstats(tp).device_bytes, resident);
  /* another component still runs */
  assert_ok(tu_forward(tp, tu_comp(tp, "dit_a")));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* F3 (issue 44): a file written into while a paced load reads it.  The
 * identity checked at open is checked again after every read, so the load
 * fails naming the file rather than copying bytes the file no longer holds
 * (its forward's byte check would see them). */
typedef struct {
  tu_pipe *tp;
  mlo_component *c;
  int rc;
  char msg[512];
} loader;

static void *forward_checked(void *arg) {
  loader *l = arg;
  l->rc = mlo_component_forward(l->c, tu_forward_check, l->tp);
  snprintf(l->msg, sizeof l->msg, "%s", mlo_pipeline_errmsg(l->tp->pipe));
  return NULL;
}

/* Every component on disk, its reads paced at bw bytes per second
 * (MLO_DISK_BW, unset by the caller), offload on: each forward's load its
 * own (no prefetch). */
static tu_pipe *paced_on_disk(const char *bw, mlo_platform **plat) {
  setenv("MLO_DISK_BW", bw, 1);
  *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(*plat);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.prefetch = false;
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  return tp;
}

static void test_file_changed_during_a_paced_load(void **state) {
  (void)state;
  mlo_platform *plat;
  tu_pipe *tp = paced_on_disk("20000000", &plat); /* dit_a's 20 MiB: about a second */
  loader l = {.tp = tp, .c = tu_comp(tp, "dit_a")};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, forward_checked, &l), 0);
  usleep(150000); /* the load's first chunk read, its tail not yet */
  char path[512];
  file_of("dit_a", path, sizeof path);
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  static const char flip[8] = "FLIPPED";
  /* in the big tensor, near the end of the file */
  assert_int_equal(pwrite(fd, flip, sizeof flip, st.st_size - 5000), (ssize_t)sizeof flip);
  close(fd);
  pthread_join(th, NULL);
  unsetenv("MLO_DISK_BW");
  if (l.rc != MLO_EIO) fail_msg("%s: %s", mlo_err_name(l.rc), l.msg);
  assert_non_null(strstr(l.msg, "dit_a.bin"));
  assert_non_null(strstr(l.msg, "changed while it was read"));
  assert_false(mlo_component_is_resident(l.c));
  assert_ok(tu_forward(tp, tu_comp(tp, "dit_b"))); /* the others still run */
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Issue 41: a load from disk says its progress to another thread while the
 * forward waits for it: bytes read rise to the files' total, never past it,
 * and both are 0 once the load is done (and for a component not loading). */
static void test_disk_progress_while_a_forward_waits(void **state) {
  (void)state;
  mlo_platform *plat;
  tu_pipe *tp = paced_on_disk("40000000", &plat); /* dit_a's 20 MiB: about half a second */
  loader l = {.tp = tp, .c = tu_comp(tp, "dit_a")};
  uint64_t done = 1, total = 1;
  assert_ok(mlo_component_disk_progress(l.c, &done, &total));
  assert_true(done == 0 && total == 0); /* not loading */
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, forward_checked, &l), 0);
  uint64_t last = 0, seen_total = 0;
  unsigned rises = 0;
  for (int i = 0; i < 400; i++) { /* polled as a progress bar does */
    assert_ok(mlo_component_disk_progress(l.c, &done, &total));
    assert_true(done <= total);
    if (total) seen_total = total;
    if (done > last) rises++, last = done;
    usleep(5000);
    if (total == 0 && seen_total) break; /* its reads are done */
  }
  pthread_join(th, NULL);
  unsetenv("MLO_DISK_BW");
  if (l.rc) fail_msg("%s: %s", mlo_err_name(l.rc), l.msg);
  assert_true(seen_total >= (20u << 20)); /* the files' bytes of dit_a */
  assert_true(rises >= 2);                /* seen part way, more than once */
  assert_ok(mlo_component_disk_progress(l.c, &done, &total));
  assert_true(done == 0 && total == 0);
  assert_int_equal(mlo_component_disk_progress(NULL, &done, &total), MLO_EINVAL);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* F7, F11 (issue 44): a freed pipeline stops a paced read at once, however
 * slow the pacing (the encoder's 3 MiB at 1000 B/s would take most of an
 * hour), and a pacing that is not a rate is refused at enable, named. */
static void test_pacing_stops_and_is_checked(void **state) {
  (void)state;
  static const char *const bad[] = {"abc", "-1", "nan", "1e400", "5 apples"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("MLO_DISK_BW", bad[i], 1);
    mlo_platform *plat = tu_platform_open(NULL);
    tu_pipe *tp = build(plat);
    mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
    s.host_budget_bytes = 1;
    assert_status(mlo_offload_enable(tp->pipe, &s), MLO_EINVAL);
    assert_non_null(strstr(mlo_pipeline_errmsg(tp->pipe), "MLO_DISK_BW"));
    assert_false(mlo_offload_is_enabled(tp->pipe));
    tu_pipe_free(tp);
    mlo_platform_close(plat);
  }
  setenv("MLO_DISK_BW", "1000", 1);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(plat);
  declare_schedule(tp);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s)); /* the encoder's read: issued, paced */
  usleep(50000);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  tu_pipe_free(tp);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  unsetenv("MLO_DISK_BW");
  double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  if (took > 5.0) fail_msg("free took %.1f s with a paced read in flight", took);
  assert_ok(mlo_platform_synchronize(plat));
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);
}

static void test_read_faults_swept(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = build(plat);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.prefetch = false; /* each forward's load is its own */
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  mlo_component *a = tu_comp(tp, "dit_a");
  mlo_sysfault_arm(MLO_SYSFAULT_READ, 0); /* counting */
  assert_ok(tu_forward(tp, a));
  uint64_t reads = mlo_sysfault_calls(MLO_SYSFAULT_READ);
  mlo_sysfault_disarm();
  assert_true(reads >= 3); /* the chunks of its big tensor, and the rest */
  for (uint64_t n = 1; n <= reads; n++) {
    assert_ok(mlo_offload_disable(tp->pipe));
    assert_ok(mlo_component_evict(a));
    assert_ok(mlo_offload_enable(tp->pipe, &s));
    mlo_sysfault_arm(MLO_SYSFAULT_READ, n);
    int rc = mlo_component_forward(a, tu_forward_check, tp);
    bool fired = mlo_sysfault_fired();
    mlo_sysfault_disarm();
    assert_true(fired);
    const char *msg = mlo_pipeline_errmsg(tp->pipe);
    if (rc != MLO_EIO)
      fail_msg("read #%llu: %s (%s)", (unsigned long long)n, mlo_err_name(rc), msg);
    assert_non_null(strstr(msg, "reading tensor"));
    assert_non_null(strstr(msg, "dit_a.bin"));
    assert_false(mlo_component_is_resident(a));
    assert_int_equal(tu_pstats(tp).device_bytes, 0);
    assert_ok(tu_forward(tp, a)); /* the retry reads it right */
  }
  mlo_sysfault_arm(MLO_SYSFAULT_SHORT, 2);
  assert_ok(tu_forward(tp, tu_comp(tp, "dit_b")));
  mlo_sysfault_disarm();
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static int no_check(mlo_component *comp, void *user) {
  (void)comp;
  (void)user;
  return 0;
}

/* A copy failing part-way through a chunk leaves the chunk's first pieces
 * queued out of its staging buffer.  The next load reading into that
 * buffer (another component's bytes) must wait for them: the buffer's
 * event is recorded after them, not left at an older chunk's (review D14).
 * A slow link keeps them queued; srccheck catches a buffer rewritten under
 * a queued copy. */
static void test_copy_faults_leave_no_stale_slot(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  /* the page cache kept: the next load's reads beat the queued copies */
  setenv("MLO_KEEP_PAGE_CACHE", "1", 1);
  mlo_platform *plat = tu_open_spec("fault:kind=copy,nth=0,inner=host:bw=50000000,srccheck=1");
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *a = add_file_comp(tp, "dit_a", MLO_ROLE_DIT, (20u << 20) + 4);
  mlo_component *b = add_file_comp(tp, "dit_b", MLO_ROLE_DIT, (20u << 20) + 4);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.prefetch = false; /* each forward's load is its own */
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  uint64_t counts[MLO_FAULT_KINDS];
  mlo_fault_arm(plat, MLO_FAULT_COPY, 0); /* counting */
  assert_ok(mlo_component_forward(a, no_check, NULL));
  assert_ok(mlo_component_forward(b, no_check, NULL)); /* every buffer used once */
  mlo_fault_counts(plat, counts);
  uint64_t copies = counts[MLO_FAULT_COPY] / 2;
  assert_true(copies >= 5); /* three chunks, the last of three pieces */
  for (uint64_t n = 1; n <= copies; n++) {
    assert_ok(mlo_offload_disable(tp->pipe));
    assert_ok(mlo_component_evict(a));
    assert_ok(mlo_component_evict(b));
    assert_ok(mlo_offload_enable(tp->pipe, &s));
    mlo_fault_arm(plat, MLO_FAULT_COPY, n);
    int rc = mlo_component_forward(a, no_check, NULL);
    bool fired = mlo_fault_fired(plat);
    mlo_fault_arm(plat, MLO_FAULT_COPY, 0);
    assert_true(fired);
    if (rc != MLO_EPLATFORM)
      fail_msg("copy #%llu: %s (%s)", (unsigned long long)n, mlo_err_name(rc),
               mlo_pipeline_errmsg(tp->pipe));
    assert_false(mlo_component_is_resident(a));
    /* the other component's chunks go through the same buffers at once */
    assert_ok(tu_forward(tp, b));
    assert_ok(mlo_platform_synchronize(plat));
    uint64_t changed = 99;
    assert_ok(mlo_host_sources_changed(mlo_fault_inner(plat), &changed));
    if (changed)
      fail_msg("copy #%llu failed: %llu copies saw their staging buffer rewritten while queued",
               (unsigned long long)n, (unsigned long long)changed);
  }
  assert_ok(tu_forward(tp, a)); /* and it loads right after all that */
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
  unsetenv("MLO_KEEP_PAGE_CACHE");
}

static void test_free_with_loads_in_flight(void **state) {
  (void)state;
  /* a slow link: the prefetches enable issues are still being read and
   * copied when the pipeline is freed */
  mlo_platform *plat = tu_platform_open("bw=200000000");
  tu_pipe *tp = build(plat);
  declare_schedule(tp);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  tu_pipe_free(tp);
  assert_ok(mlo_platform_synchronize(plat));
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);
}

/* A tier change at enable frees host memory a copy still queued may use (a
 * load by hand, evicted before its copy ran): it waits for the copy. */
static void test_tier_change_waits_for_queued_copies(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("bw=100000000,capacity=256M"); /* the copy: ~0.7 s */
  tu_pipe *tp = build(plat);
  /* large enough that its slab is unmapped when freed (a use after it faults) */
  mlo_component *a = add_file_comp(tp, "big", MLO_ROLE_DIT, 64u << 20);
  assert_ok(mlo_component_load(a));
  assert_ok(mlo_component_evict(a)); /* its slab is still the source of a queued copy */
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_null(mlo_tensor_host_data(mlo_component_tensor_at(a, 0)));
  assert_ok(tu_forward(tp, a));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

typedef struct {
  tu_pipe *tp;
  const char *name;
} racer;

static void *race_forward(void *arg) {
  racer *r = arg;
  int rc = tu_forward(r->tp, tu_comp(r->tp, r->name));
  if (rc) tu_note_failure(r->tp, "forward of %s: %s", r->name, mlo_err_name(rc));
  return NULL;
}

/* Strict enable loads the encoder from disk; two DiTs acquired while it is
 * still being read wait for the read, then exclude each other (C3): the
 * evictions never run on a stale check.  A try_acquire meanwhile says
 * why it would wait. */
static void test_strict_exclusion_while_reading(void **state) {
  (void)state;
  setenv("MLO_DISK_BW", "20000000", 1); /* the encoder's read: ~150 ms */
  for (int round = 0; round < 3; round++) {
    mlo_platform *plat = tu_platform_open(NULL);
    tu_pipe *tp = build(plat);
    tp->audit_in_forward = tp->exclusion_in_forward = true;
    mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
    s.host_budget_bytes = 1;
    assert_ok(mlo_offload_enable(tp->pipe, &s)); /* the encoder and the VAE: reads issued */
    if (round == 0) { /* the reads take 150 ms: a try_acquire now says it would wait */
      assert_int_equal(mlo_component_try_acquire(tu_comp(tp, "dit_b")), MLO_EBUSY);
      assert_non_null(strstr(mlo_pipeline_errmsg(tp->pipe), "being read from disk"));
    }
    racer r[2] = {{tp, "dit_a"}, {tp, "dit_b"}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
      assert_int_equal(pthread_create(&th[i], NULL, race_forward, &r[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    tu_assert_forwards_clean(tp);
    tu_pipe_free(tp);
    mlo_platform_close(plat);
  }
  unsetenv("MLO_DISK_BW");
}

/* After a host budget, offload off: a load by hand of a component on disk
 * returns with its copies issued, as a load from a slab does; a later
 * enable with copy_back (every tensor written back) never writes into a
 * component whose host copy is its files, and moves it back to a slab at
 * its eviction. */
static void test_by_hand_and_copy_back_after_a_host_budget(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("bw=200000000");
  tu_pipe *tp = build(plat);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.host_budget_bytes = 1;
  assert_ok(mlo_offload_enable(tp->pipe, &s)); /* strict: the encoder loads from disk */
  assert_ok(mlo_offload_disable(tp->pipe));
  mlo_component *b = tu_comp(tp, "dit_b"), *enc = tu_comp(tp, "encoder");
  assert_ok(mlo_component_load(b));
  assert_ok(mlo_platform_synchronize(plat));
  char why[256];
  if (!tu_device_content_ok(tp, b, why, sizeof why)) fail_msg("by hand: %s", why);
  assert_ok(mlo_component_evict(b));
  s = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  s.copy_back = true;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_true(mlo_component_is_resident(enc));     /* still the one loaded from disk */
  assert_ok(tu_forward(tp, tu_comp(tp, "dit_a"))); /* evicts it: nothing written back */
  assert_false(mlo_component_is_resident(enc));
  assert_ok(tu_forward(tp, enc)); /* in host memory again, as the plan without a budget says */
  assert_non_null(mlo_tensor_host_data(mlo_component_tensor_at(enc, 0)));
  /* the VAE, resident since the first enable, keeps its tier until evicted */
  assert_int_equal(tu_pstats(tp).disk_bytes, mlo_component_bytes(tu_comp(tp, "vae")));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A DiT of 8 blocks of 1 MiB, a prologue and an epilogue, in one file. */
#define SBLK 8
static mlo_component *add_streaming_dit(tu_pipe *tp) {
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "sdit", MLO_ROLE_DIT, &c));
  char path[512], names[SBLK + 2][32];
  file_of("sdit", path, sizeof path);
  unlink(path);
  size_t sizes[SBLK + 2];
  uint64_t at[SBLK + 2], end = 8;
  snprintf(names[0], sizeof names[0], "patch_embedding.weight");
  snprintf(names[SBLK + 1], sizeof names[SBLK + 1], "head.weight");
  sizes[0] = sizes[SBLK + 1] = 64u << 10;
  for (int b = 0; b < SBLK; b++) {
    snprintf(names[b + 1], sizeof names[b + 1], "blocks.%d.attn.weight", b);
    sizes[b + 1] = 1u << 20;
  }
  for (int i = 0; i < SBLK + 2; i++) {
    at[i] = end;
    end += sizes[i];
    tu_write_file_pattern("sdit", names[i], sizes[i], path, at[i]);
  }
  for (int i = 0; i < SBLK + 2; i++) tu_add_file_tensor(tp, c, names[i], sizes[i], path, at[i]);
  return c;
}

/* A forward that reads each block between its begin and end, and the
 * prologue and epilogue, against the pattern each tensor was written with. */
static int streamed_check(mlo_component *c, void *user) {
  tu_pipe *tp = user;
  for (int b = -1; b <= SBLK; b++) {
    bool in_block = b >= 0 && b < SBLK;
    if (in_block && mlo_block_begin(c, (size_t)b)) {
      tu_note_failure(tp, "begin %d: %s", b, mlo_pipeline_errmsg(tp->pipe));
      return 1;
    }
    const mlo_tensor *t = mlo_component_tensor_at(c, (size_t)(b + 1));
    size_t n = (size_t)mlo_tensor_nbytes(t);
    unsigned char *buf = malloc(n);
    int rc = tu_read_device(tp, t, buf, n);
    size_t first = rc ? 0 : tu_pattern_mismatch(buf, n, tu_seed("sdit", mlo_tensor_name(t)));
    free(buf);
    if (in_block) mlo_block_end(c, (size_t)b);
    if (first != n) {
      tu_note_failure(tp, "%s: wrong from byte %zu (%s)", mlo_tensor_name(t), first,
                      mlo_err_name(rc));
      return 1;
    }
  }
  return 0;
}

/* A 1 MiB encoder and the streaming DiT, both from files, the request
 * declared as one encoder call and three DiT steps. */
static tu_pipe *encoder_and_streaming_dit(mlo_platform *plat, mlo_component **enc,
                                          mlo_component **dit) {
  tu_pipe *tp = tu_pipe_new(plat, true);
  *enc = add_file_comp(tp, "encoder", MLO_ROLE_ENCODER, 1u << 20);
  *dit = add_streaming_dit(tp);
  mlo_schedule_entry e[] = {{*enc, 1}, {*dit, 3}};
  assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, 2));
  return tp;
}

/* Three prompts of the encoder and three DiT steps, every byte checked. */
static void run_streamed_prompts(tu_pipe *tp, mlo_component *enc, mlo_component *dit) {
  for (int p = 0; p < 3; p++) {
    assert_ok(tu_forward(tp, enc));
    for (int k = 0; k < 3; k++) {
      int rc = mlo_component_forward(dit, streamed_check, tp);
      if (rc)
        fail_msg("prompt %d: %s (%s; %s)", p, mlo_err_name(rc), mlo_pipeline_errmsg(tp->pipe),
                 tp->first_failure);
    }
  }
  assert_ok(mlo_pipeline_synchronize(tp->pipe));
  tu_assert_forwards_clean(tp);
}

/* The encoder and the streaming DiT under the budget policy, the DiT's
 * 8.1 MiB in a device budget of 5 MiB (it keeps some blocks and streams the
 * rest), with this host budget; copies delayed at random. */
static tu_pipe *streaming_on_disk(mlo_platform **plat, mlo_component **enc, mlo_component **dit,
                                  uint64_t host_budget, bool prefetch) {
  *plat = tu_platform_open("jitter=1");
  tu_pipe *tp = encoder_and_streaming_dit(*plat, enc, dit);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = 5u << 20;
  s.host_budget_bytes = host_budget;
  s.prefetch = prefetch;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  return tp;
}

/* A DiT larger than the device budget that lives on disk and has no host
 * memory for its streamed blocks reads each of them from its file into its
 * slot at each use, the reads queued as the slots free (the reader, while
 * the blocks before compute): every forward sees every byte right, with
 * copies delayed at random; nothing of it is in host memory; the disk
 * gives the resident part at each load and every streamed block at every
 * forward. */
static void test_streamed_blocks_read_from_disk(void **state) {
  (void)state;
  mlo_platform *plat;
  mlo_component *enc, *dit;
  tu_pipe *tp = streaming_on_disk(&plat, &enc, &dit, 1, true); /* nothing fits: all on disk */
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(dit, &si));
  assert_true(si.streamed_blocks >= 2 && si.resident_blocks >= 1);
  assert_int_equal(tu_pstats(tp).host_slab_bytes, 0);
  for (int b = 0; b < SBLK + 2; b++)
    assert_null(mlo_tensor_host_data(mlo_component_tensor_at(dit, (size_t)b)));
  run_streamed_prompts(tp, enc, dit);
  mlo_component_stats ds = tu_cstats(dit);
  uint64_t resident = 2 * (64u << 10) + (uint64_t)si.resident_blocks * (1u << 20);
  assert_int_equal(ds.block_loads, 9 * si.streamed_blocks); /* every forward, from disk */
  assert_int_equal(ds.disk_read_bytes, ds.disk_loads * resident + ds.block_loads * (1u << 20));
  assert_int_equal(tu_pstats(tp).host_slab_bytes, 0);
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A streamed block's read that fails fails the begin of that block (its
 * file named), never a forward reading stale bytes; the next forward reads
 * every block right.  Freeing the pipeline with block reads queued ends
 * them. */
static void test_streamed_block_read_fails(void **state) {
  (void)state;
  mlo_platform *plat;
  mlo_component *enc, *dit;
  tu_pipe *tp = streaming_on_disk(&plat, &enc, &dit, 1, false);
  assert_ok(mlo_component_forward(dit, streamed_check, tp)); /* loaded, its slots refilled */
  int failed = 0;
  for (int k = 2; k < 40 && failed < 3; k++) { /* a read failing k reads on, at every point */
    tu_reset_observations(tp);
    mlo_sysfault_arm(MLO_SYSFAULT_READ, k);
    int rc = mlo_component_forward(dit, streamed_check, tp);
    mlo_sysfault_disarm();
    if (!rc) continue;
    failed++;
    /* the forward's own failure: its begin said why, naming the file */
    if (rc != MLO_ECALLBACK || !strstr(tp->first_failure, "begin") ||
        !strstr(tp->first_failure, "reading block") || !strstr(tp->first_failure, "sdit.bin"))
      fail_msg("k=%d: %s: %s (%s)", k, mlo_err_name(rc), mlo_pipeline_errmsg(tp->pipe),
               tp->first_failure);
    tu_reset_observations(tp);
    rc = mlo_component_forward(dit, streamed_check, tp);
    if (rc) fail_msg("after a failed read: %s (%s)", mlo_err_name(rc), tp->first_failure);
  }
  assert_true(failed > 0);
  assert_ok(mlo_component_forward(dit, streamed_check, tp)); /* reads queued at its ends */
  tu_pipe_free(tp);                                          /* with them in flight */
  mlo_platform_close(plat);
}

/* A DiT larger than the device budget streams its blocks; with a host
 * budget that holds its streamed blocks they stay in host memory (they are
 * copied at every forward) and the rest of it, the blocks kept resident,
 * the prologue and the epilogue, is read from disk at each load: every
 * forward sees every byte right, with copies delayed at random. */
static void test_streamed_component_on_disk(void **state) {
  (void)state;
  mlo_platform *plat;
  mlo_component *enc, *dit;
  /* a host budget of its streamed blocks, not the rest of it */
  tu_pipe *tp = streaming_on_disk(&plat, &enc, &dit, 7u << 20, true);
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(dit, &si));
  assert_true(si.streamed_blocks >= 2 && si.resident_blocks >= 1);
  mlo_pipeline_stats st = tu_pstats(tp);
  assert_int_equal(st.host_slab_bytes, si.streamed_bytes); /* the encoder is on disk too */
  /* a streamed block's tensor has host bytes, a resident one's is on disk */
  size_t host = 0;
  for (int b = 0; b < SBLK; b++)
    host += mlo_tensor_host_data(mlo_component_tensor_at(dit, (size_t)b + 1)) != NULL;
  assert_int_equal(host, si.streamed_blocks);
  assert_null(mlo_tensor_host_data(mlo_component_tensor_at(dit, 0)));
  run_streamed_prompts(tp, enc, dit);
  mlo_component_stats ds = tu_cstats(dit);
  assert_true(ds.disk_loads >= 3); /* the encoder displaces it every prompt */
  uint64_t resident = 2 * (64u << 10) + (uint64_t)si.resident_blocks * (1u << 20);
  assert_int_equal(ds.disk_read_bytes, ds.disk_loads * resident);
  assert_int_equal(ds.block_loads, 9 * si.streamed_blocks); /* from the slab, every forward */
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A re-plan that streams fewer blocks gives back the ones it no longer
 * streams (host memory within the new budget); a fill that fails leaves no
 * plan copying blocks never read, and the next forward reads them. */
static void test_replan_and_failed_fill(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("jitter=1");
  mlo_component *enc, *dit;
  tu_pipe *tp = encoder_and_streaming_dit(plat, &enc, &dit);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = 4u << 20; /* streams most blocks */
  s.host_budget_bytes = 7u << 20;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  uint64_t many = tu_pstats(tp).host_slab_bytes;
  assert_ok(mlo_component_forward(dit, streamed_check, tp));
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_component_evict(dit));
  /* a larger device: fewer blocks stream, and the host budget holds just them */
  uint64_t fewer = mlo_component_streamed_bytes(dit, 7u << 20);
  assert_true(fewer > 0 && fewer < many);
  s.budget_bytes = 7u << 20;
  s.host_budget_bytes = fewer + (512u << 10);
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_int_equal(tu_pstats(tp).host_slab_bytes, fewer);
  for (int k = 0; k < 2; k++) assert_ok(mlo_component_forward(dit, streamed_check, tp));
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_component_evict(dit));
  /* back to the small device, its blocks read again, the first read failing */
  s.budget_bytes = 4u << 20;
  s.host_budget_bytes = 7u << 20;
  s.prefetch = false;
  mlo_sysfault_arm(MLO_SYSFAULT_READ, 1);
  int rc = mlo_offload_enable(tp->pipe, &s); /* the fill reads at enable: it fails there */
  mlo_sysfault_disarm();
  assert_int_equal(rc, MLO_EIO);
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  tu_reset_observations(tp);
  for (int k = 0; k < 2; k++) {
    rc = mlo_component_forward(dit, streamed_check, tp);
    if (rc)
      fail_msg("%s (%s; %s)", mlo_err_name(rc), mlo_pipeline_errmsg(tp->pipe), tp->first_failure);
  }
  assert_int_equal(tu_pstats(tp).host_slab_bytes, many);
  /* a fill at a forward: the DiT resident whole, then a host budget whose
   * enable evicts it (its tier changes then) and a forward whose fill fails */
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_component_evict(dit));
  s.budget_bytes = 64u << 20;
  s.host_budget_bytes = 0;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_ok(mlo_component_forward(dit, streamed_check, tp));
  assert_ok(mlo_offload_disable(tp->pipe));
  s.budget_bytes = 5u << 20;
  s.host_budget_bytes = 7u << 20;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_false(mlo_component_is_resident(dit)); /* evicted to fit: on disk now, unread */
  mlo_sysfault_arm(MLO_SYSFAULT_READ, 1);
  rc = mlo_component_forward(dit, streamed_check, tp);
  mlo_sysfault_disarm();
  assert_int_equal(rc, MLO_EIO);
  tu_reset_observations(tp);
  rc = mlo_component_forward(dit, streamed_check, tp); /* every block read, none stale */
  if (rc)
    fail_msg("%s (%s; %s)", mlo_err_name(rc), mlo_pipeline_errmsg(tp->pipe), tp->first_failure);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_twice_the_host_budget),
      cmocka_unit_test(test_budget_below_what_must_stay_refused),
      cmocka_unit_test(test_file_changed_refused_at_read),
      cmocka_unit_test(test_file_changed_during_a_paced_load),
      cmocka_unit_test(test_pacing_stops_and_is_checked),
      cmocka_unit_test(test_disk_progress_while_a_forward_waits),
      cmocka_unit_test(test_read_faults_swept),
      cmocka_unit_test(test_copy_faults_leave_no_stale_slot),
      cmocka_unit_test(test_free_with_loads_in_flight),
      cmocka_unit_test(test_tier_change_waits_for_queued_copies),
      cmocka_unit_test(test_strict_exclusion_while_reading),
      cmocka_unit_test(test_by_hand_and_copy_back_after_a_host_budget),
      cmocka_unit_test(test_streamed_component_on_disk),
      cmocka_unit_test(test_streamed_blocks_read_from_disk),
      cmocka_unit_test(test_streamed_block_read_fails),
      cmocka_unit_test(test_replan_and_failed_fill),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
