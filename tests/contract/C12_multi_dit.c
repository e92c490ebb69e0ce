/*
 * C12_multi_dit — with several DiTs, a DiT's forward offloads the inactive
 * DiTs as well as the encoders: exactly one DiT is resident after it.
 */
#include "testutil.h"

#include <stdlib.h>

static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 2, 4096, 0},
    {"text_encoder_2", MLO_ROLE_ENCODER, 1, 4096, 0},
    {"transformer", MLO_ROLE_DIT, 3, 8192, 0},
    {"transformer_2", MLO_ROLE_DIT, 3, 8192, 0},
    {"transformer_3", MLO_ROLE_DIT, 2, 12288, 0},
    {"vae", MLO_ROLE_VAE, 1, 4096, 0},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static unsigned resident_dits(tu_pipe *tp, mlo_component **which) {
  unsigned n = 0;
  for (size_t i = 0; i < NSPECS; i++) {
    mlo_component *comp = tu_comp(tp, specs[i].name);
    if (specs[i].role == MLO_ROLE_DIT && mlo_component_is_resident(comp)) {
      n++;
      *which = comp;
    }
  }
  return n;
}

static void test_one_dit_resident(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  tu_model m;
  tu_enable_modelled(tp, &m);
  srand(12);
  for (int i = 0; i < 80; i++) {
    mlo_component *comp = tu_comp(tp, specs[(size_t)rand() % NSPECS].name);
    tu_forward_modelled(tp, &m, comp);
    if (mlo_component_role(comp) == MLO_ROLE_DIT) {
      mlo_component *which = NULL;
      assert_int_equal(resident_dits(tp, &which), 1);
      assert_ptr_equal(which, comp);
      assert_false(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
      assert_false(mlo_component_is_resident(tu_comp(tp, "text_encoder_2")));
    }
  }
  tu_model_check(&m);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* The DiT cycle of a two-stage video schedule, and back to the first. */
static void test_dit_cycle(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tu_model m;
  tu_enable_modelled(tp, &m);
  const char *cycle[] = {"transformer", "transformer_2", "transformer_3"};
  for (int i = 0; i < 9; i++) {
    mlo_component *comp = tu_comp(tp, cycle[i % 3]);
    tu_forward_modelled(tp, &m, comp);
    tu_model_check(&m);
  }
  assert_int_equal(tu_cstats(tu_comp(tp, "transformer")).loads, 3);
  assert_int_equal(tu_cstats(tu_comp(tp, "transformer_3")).evictions, 2);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_dit_resident),
      cmocka_unit_test(test_dit_cycle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
