/*
 * test_ranks_cuda.c — sharded loads on GPUs (label gpu): under mpirun with
 * one rank per GPU of the node, an NCCL communicator over the node's ranks
 * (mlo_comm_set_nccl), each rank's device block after a sharded load must
 * hold exactly its component's slab (the slices copied by every rank, put
 * together by ncclAllGather on the copy stream), and the reference
 * workload's digest on the GPU must equal one process's.  Exits 77
 * (skipped) on every rank when the node has fewer GPUs than ranks.
 */
#include "mlo/checkpoint.h"
#include "mlo/mpi.h"
#include "workload/workload.h"
#include "ranks_device.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int gpus = 0, fewest = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  MPI_Allreduce(&gpus, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest < nranks) {
    if (rank == 0) printf("skipped: %d GPU(s) for %d ranks\n", fewest, nranks);
    MPI_Finalize();
    return 77;
  }
  mlo_set_log(NULL, NULL, MLO_LOG_ERROR);
  char dir[256] = "", err[512] = "";
  ranks_pipeline_dir(dir, sizeof dir, "ranks_cuda");
  cudaSetDevice(rank);
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t nccl;
  CHECK(ncclCommInitRank(&nccl, nranks, id, rank) == ncclSuccess, "ncclCommInitRank");
  mlo_comm *comm = NULL;
  CHECK(mlo_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm, err, sizeof err) == MLO_OK, "%s", err);
  mlo_comm_set_nccl(comm, nccl);
  char spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", rank);
  mlo_platform *p = NULL, *q = NULL;
  CHECK(mlo_platform_open(spec, &p, err, sizeof err) == MLO_OK, "%s", err);
  CHECK(mlo_platform_open(spec, &q, err, sizeof err) == MLO_OK, "%s", err);
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = q;
  mlo_pipeline *single = NULL, *pipe = NULL;
  CHECK(mlo_pipeline_open_path(&po, dir, NULL, &single, err, sizeof err) == MLO_OK, "%s", err);
  uint64_t reference = digest_of(q, single);
  po.platform = p;
  po.comm = comm;
  po.sharded_loads = true;
  CHECK(mlo_pipeline_open_path(&po, dir, NULL, &pipe, err, sizeof err) == MLO_OK, "%s", err);
  CHECK(mlo_pipeline_materialize(pipe) == MLO_OK, "%s", mlo_pipeline_errmsg(pipe));
  check_gathered_in_place(p, pipe);
  mlo_dist_stats ds = MLO_DIST_STATS_INIT;
  mlo_pipeline_get_dist_stats(pipe, &ds);
  CHECK(ds.gather_bytes > 0, "no gather");
  uint64_t d = digest_of(p, pipe);
  CHECK(d == reference, "sharded digest %016llx, one process %016llx", (unsigned long long)d,
        (unsigned long long)reference);
  mlo_pipeline_free(pipe);
  mlo_pipeline_free(single);
  mlo_platform_close(p);
  mlo_platform_close(q);
  mlo_comm_free(comm);
  ncclCommDestroy(nccl);
  char what[64];
  snprintf(what, sizeof what, "%d ranks on GPUs", nranks);
  return ranks_finish(dir, what);
}
