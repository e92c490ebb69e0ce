/*
 * test_cuda_fake.c — core and the CUDA platform together on the fake CUDA
 * runtime (tests/fakecuda), for the defects of issue 25 that only show
 * with a GPU's asynchrony or a device's refusals: which queued work a free
 * waits for (item 7, the default run); a slab that falls back to pageable
 * memory is registered (item 9, `pageable`, with cudaHostAlloc failing);
 * the used bytes follow a free that fails (item 9, `free-fails`).
 *
 * Each check runs the real libmlo-cuda.so through the public API; the fake
 * runs streams as FIFO threads, so a host function that blocks on the
 * compute stream stands in for a long kernel, and a free that runs too
 * early poisons memory a queued use then reads.  The program refuses to
 * run (exit 1) when the runtime loaded is not the fake.
 */
#include "testutil.h"

#include "platform/platform.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a kernel that runs until the test lets it finish ------------------- */

static atomic_int gate_open;

/* On the compute stream's worker: holds the stream, as a long kernel
 * would, until the gate opens (at most 20 s, so a defect cannot hang). */
static void CUDART_CB gated_kernel(void *user) {
  (void)user;
  for (int i = 0; i < 20000 && !atomic_load(&gate_open); i++) tu_sleep_ms(1);
}

static void queue_gated_kernel(mlo_platform *plat) {
  atomic_store(&gate_open, 0);
  cudaStream_t compute = mlo_platform_compute_queue(plat);
  assert_int_equal(cudaLaunchHostFunc(compute, gated_kernel, NULL), cudaSuccess);
}

/* Whether every stream but the compute one has run all it was given
 * within ms: the fake's view of "nothing else waits for the compute". */
static bool others_drain(mlo_platform *plat, unsigned ms) {
  bool (*idle)(cudaStream_t, unsigned) =
      (bool (*)(cudaStream_t, unsigned))dlsym(RTLD_DEFAULT, "fakecuda_idle_except");
  assert_non_null(idle);
  return idle(mlo_platform_compute_queue(plat), ms);
}

static uint64_t fake_use_after_free(void) {
  uint64_t (*count)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fakecuda_use_after_free");
  assert_non_null(count);
  return count();
}

/* Two DiTs of 7 MiB that cannot both be resident (capacity=12M, which
 * holds one with the encoder and the VAE, each block counted in the pool's
 * 2 MiB granules): loading the second reuses the first's memory, so the
 * load waits for the first's free. */
static tu_pipe *two_dits(mlo_platform **plat) {
  *plat = tu_open_spec("cuda:0:capacity=12M");
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 1, 4096, 0},
                                {"transformer", MLO_ROLE_DIT, 4, 1792 * 1024, 0},
                                {"transformer_2", MLO_ROLE_DIT, 4, 1792 * 1024, 0},
                                {"vae", MLO_ROLE_VAE, 1, 64 * 1024, 0}};
  tu_pipe *tp = tu_pipe_build(*plat, specs, 4);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  return tp;
}

/* Item 7: the first DiT ran and was released; then a long kernel of
 * someone else's is queued.  Acquiring the second DiT evicts the first and
 * loads into its memory: that load must complete while the long kernel
 * still runs (the free waits for the first DiT's own last use, not for
 * every kernel queued at eviction time). */
static void test_free_waits_for_own_use_only(void **state) {
  (void)state;
  mlo_platform *plat = NULL;
  tu_pipe *tp = two_dits(&plat);
  mlo_component *dit1 = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  assert_ok(tu_forward(tp, dit1));
  queue_gated_kernel(plat);
  assert_ok(mlo_component_acquire(dit2));
  bool overlapped = others_drain(plat, 10000); /* the free and the load's copies ran */
  atomic_store(&gate_open, 1);
  assert_ok(mlo_component_release(dit2));
  assert_ok(mlo_platform_synchronize(plat));
  assert_false(mlo_component_is_resident(dit1));
  if (!overlapped)
    fail_msg("the second DiT's load waited for a kernel queued after the first DiT's last use");
  char why[256] = "";
  if (!tu_device_content_ok(tp, dit2, why, sizeof why)) fail_msg("%s", why);
  assert_int_equal(fake_use_after_free(), 0);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* The negative control: a use of the first DiT still queued (behind the
 * long kernel, inside its acquire) when it is evicted.  Its free, and so
 * the second DiT's load into that memory, waits for that use: the use
 * reads the first DiT's bytes, never the poison or the second's. */
static void test_free_never_before_queued_use(void **state) {
  (void)state;
  mlo_platform *plat = NULL;
  tu_pipe *tp = two_dits(&plat);
  mlo_component *dit1 = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  const mlo_tensor *t = mlo_component_find_tensor(dit1, "t1");
  assert_non_null(t);
  size_t n = tu_rec(tp, t)->bytes;
  void *seen = NULL;
  assert_int_equal(cudaMallocHost(&seen, n), cudaSuccess);
  memset(seen, 0, n);
  assert_ok(mlo_component_acquire(dit1));
  queue_gated_kernel(plat);
  cudaStream_t compute = mlo_platform_compute_queue(plat);
  assert_int_equal(
      cudaMemcpyAsync(seen, mlo_tensor_device_ptr(t), n, cudaMemcpyDeviceToHost, compute),
      cudaSuccess);
  assert_ok(mlo_component_release(dit1));
  assert_ok(mlo_component_acquire(dit2));     /* evicts dit1 while its use is queued */
  bool loaded_early = others_drain(plat, 50); /* room for an early free to run */
  atomic_store(&gate_open, 1);
  assert_ok(mlo_platform_synchronize(plat));
  assert_ok(mlo_component_release(dit2));
  assert_false(loaded_early);
  size_t at = tu_pattern_mismatch(seen, n, tu_rec(tp, t)->seed);
  if (at != n)
    fail_msg("the queued use read byte %zu as 0x%02x: the block was freed under it", at,
             ((unsigned char *)seen)[at]);
  assert_int_equal(fake_use_after_free(), 0);
  char why[256] = "";
  if (!tu_device_content_ok(tp, dit2, why, sizeof why)) fail_msg("%s", why);
  cudaFreeHost(seen);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* ---- item 9 ------------------------------------------------------------- */

static uint64_t fake_registered_bytes(void) {
  uint64_t (*count)(void) =
      (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fakecuda_host_registered_bytes");
  assert_non_null(count);
  return count();
}

/* cudaHostAlloc fails (MLO_FAKECUDA_HOSTALLOC_FAIL=1): every slab falls
 * back to pageable memory, which is then registered in place, counted as
 * pinned, loads correctly, and is unregistered when the slab goes. */
static void test_pageable_slab_registered(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("cuda:0");
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 2, 64 * 1024, 1},
                                {"transformer", MLO_ROLE_DIT, 4, 256 * 1024, 0},
                                {"vae", MLO_ROLE_VAE, 1, 64 * 1024, 0}};
  tu_pipe *tp = tu_pipe_build(plat, specs, 3);
  assert_int_equal(fake_registered_bytes(), 0);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_pipeline_stats st = tu_pstats(tp);
  assert_true(st.host_slab_bytes > 0);
  assert_int_equal(st.pinned_bytes, st.host_slab_bytes);
  assert_int_equal(fake_registered_bytes(), st.host_slab_bytes);
  for (int round = 0; round < 2; round++) {
    assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder")));
    assert_ok(tu_forward(tp, tu_comp(tp, "transformer")));
    assert_ok(tu_forward(tp, tu_comp(tp, "vae")));
  }
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  assert_int_equal(fake_registered_bytes(), 0);
  mlo_platform_close(plat);
}

/* Frees fail (MLO_FAKECUDA_FREE_FAIL=1): the device still holds the block,
 * so the platform's used bytes still count it. */
static void test_failed_free_keeps_bytes(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("cuda:0");
  const size_t n = (size_t)1 << 20;
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(plat, n, &block));
  mlo_platform_memory before;
  assert_ok(mlo_platform_get_memory(plat, &before));
  assert_int_equal(before.used_bytes, n);
  assert_int_not_equal(mlo_plat_dev_free(plat, block, n), MLO_OK);
  mlo_platform_memory after;
  assert_ok(mlo_platform_get_memory(plat, &after));
  assert_int_equal(after.used_bytes, n);
  assert_true(after.free_bytes <= before.free_bytes);
  mlo_platform_close(plat);
}

/* ---- the CUDA desk review (docs/reviews: cuda-2026-12) ------------------ */

static void *fake_fn(const char *name) {
  void *fn = dlsym(RTLD_DEFAULT, name);
  assert_non_null(fn);
  return fn;
}

/* Log lines at INFO and above, kept for a test to search. */
static char logged[8192];

static void keep_log(mlo_log_level level, const char *msg, void *user) {
  (void)level, (void)user;
  size_t len = strlen(logged);
  snprintf(logged + len, sizeof logged - len, "%s\n", msg);
}

static void capture_log(void) {
  logged[0] = 0;
  mlo_set_log(keep_log, NULL, MLO_LOG_INFO);
}

static void stop_capture(void) {
  mlo_set_log(NULL, NULL, MLO_LOG_WARN);
}

/* A copy-side event that stays in flight until the gate opens: COPY waits
 * for a compute record behind the gated kernel, then copies and records. */
static void in_flight_copy(mlo_platform *plat, mlo_event *gate, mlo_event *ev, void *block,
                           const void *src, size_t n) {
  queue_gated_kernel(plat);
  assert_ok(mlo_plat_event_record_compute(plat, gate));
  assert_ok(mlo_plat_copy_wait(plat, gate));
  assert_ok(mlo_plat_copy_h2d(plat, block, 0, src, n));
  assert_ok(mlo_plat_event_record_copy(plat, ev));
}

/* D1: a query of an in-flight load answers busy and leaves the thread's
 * last error clean (mlo.torch shares libcudart with torch, whose next
 * kernel launch check would raise "device not ready"); an error the caller
 * had not read yet is not swallowed by it. */
static void test_query_leaves_last_error(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("cuda:0");
  mlo_event *gate = NULL, *ev = NULL;
  assert_ok(mlo_plat_event_create(plat, &gate));
  assert_ok(mlo_plat_event_create(plat, &ev));
  const size_t n = 4096;
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(plat, n, &block));
  char *src = malloc(n);
  assert_non_null(src);
  memset(src, 7, n);
  (void)cudaGetLastError();
  in_flight_copy(plat, gate, ev, block, src, n);
  assert_int_equal(mlo_plat_event_query(plat, ev), MLO_EBUSY);
  assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
  /* the caller's own unread error stays for them to read */
  assert_int_equal(cudaSetDevice(99), cudaErrorInvalidDevice);
  assert_int_equal(mlo_plat_event_query(plat, ev), MLO_EBUSY);
  assert_int_not_equal(cudaGetLastError(), cudaSuccess);
  assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
  atomic_store(&gate_open, 1);
  assert_ok(mlo_plat_event_sync(plat, ev));
  assert_int_equal(mlo_plat_event_query(plat, ev), MLO_OK);
  assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
  assert_ok(mlo_plat_dev_free(plat, block, n));
  mlo_plat_event_destroy(plat, ev);
  mlo_plat_event_destroy(plat, gate);
  free(src);
  mlo_platform_close(plat);
}

/* D13: after an error that leaves the context unusable (cudaErrorUnknown,
 * an uncorrectable ECC error) the platform stops calling the runtime: one
 * refused call, one log line, then every entry point answers at once. */
static void sticky_case(cudaError_t e) {
  void (*inject)(cudaError_t) = (void (*)(cudaError_t))fake_fn("fakecuda_inject_sticky");
  uint64_t (*refused)(void) = (uint64_t(*)(void))fake_fn("fakecuda_sticky_calls");
  mlo_platform *plat = tu_open_spec("cuda:0");
  mlo_event *ev = NULL;
  assert_ok(mlo_plat_event_create(plat, &ev));
  assert_ok(mlo_plat_event_record_copy(plat, ev));
  assert_ok(mlo_plat_event_sync(plat, ev));
  capture_log();
  inject(e);
  assert_int_equal(mlo_plat_event_query(plat, ev), MLO_EPLATFORM);
  assert_int_equal(refused(), 1);
  assert_int_equal(mlo_plat_event_query(plat, ev), MLO_EPLATFORM);
  assert_int_equal(mlo_plat_event_record_copy(plat, ev), MLO_EPLATFORM);
  assert_int_equal(mlo_plat_synchronize(plat), MLO_EPLATFORM);
  assert_int_equal(refused(), 1);
  stop_capture();
  if (!strstr(logged, "the device context is lost")) fail_msg("not called lost: %s", logged);
  inject(cudaSuccess);
  mlo_plat_event_destroy(plat, ev);
  mlo_platform_close(plat);
}

static void test_unknown_and_ecc_are_sticky(void **state) {
  (void)state;
  sticky_case(cudaErrorUnknown);
  sticky_case(cudaErrorECCUncorrectable);
}

/* D15: memory its owner page-locked already (cudaHostAlloc, as torch's
 * pin_memory() does) counts as pinned, is not registered again, and is
 * left pinned (not unregistered) when mlo lets go of it. */
static void test_caller_pinned_counts_as_pinned(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("cuda:0");
  const size_t n = 64 * 1024;
  void *pinned = NULL;
  assert_int_equal(cudaHostAlloc(&pinned, n, cudaHostAllocPortable), cudaSuccess);
  capture_log();
  assert_ok(mlo_plat_host_register(plat, pinned, n, true));
  assert_ok(mlo_plat_host_register(plat, (char *)pinned + 4096, 4096, false));
  assert_int_equal(fake_registered_bytes(), 0);
  mlo_plat_host_unregister(plat, (char *)pinned + 4096);
  mlo_plat_host_unregister(plat, pinned);
  stop_capture();
  if (strstr(logged, "cudaHostUnregister")) fail_msg("unregistered the caller's: %s", logged);
  struct cudaPointerAttributes a;
  assert_int_equal(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeHost);
  assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
  /* pageable memory is registered, and unregistered, as before */
  void *plain = aligned_alloc(4096, n);
  assert_non_null(plain);
  assert_int_equal(cudaPointerGetAttributes(&a, plain), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeUnregistered);
  assert_ok(mlo_plat_host_register(plat, plain, n, false));
  assert_int_equal(fake_registered_bytes(), n);
  mlo_plat_host_unregister(plat, plain);
  assert_int_equal(fake_registered_bytes(), 0);
  free(plain);
  mlo_platform_close(plat);
}

/* D12 (with MLO_FAKECUDA_HOSTALLOC_FAIL=1): cudaHostAlloc's out of memory
 * is the host's page-locked memory, and is logged so, never as the
 * device's. */
static void test_host_oom_named_host(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("cuda:0");
  capture_log();
  void *p = NULL;
  bool got = true;
  assert_ok(mlo_plat_host_alloc(plat, 1 << 20, true, &p, &got));
  stop_capture();
  assert_false(got);
  if (strstr(logged, "device out of memory")) fail_msg("host OOM logged as device's: %s", logged);
  if (!strstr(logged, "page-locked host memory")) fail_msg("host OOM not named: %s", logged);
  mlo_plat_host_free(plat, p, 1 << 20, false);
  mlo_platform_close(plat);
}

static void ignore_trace(const mlo_trace_event *ev, void *user) {
  (void)ev, (void)user;
}

/* D7: loads queue no host function behind their copy-side records unless
 * a trace is attached (with one, as before: its loads end at the stamp). */
static void test_stamps_only_when_traced(void **state) {
  (void)state;
  uint64_t (*host_fns)(void) = (uint64_t(*)(void))fake_fn("fakecuda_host_fns");
  mlo_set_log(NULL, NULL, MLO_LOG_WARN);
  mlo_platform *plat = NULL;
  tu_pipe *tp = two_dits(&plat);
  mlo_component *dit1 = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  uint64_t n0 = host_fns();
  assert_ok(tu_forward(tp, dit1));
  assert_ok(tu_forward(tp, dit2));
  assert_int_equal(host_fns(), n0);
  mlo_pipeline_set_trace(tp->pipe, ignore_trace, NULL);
  assert_ok(tu_forward(tp, dit1));
  assert_true(host_fns() > n0);
  mlo_pipeline_set_trace(tp->pipe, NULL, NULL);
  uint64_t n1 = host_fns();
  assert_ok(tu_forward(tp, dit2));
  assert_int_equal(host_fns(), n1);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* ---- D9: caller tensors sharing a page ---------------------------------- */

/* Two caller tensors on one page (the fake's registration is page-granular,
 * as the runtime's): both are page-locked, by one registration of their
 * pages, so nothing is left pageable and no load warns about it. */
static void test_shared_page_pinned(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("cuda:0");
  char *page = aligned_alloc(4096, 4096);
  assert_non_null(page);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *enc = NULL, *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &enc));
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  tu_add_tensor_at(tp, enc, "a", 1024, MLO_TENSOR_EXTERNAL, page);
  tu_add_tensor_at(tp, enc, "b", 1024, MLO_TENSOR_EXTERNAL, page + 2048);
  tu_add_tensor(tp, dit, "w", 4096, 0);
  tu_log_capture_begin();
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_int_equal(fake_registered_bytes(), 4096);
  assert_ok(tu_forward(tp, enc));
  assert_ok(tu_forward(tp, dit));
  bool pageable = tu_log_contains("pageable");
  tu_log_capture_end();
  assert_false(pageable);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  assert_int_equal(fake_registered_bytes(), 0);
  free(page);
  mlo_platform_close(plat);
}

/* ---- D4: capacity= in the pool's granules -------------------------------- */

/* The fake's pool maps 2 MiB granules and refuses past maxSize (=
 * capacity=) counted in them, as the runtime's does.  What the platform
 * says is free must be allocatable in one block: after a block of 2.5 MiB
 * under capacity=8M, that is 4 MiB, not the 5.5 MiB left in bytes (whose
 * 6 MiB of granules the pool refuses).  And an idle reserve the pool keeps
 * (two freed 4 MiB blocks, too small for 6 MiB; capped, the release
 * threshold is the cap, so a synchronize gives none of it back) must be
 * trimmed before the platform calls a block that fits the capacity out of
 * memory. */
static void test_capacity_counts_granules(void **state) {
  (void)state;
  const size_t mib = (size_t)1 << 20;
  mlo_platform *plat = tu_open_spec("cuda:0:capacity=8M");
  void *a = NULL, *b = NULL;
  assert_ok(mlo_plat_dev_alloc(plat, 5 * mib / 2, &a));
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(plat, &mem));
  assert_true(mem.free_bytes > 0);
  int rc = mlo_plat_dev_alloc(plat, (size_t)mem.free_bytes, &b);
  if (rc)
    fail_msg("%llu bytes were reported free under capacity=8M, but allocating them failed (%s)",
             (unsigned long long)mem.free_bytes, mlo_err_name(rc));
  assert_ok(mlo_plat_dev_free(plat, b, (size_t)mem.free_bytes));
  assert_ok(mlo_plat_dev_free(plat, a, 5 * mib / 2));
  assert_ok(mlo_platform_synchronize(plat));

  assert_ok(mlo_plat_dev_alloc(plat, 4 * mib, &a));
  assert_ok(mlo_plat_dev_alloc(plat, 4 * mib, &b));
  assert_ok(mlo_plat_dev_free(plat, a, 4 * mib));
  assert_ok(mlo_plat_dev_free(plat, b, 4 * mib));
  assert_ok(mlo_platform_synchronize(plat));
  rc = mlo_plat_dev_alloc(plat, 6 * mib, &a);
  if (rc)
    fail_msg("6 MiB under capacity=8M with nothing live failed (%s): the pool's idle reserve "
             "was not trimmed",
             mlo_err_name(rc));
  assert_ok(mlo_plat_dev_free(plat, a, 6 * mib));
  assert_ok(mlo_platform_synchronize(plat));
  assert_int_equal(fake_use_after_free(), 0);
  mlo_platform_close(plat);
}

/* D10: a compute block (a workload's scratch) is allocated on the compute
 * stream, not behind the copy queue as a dev_alloc block is, and counts
 * against capacity= like any other. */
static void test_compute_alloc_on_compute_stream(void **state) {
  (void)state;
  const size_t mib = (size_t)1 << 20;
  cudaStream_t (*last)(void) =
      (cudaStream_t(*)(void))dlsym(RTLD_DEFAULT, "fakecuda_last_pool_alloc_stream");
  assert_non_null(last);
  mlo_platform *plat = tu_open_spec("cuda:0:capacity=8M");
  cudaStream_t compute = mlo_platform_compute_queue(plat);
  void *a = NULL, *b = NULL;
  assert_ok(mlo_plat_dev_alloc(plat, mib, &a));
  assert_true(last() != compute); /* a load's block: on COPY */
  assert_ok(mlo_plat_dev_free(plat, a, mib));
  assert_ok(mlo_plat_dev_alloc_compute(plat, 6 * mib, &a));
  if (last() != compute) fail_msg("the compute block was not allocated on the compute stream");
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(plat, &mem));
  assert_true(mem.free_bytes <= 2 * mib);
  assert_int_equal(mlo_plat_dev_alloc(plat, 4 * mib, &b), MLO_ENOMEM_DEVICE);
  assert_int_equal(mlo_plat_dev_alloc_compute(plat, 4 * mib, &b), MLO_ENOMEM_DEVICE);
  assert_ok(mlo_plat_dev_free(plat, a, 6 * mib));
  assert_ok(mlo_platform_synchronize(plat));
  assert_ok(mlo_plat_dev_alloc_compute(plat, 6 * mib, &a));
  assert_ok(mlo_plat_dev_free(plat, a, 6 * mib));
  assert_ok(mlo_platform_synchronize(plat));
  assert_int_equal(fake_use_after_free(), 0);
  mlo_platform_close(plat);
}

int main(int argc, char **argv) {
  if (!dlsym(RTLD_DEFAULT, "fakecuda_contexts_created")) {
    fprintf(stderr, "the CUDA runtime loaded is not tests/fakecuda's\n");
    return 1;
  }
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "pageable")) {
    const struct CMUnitTest pageable[] = {cmocka_unit_test(test_pageable_slab_registered),
                                          cmocka_unit_test(test_host_oom_named_host)};
    return cmocka_run_group_tests(pageable, NULL, NULL);
  }
  if (!strcmp(mode, "free-fails")) {
    const struct CMUnitTest fails[] = {cmocka_unit_test(test_failed_free_keeps_bytes)};
    return cmocka_run_group_tests(fails, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_free_waits_for_own_use_only),
      cmocka_unit_test(test_free_never_before_queued_use),
      cmocka_unit_test(test_query_leaves_last_error),
      cmocka_unit_test(test_stamps_only_when_traced),
      cmocka_unit_test(test_caller_pinned_counts_as_pinned),
      cmocka_unit_test(test_unknown_and_ecc_are_sticky),
      cmocka_unit_test(test_capacity_counts_granules),
      cmocka_unit_test(test_compute_alloc_on_compute_stream),
      cmocka_unit_test(test_shared_page_pinned),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
