/*
 * ranks_device.h — what the two CUDA multi-rank programs share (the GPU
 * one, test_ranks_cuda.c, and the one on the fake runtime and NCCL,
 * test_ranks_nccl.c): every tensor of a sharded pipeline, loaded and
 * gathered on the device, read back and compared with its host bytes.
 */
#ifndef MLO_TESTS_RANKS_DEVICE_H
#define MLO_TESTS_RANKS_DEVICE_H

#include "ranks_check.h"

#include <cuda_runtime_api.h>
#include <string.h>

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
