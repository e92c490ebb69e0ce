/*
 * ranks_device.h — what the two CUDA multi-rank programs share (the GPU
 * one, test_ranks_cuda.c, and the one on the fake runtime and NCCL,
 * test_ranks_nccl.c): every tensor of a sharded pipeline, loaded and
 * gathered on the device, read back and compared with its host bytes.
 */
#ifndef MLO_TESTS_RANKS_DEVICE_H
#define MLO_TESTS_RANKS_DEVICE_H

#include "ranks_check.h"

#include "mlo/checkpoint.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <string.h>

/* Node rank 0 writes a generated Wan2.2 pipeline (scale 0.0005) into a
 * temporary folder of its own (TMPDIR, else /tmp), and every rank gets its
 * path in dir. */
static void ranks_pipeline_dir(char *dir, size_t size, const char *tag) {
  char err[512] = "";
  if (rank == 0) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, size, "%s/mlo_%s_XXXXXX", tmp, tag);
    if (!mkdtemp(dir) || strlen(dir) + 5 > size ||
        mlo_synth_write("wan2.2-t2v", strcat(dir, "/wan"), 0.0005, NULL, NULL, err, sizeof err)) {
      fprintf(stderr, "synth: %s\n", err);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Bcast(dir, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD);
}

/* The end of a program: every rank's failed checks summed, node rank 0
 * removes the pipeline's folder and prints `what` with the verdict, MPI
 * finalized; the exit code. */
static int ranks_finish(char *dir, const char *what) {
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[300];
    *strrchr(dir, '/') = '\0';
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    printf("%s: %s\n", what, all ? "FAILED" : "ok");
  }
  MPI_Finalize();
  return all ? 1 : 0;
}

/* Loads each component of the materialized pipe (sharded: a slice each,
 * then the gather), checks every tensor's device bytes, and evicts it
 * again; returns the tensors checked. */
static size_t check_gathered_in_place(mlo_platform *p, mlo_pipeline *pipe) {
  size_t checked = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    CHECK(mlo_component_load(c) == MLO_OK, "load: %s", mlo_pipeline_errmsg(pipe));
    CHECK(mlo_component_acquire(c) == MLO_OK, "acquire: %s", mlo_pipeline_errmsg(pipe));
    mlo_platform_synchronize(p);
    for (size_t k = 0; k < mlo_component_tensor_count(c); k++) {
      const mlo_tensor *t = mlo_component_tensor_at(c, k);
      size_t nb = (size_t)mlo_tensor_nbytes(t);
      char *back = malloc(nb ? nb : 1);
      CHECK(back && cudaMemcpy(back, mlo_tensor_device_ptr(t), nb, cudaMemcpyDeviceToHost) ==
                        cudaSuccess,
            "copy back");
      CHECK(back && !memcmp(back, mlo_tensor_host_data(t), nb), "%s differs on the device",
            mlo_tensor_name(t));
      free(back);
      checked++;
    }
    mlo_component_release(c);
    mlo_component_evict(c);
  }
  return checked;
}

#endif
