/*
 * core_register.c — which host memory core asks the platform to register
 * read-only (issue 25.2): caller-owned tensors are page-locked in place,
 * and CUDA registers a range read-only when told nothing is ever copied
 * back into it; a write-back into such a range fails on the GPU.  The host
 * platform cannot register memory, so this test wraps it with a
 * host_register that records what it was asked (white box: the platform
 * table is internal), and checks that a MUTABLE tensor is never asked
 * read-only, an immutable one is, and that enabling copy_back (every
 * tensor written back) registers the read-only ones again, writable.
 */
#include "testutil.h"

#include "platform/platform.h"

#include <string.h>

#define MAXREC 16
static struct rec {
  const void *ptr;
  bool read_only, live;
} recs[MAXREC];
static size_t nrecs;

static int rec_register(void *ctx, void *ptr, size_t bytes, bool read_only) {
  (void)ctx, (void)bytes;
  if (nrecs < MAXREC) recs[nrecs++] = (struct rec){ptr, read_only, true};
  return MLO_OK;
}

static void rec_unregister(void *ctx, void *ptr) {
  (void)ctx;
  for (size_t i = 0; i < nrecs; i++)
    if (recs[i].ptr == ptr) recs[i].live = false;
}

/* The live registration of ptr: 1 read-only, 0 writable, -1 none. */
static int registered(const void *ptr) {
  int r = -1;
  for (size_t i = 0; i < nrecs; i++)
    if (recs[i].ptr == ptr && recs[i].live) r = recs[i].read_only;
  return r;
}

static struct mlo_platform_ops wrapped;

static void test_read_only_only_where_nothing_comes_back(void **state) {
  (void)state;
  mlo_platform *plat = tu_open_spec("host:capacity=1M");
  wrapped = *plat->ops;
  wrapped.host_register = rec_register;
  wrapped.host_unregister = rec_unregister;
  plat->ops = &wrapped;
  plat->caps.host_register = true;
  nrecs = 0;
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *enc = NULL, *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &enc));
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  mlo_tensor *weights = tu_add_tensor(tp, enc, "weights", 4096, MLO_TENSOR_EXTERNAL);
  mlo_tensor *cache =
      tu_add_tensor(tp, enc, "cache", 4096, MLO_TENSOR_EXTERNAL | MLO_TENSOR_MUTABLE);
  tu_add_tensor(tp, dit, "w", 4096, 0);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  const void *w = mlo_tensor_host_data(weights), *m = mlo_tensor_host_data(cache);
  assert_int_equal(registered(w), 1); /* only read: read-only is allowed */
  assert_int_equal(registered(m), 0); /* written back at eviction: never read-only */
  /* copy_back writes every tensor back: nothing may stay read-only */
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.copy_back = true;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_int_equal(registered(w), 0);
  assert_int_equal(registered(m), 0);
  assert_ok(tu_forward(tp, enc));
  assert_ok(tu_forward(tp, dit)); /* C4: the encoder goes, written back */
  tu_assert_forwards_clean(tp);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_pipe_free(tp);
  for (size_t i = 0; i < nrecs; i++) assert_false(recs[i].live); /* freed with the pipeline */
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_only_only_where_nothing_comes_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
