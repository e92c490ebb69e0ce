/*
 * C7_pinning — host slabs are pinned when configured and the platform can;
 * tensors whose host storage belongs to the caller (EXTERNAL, SHARDED: the C
 * form of DTensors) are used in place: never copied into a slab, pinned or
 * re-allocated, with or without settings.distributed.
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static void check_pinning(bool pipeline_pin, const mlo_offload_settings *settings,
                          bool expect_pin) {
  mlo_platform *plat = tu_platform_open(NULL);
  mlo_platform_caps caps;
  mlo_platform_get_caps(plat, &caps);
  tu_pipe *tp = tu_pipe_new(plat, pipeline_pin);
  for (size_t i = 0; i < 4; i++) tu_add_component(tp, &tu_wan_specs[i]);
  assert_ok(mlo_offload_enable(tp->pipe, settings));
  mlo_pipeline_stats s = tu_pstats(tp);
  uint64_t bytes = 0;
  for (size_t i = 0; i < 4; i++) bytes += mlo_component_bytes(tu_comp(tp, tu_wan_specs[i].name));
  assert_true(s.host_slab_bytes >= bytes);
  assert_true(s.pinned_bytes <= s.host_slab_bytes);
  if (expect_pin && caps.pinned_host)
    assert_true(s.pinned_bytes > 0);
  else
    assert_int_equal(s.pinned_bytes, 0);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_pinned_when_configured(void **state) {
  (void)state;
  check_pinning(true, NULL, true);
}

static void test_not_pinned_when_pipeline_says_no(void **state) {
  (void)state;
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.pin_host = false;
  check_pinning(false, &settings, false);
}

static void test_settings_turn_pinning_off(void **state) {
  (void)state;
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.pin_host = false;
  check_pinning(true, &settings, false);
}

/* A pipeline whose DiT holds one 64 KiB caller-owned tensor (EXTERNAL or
 * SHARDED) next to a small slab tensor. */
static void check_caller_storage(unsigned flag, bool distributed) {
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  const tu_comp_spec enc = {"text_encoder", MLO_ROLE_ENCODER, 1, 1024, 0};
  const tu_comp_spec vae = {"vae", MLO_ROLE_VAE, 1, 1024, 0};
  tu_add_component(tp, &enc);
  tu_add_component(tp, &vae);
  mlo_component *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  tu_add_tensor(tp, dit, "small", 1024, 0);
  const size_t ext_bytes = 64 * 1024;
  uint8_t *caller = malloc(ext_bytes);
  assert_non_null(caller);
  uint32_t seed = tu_seed("caller", "shard");
  tu_fill_pattern(caller, ext_bytes, seed);
  mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
  desc.name = "shard";
  desc.dtype = MLO_DTYPE_U8;
  desc.ndim = 1;
  desc.shape[0] = (int64_t)ext_bytes;
  desc.flags = flag;
  desc.data = caller;
  mlo_tensor *ext = NULL;
  assert_ok(mlo_tensor_add(dit, &desc, &ext));
  tp->recs[tp->nrecs++] = (tu_tensor_rec){ext, dit, seed, ext_bytes, false};
  assert_true(mlo_tensor_flags(ext) & flag);
  assert_true(mlo_component_bytes(dit) >= ext_bytes + 1024); /* it still moves */

  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.distributed = distributed;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  assert_ptr_equal(mlo_tensor_host_data(ext), caller);
  mlo_pipeline_stats s = tu_pstats(tp);
  assert_true(s.host_slab_bytes < ext_bytes); /* not copied into a slab */
  assert_true(s.pinned_bytes < ext_bytes);    /* and not pinned */
  assert_ok(tu_forward(tp, dit));             /* device bytes checked inside */
  assert_ptr_equal(mlo_tensor_host_data(ext), caller);
  assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder"))); /* evicts the DiT */
  assert_false(mlo_component_is_resident(dit));
  assert_ptr_equal(mlo_tensor_host_data(ext), caller);
  assert_int_equal(tu_pattern_mismatch(caller, ext_bytes, tu_seed("caller", "shard")), ext_bytes);
  /* Used in place: what the caller writes while evicted is what loads. */
  uint32_t seed2 = tu_seed("caller", "shard v2");
  tu_fill_pattern(caller, ext_bytes, seed2);
  tu_rec(tp, ext)->seed = seed2;
  assert_ok(tu_forward(tp, dit));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  /* The library never freed it: it is still ours to use and free. */
  memset(caller, 0, ext_bytes);
  free(caller);
  mlo_platform_close(plat);
}

static void test_external_in_place(void **state) {
  (void)state;
  check_caller_storage(MLO_TENSOR_EXTERNAL, false);
}

static void test_external_in_place_distributed(void **state) {
  (void)state;
  check_caller_storage(MLO_TENSOR_EXTERNAL, true);
}

static void test_sharded_in_place(void **state) {
  (void)state;
  check_caller_storage(MLO_TENSOR_SHARDED, false);
}

static void test_sharded_in_place_distributed(void **state) {
  (void)state;
  check_caller_storage(MLO_TENSOR_SHARDED, true);
}

/* Caller-owned storage needs the caller's pointer. */
static void test_external_needs_data(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
  desc.name = "shard";
  desc.ndim = 1;
  desc.shape[0] = 16;
  desc.flags = MLO_TENSOR_SHARDED;
  mlo_tensor *t = NULL;
  assert_status(mlo_tensor_add(dit, &desc, &t), MLO_EINVAL);
  assert_int_equal(mlo_component_tensor_count(dit), 0);
  assert_true(mlo_pipeline_errmsg(tp->pipe)[0] != '\0');
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pinned_when_configured),
      cmocka_unit_test(test_not_pinned_when_pipeline_says_no),
      cmocka_unit_test(test_settings_turn_pinning_off),
      cmocka_unit_test(test_external_in_place),
      cmocka_unit_test(test_external_in_place_distributed),
      cmocka_unit_test(test_sharded_in_place),
      cmocka_unit_test(test_sharded_in_place_distributed),
      cmocka_unit_test(test_external_needs_data),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
