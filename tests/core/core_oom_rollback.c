/*
 * core_oom_rollback — out of device memory during a load rolls the
 * component back to the host, leaves the rest as it was and returns
 * MLO_ENOMEM_DEVICE with a message that says what did not fit (docs/reliability.md);
 * once memory is freed the same call succeeds; memory another allocator
 * holds cached is asked back before an allocation fails.
 */
#include "testutil.h"

/* Device 160 KiB.  A hand-loaded OTHER component (64 KiB) stays resident
 * across enable (OTHER is outside the exclusion set); the DiT (128 KiB)
 * then cannot fit next to it and the VAE (16 KiB). */
static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 2, 16384, 0},
    {"transformer", MLO_ROLE_DIT, 4, 32768, 0},
    {"vae", MLO_ROLE_VAE, 2, 8192, 0},
    {"controlnet", MLO_ROLE_OTHER, 4, 16384, 0},
};

static void test_dit_oom_rolls_back_then_retries(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=160K");
  tu_pipe *tp = tu_pipe_build(plat, specs, 4);
  tp->audit_in_forward = true;
  mlo_component *dit = tu_comp(tp, "transformer"), *vae = tu_comp(tp, "vae");
  mlo_component *extra = tu_comp(tp, "controlnet");
  assert_ok(mlo_component_load(extra));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  mlo_component_stats vae_before = tu_cstats(vae), dit_before = tu_cstats(dit);
  int rc = tu_forward(tp, dit);
  assert_status(rc, MLO_ENOMEM_DEVICE);
  const char *msg = mlo_pipeline_errmsg(tp->pipe);
  if (!tu_contains_ci(msg, "transformer"))
    fail_msg("OOM message \"%s\" does not name the component", msg);
  assert_int_equal(atomic_load(&tp->forwards), 0); /* the callback never ran */
  assert_false(mlo_component_is_resident(dit));
  assert_int_equal(mlo_component_residency(dit), MLO_RES_HOST);
  assert_int_equal(tu_cstats(dit).loads, dit_before.loads);
  assert_true(mlo_component_is_resident(vae));
  assert_true(mlo_component_is_resident(extra));
  mlo_component_stats vae_after = tu_cstats(vae);
  assert_int_equal(vae_after.loads, vae_before.loads);
  assert_int_equal(vae_after.evictions, vae_before.evictions);
  tu_assert_audit(tp);
  mlo_pipeline_stats ps = tu_pstats(tp);
  assert_int_equal(ps.device_bytes, tu_device_used(plat));
  assert_true(mlo_offload_is_enabled(tp->pipe));
  /* Still enabled and usable: the encoder runs. */
  assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder")));
  /* Free the room by hand (only possible with the hooks off), retry. */
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_component_evict(extra));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(tu_forward(tp, dit));
  assert_true(mlo_component_is_resident(dit));
  assert_true(mlo_component_is_resident(vae));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A DiT larger than the whole device: refused every time, nothing leaks. */
static void test_dit_larger_than_device(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=100K");
  tu_pipe *tp = tu_pipe_build(plat, specs, 3);
  mlo_component *dit = tu_comp(tp, "transformer");
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  for (int i = 0; i < 3; i++) {
    assert_status(tu_forward(tp, dit), MLO_ENOMEM_DEVICE);
    assert_false(mlo_component_is_resident(dit));
    tu_assert_audit(tp);
    assert_int_equal(tu_pstats(tp).device_bytes, tu_device_used(plat));
    assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder")));
  }
  assert_status(mlo_component_acquire(dit), MLO_ENOMEM_DEVICE);
  assert_status(mlo_component_try_acquire(dit), MLO_ENOMEM_DEVICE);
  /* Not held after the failures: the encoder is not blocked. */
  assert_ok(mlo_component_try_acquire(tu_comp(tp, "text_encoder")));
  assert_ok(mlo_component_release(tu_comp(tp, "text_encoder")));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  assert_int_equal(tu_device_used(plat), 0);
  mlo_platform_close(plat);
}

/* Another allocator's cache (mlo_platform_set_framework_cache): a second
 * pipeline on the same device stands in for PyTorch's caching allocator,
 * its 64 KiB component what torch holds reserved but unallocated. */
typedef struct {
  mlo_component *held;
  int reclaims;
} framework;

static void fw_reclaim(void *user) {
  framework *fw = user;
  fw->reclaims++;
  if (mlo_component_is_resident(fw->held)) assert_ok(mlo_component_evict(fw->held));
}

static uint64_t fw_cached(void *user) {
  framework *fw = user;
  return mlo_component_is_resident(fw->held) ? mlo_component_bytes(fw->held) : 0;
}

/* The DiT does not fit beside the framework's cache: with the cache
 * declared, the failed allocation asks for it back and succeeds, and the
 * cache counts as free memory (the budget policy's default budget). */
static void test_framework_cache_given_back(void **state) {
  (void)state;
  for (int declared = 0; declared < 2; declared++) {
    mlo_platform *plat = tu_platform_open("capacity=160K");
    tu_pipe *tp = tu_pipe_build(plat, specs, 3);
    tu_pipe *torch_like = tu_pipe_build(plat, specs + 3, 1);
    framework fw = {tu_comp(torch_like, "controlnet"), 0};
    assert_ok(mlo_component_load(fw.held));
    mlo_platform_memory before, after;
    assert_ok(mlo_platform_get_memory(plat, &before));
    if (declared) {
      mlo_framework_cache cache = {fw_reclaim, fw_cached, &fw};
      mlo_platform_set_framework_cache(plat, &cache);
    }
    assert_ok(mlo_platform_get_memory(plat, &after));
    assert_int_equal(after.free_bytes, before.free_bytes + (declared ? 65536 : 0));
    assert_ok(mlo_offload_enable(tp->pipe, NULL));
    mlo_component *dit = tu_comp(tp, "transformer");
    if (!declared) {
      assert_status(tu_forward(tp, dit), MLO_ENOMEM_DEVICE);
      assert_true(mlo_component_is_resident(fw.held));
    } else {
      assert_ok(tu_forward(tp, dit));
      assert_int_equal(fw.reclaims, 1);
      assert_false(mlo_component_is_resident(fw.held));
      assert_ok(mlo_platform_get_memory(plat, &after)); /* nothing cached now */
      assert_int_equal(after.free_bytes, after.total_bytes - after.used_bytes);
    }
    tu_assert_audit(tp);
    tu_assert_forwards_clean(tp);
    mlo_platform_set_framework_cache(plat, NULL);
    tu_pipe_free(tp);
    tu_pipe_free(torch_like);
    mlo_platform_close(plat);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dit_oom_rolls_back_then_retries),
      cmocka_unit_test(test_dit_larger_than_device),
      cmocka_unit_test(test_framework_cache_given_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
