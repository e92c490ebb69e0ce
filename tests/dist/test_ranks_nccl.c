/*
 * test_ranks_nccl.c — the NCCL communicator of sharded loads on CUDA
 * (issue 25, items 4 and 5), under mpirun with 2 ranks on the fake CUDA
 * runtime and the fake NCCL (tests/fakecuda, tests/fakenccl: the ranks'
 * gathers really move bytes between the processes).  One program, a mode
 * per ctest registration:
 *
 *   refuse  a communicator that is not the node's in node-rank order on
 *           the platform's device — over more ranks than the node has, in
 *           another rank order, on another device — is refused on every
 *           rank at materialization, with what differs named; the node's
 *           own communicator (made by mlo_comm_create_nccl) gathers every
 *           rank's slice into place: each tensor on the device equals its
 *           host bytes;
 *   fail    with a gather that never completes on rank 1 (the fake's
 *           MLO_FAKENCCL_ASYNC_ERROR or MLO_FAKENCCL_HANG, set by ctest),
 *           the load fails on every rank within the communicator's timeout
 *           (ctest's TIMEOUT fails the test instead of a hang), naming the
 *           NCCL error or the timeout, and the pipeline and the
 *           communicator are freed after it.
 */
#include "mlo/checkpoint.h"
#include "mlo/mpi.h"
#include "dist/dist.h"
#include "platform/platform.h"
#include "ranks_device.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char dir[256];

/* A sharded pipeline of the checkpoint on this rank's cuda:r. */
static mlo_pipeline *open_sharded(mlo_platform *p, mlo_comm *comm) {
  char err[512] = "";
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = p;
  po.comm = comm;
  po.sharded_loads = true;
  mlo_pipeline *pipe = NULL;
  int rc = mlo_pipeline_open_path(&po, dir, NULL, &pipe, err, sizeof err);
  CHECK(rc == MLO_OK, "open: %s", err);
  return pipe;
}

/* The node's communicator made by the caller as given: its size, its rank
 * and (device >= 0) the device current when it is made. */
static ncclComm_t make_comm(int size, int my_rank, int device) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (rank == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (device >= 0) CHECK(cudaSetDevice(device) == cudaSuccess, "cudaSetDevice(%d)", device);
  ncclComm_t nccl = NULL;
  CHECK(ncclCommInitRank(&nccl, size, id, my_rank) == ncclSuccess, "ncclCommInitRank");
  return nccl;
}

/* A communicator given with mlo_comm_set_nccl that is not the node's:
 * materialization fails on every rank, naming `differs`. */
static void refused(mlo_platform *p, ncclComm_t nccl, const char *what, const char *differs) {
  char err[512];
  mlo_comm *comm = NULL;
  CHECK(mlo_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm, err, sizeof err) == MLO_OK, "%s", err);
  CHECK(mlo_comm_set_nccl(comm, nccl) == MLO_OK, "set_nccl");
  mlo_pipeline *pipe = open_sharded(p, comm);
  int rc = pipe ? mlo_pipeline_materialize(pipe) : MLO_EINVAL;
  const char *msg = pipe ? mlo_pipeline_errmsg(pipe) : "";
  CHECK(rc != MLO_OK, "%s: a communicator that is not the node's was accepted", what);
  CHECK(strstr(msg, differs) != NULL, "%s: the message does not say '%s': %s", what, differs, msg);
  CHECK(!mlo_comm_broken(comm), "%s: refusing broke the communicator", what);
  mlo_pipeline_free(pipe);
  mlo_comm_free(comm);
  CHECK(ncclCommDestroy(nccl) == ncclSuccess, "ncclCommDestroy");
}

/* Every tensor of every component, loaded sharded, equals its host bytes. */
static void gathers_in_place(mlo_platform *p, mlo_pipeline *pipe) {
  CHECK(mlo_pipeline_materialize(pipe) == MLO_OK, "%s", mlo_pipeline_errmsg(pipe));
  size_t checked = check_gathered_in_place(p, pipe);
  mlo_dist_stats ds = MLO_DIST_STATS_INIT;
  mlo_pipeline_get_dist_stats(pipe, &ds);
  CHECK(ds.gather_bytes > 0 && checked > 0, "nothing was gathered");
}

/* Review D6: while a gather is pending (rank 1 arrives 1.5 s late), a
 * compute wait for an event recorded on the copy queue before it returns
 * at once (a sharded prefetch must not hold the forward's thread at its
 * next block); one for an event recorded after it still waits for the
 * gather on the host, watched. */
static void compute_wait_settles_only_after(mlo_platform *p, void *coll) {
  const size_t slice = 4096;
  void *block = NULL;
  mlo_event *before = NULL, *after = NULL;
  CHECK(mlo_plat_dev_alloc(p, slice * (size_t)nranks, &block) == MLO_OK, "dev_alloc");
  CHECK(mlo_plat_event_create(p, &before) == MLO_OK && mlo_plat_event_create(p, &after) == MLO_OK,
        "event_create");
  CHECK(mlo_plat_event_record_copy(p, before) == MLO_OK, "record");
  if (rank == 1) {
    struct timespec late = {1, 500000000};
    nanosleep(&late, NULL);
  }
  CHECK(mlo_plat_all_gather(p, block, 0, slice, rank, coll, 20000) == MLO_OK, "all_gather");
  CHECK(mlo_plat_event_record_copy(p, after) == MLO_OK, "record");
  if (rank == 0) {
    double t0 = MPI_Wtime();
    CHECK(mlo_plat_compute_wait(p, before) == MLO_OK, "compute_wait(before)");
    double t1 = MPI_Wtime();
    CHECK(mlo_plat_compute_wait(p, after) == MLO_OK, "compute_wait(after)");
    double t2 = MPI_Wtime();
    CHECK(t1 - t0 < 0.7, "a wait for an event recorded before the gather held the host %.2f s",
          t1 - t0);
    CHECK(t2 - t1 > 0.5, "a wait for an event recorded after the gather did not settle it (%.2f s)",
          t2 - t1);
  }
  CHECK(mlo_plat_synchronize(p) == MLO_OK, "synchronize");
  mlo_plat_event_destroy(p, before);
  mlo_plat_event_destroy(p, after);
  CHECK(mlo_plat_dev_free(p, block, slice * (size_t)nranks) == MLO_OK, "dev_free");
  MPI_Barrier(MPI_COMM_WORLD);
}

static void mode_refuse(mlo_platform *p, int device) {
  /* every rank hears the first refusing rank's reason: node rank 0's */
  refused(p, make_comm(nranks + 1, rank, -1), "world-sized",
          "it has 3 ranks, this node 2 (a gather would write past the block)");
  refused(p, make_comm(nranks, nranks - 1 - rank, -1), "mis-ordered",
          "it puts this process at rank 1, the node at rank 0");
  refused(p, make_comm(nranks, rank, (device + 1) % 2), "on another device",
          "it runs on cuda:1, this platform on cuda:0");
  /* the node's own, made by mlo: accepted, and the slices land in place */
  char err[512] = "";
  mlo_comm *comm = NULL;
  CHECK(mlo_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm, err, sizeof err) == MLO_OK, "%s", err);
  CHECK(mlo_comm_create_nccl(comm, p, err, sizeof err) == MLO_OK, "create_nccl: %s", err);
  CHECK(mlo_comm_set_nccl(comm, NULL) == MLO_ESTATE, "set_nccl over mlo's own communicator");
  uint64_t (*answers)(void) =
      (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "fakenccl_in_progress_answers");
  CHECK(answers != NULL, "the NCCL loaded is not tests/fakenccl's");
  uint64_t before = answers ? answers() : 0;
  mlo_pipeline *pipe = open_sharded(p, comm);
  if (pipe) gathers_in_place(p, pipe);
  /* mlo's communicator is non-blocking: its first gather answered
   * ncclInProgress and was polled until issued (review D2), and the bytes
   * above are right only if the event behind it was recorded after */
  CHECK(answers && answers() > before, "no gather answered ncclInProgress");
  compute_wait_settles_only_after(p, mlo_dist_nccl(comm));
  mlo_pipeline_free(pipe);
  uint64_t at_destroy = answers ? answers() : 0;
  mlo_comm_destroy_nccl(comm);
  CHECK(answers && answers() > at_destroy, "the destroy did not finalize, non-blocking");
  mlo_comm_free(comm);
}

static void mode_fail(mlo_platform *p) {
  const char *why = getenv("MLO_FAKENCCL_ASYNC_ERROR") ? "NCCL reported an error" : NULL;
  char err[512] = "";
  mlo_comm_options co = MLO_COMM_OPTIONS_INIT;
  co.timeout_ms = 2000;
  mlo_comm *comm = NULL;
  CHECK(mlo_comm_create_mpi(MPI_COMM_WORLD, &co, &comm, err, sizeof err) == MLO_OK, "%s", err);
  CHECK(mlo_comm_create_nccl(comm, p, err, sizeof err) == MLO_OK, "create_nccl: %s", err);
  mlo_pipeline *pipe = open_sharded(p, comm);
  CHECK(pipe && mlo_pipeline_materialize(pipe) == MLO_OK, "%s",
        pipe ? mlo_pipeline_errmsg(pipe) : "no pipeline");
  mlo_component *c = pipe ? mlo_pipeline_component_at(pipe, 0) : NULL;
  int rc = c ? mlo_component_acquire(c) : MLO_EINVAL;
  const char *msg = pipe ? mlo_pipeline_errmsg(pipe) : "";
  CHECK(rc != MLO_OK, "a gather that never completes was waited for successfully");
  CHECK(strstr(msg, "its all-gather failed") && strstr(msg, "the NCCL communicator was aborted"),
        "the failure does not say the gather failed and was aborted: %s", msg);
  /* the rank whose NCCL reported the error says so; the other waited out
   * its timeout */
  if (why && rank == 1)
    CHECK(strstr(msg, why) != NULL, "rank 1 does not say '%s': %s", why, msg);
  else
    CHECK(strstr(msg, "did not complete within 2.0 s") != NULL, "no timeout named: %s", msg);
  /* the component is not kept with what the gather left in it */
  CHECK(c && !mlo_component_is_resident(c), "the failed load's component is still resident");
  /* the aborted communicator is refused from now on, and freed once */
  CHECK(c && mlo_component_acquire(c) != MLO_OK, "a second acquire on an aborted communicator");
  mlo_pipeline_free(pipe);
  mlo_comm_destroy_nccl(comm);
  mlo_comm_free(comm);
}

/* Rank 1 never completes its (non-blocking) NCCL init: it gives up after
 * half the communicator's timeout and aborts, and every rank fails creating
 * the node's communicator with its reason (a blocking init waited in NCCL's
 * bootstrap for ever: issue 25, item 5's review). */
static void mode_init_hang(mlo_platform *p) {
  char err[512] = "";
  mlo_comm_options co = MLO_COMM_OPTIONS_INIT;
  co.timeout_ms = 2000;
  mlo_comm *comm = NULL;
  CHECK(mlo_comm_create_mpi(MPI_COMM_WORLD, &co, &comm, err, sizeof err) == MLO_OK, "%s", err);
  int rc = mlo_comm_create_nccl(comm, p, err, sizeof err);
  CHECK(rc != MLO_OK, "a communicator rank 1 never completed was made");
  CHECK(strstr(err, "did not complete within 1.0 s") && strstr(err, "aborted") &&
            strstr(err, "node rank 1 failed"),
        "the failure does not name the init's timeout: %s", err);
  mlo_comm_destroy_nccl(comm); /* nothing was made: nothing to destroy */
  mlo_comm_free(comm);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const char *mode = argc > 1 ? argv[1] : "";
  if (nranks != 2 || (strcmp(mode, "refuse") && strcmp(mode, "fail") && strcmp(mode, "inithang"))) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 %s refuse|fail|inithang\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  mlo_set_log(NULL, NULL, MLO_LOG_ERROR);
  (void)digest_of; /* the workload needs cuBLAS, which the fake runtime has not */
  char err[512] = "";
  ranks_pipeline_dir(dir, sizeof dir, "ranks_nccl");
  int device = rank; /* the fake has two devices: one per rank, as the tool gives them */
  char spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", device);
  mlo_platform *p = NULL;
  CHECK(mlo_platform_open(spec, &p, err, sizeof err) == MLO_OK, "%s", err);
  if (p && !strcmp(mode, "refuse")) mode_refuse(p, device);
  if (p && !strcmp(mode, "fail")) mode_fail(p);
  if (p && !strcmp(mode, "inithang")) mode_init_hang(p);
  mlo_platform_close(p);
  char what[64];
  snprintf(what, sizeof what, "%s on 2 ranks, fake CUDA and NCCL", mode);
  return ranks_finish(dir, what);
}
