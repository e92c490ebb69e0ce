/*
 * policy.c — the table of residency policies (policy.h), in the order of
 * the mlo_policy enum: the one list behind mlo_policy_name,
 * mlo_policy_from_name and every tool's --policy.
 */
#include "core/policy.h"

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
