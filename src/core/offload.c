/*
 * offload.c — the offload backend: which components exclude which (the
 * strategy that owns the hooks, C16), enable/disable (C1, C2, C11, C14,
 * C15), delegates (C10), and the hooked entry points forward and
 * acquire/release (C3–C5, C8, C12, C17).  What residency a policy wants is
 * the policy's (policy.h: strict.c, budget.c); this file asks it at each
 * entry point.
 *
 * A "hook" here is not an object attached to a module: it is the rule that
 * mlo_excludes() applies when a component is acquired.  Removing the hooks
 * is switching the strategy off; nothing moves (C14).
 */
#include "base/sysio.h"
#include "core/internal.h"
#include "core/policy.h"

#include "base/log.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

bool mlo_excludes(const mlo_pipeline *pipe, const mlo_component *a, const mlo_component *b) {
  if (a == b || a->dev != b->dev) return false; /* each device excludes on its own */
  switch (pipe->strategy) {
  case STRATEGY_GENERIC: /* the policy's rule (policy.h) */
    return pipe->policy && pipe->policy->excludes && pipe->policy->excludes(a, b);
  case STRATEGY_DELEGATE:
    return a->group && a->group == b->group;
  case STRATEGY_NONE:
    return false;
  }
  return false;
}

/* ---- audit ------------------------------------------------------------ */

static int audit_locked(mlo_pipeline *pipe) {
  uint64_t resident_bytes = 0;
  int prc = pipe->policy && pipe->policy->audit ? pipe->policy->audit(pipe) : MLO_OK;
  if (prc) return prc;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    if (mlo_res_is_resident(c)) resident_bytes += mlo_res_bytes(c);
    int src = mlo_stream_audit(c);
    if (src) return src;
    if (!c->users) continue;
    if (!mlo_res_is_resident(c))
      return mlo_fail(pipe, MLO_ESTATE, "audit: '%s' executes but is not resident", c->name);
    for (size_t j = 0; j < pipe->ncomps; j++) {
      mlo_component *o = pipe->comps[j];
      if (mlo_res_is_resident(o) && mlo_excludes(pipe, c, o))
        return mlo_fail(pipe, MLO_ESTATE, "audit: '%s' executes while '%s' (%s) is resident",
                        c->name, o->name, mlo_role_name(o->role));
    }
  }
  if (resident_bytes != pipe->device_bytes)
    return mlo_fail(pipe, MLO_ESTATE,
                    "audit: resident blocks total %llu bytes but %llu are accounted",
                    (unsigned long long)resident_bytes, (unsigned long long)pipe->device_bytes);
  return MLO_OK;
}

int mlo_pipeline_audit(mlo_pipeline *pipe) {
  if (!pipe) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = audit_locked(pipe);
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

void mlo_pipeline_set_audit(mlo_pipeline *pipe, bool on) {
  if (!pipe) return;
  MLO_LOCK_OR_VOID(&pipe->lock);
  pipe->audit_each = on;
  pthread_mutex_unlock(&pipe->lock);
}

mlo_residency mlo_component_residency(mlo_component *c) {
  if (!c) return MLO_RES_UNMATERIALIZED;
  MLO_LOCK_OR(&c->pipe->lock, MLO_RES_UNMATERIALIZED);
  mlo_residency r = c->state;
  pthread_mutex_unlock(&c->pipe->lock);
  return r;
}

bool mlo_component_is_resident(mlo_component *c) {
  if (!c) return false;
  MLO_LOCK_OR(&c->pipe->lock, false);
  bool r = mlo_res_is_resident(c);
  pthread_mutex_unlock(&c->pipe->lock);
  return r;
}

bool mlo_component_load_done(mlo_component *c) {
  if (!c) return false;
  MLO_LOCK_OR(&c->pipe->lock, false);
  bool done = mlo_res_is_resident(c) && !c->disk_busy && !c->disk_rc && !mlo_prog_deferred(c) &&
              ((c->load_waited && !mlo_prog_active(c)) || !c->load_ev ||
               mlo_plat_event_query(mlo_dev_plat(c), c->load_ev) == MLO_OK);
  pthread_mutex_unlock(&c->pipe->lock);
  return done;
}

/* ---- acquire / release ------------------------------------------------- */

/* A component this thread holds that c excludes: waiting for it would
 * wait forever (the rule is per component, so a release on another thread
 * is fine and a freed pipeline leaves nothing behind). */
static mlo_component *held_conflict(mlo_pipeline *pipe, mlo_component *c) {
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *o = pipe->comps[i];
    if (o->users && mlo_excludes(pipe, c, o) && mlo_held_by_this_thread(o)) return o;
  }
  return NULL;
}

static int add_holder(mlo_component *c) {
  if (mlo_holders_add(&c->holders, &c->hcap, &c->users))
    return mlo_fail(c->pipe, MLO_ENOMEM, "out of host memory acquiring '%s'", c->name);
  return MLO_OK;
}

/* Drops one holder: this thread's entry if it has one, else the oldest. */
static void drop_holder(mlo_component *c) {
  mlo_holders_drop(c->holders, &c->users);
}

/* A component c excludes whose load from disk is still being issued: it
 * cannot be evicted until the reader is done (the evictions below must not
 * wait, or the checks above would be stale). */
static mlo_component *reading_conflict(mlo_pipeline *pipe, mlo_component *c) {
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *o = pipe->comps[i];
    if (mlo_disk_pending(o) && mlo_excludes(pipe, c, o)) return o;
  }
  return NULL;
}

static mlo_component *busy_conflict(mlo_pipeline *pipe, mlo_component *c) {
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *o = pipe->comps[i];
    if (o->users && mlo_excludes(pipe, c, o)) return o;
  }
  return NULL;
}

/* Evicts what c excludes and makes it resident as the policy in force
 * admits it (policy.h; on demand without one); lock held.  On success
 * c->users has been raised. */
static int acquire_locked(mlo_pipeline *pipe, mlo_component *c, bool try_only) {
  const struct mlo_policy_ops *pol;
  int rc;
  do { /* from the top when offload was reconfigured while the policy's admit waited */
    mlo_component *other = held_conflict(pipe, c);
    if (other)
      return mlo_fail(pipe, MLO_EDEADLK, "'%s' cannot run while this thread holds '%s'", c->name,
                      other->name);
    mlo_component *reading = NULL;
    while (mlo_must_wait_reconfig(pipe) || (other = busy_conflict(pipe, c)) ||
           (reading = reading_conflict(pipe, c))) {
      if (try_only)
        return other     ? mlo_fail(pipe, MLO_EBUSY, "'%s' must wait: '%s' is executing", c->name,
                                    other->name)
               : reading ? mlo_fail(pipe, MLO_EBUSY,
                                    "'%s' must wait: '%s', which it excludes, is being read "
                                    "from disk",
                                    c->name, reading->name)
                         : mlo_fail(pipe, MLO_EBUSY,
                                    "'%s' must wait: offload is being reconfigured", c->name);
      pthread_cond_wait(&pipe->idle, &pipe->lock);
      other = reading = NULL;
    }
    /* an eviction moved it to another tier (a host plan made while it was
     * resident) while this thread waited: materialized again, off the lock */
    if (!c->materialized) return MLO_NOT_MATERIALIZED;
    pol = pipe->policy;
    for (size_t i = 0; i < pipe->ncomps; i++) {
      mlo_component *o = pipe->comps[i];
      if (mlo_res_is_resident(o) && mlo_excludes(pipe, c, o)) {
        rc = mlo_res_evict(o);
        if (rc) return rc;
      }
    }
    rc = pol && pol->admit ? pol->admit(pipe, c, try_only) : mlo_res_load(c);
  } while (rc == MLO_POLICY_CHANGED);
  if (!rc) rc = add_holder(c);
  if (rc) return rc;
  mlo_sched_advance(pipe, c);
  mlo_stream_acquired(c); /* after the cursor moved: the slots plan from it */
  if (pol && pol->acquired) pol->acquired(pipe, c);
  if (pipe->audit_each && (rc = audit_locked(pipe))) {
    drop_holder(c);
    if (!c->users) mlo_join_drop(c); /* a join its acquire started (budget.c) ends */
    pthread_cond_broadcast(&pipe->idle);
  }
  return rc;
}

static int acquire(mlo_component *c, bool try_only) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc;
  do {
    if (!c->materialized) { /* first use: read the weights outside the lock */
      pthread_mutex_unlock(&pipe->lock);
      rc = mlo_component_materialize(c);
      if (rc) return rc;
      pthread_mutex_lock(&pipe->lock);
    }
    rc = acquire_locked(pipe, c, try_only);
  } while (rc == MLO_NOT_MATERIALIZED);
  mlo_sync_mode sync = pipe->enabled ? pipe->settings.sync : MLO_SYNC_EVENT;
  pthread_mutex_unlock(&pipe->lock);
  if (rc) return rc;
  rc = mlo_res_wait_loaded(c, sync);
  if (rc) {
    mlo_component_release(c);
    return rc;
  }
  return MLO_OK;
}

int mlo_component_acquire(mlo_component *c) {
  return acquire(c, false);
}
int mlo_component_try_acquire(mlo_component *c) {
  return acquire(c, true);
}

static int release(mlo_component *c, uint64_t forward_ns) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = MLO_OK;
  if (c->users <= 0) {
    rc = mlo_fail(pipe, MLO_ESTATE, "'%s' released without an acquire", c->name);
    goto out_unlock;
  }
  if (forward_ns) {
    c->stats.forwards++;
    c->stats.forward_ns += forward_ns;
    mlo_res_trace(c, MLO_TRACE_FORWARD_END, 0);
  }
  drop_holder(c);
  /* a block this thread began and never ended ends with its hold (every
   * thread's with the last one): a streamed one's slot, a kept one's count */
  if (c->users == 0 || !mlo_held_by_this_thread(c)) {
    if (c->stream) mlo_stream_released(c, c->users == 0);
    if (mlo_begun_drop_thread(c, c->users == 0))
      mlo_logf(MLO_LOG_WARN, "%s: a kept block was begun and never ended; ended at the release",
               c->name);
  }
  if (c->users == 0) {
    rc = mlo_res_note_last_use(c);
    pthread_cond_broadcast(&pipe->idle);
    if (pipe->policy && pipe->policy->released) pipe->policy->released(pipe, c);
  }
out_unlock:
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_component_release(mlo_component *c) {
  return release(c, 0);
}

int mlo_component_forward(mlo_component *c, mlo_forward_fn fn, void *user) {
  if (!c || !fn) return MLO_EINVAL;
  int rc = acquire(c, false);
  if (rc) return rc;
  mlo_pipeline *pipe = c->pipe;
  pthread_mutex_lock(&pipe->lock); /* acquire took it on this thread: cannot fail */
  mlo_res_trace(c, MLO_TRACE_FORWARD_BEGIN, 0);
  pthread_mutex_unlock(&pipe->lock);
  uint64_t t0 = mlo_plat_now(mlo_dev_plat(c));
  int user_rc = fn(c, user);
  uint64_t t1 = mlo_plat_now(mlo_dev_plat(c));
  rc = release(c, t1 > t0 ? t1 - t0 : 1); /* traces FORWARD_END under its lock */
  if (user_rc)
    return mlo_fail(pipe, MLO_ECALLBACK, "forward of '%s' returned %d", c->name, user_rc);
  return rc;
}

/* ---- by hand, without offload ------------------------------------------ */

int mlo_component_load(mlo_component *c) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  int rc = mlo_component_materialize(c);
  if (rc) return rc;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  if (pipe->enabled)
    rc = mlo_fail(pipe, MLO_ESTATE, "load '%s': offload is enabled", c->name);
  else if (!(rc = mlo_res_load(c)))
    mlo_prog_issue_upto(c, c->nblocks); /* no forward to interleave with: all of it (a failed
                                           block's copy is issued again at its begin) */
  /* a load from disk: its copies are issued (or it failed) before return,
   * as a load from a slab's are */
  if (!rc && c->disk_busy) rc = mlo_disk_wait(c);
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_component_evict(mlo_component *c) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = pipe->enabled ? mlo_fail(pipe, MLO_ESTATE, "evict '%s': offload is enabled", c->name)
                         : mlo_res_evict(c);
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

static int place(mlo_pipeline *pipe, const struct mlo_policy_ops *pol,
                 const mlo_offload_settings *s);

/* Several devices and no offload: placed so that everything is resident
 * (all on the first device where it fits, else spread). */
int mlo_pipeline_load_all(mlo_pipeline *pipe) {
  if (!pipe) return MLO_EINVAL;
  int rc = MLO_OK;
  if (pipe->ndevs > 1) {
    if ((rc = mlo_lock_both(pipe))) return rc;
    if (!pipe->enabled) rc = place(pipe, NULL, NULL);
    mlo_unlock_both(pipe);
  }
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe) && !rc; i++)
    rc = mlo_component_load(mlo_pipeline_component_at(pipe, i));
  return rc;
}

/* ---- enable / disable -------------------------------------------------- */

/* The settings of 0.1 ended at copy_back: a caller built against them
 * passes that size and gets the later fields' defaults. */
#define SETTINGS_SIZE_0_1 offsetof(mlo_offload_settings, policy)
/* Those of 0.2-0.5 ended at prefetch (host_budget_bytes came in 0.6). */
#define SETTINGS_SIZE_0_5 offsetof(mlo_offload_settings, host_budget_bytes)

/* Validates the caller's settings into *out (a full struct). */
static int read_settings(mlo_pipeline *pipe, const mlo_offload_settings *in,
                         mlo_offload_settings *out) {
  if (in->size != SETTINGS_SIZE_0_1 && in->size != SETTINGS_SIZE_0_5 &&
      in->size < sizeof(mlo_offload_settings))
    return mlo_fail(pipe, MLO_EINVAL, "offload settings: size field is %zu, expected %zu", in->size,
                    sizeof(mlo_offload_settings));
  *out = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  memcpy(out, in, in->size < sizeof *out ? in->size : sizeof *out);
  out->size = sizeof *out;
  if ((unsigned)out->sync > MLO_SYNC_UNSAFE_NONE)
    return mlo_fail(pipe, MLO_EINVAL, "offload settings: invalid sync mode %d", (int)out->sync);
  if ((unsigned)out->policy >= MLO_POLICY_COUNT)
    return mlo_fail(pipe, MLO_EINVAL, "offload settings: invalid policy %d", (int)out->policy);
  if (!mlo_policy_ops_of(out->policy)->budget && (out->budget_bytes || out->reserve_bytes))
    return mlo_fail(pipe, MLO_EINVAL,
                    "offload settings: budget_bytes and reserve_bytes need the budget policy "
                    "(the %s policy keeps no device budget)",
                    mlo_policy_ops_of(out->policy)->name);
  if (out->budget_bytes && out->reserve_bytes)
    return mlo_fail(pipe, MLO_EINVAL,
                    "offload settings: give budget_bytes or reserve_bytes, not both");
  return MLO_OK;
}

static bool same_settings(const mlo_offload_settings *a, const mlo_offload_settings *b) {
  return a->sync == b->sync && a->pin_host == b->pin_host && a->distributed == b->distributed &&
         a->per_tensor_copies == b->per_tensor_copies && a->copy_back == b->copy_back &&
         a->policy == b->policy && a->budget_bytes == b->budget_bytes &&
         a->reserve_bytes == b->reserve_bytes && a->prefetch == b->prefetch &&
         a->host_budget_bytes == b->host_budget_bytes;
}

/* Removes every group's hooks (members leave it); the group objects stay
 * until mlo_group_free or the pipeline's free, as the header promises. */
static size_t detach_groups_locked(mlo_pipeline *pipe) {
  size_t live = 0;
  for (size_t i = 0; i < pipe->ngroups; i++) {
    mlo_group *g = pipe->groups[i];
    live += !g->detached;
    for (size_t j = 0; j < g->count; j++) g->members[j]->group = NULL;
    g->count = 0;
    g->detached = true;
  }
  return live;
}

static int enable_delegate(mlo_pipeline *pipe, const mlo_offload_settings *s) {
  const mlo_delegate_ops *ops = pipe->delegate;
  void *self = pipe->delegate_self;
  int rc = MLO_OK;
  for (size_t i = 0; i < pipe->ncomps && !rc; i++) rc = mlo_slab_materialize(pipe->comps[i]);
  if (rc) return rc;
  pthread_mutex_lock(&pipe->lock);
  pipe->strategy = STRATEGY_DELEGATE; /* lets the delegate create groups */
  pipe->settings = *s;
  pthread_mutex_unlock(&pipe->lock);
  rc = ops->enable(self, pipe, s);
  if (rc) {
    if (ops->disable) ops->disable(self, pipe);
    pthread_mutex_lock(&pipe->lock);
    detach_groups_locked(pipe);
    pipe->strategy = STRATEGY_NONE;
    pthread_mutex_unlock(&pipe->lock);
    return mlo_fail(pipe, rc < 0 ? rc : MLO_ECALLBACK, "the offload delegate's enable failed (%d)",
                    rc);
  }
  pthread_mutex_lock(&pipe->lock);
  pipe->enabled = true;
  pipe->enable_epoch++;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

/* Which slabs stay in host memory (disk.c), from the device room a
 * component must fit whole in (larger ones stream and keep their slabs).
 * A component not resident whose tier changes gives up its storage here
 * and is materialized again in its new tier; a resident one, at its
 * eviction; lock held.  A failed enable leaves such a component in its new
 * tier: nothing is lost, its next load reads from there. */
static int host_plan(mlo_pipeline *pipe, const mlo_offload_settings *s) {
  uint64_t room[MLO_MAX_DEVICES];
  const struct mlo_policy_ops *pol = mlo_policy_ops_of(s->policy);
  int rc = MLO_OK;
  for (size_t d = 0; d < pipe->ndevs; d++) room[d] = UINT64_MAX;
  for (size_t d = 0; d < pipe->ndevs && s->host_budget_bytes && pol->device_room && !rc; d++)
    rc = pol->device_room(pipe, s, d, &room[d]);
  if (!rc) rc = mlo_disk_plan(pipe, s, room);
  for (size_t i = 0; i < pipe->ncomps && !rc; i++) mlo_disk_change_tier(pipe->comps[i]);
  return rc;
}

/* Several devices: where each component lives, from each device's room
 * (the policy's, or the device's memory where it keeps none; pol NULL:
 * everything resident at once); both locks held. */
static int place(mlo_pipeline *pipe, const struct mlo_policy_ops *pol,
                 const mlo_offload_settings *s) {
  if (pipe->ndevs < 2) return MLO_OK;
  uint64_t room[MLO_MAX_DEVICES];
  for (size_t d = 0; d < pipe->ndevs; d++) {
    uint64_t total;
    int rc = pol && pol->device_room ? pol->device_room(pipe, s, d, &room[d])
                                     : mlo_device_memory(pipe, d, &total, &room[d]);
    if (rc) return rc;
  }
  return mlo_place(pipe, pol, room);
}

/* Generic hooks: the policy's check, every slab materialized, then the
 * policy makes residency what it wants (strict.c: C1/C2's encoders and
 * VAEs; budget.c: what fits).  A failure leaves everything as it was (C15). */
static int enable_generic(mlo_pipeline *pipe, const mlo_offload_settings *s) {
  const struct mlo_policy_ops *pol = mlo_policy_ops_of(s->policy);
  pthread_mutex_lock(&pipe->lock);
  if (!s->pin_host) pipe->pin_host = false;
  int rc = pol->check ? pol->check(pipe, s) : MLO_OK;
  if (!rc) rc = place(pipe, pol, s);
  if (!rc) rc = host_plan(pipe, s);
  pthread_mutex_unlock(&pipe->lock);
  for (size_t i = 0; i < pipe->ncomps && !rc; i++) rc = mlo_slab_materialize(pipe->comps[i]);
  if (rc) return rc;
  pthread_mutex_lock(&pipe->lock);
  if (s->copy_back) /* every tensor comes back: none may stay registered read-only */
    for (size_t i = 0; i < pipe->ncomps; i++) mlo_slab_allow_writeback(pipe->comps[i]);
  mlo_offload_settings before = pipe->settings;
  pipe->settings = *s;
  pipe->policy = pol;
  pipe->strategy = STRATEGY_GENERIC;
  pipe->enabled = true;
  pipe->enable_epoch++; /* compute by hand before it is not ordered by use_ev */
  rc = pol->enable(pipe, s);
  if (rc) {
    pipe->settings = before;
    pipe->policy = NULL;
    pipe->strategy = STRATEGY_NONE;
    pipe->enabled = false;
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_offload_enable(mlo_pipeline *pipe, const mlo_offload_settings *settings) {
  if (!pipe) return MLO_EINVAL;
  mlo_pipeline_warn_guessed(pipe); /* discovery is about to trust them */
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  if (settings) {
    int rc = read_settings(pipe, settings, &s);
    if (rc) return rc;
  }
  int rc = mlo_lock_both(pipe);
  if (rc) return rc;
  bool enabled = pipe->enabled;
  bool same = enabled && same_settings(&pipe->settings, &s);
  bool delegate = pipe->delegate != NULL;
  for (size_t i = 0; i < pipe->ncomps && !enabled && !rc; i++)
    if (pipe->comps[i]->users) /* it runs unhooked: hooking it now breaks exclusion */
      rc = mlo_fail(pipe, MLO_EBUSY, "cannot enable offload while '%s' executes",
                    pipe->comps[i]->name);
  if (!rc && !enabled) {
    pipe->reconfiguring = true;
    pipe->reconfig_thread = pthread_self();
  }
  pthread_mutex_unlock(&pipe->lock);
  if (rc || enabled) {
    pthread_mutex_unlock(&pipe->setup_lock);
    if (rc) return rc;
    return same ? MLO_OK /* C11 */
                : mlo_fail(pipe, MLO_EOWNED,
                           "offload is already enabled with other settings; disable it first");
  }
  if (delegate && !mlo_policy_ops_of(s.policy)->delegates)
    rc = mlo_fail(pipe, MLO_EUNSUPPORTED,
                  "the %s policy needs the generic hooks; this pipeline has a delegate",
                  mlo_policy_ops_of(s.policy)->name);
  else if (delegate && pipe->ndevs > 1)
    rc = mlo_fail(pipe, MLO_EUNSUPPORTED,
                  "a delegate runs on one device; this pipeline has %zu (docs/placement.md)",
                  pipe->ndevs);
  else if (delegate && s.host_budget_bytes)
    rc = mlo_fail(pipe, MLO_EUNSUPPORTED,
                  "host_budget_bytes needs the generic hooks; this pipeline has a delegate");
  else
    rc = delegate ? enable_delegate(pipe, &s) : enable_generic(pipe, &s);
  pthread_mutex_lock(&pipe->lock);
  pipe->reconfiguring = false;
  pthread_cond_broadcast(&pipe->idle);
  pthread_mutex_unlock(&pipe->lock);
  pthread_mutex_unlock(&pipe->setup_lock);
  return rc;
}

int mlo_offload_disable(mlo_pipeline *pipe) {
  if (!pipe) return MLO_EINVAL;
  int rc = mlo_lock_both(pipe);
  if (rc) return rc;
  if (!pipe->enabled) goto out_unlock; /* C11 */
  for (size_t i = 0; i < pipe->ncomps; i++)
    if (pipe->comps[i]->users) {
      rc = mlo_fail(pipe, MLO_EBUSY, "cannot disable offload while '%s' executes",
                    pipe->comps[i]->name);
      goto out_unlock;
    }
  int drc = 0;
  if (pipe->strategy == STRATEGY_DELEGATE) {
    pipe->reconfiguring = true; /* nothing may start while the delegate runs */
    pipe->reconfig_thread = pthread_self();
    pthread_mutex_unlock(&pipe->lock);
    drc = pipe->delegate->disable ? pipe->delegate->disable(pipe->delegate_self, pipe) : 0;
    pthread_mutex_lock(&pipe->lock);
    pipe->reconfiguring = false;
    pthread_cond_broadcast(&pipe->idle);
  }
  size_t left = detach_groups_locked(pipe); /* C10/C14: every hook goes, nothing moves */
  if (left)
    mlo_logf(MLO_LOG_WARN,
             "offload delegate left %zu exclusion group(s) in place; their hooks "
             "are removed (free them with mlo_group_free)",
             left);
  if (drc) mlo_logf(MLO_LOG_WARN, "offload delegate's disable returned %d", drc);
  if (pipe->policy && pipe->policy->disable) pipe->policy->disable(pipe);
  pipe->policy = NULL;
  /* what stays resident completes its load (C14 moves nothing else) */
  mlo_prog_settle(pipe, NULL, false);
  pipe->strategy = STRATEGY_NONE;
  pipe->enabled = false;
out_unlock:
  mlo_unlock_both(pipe);
  return rc;
}

bool mlo_offload_is_enabled(mlo_pipeline *pipe) {
  if (!pipe) return false;
  MLO_LOCK_OR(&pipe->lock, false);
  bool on = pipe->enabled;
  pthread_mutex_unlock(&pipe->lock);
  return on;
}

int mlo_pipeline_set_delegate(mlo_pipeline *pipe, const mlo_delegate_ops *ops, void *self) {
  if (!pipe) return MLO_EINVAL;
  if (ops && !ops->enable)
    return mlo_fail(pipe, MLO_EINVAL, "an offload delegate needs an enable function");
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = MLO_OK;
  if (pipe->enabled || pipe->strategy != STRATEGY_NONE)
    rc = mlo_fail(pipe, MLO_ESTATE, "cannot change the offload delegate while offload is enabled");
  else {
    pipe->delegate = ops;
    pipe->delegate_self = ops ? self : NULL;
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

/* ---- exclusion groups (for delegates) --------------------------------- */

int mlo_group_create(mlo_pipeline *pipe, const char *name, mlo_group **out) {
  if (out) *out = NULL;
  if (!pipe || !out) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = MLO_OK;
  /* Groups are inert until the delegate's strategy is enabled, so a
   * delegate may build them before or during its enable. */
  if (pipe->strategy == STRATEGY_GENERIC || !pipe->delegate) {
    rc = mlo_fail(pipe, MLO_EOWNED, "exclusion groups belong to an offload delegate; %s",
                  pipe->strategy == STRATEGY_GENERIC ? "the generic hooks own this pipeline"
                                                     : "no delegate is installed");
    goto out_unlock;
  }
  if (pipe->ngroups == pipe->gcap) {
    size_t cap = pipe->gcap ? pipe->gcap * 2 : 4;
    mlo_group **grown = mlo_realloc(pipe->groups, cap * sizeof *grown);
    if (!grown) goto out_nomem;
    pipe->groups = grown;
    pipe->gcap = cap;
  }
  mlo_group *g = mlo_calloc(1, sizeof *g);
  const char *gname = name ? name : "group";
  if (!g || !(g->name = mlo_malloc(strlen(gname) + 1))) {
    free(g);
    goto out_nomem;
  }
  memcpy(g->name, gname, strlen(gname) + 1);
  g->pipe = pipe;
  pipe->groups[pipe->ngroups++] = g;
  *out = g;
  goto out_unlock;
out_nomem:
  rc = mlo_fail(pipe, MLO_ENOMEM, "out of host memory creating a group");
out_unlock:
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

int mlo_group_add(mlo_group *g, mlo_component *c) {
  if (!g || !c) return MLO_EINVAL;
  mlo_pipeline *pipe = g->pipe;
  if (c->pipe != pipe) return mlo_fail(pipe, MLO_EINVAL, "'%s' is in another pipeline", c->name);
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = MLO_OK;
  if (g->detached)
    rc = mlo_fail(pipe, MLO_ESTATE, "group '%s' was removed when offload was disabled", g->name);
  else if (c->group)
    rc = mlo_fail(pipe, MLO_EEXIST, "'%s' is already in group '%s'", c->name, c->group->name);
  else if (c->users)
    rc = mlo_fail(pipe, MLO_EBUSY, "'%s' is executing", c->name);
  else if (g->count == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 4;
    mlo_component **grown = mlo_realloc(g->members, cap * sizeof *grown);
    if (!grown)
      rc = mlo_fail(pipe, MLO_ENOMEM, "out of host memory");
    else {
      g->members = grown;
      g->cap = cap;
    }
  }
  if (!rc) {
    g->members[g->count++] = c;
    c->group = g;
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

void mlo_group_free(mlo_group *g) {
  if (!g) return;
  mlo_pipeline *pipe = g->pipe;
  MLO_LOCK_OR_VOID(&pipe->lock);
  for (size_t i = 0; i < pipe->ngroups; i++)
    if (pipe->groups[i] == g) {
      pipe->groups[i] = pipe->groups[--pipe->ngroups];
      break;
    }
  for (size_t j = 0; j < g->count; j++) g->members[j]->group = NULL;
  pthread_mutex_unlock(&pipe->lock);
  free(g->members);
  free(g->name);
  free(g);
}
