/*
 * strict.c — the STRICT residency policy (policy.h): the specification's
 * rule.  Offload needs a DiT and an encoder declared; enable makes the
 * encoders and VAEs resident and leaves the DiTs where they are (C1, C2);
 * a DiT excludes every other DiT and every encoder, an encoder every DiT
 * (C3, C4, C12), and VAEs and OTHER components exclude nothing (C5).  An
 * acquire evicts what it excludes and loads on demand.  It keeps no state.
 */
#include "base/sysio.h"
#include "core/internal.h"
#include "core/policy.h"

#include <stdlib.h>

static int strict_check(mlo_pipeline *pipe, const mlo_offload_settings *s) {
  (void)s;
  size_t dits = 0, encoders = 0;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    dits += pipe->comps[i]->role == MLO_ROLE_DIT;
    encoders += pipe->comps[i]->role == MLO_ROLE_ENCODER;
  }
  if (!dits || !encoders)
    return mlo_fail(pipe, MLO_EUNSUPPORTED,
                    "model-level offload needs at least one DiT and one encoder declared; this "
                    "pipeline declares %zu DiT(s) and %zu encoder(s)",
                    dits, encoders);
  return MLO_OK;
}

/* Encoders and VAEs resident, DiTs untouched; rolls back its own loads. */
static int strict_enable(mlo_pipeline *pipe, const mlo_offload_settings *s) {
  (void)s;
  int rc = MLO_OK;
  bool *loaded_here = mlo_calloc(pipe->ncomps ? pipe->ncomps : 1, sizeof *loaded_here);
  if (!loaded_here) return mlo_fail(pipe, MLO_ENOMEM, "out of host memory");
  for (size_t i = 0; i < pipe->ncomps && !rc; i++) {
    mlo_component *c = pipe->comps[i];
    if (c->role != MLO_ROLE_ENCODER && c->role != MLO_ROLE_VAE) continue;
    if (mlo_res_is_resident(c)) continue;
    rc = mlo_res_load(c);
    loaded_here[i] = !rc;
  }
  if (rc) /* C15: the tensors go back where they were */
    for (size_t i = 0; i < pipe->ncomps; i++)
      if (loaded_here[i]) mlo_res_evict(pipe->comps[i]);
  free(loaded_here);
  return rc;
}

static bool strict_excludes(const mlo_component *a, const mlo_component *b) {
  if (a->role == MLO_ROLE_DIT) return b->role == MLO_ROLE_DIT || b->role == MLO_ROLE_ENCODER;
  if (a->role == MLO_ROLE_ENCODER) return b->role == MLO_ROLE_DIT;
  return false; /* C5: VAEs (and OTHER) are outside the set */
}

/* The larger phase: every VAE with every encoder (resident after enable),
 * or with the largest DiT (which excludes the encoders); by: the largest
 * DiT, or the largest encoder where the encoders' phase is the larger. */
static uint64_t strict_least_room(mlo_pipeline *pipe, const mlo_component **by) {
  uint64_t vae = 0, enc = 0, dit = 0, big_enc_bytes = 0;
  const mlo_component *big_enc = NULL, *big_dit = NULL;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    const mlo_component *c = pipe->comps[i];
    uint64_t b = mlo_comp_bytes(c);
    if (c->role == MLO_ROLE_VAE) vae += b;
    if (c->role == MLO_ROLE_ENCODER) {
      enc += b;
      if (!big_enc || b > big_enc_bytes) big_enc = c, big_enc_bytes = b;
    }
    if (c->role == MLO_ROLE_DIT && (!big_dit || b > dit)) big_dit = c, dit = b;
  }
  *by = enc > dit ? big_enc : (big_dit ? big_dit : big_enc);
  return vae + (enc > dit ? enc : dit);
}

const struct mlo_policy_ops mlo_policy_strict_ops = {
    .id = MLO_POLICY_STRICT,
    .name = "strict",
    .check = strict_check,
    .enable = strict_enable,
    .excludes = strict_excludes,
    .least_room = strict_least_room,
    .delegates = true, /* exclusion by role is what a delegate implements (C1-C5) */
};
