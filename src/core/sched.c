/*
 * sched.c — the pipeline's declared schedule (mlo_pipeline_set_schedule)
 * and its cursor: the calls one request makes, in order, and which of
 * them is expected next.  A policy plans from it (the budget policy's
 * next-use eviction and prefetch, docs/planner.md); the cursor follows
 * every acquire whatever the policy, and the least-recently-used tick
 * with it.
 *
 * The schedule is kept as runs (component, repeat), so a 40-step request is
 * four runs and every question costs O(runs), not O(steps).  The cursor is
 * (run, calls done in it): the call expected next is that run's component.
 *
 * Learning (mlo_pipeline_learn_schedule) records the calls as runs too,
 * and at a request's end makes the recording the schedule where it differs
 * from the one in force: the same representation, so a learned schedule is
 * exactly what a caller would have declared.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_MAX_CALLS ((uint64_t)1 << 32)
#define LEARN_MAX_RUNS 4096

int mlo_pipeline_set_schedule(mlo_pipeline *pipe, const mlo_schedule_entry *entries, size_t count) {
  if (!pipe || (count && !entries)) return MLO_EINVAL;
  struct mlo_sched_run *runs = NULL;
  size_t nruns = 0;
  uint64_t calls = 0;
  for (size_t i = 0; i < count; i++) {
    if (!entries[i].comp || entries[i].comp->pipe != pipe)
      return mlo_fail(pipe, MLO_EINVAL, "schedule entry %zu: %s", i,
                      entries[i].comp ? "a component of another pipeline" : "no component");
    calls += entries[i].repeat ? entries[i].repeat : 1;
    if (calls > SCHED_MAX_CALLS)
      return mlo_fail(pipe, MLO_EINVAL, "schedule: more than 2^32 calls in one request");
  }
  if (count && !(runs = mlo_calloc(count, sizeof *runs)))
    return mlo_fail(pipe, MLO_ENOMEM, "out of host memory for the schedule");
  for (size_t i = 0; i < count; i++) { /* consecutive calls of one component: one run */
    uint64_t n = entries[i].repeat ? entries[i].repeat : 1;
    if (nruns && runs[nruns - 1].comp == entries[i].comp)
      runs[nruns - 1].repeat += n;
    else
      runs[nruns++] = (struct mlo_sched_run){entries[i].comp, n};
  }
  /* A request that ends with the component it starts with is one run
   * across the wrap; the cursor's arithmetic does not need it merged. */
  MLO_LOCK_OR(&pipe->lock, (free(runs), mlo_reentered(pipe)));
  free(pipe->sched);
  pipe->sched = runs;
  pipe->nsched = nruns;
  pipe->cur_run = 0;
  pipe->cur_done = 0;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

int mlo_pipeline_get_schedule(mlo_pipeline *pipe, mlo_schedule_entry *out, size_t cap,
                              size_t *count) {
  if (!pipe || !count || (cap && !out)) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  for (size_t i = 0; i < pipe->nsched && i < cap; i++) {
    uint64_t n = pipe->sched[i].repeat;
    out[i] = (mlo_schedule_entry){pipe->sched[i].comp, n > UINT32_MAX ? UINT32_MAX : (uint32_t)n};
  }
  *count = pipe->nsched;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

int mlo_pipeline_learn_schedule(mlo_pipeline *pipe, bool learn) {
  if (!pipe) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  pipe->learning = learn;
  pipe->nrec = 0; /* a request is recorded from its first call */
  if (!learn) {
    free(pipe->rec);
    pipe->rec = NULL;
    pipe->reccap = 0;
  }
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

void mlo_sched_free(mlo_pipeline *pipe) {
  free(pipe->sched);
  pipe->sched = NULL;
  pipe->nsched = 0;
  free(pipe->rec);
  pipe->rec = NULL;
  pipe->nrec = pipe->reccap = 0;
}

/* Learning ends (the schedule in force stays): a recording restarted
 * mid-request would learn a piece of one as if it were a request. */
static void stop_learning(mlo_pipeline *pipe, const char *why) {
  mlo_logf(MLO_LOG_WARN, "schedule learning stopped: %s; the schedule in force stays", why);
  pipe->learning = false;
  pipe->nrec = 0;
}

/* Appends one call of c to the recording (a run of its own, or one more of
 * the last). */
static void record_call(mlo_pipeline *pipe, mlo_component *c) {
  if (pipe->nrec && pipe->rec[pipe->nrec - 1].comp == c) {
    pipe->rec[pipe->nrec - 1].repeat++;
    return;
  }
  if (pipe->nrec == LEARN_MAX_RUNS) {
    stop_learning(pipe, "a request of more than 4096 runs (declare its schedule)");
    return;
  }
  if (pipe->nrec == pipe->reccap) {
    size_t cap = pipe->reccap ? 2 * pipe->reccap : 16;
    struct mlo_sched_run *r = realloc(pipe->rec, cap * sizeof *r);
    if (!r) { /* the calls are served as ever, unprefetched */
      stop_learning(pipe, "out of host memory for the recording");
      return;
    }
    pipe->rec = r;
    pipe->reccap = cap;
  }
  pipe->rec[pipe->nrec++] = (struct mlo_sched_run){c, 1};
}

static bool has_dit(const struct mlo_sched_run *runs, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (runs[i].comp->role == MLO_ROLE_DIT) return true;
  return false;
}

static void log_learned(const mlo_pipeline *pipe) {
  char line[512];
  size_t len = 0;
  line[0] = '\0';
  for (size_t i = 0; i < pipe->nsched && len < sizeof line; i++) {
    int n = snprintf(line + len, sizeof line - len, "%s%s x%llu", i ? ", " : "",
                     pipe->sched[i].comp->name, (unsigned long long)pipe->sched[i].repeat);
    if (n < 0) break;
    len += (size_t)n;
  }
  mlo_logf(MLO_LOG_INFO, "schedule learned from the calls: %s", line);
}

/* Where the call of c ends the recorded request (c is the component the
 * request began with, called again after another and, in a pipeline with
 * DiTs, after a DiT ran), the request becomes the schedule where it
 * differs from the one in force and the recording restarts.  Returns
 * whether it did. */
static bool learn_boundary(mlo_pipeline *pipe, mlo_component *c) {
  const struct mlo_sched_run *rec = pipe->rec;
  size_t n = pipe->nrec;
  if (n < 2 || c != rec[0].comp || rec[n - 1].comp == c) return false;
  bool need_dit = false;
  for (size_t i = 0; i < pipe->ncomps && !need_dit; i++)
    need_dit = pipe->comps[i]->role == MLO_ROLE_DIT;
  if (need_dit && !has_dit(rec, n)) return false; /* a prompt's negative, not a request */
  bool same = pipe->nsched == n;
  for (size_t i = 0; same && i < n; i++)
    same = pipe->sched[i].comp == rec[i].comp && pipe->sched[i].repeat == rec[i].repeat;
  if (!same) {
    struct mlo_sched_run *runs = mlo_calloc(n, sizeof *runs);
    if (!runs) return false; /* keep the schedule in force: prefetches, not correctness */
    memcpy(runs, rec, n * sizeof *runs);
    free(pipe->sched);
    pipe->sched = runs;
    pipe->nsched = n;
    log_learned(pipe);
  }
  pipe->nrec = 0;
  return true;
}

uint64_t mlo_sched_next_use(const mlo_pipeline *pipe, const mlo_component *c) {
  uint64_t d = 0;
  for (size_t k = 0; k < pipe->nsched; k++) {
    const struct mlo_sched_run *r = &pipe->sched[(pipe->cur_run + k) % pipe->nsched];
    if (r->comp == c) return d;
    d += k ? r->repeat : r->repeat - pipe->cur_done;
  }
  return UINT64_MAX;
}

static void step_cursor(mlo_pipeline *pipe) {
  if (++pipe->cur_done < pipe->sched[pipe->cur_run].repeat) return;
  pipe->cur_run = (pipe->cur_run + 1) % pipe->nsched;
  pipe->cur_done = 0;
}

void mlo_sched_advance(mlo_pipeline *pipe, mlo_component *c) {
  c->last_use = ++pipe->tick;
  if (pipe->learning) {
    if (learn_boundary(pipe, c)) { /* the cursor at this call, which steps it below */
      pipe->cur_run = 0;
      pipe->cur_done = 0;
    }
    record_call(pipe, c);
  }
  if (!pipe->nsched) return;
  if (pipe->sched[pipe->cur_run].comp == c) {
    step_cursor(pipe);
    return;
  }
  /* Off the schedule: resynchronize at the next run of c, counting this
   * call as its first; a component the schedule never calls moves nothing. */
  for (size_t k = 1; k < pipe->nsched; k++) {
    size_t r = (pipe->cur_run + k) % pipe->nsched;
    if (pipe->sched[r].comp != c) continue;
    pipe->cur_run = r;
    pipe->cur_done = 0;
    step_cursor(pipe);
    return;
  }
}
