/*
 * comm.c — the communicator as libmlo sees it (dist.h): the public queries
 * (rank 0 of 1 without one) and the collective calls core makes, forwarded
 * to the ops table a communicator library (libmlo-mpi) filled in.  Without a
 * communicator core never reaches the collective calls; they say so if it
 * ever did.
 */
#include "base/log.h"
#include "dist/dist.h"

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
int mlo_dist_agree(mlo_comm *c, uint64_t id, uint64_t check, int status, const char *msg,
                   mlo_dist_namer name, void *user, bool *together, char *err, size_t errlen) {
  if (!c) {
    if (together) *together = false;
    return no_comm(err, errlen);
  }
  return c->ops->agree(c->ctx, id, check, status, msg, name, user, together, err, errlen);
}
