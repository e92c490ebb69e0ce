/*
 * placement.c — which device each component of a pipeline of several
 * devices lives on (docs/placement.md).  At enable, before anything is
 * materialized, the components the caller did not pin are placed to move
 * the fewest bytes per request: each device replays the schedule's calls of
 * its own components (the declared schedule, or one request in role order
 * without one) under the policy's rule (strict: exclusion by role; budget:
 * what fits, evicting as budget.c does: among those that alone free
 * enough the smallest, then the farthest next use; a component larger
 * than the room streams and moves its streamed blocks at every call),
 * warm, as a server runs, and the device's bytes are what its loads copy.  The same measure
 * the disk tier plans host memory with: bytes times loads.
 *
 * The model is the policy's rule, not its run: joins change when bytes
 * move, not how many, but a prefetch may displace another component than
 * the rule would, so its one-device figure can differ from a one-device
 * run's under the budget policy; the placed figure is what `mlo run` then
 * counts where nothing is left to displace (cli_DevicesTests).  Components
 * that share storage (an alias of another's tensor) stay on one device.
 */
#include "base/sysio.h"
#include "core/internal.h"
#include "core/policy.h"

#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLACE_MAX_TRIES 65536 /* assignments tried exhaustively; more: greedy */
#define PLACE_UNFIT UINT64_MAX
#define PLACE_COUNTED 4     /* requests counted after the first */
#define PLACE_MAX_COMPS 256 /* components placed (an assignment is a byte each) */

/* What the model knows of one component: its block's bytes and, per
 * device, the bytes a streamed plan moves at each call there (0: it fits
 * whole; PLACE_UNFIT: it cannot run there). */
typedef struct {
  uint64_t bytes;
  uint64_t streamed[MLO_MAX_DEVICES];
} place_comp;

typedef struct {
  mlo_pipeline *pipe;
  const struct mlo_policy_ops *pol;
  place_comp *pc;
  struct mlo_sched_run *calls; /* one request */
  size_t ncalls;
  uint64_t room[MLO_MAX_DEVICES];
  /* the model's working state, one device at a time */
  bool *res;
  /* which components share storage (a tensor of i references one of j's):
   * a forward reads the other's block, so both live on one device */
  bool *shares; /* ncomps x ncomps */
} place_model;

/* Calls from call k (exclusive) until comp i's next one, cyclically. */
static size_t next_call(const place_model *m, size_t k, size_t i) {
  for (size_t d = 1; d <= m->ncalls; d++)
    if (m->calls[(k + d) % m->ncalls].comp->index == i) return d;
  return SIZE_MAX;
}

/* The device memory comp i takes on device d while resident: its block,
 * or the whole room where it streams there. */
static uint64_t takes(const place_model *m, size_t i, size_t d) {
  return m->pc[i].streamed[d] ? m->room[d] : m->pc[i].bytes;
}

/* The bytes device d's loads copy in one warm request, its components
 * those with at[i] == d; PLACE_UNFIT where one cannot run there. */
static uint64_t device_bytes(place_model *m, const unsigned char *at, size_t d) {
  mlo_pipeline *pipe = m->pipe;
  uint64_t room = m->room[d], used = 0, moved = 0;
  memset(m->res, 0, pipe->ncomps * sizeof *m->res);
  for (size_t i = 0; i < pipe->ncomps; i++)
    if (at[i] == d && m->pc[i].streamed[d] == PLACE_UNFIT) return PLACE_UNFIT;
  /* the first request warms the device up; the rest are counted, and
   * averaged: next-use eviction may settle into a cycle of two requests */
  for (int pass = 0; pass <= PLACE_COUNTED; pass++) {
    for (size_t k = 0; k < m->ncalls; k++) {
      const mlo_component *x = m->calls[k].comp;
      size_t i = x->index;
      if (at[i] != d) continue;
      const place_comp *p = &m->pc[i];
      uint64_t need = takes(m, i, d);
      for (size_t j = 0; j < pipe->ncomps; j++) /* the rule's exclusions */
        if (j != i && m->res[j] && m->pol && m->pol->excludes &&
            m->pol->excludes(x, pipe->comps[j])) {
          m->res[j] = false;
          used -= takes(m, j, d);
        }
      uint64_t cost = p->streamed[d] * m->calls[k].repeat; /* every call streams */
      if (!m->res[i]) {
        while (used + need > room) { /* budget.c's rule, without its LRU ticks */
          size_t victim = SIZE_MAX, far = 0;
          uint64_t short_by = used + need - room, vbytes = 0;
          for (size_t j = 0; j < pipe->ncomps; j++) {
            if (!m->res[j] || j == i) continue;
            size_t nx = next_call(m, k, j);
            uint64_t bj = takes(m, j, d);
            if (victim == SIZE_MAX ||
                mlo_budget_better_victim(bj, nx, 0, vbytes, far, 0, short_by)) {
              victim = j;
              far = nx;
              vbytes = bj;
            }
          }
          if (victim == SIZE_MAX) break;
          m->res[victim] = false;
          used -= takes(m, victim, d);
        }
        m->res[i] = true;
        used += need;
        cost += p->bytes - p->streamed[d]; /* what it keeps, loaded once per residency */
      }
      if (pass) moved += cost;
    }
  }
  return moved / PLACE_COUNTED;
}

/* Two components that share storage on two devices: i, or SIZE_MAX. */
static size_t split_pair(const place_model *m, const unsigned char *at, size_t *other) {
  size_t n = m->pipe->ncomps;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++)
      if (m->shares[i * n + j] && at[i] != at[j]) {
        *other = j;
        return i;
      }
  return SIZE_MAX;
}

static uint64_t assignment_bytes(place_model *m, const unsigned char *at) {
  size_t other;
  if (split_pair(m, at, &other) != SIZE_MAX) return PLACE_UNFIT;
  uint64_t sum = 0;
  for (size_t d = 0; d < m->pipe->ndevs; d++) {
    uint64_t b = device_bytes(m, at, d);
    if (b == PLACE_UNFIT) return PLACE_UNFIT;
    sum += b;
  }
  return sum;
}

/* One request's calls: the declared schedule, or each encoder, DiT and VAE
 * once in role order then index order. */
static int request_calls(place_model *m) {
  mlo_pipeline *pipe = m->pipe;
  if (pipe->nsched) {
    m->calls = mlo_calloc(pipe->nsched, sizeof *m->calls);
    if (!m->calls) return MLO_ENOMEM;
    memcpy(m->calls, pipe->sched, pipe->nsched * sizeof *m->calls);
    m->ncalls = pipe->nsched;
    return MLO_OK;
  }
  m->calls = mlo_calloc(pipe->ncomps ? pipe->ncomps : 1, sizeof *m->calls);
  if (!m->calls) return MLO_ENOMEM;
  const mlo_role order[] = {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE};
  for (size_t r = 0; r < sizeof order / sizeof *order; r++)
    for (size_t i = 0; i < pipe->ncomps; i++)
      if (pipe->comps[i]->role == order[r])
        m->calls[m->ncalls++] = (struct mlo_sched_run){pipe->comps[i], 1};
  return MLO_OK;
}

/* Each component's bytes and what it streams on each device, and which
 * share storage. */
static void measure(place_model *m) {
  mlo_pipeline *pipe = m->pipe;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    for (size_t k = 0; k < c->ntensors; k++) {
      const mlo_tensor *t = c->tensors[k];
      if (t->target && t->target->comp != c) {
        size_t j = t->target->comp->index;
        m->shares[i * pipe->ncomps + j] = m->shares[j * pipe->ncomps + i] = true;
      }
    }
    place_comp *p = &m->pc[i];
    p->bytes = mlo_comp_bytes(c);
    for (size_t d = 0; d < pipe->ndevs; d++)
      p->streamed[d] = p->bytes <= m->room[d] ? 0
                       : m->pol && m->pol->streams
                           ? mlo_stream_streamed_bytes(c, m->room[d], MLO_STREAM_SLOTS)
                           : PLACE_UNFIT;
  }
}

/* The best assignment: every one of the free components' when there are
 * few enough (the first of the least bytes: earlier devices first), else
 * one at a time, largest first, each where the bytes so far are least. */
static uint64_t search(place_model *m, unsigned char *best) {
  mlo_pipeline *pipe = m->pipe;
  size_t n = pipe->ncomps, nd = pipe->ndevs, nfree = 0;
  unsigned char at[PLACE_MAX_COMPS];
  size_t freei[PLACE_MAX_COMPS];
  for (size_t i = 0; i < n; i++) {
    at[i] = (unsigned char)(pipe->comps[i]->pinned_dev >= 0 ? pipe->comps[i]->pinned_dev : 0);
    if (pipe->comps[i]->pinned_dev < 0) freei[nfree++] = i;
  }
  uint64_t tries = 1;
  for (size_t k = 0; k < nfree && tries <= PLACE_MAX_TRIES; k++) tries *= nd;
  uint64_t least = PLACE_UNFIT;
  memcpy(best, at, n);
  if (tries <= PLACE_MAX_TRIES) {
    for (uint64_t t = 0; t < tries; t++) {
      uint64_t v = t;
      for (size_t k = 0; k < nfree; k++, v /= nd) at[freei[k]] = (unsigned char)(v % nd);
      uint64_t b = assignment_bytes(m, at);
      if (b < least) {
        least = b;
        memcpy(best, at, n);
      }
    }
    return least;
  }
  for (size_t k = 0; k < nfree; k++) /* largest first */
    for (size_t q = k + 1; q < nfree; q++)
      if (m->pc[freei[q]].bytes > m->pc[freei[k]].bytes) {
        size_t s = freei[k];
        freei[k] = freei[q];
        freei[q] = s;
      }
  for (size_t k = 0; k < nfree; k++) at[freei[k]] = MLO_MAX_DEVICES; /* nowhere yet */
  for (size_t k = 0; k < nfree; k++) {
    uint64_t here = PLACE_UNFIT;
    unsigned char pick = 0;
    for (size_t d = 0; d < nd; d++) {
      at[freei[k]] = (unsigned char)d;
      uint64_t b = assignment_bytes(m, at);
      if (b < here) {
        here = b;
        pick = (unsigned char)d;
      }
    }
    at[freei[k]] = pick;
  }
  memcpy(best, at, n);
  return assignment_bytes(m, at);
}

/* Moves c to device d: not resident, its events (of the old device) gone. */
static int rehome(mlo_component *c, size_t d) {
  if (c->dev->index == d) return MLO_OK;
  if (mlo_res_is_resident(c)) {
    int rc = mlo_res_evict(c);
    if (rc) return rc;
  }
  mlo_res_finish_writeback(c);
  mlo_stream_drop(c);
  mlo_res_release_events(c);
  c->dev = &c->pipe->devs[d];
  return MLO_OK;
}

/* Names the components that fit no device, with the sizes. */
static int unplaceable(place_model *m, const unsigned char *at) {
  mlo_pipeline *pipe = m->pipe;
  char a[32], b[32];
  size_t y, x = split_pair(m, at, &y);
  if (x != SIZE_MAX)
    return mlo_fail(pipe, MLO_EINVAL,
                    "'%s' and '%s' share tensors, so they run on one device; they are pinned to "
                    "devices %u and %u",
                    pipe->comps[x]->name, pipe->comps[y]->name, at[x], at[y]);
  for (size_t i = 0; i < pipe->ncomps; i++) {
    size_t d = at[i];
    if (m->pc[i].streamed[d] != PLACE_UNFIT) continue;
    mlo_component *c = pipe->comps[i];
    return mlo_fail(
        pipe, MLO_ENOMEM_DEVICE, "'%s' (%s) cannot run on device %zu%s: its room there is %s%s",
        c->name, mlo_format_size(m->pc[i].bytes, a, sizeof a), d,
        c->pinned_dev >= 0 ? ", where it is pinned" : "", mlo_format_size(m->room[d], b, sizeof b),
        m->pol && m->pol->streams ? " and it cannot stream in it" : "");
  }
  return mlo_fail(pipe, MLO_ENOMEM_DEVICE, "no placement of the components fits the devices");
}

static void log_placement(const place_model *m, const unsigned char *at) {
  mlo_pipeline *pipe = m->pipe;
  if (!mlo_log_enabled(MLO_LOG_INFO)) return;
  char line[1024];
  size_t len = 0;
  for (size_t d = 0; d < pipe->ndevs && len < sizeof line; d++) {
    len += (size_t)snprintf(line + len, sizeof line - len, "%sdevice %zu:", d ? "; " : "", d);
    for (size_t i = 0; i < pipe->ncomps && len < sizeof line; i++)
      if (at[i] == d)
        len += (size_t)snprintf(line + len, sizeof line - len, " %s%s", pipe->comps[i]->name,
                                pipe->comps[i]->pinned_dev >= 0 ? " (pinned)" : "");
  }
  char a[32], b[32];
  mlo_logf(MLO_LOG_INFO, "placed %s: %s moved per request as modelled (one device: %s)", line,
           mlo_format_size(pipe->place_moved, a, sizeof a),
           mlo_format_size(pipe->place_one, b, sizeof b));
}

int mlo_place(mlo_pipeline *pipe, const struct mlo_policy_ops *pol, const uint64_t *room) {
  if (pipe->ndevs < 2 || !pipe->ncomps) return MLO_OK;
  if (pipe->ncomps > PLACE_MAX_COMPS)
    return mlo_fail(pipe, MLO_EUNSUPPORTED, "placement takes at most %d components",
                    PLACE_MAX_COMPS);
  place_model m = {.pipe = pipe, .pol = pol};
  memcpy(m.room, room, pipe->ndevs * sizeof *room);
  for (size_t d = 0; d < pipe->ndevs; d++) pipe->devs[d].place_room = room[d];
  unsigned char best[PLACE_MAX_COMPS], one[PLACE_MAX_COMPS] = {0};
  int rc = MLO_OK;
  if (!(m.pc = mlo_calloc(pipe->ncomps, sizeof *m.pc)) ||
      !(m.res = mlo_calloc(pipe->ncomps, sizeof *m.res)) ||
      !(m.shares = mlo_calloc(pipe->ncomps * pipe->ncomps, sizeof *m.shares)) ||
      request_calls(&m) != MLO_OK) {
    rc = mlo_fail(pipe, MLO_ENOMEM, "out of host memory placing the components");
    goto out;
  }
  measure(&m);
  uint64_t moved = search(&m, best);
  if (moved == PLACE_UNFIT) {
    rc = unplaceable(&m, best);
    goto out;
  }
  pipe->place_moved = moved;
  pipe->place_one = assignment_bytes(&m, one);
  for (size_t i = 0; i < pipe->ncomps && !rc; i++) rc = rehome(pipe->comps[i], best[i]);
  pipe->placed = !rc;
  if (!rc) log_placement(&m, best);
out:
  free(m.pc);
  free(m.res);
  free(m.shares);
  free(m.calls);
  return rc;
}

int mlo_component_set_device(mlo_component *c, int index) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  if (index != MLO_DEVICE_ANY && (index < 0 || (size_t)index >= pipe->ndevs))
    return mlo_fail(pipe, MLO_EINVAL, "'%s': device %d is not one of the pipeline's %zu", c->name,
                    index, pipe->ndevs);
  int rc = mlo_lock_both(pipe);
  if (rc) return rc;
  if (pipe->enabled)
    rc = mlo_fail(pipe, MLO_ESTATE, "'%s': a device is chosen before offload is enabled", c->name);
  else if (c->users)
    rc = mlo_fail(pipe, MLO_EBUSY, "'%s' executes: its device cannot change now", c->name);
  else if (index != MLO_DEVICE_ANY)
    rc = rehome(c, (size_t)index);
  if (!rc) c->pinned_dev = index;
  mlo_unlock_both(pipe);
  return rc;
}

int mlo_pipeline_get_placement(mlo_pipeline *pipe, mlo_placement *out) {
  if (!pipe || !out || out->size < sizeof *out) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  size_t size = out->size;
  memset(out, 0, sizeof *out);
  out->size = size;
  out->devices = pipe->ndevs;
  if (pipe->placed) {
    out->moved_bytes = pipe->place_moved;
    out->one_device_bytes = pipe->place_one;
  }
  for (size_t d = 0; d < pipe->ndevs; d++) out->room_bytes[d] = pipe->devs[d].place_room;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

int mlo_pipeline_get_device_stats(mlo_pipeline *pipe, size_t index, mlo_device_stats *out) {
  if (!pipe || !out || out->size < sizeof *out || index >= pipe->ndevs) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  const struct mlo_device *d = &pipe->devs[index];
  out->device_bytes = d->bytes;
  out->peak_device_bytes = d->peak;
  out->budget_bytes = pipe->policy && pipe->policy->budget ? d->budget : 0;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}
