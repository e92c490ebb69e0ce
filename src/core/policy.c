/*
 * policy.c — the table of residency policies (policy.h), in the order of
 * the mlo_policy enum: the one list behind mlo_policy_name,
 * mlo_policy_from_name and every tool's --policy, and behind
 * mlo_pipeline_get_needs (each policy's least room, the host plan's rule),
 * which the tools ask rather than repeat.
 */
#include "core/policy.h"
#include "core/internal.h"

#include <string.h>
#include <strings.h>

static const struct mlo_policy_ops *const policies[MLO_POLICY_COUNT] = {
    [MLO_POLICY_STRICT] = &mlo_policy_strict_ops,
    [MLO_POLICY_BUDGET] = &mlo_policy_budget_ops,
};

const struct mlo_policy_ops *mlo_policy_ops_of(mlo_policy policy) {
  return (unsigned)policy < MLO_POLICY_COUNT ? policies[policy] : NULL;
}

const char *mlo_policy_name(mlo_policy policy) {
  const struct mlo_policy_ops *ops = mlo_policy_ops_of(policy);
  return ops ? ops->name : "invalid";
}

int mlo_policy_from_name(const char *name, mlo_policy *out) {
  if (!name || !out) return MLO_EINVAL;
  for (int p = 0; p < MLO_POLICY_COUNT; p++)
    if (!strcasecmp(name, policies[p]->name)) {
      *out = (mlo_policy)p;
      return MLO_OK;
    }
  return MLO_EINVAL;
}

int mlo_pipeline_get_needs(mlo_pipeline *pipe, uint64_t device_room, mlo_pipeline_needs *out) {
  if (!pipe || !out || out->size < sizeof *out) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  size_t size = out->size;
  memset(out, 0, sizeof *out);
  out->size = size;
  for (size_t i = 0; i < pipe->ncomps; i++) out->all_resident += mlo_comp_bytes(pipe->comps[i]);
  for (int p = 0; p < MLO_POLICY_COUNT; p++)
    if (policies[p]->least_room)
      out->policy_least[p] = policies[p]->least_room(pipe, &out->policy_least_by[p]);
  mlo_disk_needs(pipe, device_room, &out->host_all, &out->host_least, &out->host_stream_keep);
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}
