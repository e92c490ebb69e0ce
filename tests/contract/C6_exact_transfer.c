/*
 * C6_exact_transfer — a load moves exactly the component's own storage, a
 * tensor shared inside the component once, and never follows a reference
 * into another component.
 */
#include "testutil.h"

#include <string.h>

/* transformer: a (4 KiB), b (8 KiB), b_tied -> b.  transformer_2: c (4 KiB)
 * and a_ref -> transformer's a.  Sizes are multiples of the slab alignment,
 * so the component byte counts carry no padding. */
static tu_pipe *build(mlo_platform *plat, mlo_tensor **a_out, mlo_tensor **b_out) {
  tu_pipe *tp = tu_pipe_new(plat, true);
  const tu_comp_spec enc = {"text_encoder", MLO_ROLE_ENCODER, 2, 4096, 0};
  const tu_comp_spec vae = {"vae", MLO_ROLE_VAE, 1, 2048, 0};
  tu_add_component(tp, &enc);
  mlo_component *dit = NULL, *dit2 = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  mlo_tensor *a = tu_add_tensor(tp, dit, "a", 4096, 0);
  mlo_tensor *b = tu_add_tensor(tp, dit, "b", 8192, 0);
  tu_add_alias(tp, dit, "b_tied", b);
  assert_ok(mlo_component_add(tp->pipe, "transformer_2", MLO_ROLE_DIT, &dit2));
  tu_add_tensor(tp, dit2, "c", 4096, 0);
  tu_add_alias(tp, dit2, "a_ref", a);
  tu_add_component(tp, &vae);
  *a_out = a;
  *b_out = b;
  return tp;
}

static void test_component_bytes(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  mlo_tensor *a, *b;
  tu_pipe *tp = build(plat, &a, &b);
  mlo_component *dit = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  assert_int_equal(mlo_component_tensor_count(dit), 3);
  assert_int_equal(mlo_component_tensor_count(dit2), 2);
  assert_int_equal(mlo_component_bytes(dit), 4096 + 8192);
  assert_int_equal(mlo_component_bytes(dit2), 4096);
  mlo_tensor *tied = mlo_component_find_tensor(dit, "b_tied");
  mlo_tensor *ref = mlo_component_find_tensor(dit2, "a_ref");
  assert_non_null(tied);
  assert_non_null(ref);
  assert_ptr_equal(mlo_tensor_owner(tied), dit);
  assert_ptr_equal(mlo_tensor_owner(ref), dit);
  assert_int_equal(mlo_tensor_nbytes(tied), 8192);
  assert_int_equal(mlo_tensor_nbytes(ref), 4096);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Loads of each DiT move exactly its own bytes; the tied alias shares the
 * device storage of its target; the reference is not resident with dit2. */
static void run_exact_loads(mlo_offload_settings *settings) {
  mlo_platform *plat = tu_platform_open(NULL);
  mlo_tensor *a, *b;
  tu_pipe *tp = build(plat, &a, &b);
  mlo_component *dit = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  assert_ok(mlo_offload_enable(tp->pipe, settings));
  assert_ok(tu_forward(tp, dit));
  mlo_component_stats s = tu_cstats(dit);
  assert_int_equal(s.loads, 1);
  assert_int_equal(s.h2d_bytes, 12288);
  if (settings && settings->per_tensor_copies) assert_int_equal(s.copy_calls, 2);
  void *tblock = NULL, *bblock = NULL;
  size_t toff = 1, boff = 2;
  mlo_tensor *tied = mlo_component_find_tensor(dit, "b_tied");
  assert_ok(mlo_component_acquire(dit));
  assert_ok(mlo_tensor_device(tied, &tblock, &toff));
  assert_ok(mlo_tensor_device(b, &bblock, &boff));
  assert_ptr_equal(tblock, bblock);
  assert_int_equal(toff, boff);
  assert_ok(mlo_component_release(dit));

  assert_ok(tu_forward(tp, dit2));
  mlo_component_stats s2 = tu_cstats(dit2);
  assert_int_equal(s2.h2d_bytes, 4096);
  assert_int_equal(tu_cstats(dit).h2d_bytes, 12288); /* not reloaded through a_ref */
  assert_false(mlo_component_is_resident(dit));
  mlo_tensor *ref = mlo_component_find_tensor(dit2, "a_ref");
  void *block = NULL;
  size_t offset = 0;
  assert_status(mlo_tensor_device(ref, &block, &offset), MLO_ESTATE);
  assert_null(mlo_tensor_device_ptr(ref));
  tu_assert_forwards_clean(tp);
  /* The pipeline total is the sum of what each component moved. */
  mlo_pipeline_stats ps = tu_pstats(tp);
  uint64_t sum = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++)
    sum += tu_cstats(mlo_pipeline_component_at(tp->pipe, i)).h2d_bytes;
  assert_int_equal(ps.total.h2d_bytes, sum);
  assert_int_equal(ps.total.d2h_bytes, 0);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_slab_loads_exact(void **state) {
  (void)state;
  run_exact_loads(NULL);
}

static void test_per_tensor_loads_exact(void **state) {
  (void)state;
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.per_tensor_copies = true;
  run_exact_loads(&settings);
}

/* A reference reads its owner's device bytes while the owner is resident. */
static void test_reference_follows_owner(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  mlo_tensor *a, *b;
  tu_pipe *tp = build(plat, &a, &b);
  mlo_component *dit2 = tu_comp(tp, "transformer_2");
  mlo_tensor *ref = mlo_component_find_tensor(dit2, "a_ref");
  mlo_component *other = NULL;
  assert_ok(mlo_component_add(tp->pipe, "lora", MLO_ROLE_OTHER, &other));
  tu_add_alias(tp, other, "b_ref", b);
  assert_int_equal(mlo_component_bytes(other), 0);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(tu_forward(tp, tu_comp(tp, "transformer")));
  void *rblock = NULL, *ablock = NULL;
  size_t roff = 1, aoff = 2;
  assert_ok(mlo_tensor_device(ref, &rblock, &roff));
  assert_ok(mlo_tensor_device(a, &ablock, &aoff));
  assert_ptr_equal(rblock, ablock);
  assert_int_equal(roff, aoff);
  assert_ok(tu_forward(tp, other));
  assert_int_equal(tu_cstats(other).h2d_bytes, 0);
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_component_bytes),
      cmocka_unit_test(test_slab_loads_exact),
      cmocka_unit_test(test_per_tensor_loads_exact),
      cmocka_unit_test(test_reference_follows_owner),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
