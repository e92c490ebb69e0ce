/*
 * absent.c — the communicator queries in a build without MPI: no
 * communicator can be created (mlo/mpi.h is not usable), so every pipeline
 * is rank 0 of 1 and core never reaches the collective calls, which say so
 * if it ever did.
 */
#include "base/log.h"
#include "dist/dist.h"

int mlo_comm_rank(const mlo_comm *c) {
  (void)c;
  return 0;
}
int mlo_comm_size(const mlo_comm *c) {
  (void)c;
  return 1;
}
int mlo_comm_node_rank(const mlo_comm *c) {
  (void)c;
  return 0;
}
int mlo_comm_node_size(const mlo_comm *c) {
  (void)c;
  return 1;
}
int mlo_dist_node_rank(const mlo_comm *c) {
  (void)c;
  return 0;
}
int mlo_dist_node_size(const mlo_comm *c) {
  (void)c;
  return 1;
}
void *mlo_dist_nccl(const mlo_comm *c) {
  (void)c;
  return NULL;
}

int mlo_dist_shared_alloc(mlo_comm *c, size_t bytes, void **ptr, void **handle, char *err,
                          size_t errlen) {
  (void)c, (void)bytes, (void)ptr, (void)handle;
  return mlo_errf(err, errlen, MLO_EUNSUPPORTED, "this mlo was built without MPI");
}
void mlo_dist_shared_free(mlo_comm *c, void *handle) {
  (void)c, (void)handle;
}
int mlo_dist_allgather(mlo_comm *c, void *buf, size_t slice, char *err, size_t errlen) {
  (void)c, (void)buf, (void)slice;
  return mlo_errf(err, errlen, MLO_EUNSUPPORTED, "this mlo was built without MPI");
}
int mlo_dist_agree(mlo_comm *c, uint64_t id, int status, const char *msg, mlo_dist_namer name,
                   void *user, bool *together, char *err, size_t errlen) {
  (void)c, (void)id, (void)status, (void)msg, (void)name, (void)user;
  if (together) *together = false;
  return mlo_errf(err, errlen, MLO_EUNSUPPORTED, "this mlo was built without MPI");
}
