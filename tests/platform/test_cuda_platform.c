/*
 * test_cuda_platform.c — the CUDA platform against its vtable contract
 * (src/platform/platform.h) and the cuBLAS workload backend.
 *
 * Two registrations of one program:
 *   platform_cuda_spec  (label platform) — `spec`: spec parsing and the
 *       no-device message; needs no GPU, so it runs in CI.
 *   platform_cuda       (label gpu) — everything on a device; exits 77
 *       (skipped) when no CUDA device is visible.
 *   platform_cuda_fake  (label platform) — `fake`: the device tests on the
 *       fake runtime (tests/fakecuda), at smaller sizes and without the
 *       cuBLAS digests (the fake runs no kernels); fails unless the fake is
 *       the runtime loaded.
 *   platform_cuda_contexts (label platform) — `contexts`: on the fake with
 *       two devices, a thread that never chose a device drives cuda:1 and
 *       no context is ever created on device 0 (issue 25, item 3).
 *   platform_cuda_blas_fake (label platform) — `blasfake`: the cuBLAS
 *       workload on the fake runtime and tests/fakecublas: its digests, and
 *       no cudaFreeHost (a device-wide synchronize) between its create and
 *       its destroy, however its pinned buffers grow (review D5).
 *   platform_cuda_blas_legacy (label platform) — `blaslegacy`: the same,
 *       two fake devices, on cuda:1 with stream=0 (the legacy default
 *       stream): the GEMMs run on device 1's legacy stream whatever
 *       context the calling thread has current, and no context is made on
 *       device 0 (review D11).
 */
#include "testutil.h"

#include "platform/platform.h"
#include "workload/workload.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest buffers the device tests move: 1 GiB on a GPU, less on the
 * fake runtime, whose device memory is this machine's. */
static size_t big_bytes = (size_t)1 << 30;

/* ---- without a device --------------------------------------------------- */

/* The workload's cuda back-end, from its module as the tool loads it. */
static const struct mlo_workload_ops *backend(void) {
  static const struct mlo_workload_ops *ops;
  char err[1024] = "";
  if (!ops && mlo_workload_backend("cuda", &ops, err, sizeof err)) fail_msg("%s", err);
  return ops;
}

static void test_bad_specs(void **state) {
  (void)state;
  static const struct {
    const char *spec;
    const char *needle;
  } cases[] = {
      {"cuda:x", "device index"},
      {"cuda:-1", "device index"},
      {"cuda:0x1", "device index"},
      {"cuda:0:bogus=1", "bogus"},
      {"cuda:0:pinned=2", "pinned"},
      {"cuda:0:chunk=12", "chunk"},
      {"cuda:0:chunk=lots", "chunk"},
      {"cuda:0:pinned", "pinned"},
      {"cuda:0:capacity=lots", "capacity"},
      {"cuda:0:capacity=0", "capacity"},
      {"cuda:0:stream=-1", "stream"},
      {"cuda:0:stream=fast", "stream"},
      {"cuda:0:stream=", "stream"},
      /* the runtime's special handles: cudaStreamLegacy, cudaStreamPerThread */
      {"cuda:0:stream=1", "stream=1"},
      {"cuda:0:stream=2", "stream=2"},
      {"cuda:0:stream=0x2", "cudaStreamPerThread"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mlo_platform *p = (mlo_platform *)&p; /* must come back NULL */
    char err[256] = "";
    int rc = mlo_platform_open(cases[i].spec, &p, err, sizeof err);
    if (rc != MLO_EINVAL || !strstr(err, cases[i].needle))
      fail_msg("%s -> %s \"%s\", expected MLO_EINVAL mentioning %s", cases[i].spec,
               mlo_err_name(rc), err, cases[i].needle);
    assert_null(p);
  }
}

/* Valid specs either open or say clearly that no device is there. */
static void test_valid_specs(void **state) {
  (void)state;
  const char *specs[] = {"cuda",
                         "cuda:0",
                         "cuda:0:pinned=0,chunk=8M",
                         "cuda:pinned=1",
                         "cuda:0:capacity=24G", /* torch's default stream's handle */
                         "cuda:0:stream=0"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    mlo_platform *p = NULL;
    char err[256] = "";
    int rc = mlo_platform_open(specs[i], &p, err, sizeof err);
    if (rc == MLO_OK) {
      assert_string_equal(mlo_platform_name(p), "cuda");
      mlo_platform_close(p);
      continue;
    }
    if (rc != MLO_ENODEV || !strstr(err, "CUDA device"))
      fail_msg("%s -> %s \"%s\", expected MLO_OK or MLO_ENODEV naming the device", specs[i],
               mlo_err_name(rc), err);
    assert_null(p);
  }
  mlo_platform *p = NULL;
  char err[256] = "";
  int rc = mlo_platform_open("cuda:1000", &p, err, sizeof err);
  assert_int_equal(rc, MLO_ENODEV);
  assert_non_null(strstr(err, "CUDA device"));
}

/* ---- on a device -------------------------------------------------------- */

/* H2D in small chunks from a pinned slab, ordered into compute, back out
 * through the copy stream; the bytes must survive exactly. */
static void round_trip(mlo_platform *p, size_t n, bool want_pinned) {
  void *slab = NULL, *back = NULL, *block = NULL;
  bool pinned = false, back_pinned = false;
  assert_ok(mlo_plat_host_alloc(p, n, want_pinned, &slab, &pinned));
  assert_ok(mlo_plat_host_alloc(p, n, want_pinned, &back, &back_pinned));
  tu_fill_pattern(slab, n, 3);
  memset(back, 0, n);
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  mlo_event *loaded = NULL, *used = NULL;
  assert_ok(mlo_plat_event_create(p, &loaded));
  assert_ok(mlo_plat_event_create(p, &used));
  assert_ok(mlo_plat_copy_h2d(p, block, 0, slab, n / 3));
  assert_ok(mlo_plat_copy_h2d(p, block, n / 3, (char *)slab + n / 3, n - n / 3));
  assert_ok(mlo_plat_event_record_copy(p, loaded));
  assert_ok(mlo_plat_compute_wait(p, loaded));
  assert_ok(mlo_plat_event_record_compute(p, used));
  /* device-to-host copies have a queue of their own: it waits for the
   * compute that waited for the load, and the host for it */
  assert_true(mlo_plat_separate_readback(p));
  assert_ok(mlo_plat_readback_wait(p, used));
  assert_ok(mlo_plat_copy_d2h(p, back, block, 0, n));
  assert_ok(mlo_plat_event_record_readback(p, loaded));
  assert_ok(mlo_plat_event_sync(p, loaded));
  assert_ok(mlo_plat_event_query(p, loaded));
  assert_memory_equal(back, slab, n);
  mlo_plat_event_destroy(p, loaded);
  mlo_plat_event_destroy(p, used);
  mlo_plat_dev_free(p, block, n);
  assert_ok(mlo_plat_synchronize(p));
  mlo_plat_host_free(p, slab, n, pinned);
  mlo_plat_host_free(p, back, n, back_pinned);
}

static void test_round_trip(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0:chunk=1M");
  mlo_platform_caps caps;
  mlo_platform_get_caps(p, &caps);
  assert_true(caps.async_copy && caps.events && caps.device_pointers);
  assert_non_null(mlo_platform_compute_queue(p));
  round_trip(p, ((size_t)7 << 20) / 2, true);
  mlo_platform_close(p);
}

/* A freed block's memory is reused by the next allocation only after the
 * free: the second pattern must be what comes back. */
static void test_free_then_reuse(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0");
  const size_t n = (size_t)64 << 20;
  unsigned char *a = NULL, *b = NULL, *back = NULL;
  bool pa = false, pb = false, pback = false;
  assert_ok(mlo_plat_host_alloc(p, n, true, (void **)&a, &pa));
  assert_ok(mlo_plat_host_alloc(p, n, true, (void **)&b, &pb));
  assert_ok(mlo_plat_host_alloc(p, n, true, (void **)&back, &pback));
  tu_fill_pattern(a, n, 1);
  tu_fill_pattern(b, n, 2);
  mlo_event *in = NULL;
  assert_ok(mlo_plat_event_create(p, &in));
  for (int round = 0; round < 4; round++) {
    void *block = NULL;
    assert_ok(mlo_plat_dev_alloc(p, n, &block));
    assert_ok(mlo_plat_copy_h2d(p, block, 0, round % 2 ? b : a, n));
    assert_ok(mlo_plat_event_record_copy(p, in));
    assert_ok(mlo_plat_readback_wait(p, in)); /* the readback queue after the load */
    assert_ok(mlo_plat_copy_d2h(p, back, block, 0, n));
    mlo_plat_dev_free(p, block, n); /* before the copies are known complete */
    assert_ok(mlo_plat_synchronize(p));
    assert_memory_equal(back, round % 2 ? b : a, n);
  }
  mlo_plat_event_destroy(p, in);
  mlo_plat_host_free(p, a, n, pa);
  mlo_plat_host_free(p, b, n, pb);
  mlo_plat_host_free(p, back, n, pback);
  mlo_platform_close(p);
}

/* MLO_UNDER_SANITIZER=1 (scripts/gpu-check.sh under compute-sanitizer):
 * the deliberate allocation failure and the unordered negative control are
 * left out, so every report the sanitizer makes is a real defect. */
static bool under_sanitizer(void) {
  const char *v = getenv("MLO_UNDER_SANITIZER");
  return v && !strcmp(v, "1");
}

static void test_oom_maps_and_recovers(void **state) {
  (void)state;
  if (under_sanitizer()) skip(); /* the driver's refusal is an API error it reports */
  mlo_platform *p = tu_open_spec("cuda:0");
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_true(mem.total_bytes > 0 && mem.free_bytes <= mem.total_bytes);
  void *block = (void *)&block;
  /* The whole device: within the (default) capacity, so the driver itself
   * refuses it (the context holds some memory) and its error is mapped. */
  size_t too_big = (size_t)mem.total_bytes;
  assert_int_equal(mlo_plat_dev_alloc(p, too_big, &block), MLO_ENOMEM_DEVICE);
  assert_null(block);
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.used_bytes, 0);
  round_trip(p, (size_t)1 << 20, true); /* still usable */
  mlo_platform_close(p);
}

/* capacity= makes a big GPU stand in for a smaller one: allocations past
 * the cap fail as out-of-memory, and freeing makes room again. */
static void test_capacity_caps(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0:capacity=64M");
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.total_bytes, (uint64_t)64 << 20);
  void *a = NULL, *b = (void *)&b;
  assert_ok(mlo_plat_dev_alloc(p, (size_t)48 << 20, &a));
  assert_int_equal(mlo_plat_dev_alloc(p, (size_t)32 << 20, &b), MLO_ENOMEM_DEVICE);
  assert_null(b);
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_true(mem.free_bytes <= ((uint64_t)16 << 20));
  mlo_plat_dev_free(p, a, (size_t)48 << 20);
  assert_ok(mlo_plat_dev_alloc(p, (size_t)32 << 20, &b));
  mlo_plat_dev_free(p, b, (size_t)32 << 20);
  assert_ok(mlo_platform_synchronize(p));
  mlo_platform_close(p);
}

static void test_no_pinned(void **state) {
  (void)state;
  setenv("MLO_NO_PINNED", "yes", 1); /* any value but "" or "0", as the core reads it */
  mlo_platform *p = tu_open_spec("cuda:0");
  unsetenv("MLO_NO_PINNED");
  mlo_platform_caps caps;
  mlo_platform_get_caps(p, &caps);
  assert_false(caps.pinned_host);
  void *slab = NULL;
  bool pinned = true;
  assert_ok(mlo_plat_host_alloc(p, 1 << 20, true, &slab, &pinned));
  assert_false(pinned);
  mlo_plat_host_free(p, slab, 1 << 20, pinned);
  round_trip(p, (size_t)5 << 20, true); /* pageable copies still correct */
  mlo_platform_close(p);

  p = tu_open_spec("cuda:0:pinned=0");
  mlo_platform_get_caps(p, &caps);
  assert_false(caps.pinned_host);
  mlo_platform_close(p);
}

/* ---- review findings, each on the device -------------------------------- */

/* Index of the first byte of a device range that differs from the pattern
 * (n if none), read back after everything queued has finished. */
static size_t dev_pattern_mismatch(const void *dev, size_t n, uint32_t seed, unsigned char *host) {
  if (cudaDeviceSynchronize() != cudaSuccess) return 0;
  if (cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
  return tu_pattern_mismatch(host, n, seed);
}

static void *use_from_fresh_thread(void *arg) {
  mlo_platform *p = arg;
  void *block = NULL;
  intptr_t bad = mlo_plat_dev_alloc(p, 1 << 20, &block) != MLO_OK;
  if (!bad) {
    mlo_plat_dev_free(p, block, 1 << 20);
    bad = mlo_plat_synchronize(p) != MLO_OK;
  }
  return (void *)bad;
}

/* Finding 5: a thread that never selected a device works, and a caller's
 * current device is given back (with two devices: device 1 stays current
 * across calls on cuda:0). */
static void test_current_device_kept(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0");
  pthread_t t;
  void *bad = NULL;
  assert_int_equal(pthread_create(&t, NULL, use_from_fresh_thread, p), 0);
  pthread_join(t, &bad);
  assert_null(bad);
  int count = 0;
  assert_int_equal(cudaGetDeviceCount(&count), cudaSuccess);
  if (count > 1) {
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    void *block = NULL;
    assert_ok(mlo_plat_dev_alloc(p, 1 << 20, &block));
    mlo_plat_dev_free(p, block, 1 << 20);
    assert_ok(mlo_plat_synchronize(p));
    int cur = -1;
    assert_int_equal(cudaGetDevice(&cur), cudaSuccess);
    assert_int_equal(cur, 1);
    cudaSetDevice(0);
  } else {
    printf("one device: the restore of another current device is not observable here\n");
  }
  mlo_platform_close(p);
}

/* Copies a device range to another on the compute stream: "compute" that
 * reads a block, as a kernel would. */
static void compute_copy(mlo_platform *p, void *dst, const void *src, size_t n) {
  cudaStream_t s = mlo_platform_compute_queue(p);
  assert_int_equal(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s), cudaSuccess);
}

/* C8 on the device: a 1 GiB load, compute_wait, then compute reads it into
 * scratch: the scratch holds the load's bytes, every time.  The negative
 * control (no wait) is reported, not asserted: whether the race shows
 * depends on the copy engines' timing. */
static void test_load_ordering(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0");
  const size_t n = big_bytes;
  unsigned char *slab = NULL, *host = malloc(n);
  bool pinned = false;
  assert_non_null(host);
  assert_ok(mlo_plat_host_alloc(p, n, true, (void **)&slab, &pinned));
  void *block = NULL, *scratch = NULL;
  assert_ok(mlo_plat_dev_alloc(p, n, &scratch));
  mlo_event *loaded = NULL;
  assert_ok(mlo_plat_event_create(p, &loaded));
  unsigned caught = 0;
  for (int round = 0; round < 6; round++) {
    uint32_t seed = 100 + (uint32_t)round;
    tu_fill_pattern(slab, n, seed);
    assert_ok(mlo_platform_synchronize(p));
    assert_int_equal(cudaMemset(scratch, 0, n), cudaSuccess);
    /* the legacy stream's memset is not ordered before our non-blocking
     * compute stream's copy: the runtime promises nothing until it is done */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_ok(mlo_plat_dev_alloc(p, n, &block));
    assert_ok(mlo_plat_copy_h2d(p, block, 0, slab, n));
    assert_ok(mlo_plat_event_record_copy(p, loaded));
    bool wait = round % 2 == 0 || under_sanitizer(); /* the control races on purpose */
    if (wait) assert_ok(mlo_plat_compute_wait(p, loaded));
    compute_copy(p, scratch, block, n);
    if (wait) {
      assert_int_equal(dev_pattern_mismatch(scratch, n, seed, host), n);
    } else {
      caught += dev_pattern_mismatch(scratch, n, seed, host) < n;
    }
    mlo_plat_dev_free(p, block, n);
  }
  printf("C8 negative control: %u of 3 unordered reads saw unloaded bytes\n", caught);
  mlo_plat_event_destroy(p, loaded);
  mlo_plat_dev_free(p, scratch, n);
  assert_ok(mlo_platform_synchronize(p));
  mlo_plat_host_free(p, slab, n, pinned);
  free(host);
  mlo_platform_close(p);
}

/* C9 on the device: compute reads block A (several large copies, tens of
 * ms), A is freed, B allocated (the pool hands back A's memory) and loaded
 * with a second pattern: the scratch compute filled from A still holds the
 * first pattern. */
static void test_free_ordering(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0");
  const size_t n = big_bytes / 4;
  unsigned char *one = NULL, *two = NULL, *host = malloc(n);
  bool p1 = false, p2 = false;
  assert_non_null(host);
  assert_ok(mlo_plat_host_alloc(p, n, true, (void **)&one, &p1));
  assert_ok(mlo_plat_host_alloc(p, n, true, (void **)&two, &p2));
  tu_fill_pattern(one, n, 1);
  tu_fill_pattern(two, n, 2);
  void *a = NULL, *b = NULL, *scratch = NULL;
  assert_ok(mlo_plat_dev_alloc(p, n, &scratch));
  assert_ok(mlo_plat_dev_alloc(p, n, &a));
  assert_ok(mlo_plat_copy_h2d(p, a, 0, one, n));
  mlo_event *loaded = NULL;
  assert_ok(mlo_plat_event_create(p, &loaded));
  assert_ok(mlo_plat_event_record_copy(p, loaded));
  assert_ok(mlo_plat_compute_wait(p, loaded));
  for (int i = 0; i < 16; i++) compute_copy(p, scratch, a, n); /* long work reading A */
  mlo_plat_dev_free(p, a, n);
  assert_ok(mlo_plat_dev_alloc(p, n, &b));
  if (b != a) printf("the pool gave B other memory than A: the reuse is not exercised\n");
  assert_ok(mlo_plat_copy_h2d(p, b, 0, two, n));
  assert_int_equal(dev_pattern_mismatch(scratch, n, 1, host), n);
  mlo_plat_event_destroy(p, loaded);
  mlo_plat_dev_free(p, b, n);
  mlo_plat_dev_free(p, scratch, n);
  assert_ok(mlo_platform_synchronize(p));
  mlo_plat_host_free(p, one, n, p1);
  mlo_plat_host_free(p, two, n, p2);
  free(host);
  mlo_platform_close(p);
}

/* ---- review D8: a load from pageable memory behind a gate -------------- */

static atomic_int gate_open, gate_ended;

/* On the compute stream: holds it, as a long kernel would, until the gate
 * opens (at most 20 s, so a defect cannot hang the run). */
static void CUDART_CB gated_kernel(void *user) {
  (void)user;
  for (int i = 0; i < 20000 && !atomic_load(&gate_open); i++) tu_sleep_ms(1);
  atomic_store(&gate_ended, 1);
}

/* A load from pageable memory queued behind a gate (COPY waits for a
 * compute record behind a long kernel, as a joined switch's copies wait
 * for the blocks they overwrite) returns to the caller while the gate is
 * still shut, and lands intact once it opens.  The driver may synchronize
 * with the stream before staging a pageable source (the fake runtime
 * does): handed to it directly, the copy returns only once the kernel has
 * ended.  Through the platform's staging ring (chunk=1M: four 1 MiB
 * slots), each slot reused while earlier pieces are still queued.  On the
 * fake, a page-locked source also queues no host function (no staging). */
static void test_pageable_load_not_held_by_gate(void **state) {
  (void)state;
  uint64_t (*host_fns)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fakecuda_host_fns");
  mlo_platform *p = tu_open_spec("cuda:0:chunk=1M");
  const size_t n = big_bytes / 4 + 100;
  unsigned char *src = malloc(n), *back = malloc(n);
  assert_non_null(src);
  assert_non_null(back);
  tu_fill_pattern(src, n, 21);
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  mlo_event *gate = NULL, *ev = NULL;
  assert_ok(mlo_plat_event_create(p, &gate));
  assert_ok(mlo_plat_event_create(p, &ev));
  atomic_store(&gate_open, 0);
  atomic_store(&gate_ended, 0);
  assert_int_equal(cudaLaunchHostFunc(mlo_platform_compute_queue(p), gated_kernel, NULL),
                   cudaSuccess);
  assert_ok(mlo_plat_event_record_compute(p, gate));
  assert_ok(mlo_plat_copy_wait(p, gate));
  assert_ok(mlo_plat_copy_h2d(p, block, 0, src, n));
  bool held = atomic_load(&gate_ended);
  assert_ok(mlo_plat_event_record_copy(p, ev));
  bool in_flight = mlo_plat_event_query(p, ev) == MLO_EBUSY;
  atomic_store(&gate_open, 1);
  assert_ok(mlo_plat_event_sync(p, ev));
  if (held)
    fail_msg("a load from pageable memory behind a shut gate returned only once the gate's "
             "kernel had ended");
  assert_true(in_flight);
  size_t at = dev_pattern_mismatch(block, n, 21, back);
  if (at != n) fail_msg("byte %zu of the staged load is 0x%02x", at, back[at]);
  if (host_fns) {
    void *pinned = NULL;
    assert_int_equal(cudaHostAlloc(&pinned, n, cudaHostAllocPortable), cudaSuccess);
    memcpy(pinned, src, n);
    uint64_t before = host_fns();
    assert_ok(mlo_plat_copy_h2d(p, block, 0, pinned, n));
    assert_int_equal(host_fns(), before);
    assert_ok(mlo_plat_synchronize(p));
    assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
  }
  assert_ok(mlo_plat_dev_free(p, block, n));
  mlo_plat_event_destroy(p, ev);
  mlo_plat_event_destroy(p, gate);
  mlo_platform_close(p);
  free(src);
  free(back);
}

/* Findings 2 and the leak check: memory freed by evictions goes back to the
 * driver at a synchronize (uncapped pool, release threshold 0), and after
 * close the device is where it was. */
static void test_memory_given_back(void **state) {
  (void)state;
  if (under_sanitizer()) skip(); /* the sanitizer's own allocations move cudaMemGetInfo */
  size_t free0 = 0, total = 0;
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  assert_int_equal(cudaMemGetInfo(&free0, &total), cudaSuccess);
  mlo_platform *p = tu_open_spec("cuda:0");
  const size_t n = 2 * big_bytes;
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  size_t held = 0;
  assert_int_equal(cudaMemGetInfo(&held, &total), cudaSuccess);
  assert_true(held + n / 2 < free0); /* the allocation is visible */
  mlo_plat_dev_free(p, block, n);
  assert_ok(mlo_platform_synchronize(p));
  /* The pool gives back what it holds over its threshold "on the next call
   * to stream, event or context synchronize" (cudaMemPoolAttrReleaseThreshold):
   * the free is known complete now, so the next synchronize may release. */
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  size_t after = 0;
  assert_int_equal(cudaMemGetInfo(&after, &total), cudaSuccess);
  assert_true(after + ((size_t)256 << 20) >= free0); /* back to the driver */
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_true(mem.reserved_peak_bytes >= n);
  mlo_platform_close(p);
  assert_int_equal(cudaMemGetInfo(&after, &total), cudaSuccess);
  assert_true(after + ((size_t)64 << 20) >= free0);
}

static uint16_t bf16_round(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* W[o][k] = 1 where k == perm(o): each Y element is one X value (rounded
 * to bf16 for a bf16 W), exact whatever cuBLAS's summation order. */
static void gemm_case(mlo_platform *p, void *wctx, mlo_dtype dtype, bool exact) {
  enum { OUT = 48, IN = 32, TOKENS = 6, PAD = 256 };
  size_t esize = dtype == MLO_DTYPE_F32 ? 4 : 2;
  size_t wbytes = (size_t)OUT * IN * esize;
  unsigned char *w = calloc(1, wbytes);
  assert_non_null(w);
  for (int o = 0; o < OUT; o++) {
    size_t at = ((size_t)o * IN + (size_t)((o * 5) % IN)) * esize;
    float one = 1.0f;
    uint16_t bits = dtype == MLO_DTYPE_BF16 ? 0x3f80 : 0x3c00;
    memcpy(w + at, esize == 4 ? (void *)&one : (void *)&bits, esize);
  }
  uint64_t seed = 77;
  float y[TOKENS * OUT];
  for (int t = 0; t < TOKENS; t++)
    for (int o = 0; o < OUT; o++) {
      float x = mlo_workload_input(seed, t, (o * 5) % IN);
      if (dtype == MLO_DTYPE_BF16) {
        uint32_t bits = (uint32_t)bf16_round(x) << 16;
        memcpy(&x, &bits, 4);
      }
      y[t * OUT + o] = x;
    }
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(p, 2 * PAD + 2 * wbytes, &block));
  assert_ok(mlo_plat_copy_h2d(p, block, PAD, w, wbytes));
  assert_ok(mlo_plat_copy_h2d(p, block, 2 * PAD + wbytes, w, wbytes));
  assert_ok(mlo_plat_synchronize(p));
  uint64_t first = 5, second = 5;
  assert_ok(backend()->gemm_digest(wctx, block, PAD, dtype, OUT, IN, TOKENS, seed, &first));
  assert_ok(
      backend()->gemm_digest(wctx, block, 2 * PAD + wbytes, dtype, OUT, IN, TOKENS, seed, &second));
  assert_int_equal(first, 5); /* deferred: nothing folded before the flush */
  assert_ok(backend()->flush(wctx));
  assert_int_equal(first, second); /* same bytes elsewhere: same digest */
  if (exact) assert_int_equal(first, mlo_digest_fold(5, y, sizeof y));
  uint64_t raw = 3;
  assert_ok(backend()->bytes_digest(wctx, block, PAD, wbytes, &raw));
  assert_ok(backend()->flush(wctx));
  assert_int_equal(raw, mlo_digest_fold(3, w, wbytes));
  mlo_plat_dev_free(p, block, 2 * PAD + 2 * wbytes);
  free(w);
}

static void test_workload_gemm(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("cuda:0");
  void *wctx = NULL;
  assert_ok(backend()->create(p, &wctx));
  gemm_case(p, wctx, MLO_DTYPE_F32, true);
  gemm_case(p, wctx, MLO_DTYPE_BF16, true);
  gemm_case(p, wctx, MLO_DTYPE_F16, false);
  uint64_t d = 0;
  assert_int_equal(backend()->gemm_digest(wctx, NULL, 0, MLO_DTYPE_I8, 2, 2, 1, 0, &d),
                   MLO_EUNSUPPORTED);
  backend()->destroy(wctx);
  mlo_platform_close(p);
}

/* cudaFreeHost synchronizes the whole device (the fake does too, and
 * counts the calls): the workload's pinned buffers, grown as results and
 * raw digests grow, are freed at destroy and never mid-run (review D5).
 * On the fake runtime and cuBLAS only (blasfake). */
static void *fake_symbol(const char *name);

static void test_workload_frees_pinned_only_at_destroy(void **state) {
  (void)state;
  uint64_t (*frees)(void) = (uint64_t(*)(void))fake_symbol("fakecuda_free_host_calls");
  if (!frees) skip();
  mlo_platform *p = tu_open_spec("cuda:0");
  void *wctx = NULL;
  assert_ok(backend()->create(p, &wctx));
  uint64_t before = frees();
  enum { MAX = 1 << 20 };
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(p, MAX, &block));
  gemm_case(p, wctx, MLO_DTYPE_F32, true);
  uint64_t d[12] = {0};
  for (int i = 0; i < 12; i++) /* every ring slot's buffer grows, several times */
    assert_ok(backend()->bytes_digest(wctx, block, 0, (size_t)256 << i, &d[i]));
  assert_ok(backend()->flush(wctx));
  gemm_case(p, wctx, MLO_DTYPE_BF16, true);
  if (frees() != before)
    fail_msg("%llu cudaFreeHost calls (each a device-wide synchronize) between create and destroy",
             (unsigned long long)(frees() - before));
  assert_ok(mlo_plat_dev_free(p, block, MAX));
  backend()->destroy(wctx);
  assert_true(frees() > before); /* what grew is freed at destroy */
  mlo_platform_close(p);
}

/* D11: on a stream=0 platform the compute stream is the legacy default
 * stream, which names no context: the runtime resolves it in the calling
 * thread's current context.  The workload resolves it to the platform's
 * context, so its GEMMs go where the platform orders compute (device 1's
 * legacy stream here) from a thread with no context (which is left with
 * none, and device 0 never gets one) and from a thread whose current
 * context is device 0's (left current).  Before, the workload refused a
 * stream=0 platform (EINVAL); resolving 0 with cuStreamGetCtx would have
 * answered the caller's context instead.  On the fakes only (blaslegacy:
 * two devices, nothing done on device 0 before). */
static void test_workload_on_legacy_stream(void **state) {
  (void)state;
  unsigned (*created)(void) = (unsigned (*)(void))fake_symbol("fakecuda_contexts_created");
  int (*current)(void) = (int (*)(void))fake_symbol("fakecuda_current_context");
  backend(); /* loads the workload module, and with it the (fake) cuBLAS, locally */
  char soname[32];
  snprintf(soname, sizeof soname, "libcublas.so.%d", CUDART_VERSION / 1000);
  void *cublas = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  int (*gemm_device)(void) =
      cublas ? (int (*)(void))dlsym(cublas, "fakecublas_last_gemm_device") : NULL;
  assert_non_null(created);
  assert_non_null(current);
  if (!gemm_device) fail_msg("the cuBLAS loaded is not tests/fakecublas's");
  assert_int_equal(created(), 0);
  mlo_platform *p = tu_open_spec("cuda:1:stream=0");
  assert_null(mlo_platform_compute_queue(p));
  void *wctx = NULL;
  int rc = backend()->create(p, &wctx);
  if (rc) fail_msg("the workload refused a stream=0 platform: %s", mlo_err_name(rc));
  gemm_case(p, wctx, MLO_DTYPE_F32, true);
  assert_int_equal(gemm_device(), 1);
  assert_int_equal(current(), -1);
  assert_int_equal(created(), 1u << 1);

  assert_int_equal(cudaSetDevice(0), cudaSuccess); /* a caller on device 0 */
  gemm_case(p, wctx, MLO_DTYPE_BF16, true);
  if (gemm_device() != 1)
    fail_msg("with device 0 current, the GEMM went to device %d's legacy stream", gemm_device());
  assert_int_equal(current(), 0);
  backend()->destroy(wctx);
  mlo_platform_close(p);
  dlclose(cublas);
}

/* ---- contexts, on the fake runtime (issue 25, item 3) ------------------- */

/* The fake runtime's record of contexts (tests/fakecuda): NULL when the
 * runtime loaded is not the fake. */
static void *fake_symbol(const char *name) {
  return dlsym(RTLD_DEFAULT, name);
}

struct drive {
  bool choose_device0; /* the thread selects device 0 itself first */
  const char *failed;  /* the first step that failed, NULL if none */
  int current_after;   /* its current context's device afterwards, -1: none */
};

#define DRIVE_STEP(d, expr)                                                                        \
  do {                                                                                             \
    if (!(d)->failed && (expr) != MLO_OK) (d)->failed = #expr;                                     \
  } while (0)

/* Everything a load, a forward and an eviction ask of cuda:1, and the
 * workload backend's create (which fails on the fake, having no cuBLAS:
 * its failure path runs), from a thread of its own. */
static void *drive_cuda1(void *arg) {
  struct drive *d = arg;
  int (*current)(void) = (int (*)(void))fake_symbol("fakecuda_current_context");
  if (d->choose_device0 && cudaSetDevice(0) != cudaSuccess) d->failed = "cudaSetDevice(0)";
  mlo_platform *p = NULL;
  char err[256] = "";
  DRIVE_STEP(d, mlo_platform_open("cuda:1", &p, err, sizeof err));
  if (d->failed) return NULL;
  const size_t n = (size_t)1 << 20;
  void *slab = NULL, *back = NULL, *block = NULL;
  bool pinned = false, back_pinned = false;
  mlo_event *loaded = NULL, *used = NULL;
  DRIVE_STEP(d, mlo_plat_host_alloc(p, n, true, &slab, &pinned));
  DRIVE_STEP(d, mlo_plat_host_alloc(p, n, true, &back, &back_pinned));
  if (!d->failed) tu_fill_pattern(slab, n, 9);
  DRIVE_STEP(d, mlo_plat_event_create(p, &loaded));
  DRIVE_STEP(d, mlo_plat_event_create(p, &used));
  DRIVE_STEP(d, mlo_plat_dev_alloc(p, n, &block));
  DRIVE_STEP(d, mlo_plat_copy_h2d(p, block, 0, slab, n));
  DRIVE_STEP(d, mlo_plat_event_record_copy(p, loaded));
  DRIVE_STEP(d, mlo_plat_compute_wait(p, loaded));
  DRIVE_STEP(d, mlo_plat_event_record_compute(p, used));
  DRIVE_STEP(d, mlo_plat_readback_wait(p, used));
  DRIVE_STEP(d, mlo_plat_copy_d2h(p, back, block, 0, n));
  DRIVE_STEP(d, mlo_plat_event_record_readback(p, used));
  DRIVE_STEP(d, mlo_plat_event_sync(p, used));
  DRIVE_STEP(d, mlo_plat_event_query(p, loaded));
  mlo_platform_memory mem;
  DRIVE_STEP(d, mlo_platform_get_memory(p, &mem));
  if (!d->failed && tu_pattern_mismatch(back, n, 9) != n) d->failed = "the round trip's bytes";
  mlo_plat_dev_free(p, block, n);
  DRIVE_STEP(d, mlo_plat_synchronize(p));
  const struct mlo_workload_ops *ops = NULL;
  void *wctx = NULL;
  if (!d->failed && mlo_workload_backend("cuda", &ops, err, sizeof err) == MLO_OK &&
      ops->create(p, &wctx) == MLO_OK)
    ops->destroy(wctx);
  mlo_plat_event_destroy(p, loaded);
  mlo_plat_event_destroy(p, used);
  mlo_plat_host_free(p, slab, n, pinned);
  mlo_plat_host_free(p, back, n, back_pinned);
  mlo_platform_close(p);
  d->current_after = current();
  return NULL;
}

/* A thread that never chose a device uses cuda:1 only: no context on
 * device 0, ever, and the thread is left with no current context.  Then a
 * thread that chose device 0 gets device 0's context back. */
static void test_no_context_on_device0(void **state) {
  (void)state;
  unsigned (*created)(void) = (unsigned (*)(void))fake_symbol("fakecuda_contexts_created");
  assert_non_null(created);
  int count = 0;
  assert_int_equal(cudaGetDeviceCount(&count), cudaSuccess);
  assert_int_equal(count, 2); /* MLO_FAKECUDA_DEVICES=2 */
  assert_int_equal(created(), 0);
  struct drive fresh = {.current_after = -2};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, drive_cuda1, &fresh), 0);
  pthread_join(t, NULL);
  if (fresh.failed) fail_msg("driving cuda:1 failed at %s", fresh.failed);
  assert_int_equal(created(), 1u << 1); /* device 1's context only */
  assert_int_equal(fresh.current_after, -1);

  struct drive chose = {.choose_device0 = true, .current_after = -2};
  assert_int_equal(pthread_create(&t, NULL, drive_cuda1, &chose), 0);
  pthread_join(t, NULL);
  if (chose.failed) fail_msg("driving cuda:1 after choosing device 0 failed at %s", chose.failed);
  assert_int_equal(chose.current_after, 0);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "spec")) {
    const struct CMUnitTest spec_tests[] = {
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_valid_specs),
    };
    return cmocka_run_group_tests(spec_tests, NULL, NULL);
  }
  if (argc > 1 && !strcmp(argv[1], "contexts")) {
    const struct CMUnitTest context_tests[] = {cmocka_unit_test(test_no_context_on_device0)};
    return cmocka_run_group_tests(context_tests, NULL, NULL);
  }
  if (argc > 1 && !strcmp(argv[1], "blaslegacy")) {
    if (!fake_symbol("fakecuda_contexts_created")) {
      fprintf(stderr, "`blaslegacy` asked for, but the CUDA runtime loaded is not the fake\n");
      return 1;
    }
    const struct CMUnitTest legacy_tests[] = {cmocka_unit_test(test_workload_on_legacy_stream)};
    return cmocka_run_group_tests(legacy_tests, NULL, NULL);
  }
  if (argc > 1 && !strcmp(argv[1], "blasfake")) { /* the workload on fakecuda and fakecublas */
    if (!fake_symbol("fakecuda_free_host_calls")) {
      fprintf(stderr, "`blasfake` asked for, but the CUDA runtime loaded is not the fake\n");
      return 1;
    }
    const struct CMUnitTest blas_tests[] = {
        cmocka_unit_test(test_workload_gemm),
        cmocka_unit_test(test_workload_frees_pinned_only_at_destroy),
    };
    return cmocka_run_group_tests(blas_tests, NULL, NULL);
  }
  bool fake = argc > 1 && !strcmp(argv[1], "fake");
  if (fake && !fake_symbol("fakecuda_contexts_created")) {
    fprintf(stderr, "`fake` asked for, but the CUDA runtime loaded is not tests/fakecuda's\n");
    return 1;
  }
  if (fake) big_bytes = (size_t)64 << 20;
  mlo_platform *probe = NULL;
  char err[256] = "";
  int rc = mlo_platform_open("cuda", &probe, err, sizeof err);
  if (rc == MLO_ENODEV) {
    fprintf(stderr, "skipped: %s\n", err);
    return 77;
  }
  mlo_platform_close(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_free_then_reuse),
      cmocka_unit_test(test_oom_maps_and_recovers),
      cmocka_unit_test(test_capacity_caps),
      cmocka_unit_test(test_no_pinned),
      cmocka_unit_test(test_workload_gemm),
      cmocka_unit_test(test_current_device_kept),
      cmocka_unit_test(test_load_ordering),
      cmocka_unit_test(test_free_ordering),
      cmocka_unit_test(test_pageable_load_not_held_by_gate),
      cmocka_unit_test(test_memory_given_back),
  };
  if (fake) { /* no kernels on the fake: everything but the cuBLAS digests */
    const struct CMUnitTest fake_tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_free_then_reuse),
        cmocka_unit_test(test_oom_maps_and_recovers),
        cmocka_unit_test(test_capacity_caps),
        cmocka_unit_test(test_no_pinned),
        cmocka_unit_test(test_current_device_kept),
        cmocka_unit_test(test_load_ordering),
        cmocka_unit_test(test_free_ordering),
        cmocka_unit_test(test_pageable_load_not_held_by_gate),
        cmocka_unit_test(test_memory_given_back),
    };
    return cmocka_run_group_tests(fake_tests, NULL, NULL);
  }
  return cmocka_run_group_tests(tests, NULL, NULL);
}
