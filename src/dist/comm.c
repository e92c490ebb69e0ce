/*
 * comm.c — the communicator as libmlo sees it (dist.h): the public queries
 * (rank 0 of 1 without one) and the collective calls core makes, forwarded
 * to the ops table a communicator library (libmlo-mpi) filled in.  Without a
 * communicator core never reaches the collective calls; they say so if it
 * ever did.
 */
#include "base/log.h"
#include "dist/dist.h"
#include "platform/platform.h"

#include <stdio.h>
#include <string.h>

int mlo_comm_rank(const mlo_comm *c) {
  return c ? c->rank : 0;
}
int mlo_comm_size(const mlo_comm *c) {
  return c ? c->size : 1;
}
int mlo_comm_node_rank(const mlo_comm *c) {
  return c ? c->node_rank : 0;
}
int mlo_comm_node_size(const mlo_comm *c) {
  return c ? c->node_size : 1;
}
int mlo_dist_node_rank(const mlo_comm *c) {
  return mlo_comm_node_rank(c);
}
int mlo_dist_node_size(const mlo_comm *c) {
  return mlo_comm_node_size(c);
}
void *mlo_dist_nccl(const mlo_comm *c) {
  return c ? c->nccl : NULL;
}
unsigned mlo_dist_timeout_ms(const mlo_comm *c) {
  return c && c->timeout_ms ? c->timeout_ms : 60000u;
}

static int no_comm(char *err, size_t errlen) {
  return mlo_errf(err, errlen, MLO_EUNSUPPORTED, "no communicator (mlo_comm_create_mpi)");
}

int mlo_dist_shared_alloc(mlo_comm *c, size_t bytes, void **ptr, void **handle, char *err,
                          size_t errlen) {
  return c ? c->ops->shared_alloc(c->ctx, bytes, ptr, handle, err, errlen) : no_comm(err, errlen);
}
void mlo_dist_shared_free(mlo_comm *c, void *handle) {
  if (c) c->ops->shared_free(c->ctx, handle);
}
int mlo_dist_allgather(mlo_comm *c, void *buf, size_t slice, char *err, size_t errlen) {
  return c ? c->ops->allgather(c->ctx, buf, slice, err, errlen) : no_comm(err, errlen);
}
bool mlo_dist_gather_lane(const mlo_comm *c) {
  return c && c->gather_lane && c->ops->lane_gather;
}

bool mlo_dist_lane_claim(mlo_comm *c, void *owner) {
  void *none = NULL;
  if (!mlo_dist_gather_lane(c)) return false;
  return __atomic_compare_exchange_n(&c->lane_owner, &none, owner, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE) ||
         none == owner;
}

void mlo_dist_lane_release(mlo_comm *c, void *owner) {
  void *mine = owner;
  if (c)
    __atomic_compare_exchange_n(&c->lane_owner, &mine, NULL, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

int mlo_dist_lane_gather(mlo_comm *c, uint64_t id, uint64_t check, int status, const char *msg,
                         mlo_dist_namer name, void *user, void *buf, size_t slice, char *err,
                         size_t errlen) {
  if (!mlo_dist_gather_lane(c)) return no_comm(err, errlen);
  return c->ops->lane_gather(c->ctx, id, check, status, msg, name, user, buf, slice, err, errlen);
}

int mlo_dist_agree(mlo_comm *c, uint64_t id, uint64_t check, int status, const char *msg,
                   mlo_dist_namer name, void *user, bool *together, char *err, size_t errlen) {
  if (!c) {
    if (together) *together = false;
    return no_comm(err, errlen);
  }
  return c->ops->agree(c->ctx, id, check, status, msg, name, user, together, err, errlen);
}

/* ---- the node's NCCL communicator, made by mlo (mlo_comm_create_nccl) ---- */

enum { STEP_NCCL_ID = 1, STEP_NCCL_INIT };

/* Declared in mlo/mpi.h, which needs MPI's headers: libmlo defines them
 * all the same, since only the CUDA module it loads reaches NCCL. */
MLO_API int mlo_comm_create_nccl(mlo_comm *c, mlo_platform *p, char *err, size_t errlen);
MLO_API void mlo_comm_destroy_nccl(mlo_comm *c);

static const char *comm_step_name(uint64_t id, void *user) {
  (void)user;
  if (id & MLO_DIST_PROGRAM_STEP) return "the program's own step (past creating the NCCL one)";
  if (!(id & MLO_DIST_COMM_STEP)) return "a step of its pipeline";
  return (id & ~MLO_DIST_COMM_STEP) == STEP_NCCL_ID ? "making the NCCL communicator's id"
                                                    : "creating the NCCL communicator";
}

/* Collective over the node: node rank 0 makes the id, every rank gets it
 * and makes its communicator on the platform's device; each step is agreed,
 * so a rank that fails (or is missing) fails every rank, with its message,
 * within the timeout.  The platform's init does not block: it gives up
 * after half the timeout, so its failure reaches the agreement after it. */
MLO_API int mlo_comm_create_nccl(mlo_comm *c, mlo_platform *p, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!c || !p)
    return mlo_errf(err, errlen, MLO_EINVAL, "mlo_comm_create_nccl: no %s",
                    c ? "platform" : "communicator");
  char why[400] = "";
  unsigned char id[MLO_COLL_ID_BYTES];
  memset(id, 0, sizeof id);
  int mine = MLO_OK;
  if (c->nccl)
    mine = mlo_errf(why, sizeof why, MLO_ESTATE, "the communicator has an NCCL one already");
  else if (!c->ops->bcast)
    mine = mlo_errf(why, sizeof why, MLO_EUNSUPPORTED, "the communicator cannot broadcast");
  else if (!mlo_plat_has_coll(p))
    mine = mlo_plat_coll_id(p, id, sizeof id, why, sizeof why); /* says it has none */
  else if (c->node_rank == 0)
    mine = mlo_plat_coll_id(p, id, sizeof id, why, sizeof why);
  char aerr[512] = "";
  int rc = mlo_dist_agree(c, MLO_DIST_COMM_STEP | STEP_NCCL_ID, 0, mine, mine ? why : NULL,
                          comm_step_name, NULL, NULL, aerr, sizeof aerr);
  if (rc) return mlo_errf(err, errlen, rc, "creating the node's NCCL communicator: %s", aerr);
  if ((rc = c->ops->bcast(c->ctx, id, sizeof id, 0, aerr, sizeof aerr)))
    return mlo_errf(err, errlen, rc, "creating the node's NCCL communicator: %s", aerr);
  void *coll = NULL;
  why[0] = '\0';
  /* half the agreement's timeout: a rank whose init gives up reaches the
   * agreement below with its reason while the others still wait there */
  unsigned half = mlo_dist_timeout_ms(c) / 2;
  mine = mlo_plat_coll_init(p, id, sizeof id, c->node_size, c->node_rank, half ? half : 1, &coll,
                            why, sizeof why);
  if (!mine) /* what the platform made, checked as any caller's would be */
    mine = mlo_plat_coll_check(p, coll, c->node_size, c->node_rank, why, sizeof why);
  rc = mlo_dist_agree(c, MLO_DIST_COMM_STEP | STEP_NCCL_INIT, 0, mine, mine ? why : NULL,
                      comm_step_name, NULL, NULL, aerr, sizeof aerr);
  if (rc) {
    mlo_plat_coll_destroy(p, coll);
    return mlo_errf(err, errlen, rc, "creating the node's NCCL communicator: %s", aerr);
  }
  c->nccl = coll;
  c->nccl_platform = p;
  return MLO_OK;
}

MLO_API void mlo_comm_destroy_nccl(mlo_comm *c) {
  if (!c || !c->nccl_platform) return;
  mlo_plat_coll_destroy(c->nccl_platform, c->nccl);
  c->nccl = NULL;
  c->nccl_platform = NULL;
}
