/*
 * guard.c — the helpers every file of core calls, in a file of their own
 * below the others so that none of them imports the rest: recording a
 * failure in the pipeline's message, refusing a call from inside the
 * pipeline's own callback, taking both of its locks, the lists of threads
 * holding a component or a streamed block (and the kept blocks begun), and the agreement step
 * before a collective operation (dist.h).  They once lived in pipeline.c, which made the six files
 * of core import each other in a circle.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include "base/log.h"
#include "dist/dist.h"
#include "platform/platform.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int mlo_fail(mlo_pipeline *pipe, int status, const char *fmt, ...) {
  if (pipe) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pipe->errmsg, sizeof pipe->errmsg, fmt, ap);
    va_end(ap);
  }
  return status;
}

int mlo_reentered(mlo_pipeline *pipe) {
  return mlo_fail(pipe, MLO_EDEADLK,
                  "called from inside a callback that holds this pipeline's lock (trace, log, "
                  "progress or delegate callbacks must not call these functions; see mlo.h)");
}

void mlo_log_reentry(const char *func) {
  mlo_logf(MLO_LOG_ERROR, "%s: called from inside a callback of the same pipeline; refused", func);
}

int mlo_lock_both(mlo_pipeline *pipe) {
  if (pthread_mutex_lock(&pipe->setup_lock)) return mlo_reentered(pipe);
  if (pthread_mutex_lock(&pipe->lock)) {
    pthread_mutex_unlock(&pipe->setup_lock);
    return mlo_reentered(pipe);
  }
  return MLO_OK;
}

void mlo_unlock_both(mlo_pipeline *pipe) {
  pthread_mutex_unlock(&pipe->lock);
  pthread_mutex_unlock(&pipe->setup_lock);
}

/* Component names for the agreement's messages; the id is the component's
 * index times 8 plus the step. */
static const char *collective_name(uint64_t id, void *user) {
  mlo_pipeline *pipe = user;
  static const char *const steps[] = {"?",    "materialize",   "loaded",           "load", "gather",
                                      "free", "compare files", "hash the files of"};
  static _Thread_local char buf[192];
  if (id & MLO_DIST_PROGRAM_STEP) { /* another rank is at the program's own step */
    snprintf(buf, sizeof buf, "the program's own step %llu (past its pipeline)",
             (unsigned long long)(id & ~MLO_DIST_PROGRAM_STEP));
    return buf;
  }
  uint64_t index = id >> 3;
  const char *step = steps[id & 7];
  if (index == 0xffffff)
    snprintf(buf, sizeof buf, "%s the pipeline", step);
  else if (index < pipe->ncomps)
    snprintf(buf, sizeof buf, "%s '%s'", step, pipe->comps[index]->name);
  else
    snprintf(buf, sizeof buf, "%s component #%llu", step, (unsigned long long)index);
  return buf;
}

uint64_t mlo_collective_id(const mlo_component *c, unsigned step) {
  return ((c ? (uint64_t)c->index : 0xffffffu) << 3) | step;
}

int mlo_collective_failed(mlo_pipeline *pipe, int rc, const char *err) {
  char mine[32];
  snprintf(mine, sizeof mine, "rank %d: ", pipe->dist.rank);
  return mlo_fail(pipe, rc, "%s%s", strncmp(err, mine, strlen(mine)) ? mine : "", err);
}

int mlo_collective(mlo_pipeline *pipe, const mlo_component *c, unsigned step, uint64_t check,
                   int status, const char *msg, bool *together) {
  if (together) *together = true;
  if (!pipe->comm) return MLO_OK;
  char err[512];
  pipe->dist.collectives++;
  int rc = mlo_dist_agree(pipe->comm, mlo_collective_id(c, step), check, status, msg,
                          collective_name, pipe, together, err, sizeof err);
  return rc ? mlo_collective_failed(pipe, rc, err) : MLO_OK;
}

int mlo_check_device_gather(mlo_pipeline *pipe, char *why, size_t whylen) {
  mlo_platform *p = pipe->platform;
  if (!pipe->comm || !pipe->sharded || pipe->shard_resident || p->caps.host_addressable)
    return MLO_OK;
  void *coll = mlo_dist_nccl(pipe->comm);
  if (coll && coll == pipe->coll_checked) return MLO_OK;
  int rc = mlo_plat_coll_check(p, coll, mlo_dist_node_size(pipe->comm),
                               mlo_dist_node_rank(pipe->comm), why, whylen);
  if (!rc) pipe->coll_checked = coll;
  return rc;
}

int mlo_holders_add(pthread_t **holders, size_t *cap, int *n) {
  if ((size_t)*n == *cap) {
    size_t grown_cap = *cap ? *cap * 2 : 4;
    pthread_t *grown = mlo_realloc(*holders, grown_cap * sizeof *grown);
    if (!grown) return MLO_ENOMEM;
    *holders = grown;
    *cap = grown_cap;
  }
  (*holders)[(*n)++] = pthread_self();
  return MLO_OK;
}

void mlo_holders_drop(pthread_t *holders, int *n) {
  pthread_t self = pthread_self();
  int k = 0;
  for (int i = *n - 1; i >= 0; i--)
    if (pthread_equal(holders[i], self)) {
      k = i;
      break;
    }
  holders[k] = holders[--*n];
}

bool mlo_holders_has(const pthread_t *holders, int n) {
  pthread_t self = pthread_self();
  for (int i = 0; i < n; i++)
    if (pthread_equal(holders[i], self)) return true;
  return false;
}

int mlo_begun_add(mlo_component *c, size_t block) {
  if (c->nbegun == c->begun_cap) {
    size_t cap = c->begun_cap ? c->begun_cap * 2 : 8;
    struct mlo_begun *grown = mlo_realloc(c->begun, cap * sizeof *grown);
    if (!grown) return MLO_ENOMEM;
    c->begun = grown;
    c->begun_cap = cap;
  }
  c->begun[c->nbegun++] = (struct mlo_begun){.block = block, .thread = pthread_self()};
  return MLO_OK;
}

bool mlo_begun_end(mlo_component *c, size_t block) {
  pthread_t self = pthread_self();
  for (size_t i = c->nbegun; i-- > 0;)
    if (c->begun[i].block == block && pthread_equal(c->begun[i].thread, self)) {
      c->begun[i] = c->begun[--c->nbegun];
      return true;
    }
  return false;
}

bool mlo_begun_open(const mlo_component *c, size_t block) {
  for (size_t i = 0; i < c->nbegun; i++)
    if (c->begun[i].block == block) return true;
  return false;
}

size_t mlo_begun_drop_thread(mlo_component *c, bool all) {
  pthread_t self = pthread_self();
  size_t dropped = 0;
  for (size_t i = c->nbegun; i-- > 0;)
    if (all || pthread_equal(c->begun[i].thread, self)) {
      c->begun[i] = c->begun[--c->nbegun];
      dropped++;
    }
  return dropped;
}
