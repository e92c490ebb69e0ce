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
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <stdlib.h>

#define SCHED_MAX_CALLS ((uint64_t)1 << 32)

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

void mlo_sched_free(mlo_pipeline *pipe) {
  free(pipe->sched);
  pipe->sched = NULL;
  pipe->nsched = 0;
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
