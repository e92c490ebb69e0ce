/*
 * C3_dit_evicts — before a DiT runs, every encoder and every other DiT is
 * offloaded, and only then is the DiT loaded.  Checked three ways: inside
 * the forward (residency + audit), by the order of trace events, and on the
 * host platform by a capacity that only fits if eviction comes first.
 */
#include "testutil.h"

#include <string.h>

static const tu_comp_spec specs[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 3, 16384, 0},
    {"text_encoder_2", MLO_ROLE_ENCODER, 1, 16384, 0},
    {"transformer", MLO_ROLE_DIT, 4, 32768, 0},
    {"transformer_2", MLO_ROLE_DIT, 4, 32768, 0},
    {"vae", MLO_ROLE_VAE, 2, 8192, 0},
};
#define NSPECS (sizeof specs / sizeof specs[0])

#define MAX_EVENTS 256
static mlo_trace_event events[MAX_EVENTS];
static atomic_uint nevents;

static void record(const mlo_trace_event *ev, void *user) {
  (void)user;
  unsigned i = atomic_fetch_add(&nevents, 1);
  if (i < MAX_EVENTS) events[i] = *ev;
}

/* Index of the first event of kind for comp at or after from, or -1. */
static int find_event(mlo_trace_kind kind, const mlo_component *comp, unsigned from) {
  unsigned n = atomic_load(&nevents);
  for (unsigned i = from; i < n && i < MAX_EVENTS; i++)
    if (events[i].kind == kind && events[i].comp == comp) return (int)i;
  return -1;
}

static void test_dit_forward_evicts_first(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  mlo_component *enc = tu_comp(tp, "text_encoder"), *enc2 = tu_comp(tp, "text_encoder_2");
  mlo_component *dit = tu_comp(tp, "transformer"), *vae = tu_comp(tp, "vae");
  tu_model m;
  tu_enable_modelled(tp, &m);
  atomic_store(&nevents, 0);
  mlo_pipeline_set_trace(tp->pipe, record, NULL);
  assert_ok(tu_forward(tp, dit));
  mlo_pipeline_set_trace(tp->pipe, NULL, NULL);
  tu_model_forward(&m, dit);
  tu_model_check(&m);
  tu_assert_forwards_clean(tp);
  assert_int_equal(atomic_load(&tp->forwards), 1);
  /* Both encoders evicted before the DiT's load began; VAE untouched. */
  int load = find_event(MLO_TRACE_LOAD_BEGIN, dit, 0);
  int evict1 = find_event(MLO_TRACE_EVICT, enc, 0), evict2 = find_event(MLO_TRACE_EVICT, enc2, 0);
  assert_true(load >= 0 && evict1 >= 0 && evict2 >= 0);
  assert_true(evict1 < load && evict2 < load);
  assert_int_equal(find_event(MLO_TRACE_EVICT, vae, 0), -1);
  int fwd = find_event(MLO_TRACE_FORWARD_BEGIN, dit, 0);
  int loaded = find_event(MLO_TRACE_LOAD_END, dit, 0);
  assert_true(fwd > load);
  if (loaded >= 0) assert_true(loaded > load);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_dit_evicts_other_dit(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  mlo_component *dit = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  tu_model m;
  tu_enable_modelled(tp, &m);
  mlo_component *schedule[] = {dit, dit, dit2, dit2, dit2, dit, dit2};
  for (size_t i = 0; i < sizeof schedule / sizeof schedule[0]; i++) {
    tu_forward_modelled(tp, &m, schedule[i]);
    tu_model_check(&m);
  }
  assert_true(mlo_component_is_resident(dit2));
  assert_false(mlo_component_is_resident(dit));
  tu_assert_forwards_clean(tp);
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* The device holds encoders + VAE, or one DiT + VAE, never all three: the
 * DiT's load only fits if the encoders are already gone. */
static void test_fits_only_when_evicting_first(void **state) {
  (void)state;
  /* encoders 64 KiB, DiT 128 KiB, VAE 16 KiB: 144 KiB needed, 208 for all. */
  mlo_platform *plat = tu_platform_open("capacity=176K");
  tu_pipe *tp = tu_pipe_build(plat, specs, NSPECS);
  mlo_component *dit = tu_comp(tp, "transformer"), *dit2 = tu_comp(tp, "transformer_2");
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  for (int round = 0; round < 3; round++) {
    assert_ok(tu_forward(tp, dit));
    assert_ok(tu_forward(tp, dit2));
    assert_ok(tu_forward(tp, tu_comp(tp, "text_encoder")));
  }
  tu_assert_forwards_clean(tp);
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(plat, &mem));
  assert_true(mem.peak_bytes <= 176 * 1024);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dit_forward_evicts_first),
      cmocka_unit_test(test_dit_evicts_other_dit),
      cmocka_unit_test(test_fits_only_when_evicting_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
