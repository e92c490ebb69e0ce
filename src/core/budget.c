/*
 * budget.c — the BUDGET residency policy (policy.h, docs/planner.md): keep
 * what fits in a device budget, evict by the declared schedule's next use
 * (Belady's rule, weighed by bytes), and prefetch what the schedule calls
 * next on the copy queue while the current compute runs.
 *
 * Every decision is made with the pipeline lock held, and every move goes
 * through residency.c, so the ordering rules (C8: compute waits on the
 * load's event; C9: a block is freed stream-ordered after the work that
 * uses it) hold for prefetches exactly as for demand loads.  A component
 * with users (executing, or acquired) is never a victim.  The policy's
 * state (the budget) is behind pipe->policy_state while it is in force.
 */
#include "base/sysio.h"
#include "core/internal.h"
#include "core/policy.h"

#include <stdlib.h>

/* Each device's budget is its own (struct mlo_device's budget): a
 * component's room, victims and prefetches are of its device alone, so a
 * switch on one device never waits for another. */
struct budget_state {
  bool join; /* switches may be joined (MLO_NO_JOIN=1 turns it off, to measure) */
};

static struct budget_state *B(const mlo_pipeline *pipe) {
  return pipe->policy_state;
}

/* ---- eviction by next use ---------------------------------------------- */

/* The idle resident component to evict for `short_by` bytes of room.
 * Belady's rule (farthest next use, then least recently used) is optimal
 * in misses when components are the same size; ours are not, and in a
 * repeating schedule every component comes back, so bytes decide: among
 * the components that alone free enough room, the smallest, then the
 * farthest next use, then the least recently used; where none does alone,
 * the farthest (it goes, and the search runs again).  With `limited`, only
 * components used strictly later than `after` calls from now qualify (a
 * prefetch may only displace what is needed after what it loads).  NULL if
 * none qualifies. */
bool mlo_budget_better_victim(uint64_t bytes, uint64_t next, uint64_t last, uint64_t best_bytes,
                              uint64_t best_next, uint64_t best_last, uint64_t short_by) {
  bool covers = bytes >= short_by, best_covers = best_bytes >= short_by;
  if (covers != best_covers) return covers;
  if (covers && bytes != best_bytes) return bytes < best_bytes;
  if (next != best_next) return next > best_next;
  return last < best_last;
}

static bool better_victim(const mlo_component *o, uint64_t next, const mlo_component *best,
                          uint64_t best_next, uint64_t short_by) {
  return !best || mlo_budget_better_victim(mlo_res_bytes(o), next, o->last_use, mlo_res_bytes(best),
                                           best_next, best->last_use, short_by);
}

static mlo_component *pick_victim(mlo_pipeline *pipe, const struct mlo_device *dev,
                                  const mlo_component *keep, bool limited, uint64_t after,
                                  uint64_t short_by) {
  mlo_component *best = NULL;
  uint64_t best_next = 0;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *o = pipe->comps[i];
    if (o == keep || o->dev != dev || o->users || mlo_disk_pending(o) || !mlo_res_is_resident(o) ||
        !mlo_res_bytes(o))
      continue; /* in use, or still being read from disk */
    uint64_t next = mlo_sched_next_use(pipe, o);
    if (limited && next <= after) continue;
    if (better_victim(o, next, best, best_next, short_by)) {
      best = o;
      best_next = next;
    }
  }
  return best;
}

/* Bytes missing for `need` more within dev's budget (0 if it fits). */
static uint64_t short_by(const struct mlo_device *dev, uint64_t need) {
  uint64_t want = dev->bytes + need;
  return want > dev->budget ? want - dev->budget : 0;
}

static bool evict_one(mlo_pipeline *pipe, const mlo_component *keep) {
  mlo_component *v = pick_victim(pipe, keep->dev, keep, false, 0, UINT64_MAX);
  return v && mlo_res_evict(v) == MLO_OK;
}

/* A resident component still being read from disk and held by nobody:
 * eviction gets its room once the reader is done. */
static bool disk_busy_idle(const mlo_pipeline *pipe, const struct mlo_device *dev) {
  for (size_t i = 0; i < pipe->ncomps; i++)
    if (pipe->comps[i]->dev == dev && mlo_disk_pending(pipe->comps[i]) && !pipe->comps[i]->users)
      return true;
  return false;
}

/* A component this thread holds on any device (the last one found; NULL:
 * none), and in *mine the bytes of those resident on dev: room there that
 * never comes back while this thread waits. */
static const mlo_component *held_here(const mlo_pipeline *pipe, const struct mlo_device *dev,
                                      uint64_t *mine) {
  const mlo_component *held = NULL;
  *mine = 0;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    const mlo_component *o = pipe->comps[i];
    if (o->users && mlo_held_by_this_thread(o)) {
      *mine += mlo_res_is_resident(o) && o->dev == dev ? mlo_res_bytes(o) : 0;
      held = o;
    }
  }
  return held;
}

static int make_room(mlo_pipeline *pipe, mlo_component *c) {
  struct mlo_device *dev = c->dev;
  uint64_t need = mlo_res_bytes(c);
  char a[32], b[32];
  if (need > dev->budget)
    return mlo_fail(pipe, MLO_ENOMEM_DEVICE, "'%s' (%s) does not fit in the budget of %s", c->name,
                    mlo_format_size(need, a, sizeof a), mlo_format_size(dev->budget, b, sizeof b));
  while (dev->bytes + need > dev->budget) {
    mlo_component *v = pick_victim(pipe, dev, c, false, 0, short_by(dev, need));
    if (v) {
      int rc = mlo_res_evict(v);
      if (rc) return rc;
      continue;
    }
    /* A load from disk still being issued frees its room to eviction when
     * the reader is done, whatever this thread holds: wait for it. */
    if (disk_busy_idle(pipe, dev)) return MLO_EBUSY;
    /* Everything resident is in use.  Room held by this thread never comes
     * back while it waits; room held by others does, at their release —
     * unless they wait for room this thread holds.  So a thread that holds
     * anything does not wait (no cycle can form); one that holds nothing
     * does, and every holder it waits for can finish. */
    uint64_t mine = 0;
    const mlo_component *held = held_here(pipe, dev, &mine);
    if (held && mine + need > dev->budget)
      return mlo_fail(pipe, MLO_EDEADLK,
                      "'%s' (%s) needs room in the budget of %s that this thread holds ('%s')",
                      c->name, mlo_format_size(need, a, sizeof a),
                      mlo_format_size(dev->budget, b, sizeof b), held->name);
    if (held)
      return mlo_fail(pipe, MLO_EDEADLK,
                      "'%s' needs room in the budget that other threads hold, and this thread "
                      "holds '%s': waiting could deadlock",
                      c->name, held->name);
    return MLO_EBUSY;
  }
  return MLO_OK;
}

static int fit(mlo_pipeline *pipe, struct mlo_device *dev) {
  while (dev->bytes > dev->budget) {
    mlo_component *v = pick_victim(pipe, dev, NULL, false, 0, dev->bytes - dev->budget);
    if (!v && disk_busy_idle(pipe, dev)) { /* its reads end without this thread */
      pthread_cond_wait(&pipe->idle, &pipe->lock);
      continue;
    }
    if (!v)
      return mlo_fail(pipe, MLO_ENOMEM_DEVICE,
                      "the components in use hold more than the budget of %s",
                      mlo_format_size(dev->budget, (char[32]){0}, 32));
    int rc = mlo_res_evict(v);
    if (rc) return rc;
  }
  return MLO_OK;
}

/* A component larger than the budget streams its blocks (stream.c)
 * through a footprint within it; the others move whole.  A plan is made
 * for a component that is not resident (a resident one keeps the plan it
 * was loaded with until it is evicted: a plan left from another budget is
 * made again before its next load).  The budget is c's device's. */
static int ensure_plan(mlo_component *c) {
  if (mlo_res_is_resident(c) || !c->materialized) return MLO_OK;
  uint64_t budget = c->dev->budget;
  bool want = c->block_bytes > budget;
  if (want && c->stream && mlo_stream_room(c) == budget) return MLO_OK;
  if (!want) {
    mlo_stream_drop(c);
    return MLO_OK;
  }
  int rc = mlo_stream_plan(c, budget, MLO_STREAM_SLOTS);
  /* on disk, partial: its streamed blocks into host memory (else each is
   * read from its files at each use, stream.c) */
  if (!rc && (rc = mlo_disk_fill_streamed(c)))
    mlo_stream_drop(c); /* not read: no plan may copy them (the next admit plans again) */
  return rc;
}

/* ---- prefetch ---------------------------------------------------------- */

/* Prefetches t, whose run ends `after` calls from now; false where it
 * cannot now (the rest of its device's must wait for their turn). */
static bool prefetch_one(mlo_pipeline *pipe, mlo_component *t, uint64_t after) {
  struct mlo_device *dev = t->dev;
  /* Only what is needed after t's run and at least one call more: a
   * component displaced now and called right after t would have to come
   * back with nothing to hide its copy under — the stall moves from t to
   * it, and the bytes double (an encoder prefetched over the first DiT). */
  while (dev->bytes + mlo_res_bytes(t) > dev->budget) {
    mlo_component *v = pick_victim(pipe, dev, t, true, after, short_by(dev, mlo_res_bytes(t)));
    if (!v || mlo_res_evict(v) != MLO_OK) return false;
  }
  /* A failed prefetch changes nothing (mlo_res_load rolls back) and costs
   * nothing but the overlap: the forward loads on demand. */
  if (mlo_res_load(t) != MLO_OK) {
    mlo_logf(MLO_LOG_DEBUG, "prefetch of %s not issued: %s", t->name, pipe->errmsg);
    return false;
  }
  if (!mlo_res_bytes(t)) return true; /* empty (C13): nothing moved, nothing to count */
  t->stats.prefetches++;
  mlo_res_trace(t, MLO_TRACE_PREFETCH, mlo_res_bytes(t));
  return true;
}

/* Each device's in schedule order: the walk stops on a device at the first
 * component it cannot prefetch there, and goes on for the others. */
static void prefetch(mlo_pipeline *pipe) {
  if (!pipe->settings.prefetch || !pipe->nsched) return;
  uint64_t d = 0;
  bool stopped[MLO_MAX_DEVICES] = {false};
  size_t nstopped = 0;
  for (size_t k = 0; k < pipe->nsched && nstopped < pipe->ndevs; k++) {
    const struct mlo_sched_run *r = &pipe->sched[(pipe->cur_run + k) % pipe->nsched];
    uint64_t here = d, run = k ? r->repeat : r->repeat - pipe->cur_done;
    d += run;
    mlo_component *t = r->comp;
    struct mlo_device *dev = t->dev;
    if (stopped[dev->index] || mlo_res_is_resident(t))
      continue; /* nearer uses are never displaced below */
    if (t->join || !t->materialized || ensure_plan(t) || mlo_res_bytes(t) > dev->budget ||
        !prefetch_one(pipe, t, here + run)) {
      stopped[dev->index] = true; /* (a join: loading into the memory of a switch, join.c) */
      nstopped++;
    }
  }
}

/* ---- the budget -------------------------------------------------------- */

/* The budget the budget policy keeps to on device dev with settings s:
 * budget_bytes (each device's), or what is free there less reserve_bytes;
 * lock held.  It is the room a component must fit whole in (policy.h,
 * device_room). */
static int budget_for(mlo_pipeline *pipe, const mlo_offload_settings *s, size_t dev,
                      uint64_t *budget) {
  uint64_t total, avail;
  int rc = mlo_device_memory(pipe, dev, &total, &avail);
  if (rc) return rc;
  char a[32], b[32];
  uint64_t got;
  if (s->budget_bytes) {
    if (s->budget_bytes > total)
      return mlo_fail(pipe, MLO_EINVAL, "budget %s exceeds the device's %s",
                      mlo_format_size(s->budget_bytes, a, sizeof a),
                      mlo_format_size(total, b, sizeof b));
    got = s->budget_bytes;
  } else {
    if (s->reserve_bytes >= avail)
      return mlo_fail(pipe, MLO_ENOMEM_DEVICE, "a reserve of %s leaves nothing of the %s free",
                      mlo_format_size(s->reserve_bytes, a, sizeof a),
                      mlo_format_size(avail, b, sizeof b));
    got = avail - s->reserve_bytes;
  }
  *budget = got;
  return MLO_OK;
}

/* ---- the policy's slots ------------------------------------------------ */

/* Makes room for c by next use and loads it, waiting while the room is
 * held by components executing on other threads. */
static int budget_admit(mlo_pipeline *pipe, mlo_component *c, bool try_only) {
  for (;;) {
    /* a wait below dropped the lock: offload may be off, or another policy */
    if (pipe->policy != &mlo_policy_budget_ops) return MLO_POLICY_CHANGED;
    if (mlo_must_wait_reconfig(pipe)) {
      if (try_only)
        return mlo_fail(pipe, MLO_EBUSY, "'%s' must wait: offload is being reconfigured", c->name);
      pthread_cond_wait(&pipe->idle, &pipe->lock);
      continue;
    }
    if (c->join) { /* a joined switch: its source is spent, its target loading into it */
      mlo_component *a = mlo_join_source(c), *b = mlo_join_target(c);
      /* except a source without blocks: nothing of it is overwritten before
       * its last release, so it is shared as any resident component (a
       * nested acquire, mlo.torch's among them; another thread's) */
      if (a == c && !c->nblocks && mlo_res_is_resident(c)) return MLO_OK;
      uint64_t mine; /* as make_room: a thread holding anything does not wait */
      if (try_only || held_here(pipe, c->dev, &mine))
        return mlo_fail(pipe, try_only ? MLO_EBUSY : MLO_EDEADLK,
                        "'%s' must wait for the switch from '%s' (held%s) to end: '%s''s "
                        "memory goes to '%s' as its blocks end, and is '%s''s at its release",
                        c->name, a->name, try_only ? "" : " by this thread", a->name, b->name,
                        b->name);
      pthread_cond_wait(&pipe->idle, &pipe->lock);
      continue;
    }
    if (mlo_res_is_resident(c)) return MLO_OK; /* kept, or prefetched */
    if (!c->materialized) return MLO_NOT_MATERIALIZED;
    int rc = ensure_plan(c);
    if (rc) return rc;
    rc = make_room(pipe, c);
    if (rc == MLO_EBUSY) {
      if (try_only)
        return mlo_fail(pipe, MLO_EBUSY, "'%s' must wait: its room in the budget is in use",
                        c->name);
      pthread_cond_wait(&pipe->idle, &pipe->lock);
      continue;
    }
    if (!rc) rc = mlo_res_load(c);
    /* The device ran out below the budget (someone else's allocations):
     * give up one more idle component and try again. */
    if (rc == MLO_ENOMEM_DEVICE && evict_one(pipe, c)) continue;
    return rc;
  }
}

static int plan_streams(mlo_pipeline *pipe) {
  for (size_t i = 0; i < pipe->ncomps; i++) {
    int rc = ensure_plan(pipe->comps[i]);
    if (rc) return rc;
  }
  return MLO_OK;
}

static void drop_streams(mlo_pipeline *pipe) {
  for (size_t i = 0; i < pipe->ncomps; i++)
    if (!mlo_res_is_resident(pipe->comps[i])) mlo_stream_drop(pipe->comps[i]);
}

/* Roles do not decide residency, the budget and the schedule do.  What is
 * resident already stays within the budget; with a schedule and prefetch
 * on, the first components the schedule calls start loading. */
static int budget_enable(mlo_pipeline *pipe, const mlo_offload_settings *s) {
  struct budget_state *st = mlo_calloc(1, sizeof *st);
  if (!st) return mlo_fail(pipe, MLO_ENOMEM, "out of host memory");
  int rc = MLO_OK;
  for (size_t d = 0; d < pipe->ndevs && !rc; d++)
    rc = budget_for(pipe, s, d, &pipe->devs[d].budget);
  if (rc) {
    free(st);
    return rc;
  }
  st->join = !mlo_env_flag("MLO_NO_JOIN");
  pipe->policy_state = st;
  for (size_t d = 0; d < pipe->ndevs && !rc; d++) rc = fit(pipe, &pipe->devs[d]);
  if (!rc) rc = plan_streams(pipe);
  if (rc) {
    drop_streams(pipe);
    pipe->policy_state = NULL;
    free(st);
    return rc;
  }
  prefetch(pipe);
  return MLO_OK;
}

static void budget_disable(mlo_pipeline *pipe) {
  drop_streams(pipe); /* a resident one keeps its plan until evicted */
  free(pipe->policy_state);
  pipe->policy_state = NULL;
}

/* After an acquire (c is held now: never a victim, and the schedule has
 * moved past it): load what the schedule calls next.  c's forward runs now,
 * so what was loaded ahead of it and sits idle may issue the rest of its
 * copies at once: a streamed plan's kept blocks go between its slots'
 * refills only while its own forward runs (progressive.c), since then a
 * streamed block early in the forward would wait for all of them; under
 * another's forward they wait for nothing.  (One that fails is issued again
 * at its begin.) */
static void maybe_join(mlo_pipeline *pipe, mlo_component *a);

static void budget_acquired(mlo_pipeline *pipe, mlo_component *c) {
  if (!c->nblocks && !c->join) { /* no block ends to join at: its call is one */
    maybe_join(pipe, c);
    mlo_join_kick(c);
  }
  prefetch(pipe);
  mlo_prog_settle(pipe, c, false);
}

/* After a last release (c may be displaceable now): a switch joined from c
 * hands c's block over (join.c), then what the schedule calls next loads. */
static void budget_released(mlo_pipeline *pipe, mlo_component *c) {
  mlo_join_released(c);
  prefetch(pipe);
}

/* ---- the joined switch ------------------------------------------------- */

/* In c's call the schedule says is its last before the next component's,
 * where that one does not fit beside it, the next one's copies go into the
 * memory c's ended blocks free (join.c) — unless the room that leaves it
 * (c's whole block) is room the component after it would have been
 * prefetched into, had it loaded at its acquire into a block of its own
 * size, and that one could not join in turn into the room the next one
 * leaves in c's block (docs/streaming.md, "The prompt's cycle").  A c
 * without blocks is asked at its acquire, its call being one. */
static void maybe_join(mlo_pipeline *pipe, mlo_component *a) {
  if (!pipe->settings.prefetch || !pipe->nsched || !B(pipe)->join) return;
  mlo_component *b = pipe->sched[pipe->cur_run].comp; /* the call expected next */
  /* on another device b loads beside a whatever a does: prefetch's */
  if (b == a || b->dev != a->dev || b->join || mlo_res_is_resident(b) || !b->materialized) return;
  if (ensure_plan(b)) return; /* (a streamed b joins a streamed a of its layout: join.c) */
  const struct mlo_device *dev = a->dev;
  uint64_t budget = dev->budget, need = mlo_res_bytes(b);
  if (dev->bytes + need <= budget) return; /* it fits beside: prefetch's */
  mlo_component *after = pipe->sched[(pipe->cur_run + 1) % pipe->nsched].comp;
  if (after != a && after != b && after->dev == dev && !mlo_res_is_resident(after)) {
    uint64_t plain = dev->bytes - mlo_res_bytes(a) + need, more = mlo_res_bytes(after);
    /* unless b leaves room beside it in a's block for that one to join in
     * during b's call (b without blocks: its join starts at its acquire) */
    bool chains = !b->nblocks && !b->stream && !after->stream && mlo_join_can_take(after) &&
                  need + more <= a->alloc_bytes;
    if (plain + more <= budget && dev->bytes + more > budget && !chains) return;
  }
  mlo_join_start(a, b);
}

static void budget_block_ended(mlo_pipeline *pipe, mlo_component *c, size_t block) {
  if (!c->join) maybe_join(pipe, c);
  mlo_join_block_ended(c, block);
}

static int budget_audit(mlo_pipeline *pipe) {
  for (size_t d = 0; d < pipe->ndevs; d++) {
    const struct mlo_device *dev = &pipe->devs[d];
    if (dev->bytes > dev->budget)
      return mlo_fail(pipe, MLO_ESTATE,
                      "audit: %llu bytes resident on device %zu, over its budget of %llu",
                      (unsigned long long)dev->bytes, d, (unsigned long long)dev->budget);
  }
  return MLO_OK;
}

/* Every device's (one device: its budget). */
static uint64_t budget_bytes(const mlo_pipeline *pipe) {
  uint64_t sum = 0;
  for (size_t d = 0; d < pipe->ndevs; d++) sum += pipe->devs[d].budget;
  return sum;
}

/* The largest component's least room: each streams what it can, and every
 * other one can be evicted while it runs. */
static uint64_t budget_least_room(mlo_pipeline *pipe, const mlo_component **by) {
  uint64_t most = 0;
  *by = NULL;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    uint64_t least = mlo_stream_least(pipe->comps[i]);
    if (!*by || least > most) *by = pipe->comps[i], most = least;
  }
  return most;
}

const struct mlo_policy_ops mlo_policy_budget_ops = {
    .id = MLO_POLICY_BUDGET,
    .name = "budget",
    .check = NULL, /* any pipeline: roles do not matter to it */
    .enable = budget_enable,
    .disable = budget_disable,
    .excludes = NULL, /* the budget decides, not roles */
    .admit = budget_admit,
    .acquired = budget_acquired,
    .released = budget_released,
    .block_ended = budget_block_ended,
    .audit = budget_audit,
    .budget = budget_bytes,
    .device_room = budget_for,
    .least_room = budget_least_room,
    .streams = true,
    .delegates = false, /* it needs the generic hooks' acquire and release */
};
