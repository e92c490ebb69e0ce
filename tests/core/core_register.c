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

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXREC 16
static struct rec {
  const char *ptr;
  size_t bytes;
  bool read_only, live;
} recs[MAXREC];
static size_t nrecs;

/* As CUDA's, registration is page-granular: a range on a page that a live
 * one holds is refused (cudaErrorHostMemoryAlreadyRegistered). */
static int rec_register(void *ctx, void *ptr, size_t bytes, bool read_only) {
  (void)ctx;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = (uintptr_t)ptr / page * page,
            hi = ((uintptr_t)ptr + bytes + page - 1) / page * page;
  for (size_t i = 0; i < nrecs; i++) {
    uintptr_t a = (uintptr_t)recs[i].ptr / page * page;
    uintptr_t b = ((uintptr_t)recs[i].ptr + recs[i].bytes + page - 1) / page * page;
    if (recs[i].live && lo < b && a < hi) return MLO_EUNSUPPORTED;
  }
  if (nrecs < MAXREC) recs[nrecs++] = (struct rec){ptr, bytes, read_only, true};
  return MLO_OK;
}

static void rec_unregister(void *ctx, void *ptr) {
  (void)ctx;
  for (size_t i = 0; i < nrecs; i++)
    if (recs[i].ptr == ptr) recs[i].live = false;
}

/* The live registration holding [ptr, ptr + n): 1 read-only, 0 writable,
 * -1 none. */
static int registered(const void *ptr, size_t n) {
  const char *p = ptr;
  int r = -1;
  for (size_t i = 0; i < nrecs; i++)
    if (recs[i].live && p >= recs[i].ptr && p + n <= recs[i].ptr + recs[i].bytes)
      r = recs[i].read_only;
  return r;
}

static struct mlo_platform_ops wrapped;

/* A host platform that says it registers host memory, and records each
 * registration (recs) instead. */
static mlo_platform *recording_host(void) {
  mlo_platform *plat = tu_open_spec("host:capacity=1M");
  wrapped = *plat->ops;
  wrapped.host_register = rec_register;
  wrapped.host_unregister = rec_unregister;
  plat->ops = &wrapped;
  plat->caps.host_register = true;
  nrecs = 0;
  return plat;
}

static void test_read_only_only_where_nothing_comes_back(void **state) {
  (void)state;
  mlo_platform *plat = recording_host();
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *enc = NULL, *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &enc));
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  /* on pages of their own: each is registered as it alone needs */
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *pages = aligned_alloc(page, 2 * page);
  assert_non_null(pages);
  mlo_tensor *weights = tu_add_tensor_at(tp, enc, "weights", 4096, MLO_TENSOR_EXTERNAL, pages);
  mlo_tensor *cache = tu_add_tensor_at(tp, enc, "cache", 4096,
                                       MLO_TENSOR_EXTERNAL | MLO_TENSOR_MUTABLE, pages + page);
  tu_add_tensor(tp, dit, "w", 4096, 0);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  const void *w = mlo_tensor_host_data(weights), *m = mlo_tensor_host_data(cache);
  assert_int_equal(registered(w, 4096), 1); /* only read: read-only is allowed */
  assert_int_equal(registered(m, 4096), 0); /* written back at eviction: never read-only */
  /* copy_back writes every tensor back: nothing may stay read-only */
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.copy_back = true;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  assert_int_equal(registered(w, 4096), 0);
  assert_int_equal(registered(m, 4096), 0);
  assert_ok(tu_forward(tp, enc));
  assert_ok(tu_forward(tp, dit)); /* C4: the encoder goes, written back */
  tu_assert_forwards_clean(tp);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_pipe_free(tp);
  for (size_t i = 0; i < nrecs; i++) assert_false(recs[i].live); /* freed with the pipeline */
  free(pages);
  mlo_platform_close(plat);
}

/* Review D9: caller tensors that share a page are registered once, as the
 * union of their pages (a second registration on a registered page is
 * refused, and its tensor stayed pageable), read-only only where all of
 * them are; every byte of each is in a live registration, and nothing
 * stays registered after the pipeline. */
static void test_shared_page_registered_once(void **state) {
  (void)state;
  mlo_platform *plat = recording_host();
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *pages = aligned_alloc(page, 5 * page);
  assert_non_null(pages);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *enc = NULL, *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &enc));
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  tu_add_tensor(tp, dit, "w", 4096, 0);
  /* a and b share page 0, b runs into page 1, which c shares: one run;
   * d on page 3 alone; e fills page 4; c is written back, so the first run
   * is writable; d leaves the rest of its page to someone else (a heap
   * neighbour), and read-only is a whole page's, so it is writable too:
   * a copy into the neighbour would be refused (C7_pinning_cudafake failed
   * so when a test's buffer landed there); e alone is read-only */
  mlo_tensor *a = tu_add_tensor_at(tp, enc, "a", 1024, MLO_TENSOR_EXTERNAL, pages + 64);
  mlo_tensor *b = tu_add_tensor_at(tp, enc, "b", page, MLO_TENSOR_EXTERNAL, pages + 2048);
  mlo_tensor *c = tu_add_tensor_at(tp, enc, "c", 512, MLO_TENSOR_EXTERNAL | MLO_TENSOR_MUTABLE,
                                   pages + page + 2048 + 512);
  mlo_tensor *d = tu_add_tensor_at(tp, enc, "d", 256, MLO_TENSOR_EXTERNAL, pages + 3 * page + 8);
  mlo_tensor *e = tu_add_tensor_at(tp, enc, "e", page, MLO_TENSOR_EXTERNAL, pages + 4 * page);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  mlo_tensor *all[] = {a, b, c, d, e};
  size_t bytes[] = {1024, page, 512, 256, page};
  int want[] = {0, 0, 0, 0, 1};
  for (int i = 0; i < 5; i++)
    if (registered(mlo_tensor_host_data(all[i]), bytes[i]) != want[i])
      fail_msg("tensor %d: registration %d, expected %d", i,
               registered(mlo_tensor_host_data(all[i]), bytes[i]), want[i]);
  size_t live = 0;
  for (size_t i = 0; i < nrecs; i++) live += recs[i].live;
  assert_int_equal(live, 3);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(tu_forward(tp, enc));
  assert_ok(tu_forward(tp, dit));
  tu_assert_forwards_clean(tp);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_pipe_free(tp);
  for (size_t i = 0; i < nrecs; i++) assert_false(recs[i].live);
  free(pages);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_only_only_where_nothing_comes_back),
      cmocka_unit_test(test_shared_page_registered_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
