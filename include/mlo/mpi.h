/*
 * mpi.h — mlo over the caller's MPI job: node-shared host slabs and
 * sharded loads (docs/distributed.md).  Include it after <mpi.h> is
 * available; it exists in builds with MPI (MLO_HAVE_MPI).
 *
 * mlo never creates the job: the caller runs MPI_Init (under mpirun) and
 * hands mlo a communicator, which mlo duplicates so its messages never mix
 * with the caller's.  Where MPI was initialized with MPI_THREAD_MULTIPLE,
 * the host platform's gathers of sharded pieces run on a thread of the
 * pipeline's own, under the compute, on a duplicate of their own; else on
 * the calling thread.  Ranks on one node (MPI_COMM_TYPE_SHARED) share one
 * host slab per component and read 1/n of the checkpoint each; with
 * sharded loads each rank copies 1/n of a component over its own link and
 * the node's ranks all-gather the rest over the device fabric.
 *
 * The rule of collectives.  With a communicator in the pipeline options,
 * these calls are collective over the ranks of a node, which must make
 * them in the same order, on pipelines declared the same way:
 * materialization (explicit or at enable), every load a sharded pipeline
 * makes (so every acquire or forward that loads, and every prefetch: give
 * every rank the same schedule and budget), and mlo_pipeline_free.  Each is
 * checked before it runs: a rank at another component, or a rank that does
 * not arrive within the timeout, fails the call on every rank that arrived
 * (MLO_ESTATE, the message naming both sides or the missing ranks) instead
 * of hanging; after a timeout the communicator is unusable and every later
 * collective fails at once, the late rank's included.  A failure in one
 * rank's part (a file that cannot be read, a device out of memory) fails
 * the call on every rank with that rank's message, and nothing is kept.
 * One thread per rank drives a pipeline with a communicator.
 */
#ifndef MLO_MPI_H
#define MLO_MPI_H

#include "mlo/mlo.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLO_COMM_DEFAULT_TIMEOUT_MS 60000u
typedef struct {
  size_t size;         /* sizeof(mlo_comm_options) */
  unsigned timeout_ms; /* how long a collective waits for a missing rank (default 60 s) */
} mlo_comm_options;
#define MLO_COMM_OPTIONS_INIT                                                                      \
  { sizeof(mlo_comm_options), MLO_COMM_DEFAULT_TIMEOUT_MS }

/* Wraps comm (collective over it: every rank calls it).  opts may be NULL.
 * MLO_EINVAL if MPI is not initialized.  Free with mlo_comm_free (also
 * collective) after every pipeline using it. */
MLO_API int mlo_comm_create_mpi(MPI_Comm comm, const mlo_comm_options *opts, mlo_comm **out,
                                char *err, size_t errlen);
MLO_API void mlo_comm_free(mlo_comm *comm);
/* Whether the communicator is broken: a rank did not arrive at an agreement
 * within the timeout (or the coordinator did not answer).  Every later
 * collective then fails at once; but MPI_Finalize, and freeing node-shared
 * windows, would still wait for the missing rank, possibly forever (a rank
 * stopped, not dead).  A program that finds it broken should end the job
 * with MPI_Abort, as `mlo run --ranks` does, so a scheduler sees the failure
 * within the timeout. */
MLO_API bool mlo_comm_broken(const mlo_comm *comm);
/* On CUDA: the node's NCCL communicator (an ncclComm_t over the same node
 * ranks, in node-rank order, on each rank's platform device) for the
 * device-side all-gather of sharded loads, which then runs on the copy
 * stream without the host.  Not owned.  It is checked where the platform
 * is known: a sharded pipeline's materialization and loads refuse it, on
 * every node rank at once, when its ncclCommCount is not the node's size,
 * its ncclCommUserRank not the node rank, or its ncclCommCuDevice not the
 * platform's device, naming what differs.  A gather on it that reports an
 * error (ncclCommGetAsyncError) or does not complete within the timeout
 * (mlo_comm_options.timeout_ms) is abandoned: mlo calls ncclCommAbort on
 * it, which frees it (do not destroy it then), and the load fails.
 * MLO_ESTATE if mlo made the node's communicator (mlo_comm_create_nccl). */
MLO_API int mlo_comm_set_nccl(mlo_comm *comm, void *nccl_comm);
/* Or mlo makes it (collective over the node): node rank 0 asks NCCL for an
 * id, every rank receives it over the node's MPI ranks and makes its
 * communicator (ncclCommInitRank, the node's size and rank) on platform's
 * device, checked as above; a rank that fails fails every rank, with its
 * message.  MLO_EUNSUPPORTED for a platform without NCCL (every platform
 * but cuda built with NCCL).  Owned by comm: mlo_comm_destroy_nccl frees it,
 * after the last pipeline using it and before platform is closed
 * (mlo_comm_free does not).  Defined in libmlo, which reaches NCCL only
 * through the CUDA module. */
MLO_API int mlo_comm_create_nccl(mlo_comm *comm, mlo_platform *platform, char *err, size_t errlen);
MLO_API void mlo_comm_destroy_nccl(mlo_comm *comm);

#ifdef __cplusplus
}
#endif
#endif
