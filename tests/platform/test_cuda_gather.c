/*
 * test_cuda_gather.c — a sharded load's all-gather through the CUDA
 * platform, with one NCCL rank (issue 42, item 3: "a single NCCL rank's
 * gather runs too").  One rank needs no MPI, so this runs where the device
 * check runs (scripts/gpu-check.sh, step nccl_gather: the real NCCL the
 * device's torch brings, through the pack's NCCL copy of libmlo-cuda.so)
 * and in CI on tests/fakecuda and tests/fakenccl.  Everything goes through
 * the platform's slots as core calls them: coll_id and coll_init (mlo's
 * own non-blocking communicator), coll_check, all_gather on the copy
 * queue, coll_wait, coll_destroy.
 *
 * With one rank an in-place gather moves nothing, so every byte of the
 * block must come back as it went in: a send buffer taken from the wrong
 * place, a gather at the wrong offset or one not ordered after the copy
 * that filled the block shows as changed bytes.
 *
 * Registrations of the one program:
 *   platform_cuda_gather       (label gpu) — a device and a real NCCL;
 *       77 (skipped) when no CUDA device is visible, a failure when the
 *       CUDA module loaded has no all-gather (built without NCCL).
 *   platform_cuda_gather_fake  (label platform) — `fake`: on the fakes;
 *       fails unless the NCCL loaded is tests/fakenccl and the first gather
 *       and the finalize on each communicator answered ncclInProgress (the
 *       platform then polled them to their end: they went through).
 *   platform_cuda_gather_hang  (label platform) — `hang`: the fakes with
 *       MLO_FAKENCCL_HANG=0, a gather that never completes: the wait fails
 *       within the communicator's timeout, naming it, and the aborted
 *       communicator is refused afterwards.
 */
#define _GNU_SOURCE /* dladdr */
#include "testutil.h"

#include "platform/platform.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COLL_TIMEOUT_MS 20000u
#define HANG_TIMEOUT_MS 500u

static size_t block_bytes = (size_t)256 << 20; /* less on the fake */
/* On the fake (`fake`): how many of its calls have answered ncclInProgress
 * (a non-blocking communicator's first gather and its finalize do). */
static uint64_t (*fake_in_progress)(void);

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A symbol of the libnccl.so.2 the CUDA module loaded (it is not in the
 * global scope: the module is dlopen'ed privately); NULL when none is. */
static void *nccl_symbol(const char *name) {
  void *h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return NULL;
  void *sym = dlsym(h, name);
  dlclose(h);
  return sym;
}

/* cuda:0 with its all-gather, and this process's one-rank communicator. */
static mlo_platform *open_with_comm(unsigned timeout_ms, void **coll) {
  mlo_platform *p = tu_open_spec("cuda:0");
  if (!mlo_plat_has_all_gather(p) || !mlo_plat_has_coll(p))
    fail_msg("the CUDA module loaded has no all-gather: it was built without NCCL "
             "(MLO_MODULE_PATH=%s)",
             getenv("MLO_MODULE_PATH") ? getenv("MLO_MODULE_PATH") : "unset");
  unsigned char id[MLO_COLL_ID_BYTES];
  char err[512] = "";
  int rc = mlo_plat_coll_id(p, id, sizeof id, err, sizeof err);
  if (rc) fail_msg("coll_id -> %s: %s", mlo_err_name(rc), err);
  double t0 = now_ms();
  rc = mlo_plat_coll_init(p, id, sizeof id, 1, 0, timeout_ms, coll, err, sizeof err);
  if (rc) fail_msg("coll_init (one rank) -> %s: %s", mlo_err_name(rc), err);
  assert_non_null(*coll);
  printf("one-rank communicator made in %.1f ms\n", now_ms() - t0);
  return p;
}

/* The block filled with a pattern through the copy queue, from pinned
 * memory (as a sharded load's slice is). */
static void *filled_block(mlo_platform *p, size_t n, uint32_t seed) {
  void *slab = NULL, *block = NULL;
  bool pinned = false;
  assert_ok(mlo_plat_host_alloc(p, n, true, &slab, &pinned));
  tu_fill_pattern(slab, n, seed);
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  assert_ok(mlo_plat_copy_h2d(p, block, 0, slab, n));
  assert_ok(mlo_plat_synchronize(p)); /* the slab may go */
  mlo_plat_host_free(p, slab, n, pinned);
  return block;
}

/* Every byte of the block read back: the pattern it was filled with. */
static void assert_block_unchanged(mlo_platform *p, void *block, size_t n, uint32_t seed) {
  void *back = malloc(n);
  assert_non_null(back);
  memset(back, 0, n);
  assert_ok(mlo_plat_copy_d2h(p, back, block, 0, n));
  assert_ok(mlo_plat_synchronize(p));
  size_t first = tu_pattern_mismatch(back, n, seed); /* n: none differs */
  free(back);
  if (first != n) fail_msg("byte %zu of %zu changed by one rank's in-place gathers", first, n);
}

/* mlo's communicator is the node's for one rank at rank 0 on cuda:0, and
 * not one for two ranks or for rank 1: what core checks before a sharded
 * load gathers into a block. */
static void test_comm_is_checked(void **state) {
  (void)state;
  void *coll = NULL;
  mlo_platform *p = open_with_comm(COLL_TIMEOUT_MS, &coll);
  char err[512] = "";
  int rc = mlo_plat_coll_check(p, coll, 1, 0, err, sizeof err);
  if (rc) fail_msg("coll_check(1 rank, rank 0) -> %s: %s", mlo_err_name(rc), err);
  err[0] = 0;
  assert_status(mlo_plat_coll_check(p, coll, 2, 0, err, sizeof err), MLO_EINVAL);
  if (!strstr(err, "this node 2")) fail_msg("two ranks refused without saying so: %s", err);
  err[0] = 0;
  assert_status(mlo_plat_coll_check(p, coll, 1, 1, err, sizeof err), MLO_EINVAL);
  if (!strstr(err, "the node at rank 1")) fail_msg("rank 1 refused without saying so: %s", err);
  mlo_plat_coll_destroy(p, coll);
  mlo_platform_close(p);
}

/* Gathers of the whole block and of regions at odd offsets and sizes, as
 * a load block by block makes, queued right behind the copy that fills
 * the block; the host waits on the last one with coll_wait, as core does. */
static void test_gathers_in_place(void **state) {
  (void)state;
  void *coll = NULL;
  mlo_platform *p = open_with_comm(COLL_TIMEOUT_MS, &coll);
  const size_t n = block_bytes;
  void *slab = NULL, *block = NULL;
  bool pinned = false;
  assert_ok(mlo_plat_host_alloc(p, n, true, &slab, &pinned));
  tu_fill_pattern(slab, n, 42);
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  mlo_event *done = NULL;
  assert_ok(mlo_plat_event_create(p, &done));
  double t0 = now_ms();
  assert_ok(mlo_plat_copy_h2d(p, block, 0, slab, n)); /* not waited for: the queue orders it */
  const struct {
    size_t offset, slice;
  } regions[] = {{0, n}, {4097, 12345}, {n / 3, n / 2}, {n - 1, 1}};
  uint64_t answered = fake_in_progress ? fake_in_progress() : 0;
  for (size_t i = 0; i < sizeof regions / sizeof regions[0]; i++) {
    int rc = mlo_plat_all_gather(p, block, regions[i].offset, regions[i].slice, 0, coll,
                                 COLL_TIMEOUT_MS);
    if (rc)
      fail_msg("all_gather of %zu bytes at %zu -> %s", regions[i].slice, regions[i].offset,
               mlo_err_name(rc));
  }
  /* the fake's first gather answered ncclInProgress, and it went through:
   * the platform polled it to its end */
  if (fake_in_progress && fake_in_progress() == answered)
    fail_msg("the fake NCCL's first gather did not answer ncclInProgress");
  assert_ok(mlo_plat_event_record_copy(p, done));
  char err[512] = "";
  int rc = mlo_plat_coll_wait(p, done, err, sizeof err);
  if (rc) fail_msg("coll_wait -> %s: %s", mlo_err_name(rc), err);
  printf("%zu MiB copied in and gathered 4 times (one rank) in %.1f ms\n", n >> 20, now_ms() - t0);
  mlo_plat_host_free(p, slab, n, pinned);
  assert_block_unchanged(p, block, n, 42);
  /* still the node's after gathering: nothing aborted it */
  assert_ok(mlo_plat_coll_check(p, coll, 1, 0, err, sizeof err));
  mlo_plat_event_destroy(p, done);
  assert_ok(mlo_plat_dev_free(p, block, n));
  mlo_plat_coll_destroy(p, coll);
  mlo_platform_close(p);
}

/* A communicator destroyed with a gather still queued on it: NCCL's
 * finalize flushes it (on a non-blocking communicator it answers
 * ncclInProgress until then, and the platform polls it); the block keeps
 * its bytes and the device stays usable. */
static void test_destroy_with_gather_queued(void **state) {
  (void)state;
  void *coll = NULL;
  mlo_platform *p = open_with_comm(COLL_TIMEOUT_MS, &coll);
  const size_t n = block_bytes / 4;
  void *block = filled_block(p, n, 7);
  assert_ok(mlo_plat_all_gather(p, block, 0, n, 0, coll, COLL_TIMEOUT_MS));
  uint64_t answered = fake_in_progress ? fake_in_progress() : 0;
  mlo_plat_coll_destroy(p, coll);
  if (fake_in_progress && fake_in_progress() == answered)
    fail_msg("the fake NCCL's finalize did not answer ncclInProgress");
  assert_block_unchanged(p, block, n, 7);
  assert_ok(mlo_plat_dev_free(p, block, n));
  mlo_platform_close(p);
}

/* `hang`: MLO_FAKENCCL_HANG=0, so rank 0's gather never completes: the
 * wait fails within the communicator's timeout and says so, the
 * communicator is aborted, and a gather on it afterwards is refused. */
static void test_hang_fails_in_time(void **state) {
  (void)state;
  void *coll = NULL;
  mlo_platform *p = open_with_comm(HANG_TIMEOUT_MS, &coll);
  const size_t n = (size_t)1 << 20;
  void *block = filled_block(p, n, 9);
  assert_ok(mlo_plat_all_gather(p, block, 0, n, 0, coll, HANG_TIMEOUT_MS));
  mlo_event *done = NULL;
  assert_ok(mlo_plat_event_create(p, &done));
  assert_ok(mlo_plat_event_record_copy(p, done));
  char err[512] = "";
  double t0 = now_ms();
  int rc = mlo_plat_coll_wait(p, done, err, sizeof err);
  double waited = now_ms() - t0;
  if (rc == MLO_OK) fail_msg("a gather that never completes was waited for successfully");
  if (!strstr(err, "did not complete within"))
    fail_msg("the failed wait does not name the timeout: %s", err);
  if (waited > 20.0 * HANG_TIMEOUT_MS) fail_msg("the wait took %.0f ms", waited);
  assert_status(mlo_plat_all_gather(p, block, 0, n, 0, coll, HANG_TIMEOUT_MS), MLO_ESTATE);
  err[0] = 0;
  assert_status(mlo_plat_coll_check(p, coll, 1, 0, err, sizeof err), MLO_ESTATE);
  mlo_plat_coll_destroy(p, coll); /* aborted: nothing left to free */
  mlo_plat_event_destroy(p, done);
  assert_ok(mlo_plat_synchronize(p));
  assert_ok(mlo_plat_dev_free(p, block, n));
  mlo_platform_close(p);
}

/* Which NCCL the module loaded, for the device check's log. */
static void say_which_nccl(void) {
  int (*version)(int *) = (int (*)(int *))nccl_symbol("ncclGetVersion");
  int v = 0;
  Dl_info where;
  memset(&where, 0, sizeof where);
  if (version && version(&v) == 0 && dladdr((void *)version, &where))
    printf("NCCL %d.%d.%d from %s\n", v / 10000, v / 100 % 100, v % 100,
           where.dli_fname ? where.dli_fname : "?");
  else
    printf("NCCL: the module loaded none\n");
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "device";
  bool fake = !strcmp(mode, "fake"), hang = !strcmp(mode, "hang");
  if (!fake && !hang && strcmp(mode, "device")) {
    fprintf(stderr, "usage: %s [fake | hang]\n", argv[0]);
    return 2;
  }
  mlo_platform *probe = NULL;
  char err[512] = "";
  int rc = mlo_platform_open("cuda", &probe, err, sizeof err);
  if (rc == MLO_ENODEV && !fake && !hang) {
    fprintf(stderr, "skipped: %s\n", err);
    return 77;
  }
  if (rc) {
    fprintf(stderr, "cuda: %s: %s\n", mlo_err_name(rc), err);
    return 1;
  }
  mlo_platform_close(probe);
  say_which_nccl();
  if (fake || hang) {
    fake_in_progress = (uint64_t(*)(void))nccl_symbol("fakenccl_in_progress_answers");
    if (!fake_in_progress) {
      fprintf(stderr, "`%s` asked for, but the NCCL loaded is not tests/fakenccl's\n", mode);
      return 1;
    }
  }
  if (fake || hang) block_bytes = (size_t)16 << 20;
  if (hang) {
    const struct CMUnitTest hang_tests[] = {cmocka_unit_test(test_hang_fails_in_time)};
    return cmocka_run_group_tests(hang_tests, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_comm_is_checked),
      cmocka_unit_test(test_gathers_in_place),
      cmocka_unit_test(test_destroy_with_gather_queued),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
