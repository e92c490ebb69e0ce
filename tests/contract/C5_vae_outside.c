/*
 * C5_vae_outside — VAEs are outside the mutual-exclusion set: no hook ever
 * evicts one, and a VAE's forward evicts nothing.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>

static void test_vae_never_evicted(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  tp->exclusion_in_forward = tp->audit_in_forward = true;
  mlo_component *vae = tu_comp(tp, "vae");
  tu_model m;
  tu_enable_modelled(tp, &m);
  srand(5);
  for (int i = 0; i < 60; i++) {
    mlo_component *comp = tu_comp(tp, tu_wan_specs[rand() % 4].name);
    tu_forward_modelled(tp, &m, comp);
    assert_true(mlo_component_is_resident(vae));
  }
  tu_model_check(&m);
  assert_int_equal(tu_cstats(vae).evictions, 0);
  assert_int_equal(tu_cstats(vae).loads, 1);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Whatever is resident before a VAE forward is resident after it, and no
 * component's eviction counter moves. */
static void test_vae_forward_evicts_nothing(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  mlo_component *vae = tu_comp(tp, "vae");
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  const char *before_vae[] = {"transformer", "text_encoder", "transformer_2"};
  for (size_t k = 0; k < 3; k++) {
    assert_ok(tu_forward(tp, tu_comp(tp, before_vae[k])));
    bool resident[4];
    mlo_component_stats stats[4];
    for (size_t i = 0; i < 4; i++) {
      mlo_component *comp = tu_comp(tp, tu_wan_specs[i].name);
      resident[i] = mlo_component_is_resident(comp);
      stats[i] = tu_cstats(comp);
    }
    assert_ok(tu_forward(tp, vae));
    for (size_t i = 0; i < 4; i++) {
      mlo_component *comp = tu_comp(tp, tu_wan_specs[i].name);
      assert_int_equal(mlo_component_is_resident(comp), resident[i]);
      assert_int_equal(tu_cstats(comp).evictions, stats[i].evictions);
      assert_int_equal(tu_cstats(comp).loads, stats[i].loads);
    }
  }
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A thread holding the VAE does not block a DiT on another thread. */
typedef struct {
  mlo_component *vae;
  atomic_int phase; /* 1: VAE held, 2: may release */
  int rc_acquire, rc_release;
} holder;

static void *hold_vae(void *arg) {
  holder *h = arg;
  h->rc_acquire = mlo_component_acquire(h->vae);
  atomic_store(&h->phase, 1);
  while (atomic_load(&h->phase) != 2) tu_sleep_ms(1);
  h->rc_release = h->rc_acquire ? MLO_OK : mlo_component_release(h->vae);
  return NULL;
}

static void test_held_vae_does_not_block_dit(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  holder h = {.vae = tu_comp(tp, "vae")};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hold_vae, &h), 0);
  while (atomic_load(&h.phase) != 1) tu_sleep_ms(1);
  mlo_component *dit = tu_comp(tp, "transformer");
  int rc = mlo_component_try_acquire(dit);
  if (rc == MLO_OK) mlo_component_release(dit);
  atomic_store(&h.phase, 2);
  pthread_join(th, NULL);
  assert_ok(h.rc_acquire);
  assert_ok(h.rc_release);
  assert_ok(rc);
  assert_true(mlo_component_is_resident(h.vae));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vae_never_evicted),
      cmocka_unit_test(test_vae_forward_evicts_nothing),
      cmocka_unit_test(test_held_vae_does_not_block_dit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
