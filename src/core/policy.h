/*
 * policy.h — a residency policy as an ops table, the way a platform is one
 * (platform/platform.h): what offload.c asks of the policy in force at
 * enable, acquire, release and audit, with the policy's state behind its
 * own pointer (pipe->policy_state).  `strict` (strict.c) is the
 * specification's exclusion rule; `budget` (budget.c) keeps what fits in a
 * device budget and plans from the declared schedule.  A new policy is one
 * file and one row of policy.c's table.
 *
 * A policy is in force while generic offload is enabled (pipe->policy is
 * NULL when offload is off or a delegate owns the hooks: then an acquire
 * evicts what the strategy excludes and loads on demand).  Every slot is
 * called with pipe->lock held; slots but enable may be NULL (nothing to
 * do).
 */
#ifndef MLO_CORE_POLICY_H
#define MLO_CORE_POLICY_H

#include "mlo/mlo.h"

#include <stdbool.h>
#include <stdint.h>

struct mlo_policy_ops {
  mlo_policy id;
  const char *name; /* as mlo_policy_name says it and the tools' --policy takes it */
  /* Settings this policy cannot run with, refused before anything moves
   * (the message names what is missing). */
  int (*check)(mlo_pipeline *pipe, const mlo_offload_settings *s);
  /* Makes residency what the policy wants at enable (slabs are
   * materialized, pipe->settings and pipe->policy are set, the lock is
   * held).  On failure what it loaded is evicted again (C15) and its state
   * freed; what it evicted to fit a budget stays evicted (nothing is lost:
   * a component comes back on its next acquire). */
  int (*enable)(mlo_pipeline *pipe, const mlo_offload_settings *s);
  /* Frees the policy's state at disable (and at a failed enable's end). */
  void (*disable)(mlo_pipeline *pipe);
  /* Whether a resident b must go before a executes (the audit checks the
   * same rule).  NULL: nothing excludes anything. */
  bool (*excludes)(const mlo_component *a, const mlo_component *b);
  /* Makes c resident for an acquire, after the excluded components are
   * gone; may wait on pipe->idle unless try_only.  A wait drops the lock:
   * if offload was reconfigured meanwhile (pipe->policy is not this one),
   * it returns MLO_POLICY_CHANGED and the acquire starts over under the
   * policy now in force.  NULL: load on demand. */
  int (*admit)(mlo_pipeline *pipe, mlo_component *c, bool try_only);
  /* c was acquired (its holder is counted). */
  void (*acquired)(mlo_pipeline *pipe, mlo_component *c);
  /* c's last holder released it. */
  void (*released)(mlo_pipeline *pipe, mlo_component *c);
  /* The forward holding c (resident) ended block `block` (a streamed one
   * once its last begin ended, after its slot's refill): the compute
   * before it is queued. */
  void (*block_ended)(mlo_pipeline *pipe, mlo_component *c, size_t block);
  /* The policy's own invariant, checked by every audit. */
  int (*audit)(mlo_pipeline *pipe);
  /* The device bytes the policy keeps to (mlo_pipeline_stats.budget_bytes);
   * NULL: none. */
  uint64_t (*budget)(const mlo_pipeline *pipe);
  /* The room a component must fit whole in on device `dev` under settings
   * s, for the host plan (disk.c: a larger one streams its blocks) and
   * placement; lock held.  NULL: no limit (every component loads whole). */
  int (*device_room)(mlo_pipeline *pipe, const mlo_offload_settings *s, size_t dev, uint64_t *room);
  /* The least device room it runs the pipeline in, from the declarations
   * (nothing need be materialized), and the component that sets it;
   * lock held (mlo_pipeline_get_needs). */
  uint64_t (*least_room)(mlo_pipeline *pipe, const mlo_component **by);
  /* Whether it plans components to stream their blocks (stream.c): a plan
   * outlives an eviction only under a policy that does. */
  bool streams;
  /* Whether it runs through a pipeline's delegate (mlo_pipeline_set_delegate)
   * as well as through the generic hooks. */
  bool delegates;
};

/* admit's answer when offload was reconfigured while it waited (never
 * returned to a caller of the API). */
#define MLO_POLICY_CHANGED (-1000)
/* admit's (and the acquire's) answer when the component is no longer
 * materialized after a wait: an eviction moved it to another tier
 * (disk.c); the acquire materializes it again and starts over. */
#define MLO_NOT_MATERIALIZED (-1001)

extern const struct mlo_policy_ops mlo_policy_strict_ops;
extern const struct mlo_policy_ops mlo_policy_budget_ops;

/* The table row of a policy; NULL for a value outside the enum. */
const struct mlo_policy_ops *mlo_policy_ops_of(mlo_policy policy);

#endif
