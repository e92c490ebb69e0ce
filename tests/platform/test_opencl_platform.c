/*
 * test_opencl_platform.c — the OpenCL platform against its vtable contract
 * (src/platform/platform.h) and its spec options, plus the OpenCL workload
 * backend's arithmetic.  Runs on PoCL in CI; exits 77 (skipped) only when
 * no OpenCL device is visible at all.
 */
#include "testutil.h"

#include "platform/platform.h"
#include "workload/workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The workload's opencl back-end, from its module as the tool loads it. */
static const struct mlo_workload_ops *backend(void) {
  static const struct mlo_workload_ops *ops;
  char err[1024] = "";
  if (!ops && mlo_workload_backend("opencl", &ops, err, sizeof err)) fail_msg("%s", err);
  return ops;
}

static void test_bad_specs(void **state) {
  (void)state;
  static const struct {
    const char *spec;
    int code;
    const char *needle;
  } cases[] = {
      {"opencl:x", MLO_EINVAL, "device index"},
      {"opencl:-1", MLO_EINVAL, "device index"},
      {"opencl:0:bogus=1", MLO_EINVAL, "bogus"},
      {"opencl:0:capacity=abc", MLO_EINVAL, "capacity=abc"},
      {"opencl:0:capacity=0", MLO_EINVAL, "capacity"},
      {"opencl:0:blocking_d2h=2", MLO_EINVAL, "blocking_d2h"},
      {"opencl:0:pinned=yes", MLO_EINVAL, "pinned"},
      {"opencl:0:pinned", MLO_EINVAL, "pinned"},
      {"opencl:0:max_alloc=1K", MLO_EINVAL, "max_alloc"},
      {"opencl:0:max_alloc=lots", MLO_EINVAL, "max_alloc"},
      {"opencl:999", MLO_ENODEV, "not present"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mlo_platform *p = (mlo_platform *)&p; /* must come back NULL */
    char err[256] = "";
    int rc = mlo_platform_open(cases[i].spec, &p, err, sizeof err);
    if (rc != cases[i].code || !strstr(err, cases[i].needle))
      fail_msg("%s -> %s \"%s\", expected %s mentioning %s", cases[i].spec, mlo_err_name(rc), err,
               mlo_err_name(cases[i].code), cases[i].needle);
    assert_null(p);
  }
}

static void test_spec_forms(void **state) {
  (void)state;
  const char *specs[] = {"opencl", "opencl:0", "opencl:0:", "opencl:capacity=64M",
                         "opencl:0:capacity=64M,pinned=0,blocking_d2h=0"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    mlo_platform *p = tu_open_spec(specs[i]);
    assert_string_equal(mlo_platform_name(p), "opencl");
    assert_non_null(mlo_platform_compute_queue(p));
    mlo_platform_caps caps;
    mlo_platform_get_caps(p, &caps);
    assert_true(caps.events && caps.async_copy);
    assert_false(caps.device_pointers);
    mlo_platform_close(p);
  }
}

/* H2D in two pieces from a pinned slab, ordered into the compute queue and
 * back out through the copy queue; the bytes must survive exactly. */
static void test_round_trip(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("opencl:0");
  const size_t n = (size_t)3 << 20;
  void *slab = NULL, *back = NULL, *block = NULL;
  bool pinned = false, back_pinned = true;
  assert_ok(mlo_plat_host_alloc(p, n, true, &slab, &pinned));
  assert_true(pinned); /* PoCL maps ALLOC_HOST_PTR buffers */
  assert_ok(mlo_plat_host_alloc(p, n, false, &back, &back_pinned));
  assert_false(back_pinned);
  tu_fill_pattern(slab, n, 1);
  memset(back, 0, n);
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.used_bytes, n);
  assert_int_equal(mem.free_bytes, mem.total_bytes - n);

  mlo_event *loaded = NULL, *used = NULL;
  assert_ok(mlo_plat_event_create(p, &loaded));
  assert_ok(mlo_plat_event_create(p, &used));
  assert_ok(mlo_plat_event_query(p, loaded)); /* never recorded: complete */
  assert_ok(mlo_plat_copy_h2d(p, block, 0, slab, n / 2));
  assert_ok(mlo_plat_copy_h2d(p, block, n / 2, (char *)slab + n / 2, n - n / 2));
  assert_ok(mlo_plat_event_record_copy(p, loaded));
  assert_ok(mlo_plat_compute_wait(p, loaded));
  assert_ok(mlo_plat_event_record_compute(p, used));
  assert_ok(mlo_plat_copy_wait(p, used));
  assert_ok(mlo_plat_copy_d2h(p, back, block, 4096, n - 4096));
  assert_ok(mlo_plat_event_record_copy(p, loaded));
  assert_ok(mlo_plat_event_sync(p, loaded));
  assert_ok(mlo_plat_event_query(p, loaded));
  assert_memory_equal(back, (char *)slab + 4096, n - 4096);
  /* the completion stamp comes from the runtime's callback, which may run
   * just after event_sync returns: wait for it, then it lies in the past */
  uint64_t done = 0, t_sync = mlo_now_ns();
  int trc = MLO_EBUSY;
  for (int i = 0; i < 2000 && trc == MLO_EBUSY; i++) {
    trc = mlo_plat_event_time(p, loaded, &done);
    if (trc == MLO_EBUSY) tu_sleep_ms(1);
  }
  assert_ok(trc);
  assert_true(done > 0 && done <= mlo_now_ns());
  assert_true(done <= t_sync + 2000000000ull);
  assert_status(mlo_plat_event_time(p, used, &done), MLO_EUNSUPPORTED); /* compute side */

  mlo_plat_event_destroy(p, loaded);
  mlo_plat_event_destroy(p, used);
  mlo_plat_dev_free(p, block, n);
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.used_bytes, 0);
  assert_int_equal(mem.peak_bytes, n);
  mlo_plat_host_free(p, slab, n, pinned);
  mlo_plat_host_free(p, back, n, back_pinned);
  mlo_platform_close(p);
}

/* A block released while its copy is still queued: the runtime defers the
 * deletion, so nothing crashes and the queue drains cleanly. */
static void test_free_while_pending(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("opencl:0");
  const size_t n = (size_t)32 << 20;
  void *slab = NULL, *block = NULL;
  bool pinned = false;
  assert_ok(mlo_plat_host_alloc(p, n, true, &slab, &pinned));
  memset(slab, 0x5a, n);
  for (int round = 0; round < 3; round++) {
    assert_ok(mlo_plat_dev_alloc(p, n, &block));
    assert_ok(mlo_plat_copy_h2d(p, block, 0, slab, n));
    mlo_plat_dev_free(p, block, n);
  }
  assert_ok(mlo_plat_synchronize(p));
  mlo_plat_host_free(p, slab, n, pinned);
  mlo_platform_close(p);
}

static void test_capacity_oom(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("opencl:0:capacity=1M");
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.total_bytes, 1 << 20);
  assert_int_equal(mem.free_bytes, 1 << 20);
  void *a = NULL, *b = (void *)&a;
  assert_ok(mlo_plat_dev_alloc(p, 768 << 10, &a));
  assert_int_equal(mlo_plat_dev_alloc(p, 512 << 10, &b), MLO_ENOMEM_DEVICE);
  assert_null(b);
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.used_bytes, 768 << 10);
  assert_int_equal(mem.free_bytes, 256 << 10);
  mlo_plat_dev_free(p, a, 768 << 10);
  assert_ok(mlo_plat_dev_alloc(p, 512 << 10, &b)); /* usable after the refusal */
  mlo_plat_dev_free(p, b, 512 << 10);
  assert_int_equal(mlo_plat_dev_alloc(p, (2 << 20), &b), MLO_ENOMEM_DEVICE);
  mlo_platform_close(p);
}

/* A block larger than the largest allocation is built from segments
 * (max_alloc= lowers the limit so a test can see it): a copy that spans
 * segment boundaries lands whole, each tensor-sized piece resolves to its
 * own cl_mem, and the caps say so.  More than the device has is still out
 * of memory, with nothing left held. */
static void test_beyond_max_alloc(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("opencl:0:max_alloc=64K");
  mlo_platform_caps caps;
  mlo_platform_get_caps(p, &caps);
  assert_int_equal(caps.max_block_bytes, 64 << 10);
  const size_t n = (200 << 10) + 123; /* four segments, the last short */
  unsigned char *src = malloc(n), *back = malloc(n);
  assert_non_null(src);
  assert_non_null(back);
  tu_fill_pattern(src, n, 9);
  memset(back, 0, n);
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  assert_ok(mlo_plat_copy_h2d(p, block, 0, src, 100 << 10)); /* ends inside segment 1 */
  assert_ok(mlo_plat_copy_h2d(p, block, 100 << 10, src + (100 << 10), n - (100 << 10)));
  assert_ok(mlo_plat_copy_d2h(p, back, block, 0, n));
  assert_ok(mlo_plat_synchronize(p));
  assert_memory_equal(back, src, n);
  void *h0 = NULL, *h1 = NULL, *h3 = NULL;
  size_t o0 = 1, o1 = 1, o3 = 1;
  mlo_plat_resolve(p, block, 100, &h0, &o0);
  mlo_plat_resolve(p, block, (64 << 10) + 5, &h1, &o1);
  mlo_plat_resolve(p, block, (192 << 10) + 7, &h3, &o3);
  assert_int_equal(o0, 100);
  assert_int_equal(o1, 5);
  assert_int_equal(o3, 7);
  assert_true(h0 != h1 && h1 != h3 && h0 != block);
  memset(back, 0, n); /* a segment read through its own cl_mem */
  assert_ok(mlo_plat_copy_d2h(p, back, h1, o1, 1000));
  assert_ok(mlo_plat_synchronize(p));
  assert_memory_equal(back, src + (64 << 10) + 5, 1000);
  assert_status(mlo_plat_copy_h2d(p, block, n - 10, src, 11), MLO_EINVAL); /* past its end */
  mlo_plat_dev_free(p, block, n);
  void *b = (void *)&b;
  assert_int_equal(mlo_plat_dev_alloc(p, SIZE_MAX / 2, &b), MLO_ENOMEM_DEVICE);
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(p, &mem));
  assert_int_equal(mem.used_bytes, 0);
  mlo_platform_close(p);
  free(src);
  free(back);
}

static void test_blocking_d2h(void **state) {
  (void)state;
  mlo_platform_caps caps;
  mlo_platform *p = tu_open_spec("opencl:0:blocking_d2h=0");
  mlo_platform_get_caps(p, &caps);
  assert_false(caps.blocking_d2h);
  mlo_platform_close(p);

  p = tu_open_spec("opencl:0:blocking_d2h=1");
  mlo_platform_get_caps(p, &caps);
  assert_true(caps.blocking_d2h);
  assert_non_null(strstr(mlo_platform_description(p), "blocking d2h"));
  const size_t n = 1 << 20;
  unsigned char *src = malloc(n), *dst = malloc(n);
  void *block = NULL;
  assert_non_null(src);
  assert_non_null(dst);
  tu_fill_pattern(src, n, 9);
  memset(dst, 0, n);
  assert_ok(mlo_plat_dev_alloc(p, n, &block));
  assert_ok(mlo_plat_copy_h2d(p, block, 0, src, n));
  /* No event wait: with the rule the read has landed when it returns. */
  assert_ok(mlo_plat_copy_d2h(p, dst, block, 0, n));
  assert_memory_equal(dst, src, n);
  mlo_plat_dev_free(p, block, n);
  mlo_platform_close(p);
  free(src);
  free(dst);
}

static void expect_pageable(const char *spec) {
  mlo_platform *p = tu_open_spec(spec);
  mlo_platform_caps caps;
  mlo_platform_get_caps(p, &caps);
  assert_false(caps.pinned_host);
  void *slab = NULL;
  bool pinned = true;
  assert_ok(mlo_plat_host_alloc(p, 1 << 20, true, &slab, &pinned));
  assert_false(pinned);
  memset(slab, 1, 1 << 20); /* really usable host memory */
  mlo_plat_host_free(p, slab, 1 << 20, pinned);
  mlo_platform_close(p);
}

static void test_pinned_off(void **state) {
  (void)state;
  expect_pageable("opencl:0:pinned=0");
  setenv("MLO_NO_PINNED", "1", 1);
  expect_pageable("opencl:0");
  expect_pageable("opencl:0:pinned=1"); /* the environment is a kill switch */
  setenv("MLO_NO_PINNED", "yes", 1);    /* one reading everywhere: not only "1" */
  expect_pageable("opencl:0");
  unsetenv("MLO_NO_PINNED");
}

/* W[o][k] = 1 where k == perm(o), else 0: every Y element is exactly one X
 * value whatever the summation order, so the digest is known in advance and
 * checks the layout (X * W^T, row-major Y) bit for bit. */
static uint16_t one_bits(mlo_dtype d) {
  return d == MLO_DTYPE_BF16 ? 0x3f80 : 0x3c00;
}

static void gemm_case(mlo_platform *p, void *wctx, mlo_dtype dtype) {
  enum { OUT = 40, IN = 24, TOKENS = 5, PAD = 256 };
  size_t esize = dtype == MLO_DTYPE_F32 ? 4 : 2;
  size_t wbytes = (size_t)OUT * IN * esize;
  unsigned char *w = calloc(1, wbytes);
  assert_non_null(w);
  for (int o = 0; o < OUT; o++) {
    size_t at = ((size_t)o * IN + (size_t)((o * 7) % IN)) * esize;
    if (dtype == MLO_DTYPE_F32) {
      float one = 1.0f;
      memcpy(w + at, &one, 4);
    } else {
      uint16_t bits = one_bits(dtype);
      memcpy(w + at, &bits, 2);
    }
  }
  uint64_t seed = 1234;
  float y[TOKENS * OUT];
  for (int t = 0; t < TOKENS; t++)
    for (int o = 0; o < OUT; o++) y[t * OUT + o] = mlo_workload_input(seed, t, (o * 7) % IN);
  uint64_t expect = mlo_digest_fold(99, y, sizeof y); /* one fold over Y, as the backend does */
  void *block = NULL;
  assert_ok(mlo_plat_dev_alloc(p, PAD + wbytes, &block));
  assert_ok(mlo_plat_copy_h2d(p, block, PAD, w, wbytes));
  assert_ok(mlo_plat_synchronize(p));
  uint64_t got = 99;
  assert_ok(backend()->gemm_digest(wctx, block, PAD, dtype, OUT, IN, TOKENS, seed, &got));
  if (got != expect)
    fail_msg("%s gemm digest %llx, expected %llx", mlo_dtype_name(dtype), (unsigned long long)got,
             (unsigned long long)expect);
  uint64_t raw = 7, raw_expect = mlo_digest_fold(7, w, wbytes);
  assert_ok(backend()->bytes_digest(wctx, block, PAD, wbytes, &raw));
  assert_int_equal(raw, raw_expect);
  mlo_plat_dev_free(p, block, PAD + wbytes);
  free(w);
}

static void test_workload_gemm(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("opencl:0");
  void *wctx = NULL;
  assert_ok(backend()->create(p, &wctx));
  gemm_case(p, wctx, MLO_DTYPE_F32);
  gemm_case(p, wctx, MLO_DTYPE_BF16);
  gemm_case(p, wctx, MLO_DTYPE_F16);
  uint64_t d = 0;
  assert_int_equal(backend()->gemm_digest(wctx, NULL, 0, MLO_DTYPE_I8, 2, 2, 1, 0, &d),
                   MLO_EUNSUPPORTED);
  backend()->destroy(wctx);
  mlo_platform_close(p);
}

int main(void) {
  mlo_platform *probe = NULL;
  char err[256] = "";
  int rc = mlo_platform_open("opencl", &probe, err, sizeof err);
  if (rc == MLO_ENODEV) {
    fprintf(stderr, "skipped: %s\n", err);
    return 77;
  }
  mlo_platform_close(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_specs),     cmocka_unit_test(test_spec_forms),
      cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_free_while_pending),
      cmocka_unit_test(test_capacity_oom),  cmocka_unit_test(test_beyond_max_alloc),
      cmocka_unit_test(test_blocking_d2h),  cmocka_unit_test(test_pinned_off),
      cmocka_unit_test(test_workload_gemm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
