/*
 * test_workload.c — the reference workload behind `mlo run` (src/workload):
 * the host backend widens bf16/f16 exactly and handles unaligned f32, the
 * input is deterministic, a forward's digest covers every tensor and
 * depends on the step, the schedule follows the documented rule, the
 * memory figures follow the roles, and an offloaded run on a jittery host
 * device gives the all-resident digest bit for bit.
 */
#include "testutil.h"
#include "workload/workload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Values exact in f32, f16 and bf16 alike (2^-20 is an f16 subnormal). */
static const float exact[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 0x1p-20f, 0x1p-14f, 49152.0f};
#define NEXACT (sizeof exact / sizeof exact[0])

static uint16_t to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16);
}

/* f32 -> f16 for the exact values above only (normal, subnormal, zero). */
static uint16_t to_f16(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  float a = fabsf(f);
  if (a == 0.0f) return sign;
  int e;
  float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  if (e - 1 < -14) return (uint16_t)(sign | (uint16_t)ldexpf(a, 24)); /* subnormal */
  return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}

static uint64_t gemm(void *ctx, void *buf, size_t off, mlo_dtype dt, int64_t out, int64_t in) {
  uint64_t d = 12345;
  assert_ok(mlo_workload_host_ops.gemm_digest(ctx, buf, off, dt, out, in, 4, 7, &d));
  return d;
}

static void test_widening_is_exact(void **state) {
  (void)state;
  enum { OUT = 3, IN = 40 };
  float w32[OUT * IN];
  uint16_t wbf[OUT * IN], wf16[OUT * IN];
  for (int i = 0; i < OUT * IN; i++) {
    w32[i] = exact[(size_t)i % NEXACT];
    wbf[i] = to_bf16(w32[i]);
    wf16[i] = to_f16(w32[i]);
  }
  void *ctx = NULL;
  assert_ok(mlo_workload_host_ops.create(NULL, &ctx));
  uint64_t d32 = gemm(ctx, w32, 0, MLO_DTYPE_F32, OUT, IN);
  assert_int_equal(gemm(ctx, wbf, 0, MLO_DTYPE_BF16, OUT, IN), d32);
  assert_int_equal(gemm(ctx, wf16, 0, MLO_DTYPE_F16, OUT, IN), d32);
  /* f32 at an odd address takes the copying path and agrees. */
  unsigned char *odd = malloc(sizeof w32 + 3);
  memcpy(odd + 3, w32, sizeof w32);
  assert_int_equal(gemm(ctx, odd, 3, MLO_DTYPE_F32, OUT, IN), d32);
  /* A changed weight changes the digest. */
  w32[5] = 3.0f;
  assert_int_not_equal(gemm(ctx, w32, 0, MLO_DTYPE_F32, OUT, IN), d32);
  free(odd);
  mlo_workload_host_ops.destroy(ctx);
}

static void test_input_and_fold(void **state) {
  (void)state;
  for (int64_t k = 0; k < 1000; k++) {
    float x = mlo_workload_input(3, 1, k);
    assert_true(x >= -1.0f && x < 1.0f);
    assert_true(x == mlo_workload_input(3, 1, k));
  }
  int differ = 0;
  for (int64_t k = 0; k < 100; k++)
    differ += mlo_workload_input(3, 1, k) != mlo_workload_input(4, 1, k);
  assert_true(differ > 90);
  const char a[] = "abcdefghijklmnop";
  uint64_t whole = mlo_digest_fold(1, a, 16);
  assert_int_equal(mlo_digest_fold(mlo_digest_fold(1, a, 8), a + 8, 8), whole);
  assert_int_not_equal(mlo_digest_fold(1, a, 15), whole);
  assert_int_not_equal(mlo_digest_fold(2, a, 16), whole);
}

/* A pipeline: encoder, two DiTs, VAE with 2-D bf16 and 1-D f32 tensors. */
static mlo_pipeline *build(mlo_platform *plat, uint16_t *w) {
  static const struct {
    const char *name;
    mlo_role role;
    int64_t out;
  } comps[] = {{"text_encoder", MLO_ROLE_ENCODER, 48},
               {"transformer", MLO_ROLE_DIT, 64},
               {"transformer_2", MLO_ROLE_DIT, 64},
               {"vae", MLO_ROLE_VAE, 16}};
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *pipe = NULL;
  assert_ok(mlo_pipeline_create(&po, &pipe));
  for (size_t i = 0; i < 4; i++) {
    mlo_component *c;
    assert_ok(mlo_component_add(pipe, comps[i].name, comps[i].role, &c));
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = "weight";
    d.dtype = MLO_DTYPE_BF16;
    d.ndim = 2;
    d.shape[0] = comps[i].out;
    d.shape[1] = 128;
    d.data = w + i * 7; /* a different window of the data per component */
    assert_ok(mlo_tensor_add(c, &d, NULL));
    mlo_tensor_desc b = MLO_TENSOR_DESC_INIT;
    b.name = "bias";
    b.ndim = 1;
    b.shape[0] = comps[i].out;
    b.data = w;
    assert_ok(mlo_tensor_add(c, &b, NULL));
  }
  return pipe;
}

static uint64_t run_digest(const char *spec, bool offload, uint16_t *w) {
  mlo_platform *plat = NULL;
  char err[256];
  assert_ok(mlo_platform_open(spec, &plat, err, sizeof err));
  mlo_pipeline *pipe = build(plat, w);
  mlo_workload *wl = NULL;
  assert_ok(mlo_workload_open(plat, &wl, NULL, 0));
  mlo_workload_call *calls = NULL;
  size_t n = 0;
  assert_ok(mlo_workload_schedule(pipe, 8, 4, &calls, &n));
  if (offload)
    assert_ok(mlo_offload_enable(pipe, NULL));
  else
    assert_ok(mlo_pipeline_load_all(pipe));
  uint64_t digest = 0;
  assert_ok(mlo_workload_run(wl, calls, n, &digest, NULL, NULL, NULL));
  free(calls);
  mlo_workload_close(wl);
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  return digest;
}

/* One component with the tensors declared in the given order. */
static uint64_t digest_in_order(const uint16_t *w, const int *order, size_t n) {
  static const char *const names[] = {"a.weight", "b.weight", "c.bias", "d.weight"};
  mlo_platform *plat = NULL;
  char err[256];
  assert_ok(mlo_platform_open("host", &plat, err, sizeof err));
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *pipe = NULL;
  mlo_component *c;
  assert_ok(mlo_pipeline_create(&po, &pipe));
  assert_ok(mlo_component_add(pipe, "transformer", MLO_ROLE_DIT, &c));
  for (size_t i = 0; i < n; i++) {
    int k = order[i];
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = names[k];
    d.dtype = MLO_DTYPE_BF16;
    d.ndim = k == 2 ? 1 : 2;
    d.shape[0] = 16 + 8 * k;
    d.shape[1] = 64;
    d.data = w + k * 100;
    assert_ok(mlo_tensor_add(c, &d, NULL));
  }
  mlo_workload *wl = NULL;
  assert_ok(mlo_workload_open(plat, &wl, NULL, 0));
  assert_ok(mlo_pipeline_load_all(pipe));
  uint64_t digest = 0; /* a hooked forward: it waits for the load */
  assert_ok(mlo_workload_forward(wl, c, 7, &digest));
  mlo_workload_close(wl);
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  return digest;
}

/* The digest depends on the weights, not on the order files list them
 * (sharded and unsharded saves of one model list them differently). */
static void test_digest_ignores_declaration_order(void **state) {
  (void)state;
  uint16_t *w = malloc(64 * 64 * sizeof *w * 4);
  for (size_t i = 0; i < 64 * 64 * 4; i++) w[i] = to_bf16((float)((int)(i % 97) - 48) / 64.0f);
  static const int forward[] = {0, 1, 2, 3}, backward[] = {3, 2, 1, 0}, mixed[] = {2, 0, 3, 1};
  uint64_t a = digest_in_order(w, forward, 4);
  assert_int_equal(digest_in_order(w, backward, 4), a);
  assert_int_equal(digest_in_order(w, mixed, 4), a);
  assert_int_not_equal(digest_in_order(w, forward, 3), a); /* a tensor less: another digest */
  free(w);
}

static void test_offloaded_equals_resident(void **state) {
  (void)state;
  size_t count = 64 * 128 + 64;
  uint16_t *w = malloc(count * sizeof *w);
  for (size_t i = 0; i < count; i++) w[i] = to_bf16((float)((int)(i * 37 % 201) - 100) / 64.0f);
  uint64_t resident = run_digest("host", false, w);
  /* jitter delays copies at random: a forward that raced its load would
   * read poisoned or stale bytes and change the digest. */
  for (int seed = 1; seed <= 3; seed++) {
    char spec[64];
    snprintf(spec, sizeof spec, "host:jitter=1,seed=%d", seed);
    assert_int_equal(run_digest(spec, true, w), resident);
  }
  /* Different data, different digest: the digest reads the weights. */
  w[1] ^= 0x40;
  assert_int_not_equal(run_digest("host", false, w), resident);
  free(w);
}

static void test_schedule_and_needs(void **state) {
  (void)state;
  mlo_platform *plat = NULL;
  char err[256];
  assert_ok(mlo_platform_open("host", &plat, err, sizeof err));
  uint16_t *w = calloc(64 * 128 + 64, sizeof *w);
  mlo_pipeline *pipe = build(plat, w);
  mlo_workload_call *calls = NULL;
  size_t n = 0;
  assert_ok(mlo_workload_schedule(pipe, 8, 7, &calls, &n));
  assert_int_equal(n, 1 + 8 + 1);
  assert_string_equal(mlo_component_name(calls[0].comp), "text_encoder");
  for (size_t s = 1; s <= 7; s++)
    assert_string_equal(mlo_component_name(calls[s].comp), "transformer");
  assert_string_equal(mlo_component_name(calls[8].comp), "transformer_2");
  assert_string_equal(mlo_component_name(calls[9].comp), "vae");
  for (size_t i = 0; i < n; i++) assert_int_equal(calls[i].step, i);
  free(calls);
  assert_int_equal(mlo_workload_schedule(pipe, 0, 0, &calls, &n), MLO_EINVAL);
  assert_int_equal(mlo_workload_schedule(pipe, 4, 5, &calls, &n), MLO_EINVAL);
  assert_int_equal(mlo_workload_schedule(pipe, 4, -1, &calls, &n), MLO_EINVAL);

  uint64_t enc = mlo_component_bytes(mlo_pipeline_find(pipe, "text_encoder"));
  uint64_t dit = mlo_component_bytes(mlo_pipeline_find(pipe, "transformer"));
  uint64_t vae = mlo_component_bytes(mlo_pipeline_find(pipe, "vae"));
  mlo_component *largest = NULL;
  assert_int_equal(mlo_workload_all_resident_bytes(pipe), enc + 2 * dit + vae);
  assert_int_equal(mlo_workload_model_offload_bytes(pipe, &largest), vae + (enc > dit ? enc : dit));
  assert_string_equal(mlo_component_name(largest), enc > dit ? "text_encoder" : "transformer");
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  free(w);
}

static void test_tokens(void **state) {
  (void)state;
  mlo_platform *plat = NULL;
  char err[256];
  assert_ok(mlo_platform_open("host", &plat, err, sizeof err));
  mlo_workload *wl = NULL;
  assert_ok(mlo_workload_open(plat, &wl, NULL, 0));
  assert_int_equal(mlo_workload_tokens(wl, MLO_ROLE_DIT), MLO_WORKLOAD_TOKENS_DIT);
  assert_ok(mlo_workload_set_tokens(wl, MLO_ROLE_VAE, 3));
  assert_int_equal(mlo_workload_tokens(wl, MLO_ROLE_VAE), 3);
  assert_int_equal(mlo_workload_set_tokens(wl, MLO_ROLE_VAE, 0), MLO_EINVAL);
  assert_int_equal(mlo_workload_set_tokens(wl, MLO_ROLE_AUTO, 4), MLO_EINVAL);
  mlo_workload_close(wl);
  mlo_workload_close(NULL);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_widening_is_exact),
      cmocka_unit_test(test_input_and_fold),
      cmocka_unit_test(test_offloaded_equals_resident),
      cmocka_unit_test(test_digest_ignores_declaration_order),
      cmocka_unit_test(test_schedule_and_needs),
      cmocka_unit_test(test_tokens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
