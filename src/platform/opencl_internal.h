/*
 * opencl_internal.h — what the two files of the OpenCL platform share
 * (opencl.c: memory, copies, events, the ops table; opencl_open.c: the
 * spec, finding the device, configuring it, its queues).
 */
#ifndef MLO_PLATFORM_OPENCL_INTERNAL_H
#define MLO_PLATFORM_OPENCL_INTERNAL_H

#define CL_TARGET_OPENCL_VERSION 120

#include "platform/platform.h"

#include <CL/cl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* A recorded point on a queue: the marker of the latest record, or NULL
 * before the first record (waiting on it is then a no-op, as in CUDA). */
struct mlo_event {
  cl_event last;
  mlo_stamp *stamp; /* when `last` completed (copy-queue records only) */
};

/* A pinned host buffer: the cl_mem behind a mapped pointer, kept so that
 * host_free can unmap and release it. */
struct host_map {
  void *ptr;
  cl_mem mem;
  struct host_map *next;
};

struct ocl_options {
  unsigned long index;
  uint64_t capacity;  /* 0: the device's global memory */
  int blocking_d2h;   /* -1: decide from the device */
  int pinned;         /* -1: on unless MLO_NO_PINNED=1 */
  uint64_t max_alloc; /* 0: the device's; else a lower limit (tests, or a driver that lies) */
};

/* A block larger than the device's largest allocation: buffers of
 * max_alloc bytes (the last shorter), addressed as one range.  Its handle
 * is the struct's address, which no cl_mem can be; core's layout keeps
 * every tensor inside one segment, and resolve gives a tensor its cl_mem. */
struct seg_block {
  size_t bytes, seg, n;
  cl_mem *mems;
  struct seg_block *next;
};

struct ocl_ctx {
  cl_device_id device;
  cl_context context;
  cl_command_queue copy_q, compute_q;
  uint64_t capacity;  /* what get_memory reports as total */
  uint64_t max_alloc; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  bool blocking_d2h, pinned;
  pthread_mutex_t lock; /* guards used, maps, warned and every mlo_event */
  uint64_t used;        /* bytes of live blocks, for capacity and free */
  struct host_map *maps;
  bool warned_pageable;
  struct seg_block *segs; /* live segmented blocks; guarded by lock */
};

/* The name of an OpenCL status ("CL_OUT_OF_RESOURCES"). */
const char *ocl_err_name(cl_int err);

/* Opening a device (opencl_open.c). */
int ocl_parse_spec(const char *args, struct ocl_options *o, char *err, size_t errlen);
int ocl_find_device(unsigned long index, cl_platform_id *plat_out, cl_device_id *dev_out, char *err,
                    size_t errlen);
void ocl_configure(struct ocl_ctx *c, const struct ocl_options *o, mlo_platform *p);
int ocl_create_queues(struct ocl_ctx *c, cl_platform_id plat, char *err, size_t errlen);

#endif
