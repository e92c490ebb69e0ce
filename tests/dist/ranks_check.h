/*
 * ranks_check.h — what the multi-rank test programs share: a CHECK that
 * counts a failure and goes on (a rank that gave up on an assertion would
 * leave the others waiting in a collective; each program agrees on the
 * count at the end), and the reference workload's digest of a pipeline,
 * the figure every rank must match against one process's.
 */
#ifndef MLO_TESTS_RANKS_CHECK_H
#define MLO_TESTS_RANKS_CHECK_H

#include "mlo/mlo.h"
#include "workload/workload.h"

#include <stdio.h>
#include <stdlib.h>

static int rank, nranks, failures;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed: ", rank, __FILE__, __LINE__, #cond);      \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)

/* The digest of 4 steps (3 on the first DiT) under strict offload. */
static uint64_t digest_of(mlo_platform *p, mlo_pipeline *pipe) {
  mlo_workload *w = NULL;
  mlo_workload_call *calls = NULL;
  size_t n = 0;
  uint64_t d = 0;
  int rc = mlo_workload_open(p, &w, NULL, 0);
  if (!rc) rc = mlo_workload_schedule(pipe, 4, 3, &calls, &n);
  mlo_offload_settings set = MLO_OFFLOAD_SETTINGS_INIT;
  if (!rc) rc = mlo_offload_enable(pipe, &set);
  if (!rc) rc = mlo_workload_run(w, calls, n, &d, NULL, NULL, NULL);
  CHECK(rc == MLO_OK, "workload: %s: %s", mlo_err_name(rc), mlo_pipeline_errmsg(pipe));
  mlo_offload_disable(pipe);
  free(calls);
  mlo_workload_close(w);
  return d;
}

#endif
