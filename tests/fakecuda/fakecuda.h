/*
 * fakecuda.h — what the two files of the fake CUDA runtime share
 * (fakecuda.c: configuration, devices, contexts, streams, events, errors,
 * the driver entry points; fakecuda_mem.c: device memory, pools, host
 * memory, copies).  A test double only: see fakecuda.c's header for what it
 * models and what it does not.
 */
#ifndef MLO_FAKECUDA_H
#define MLO_FAKECUDA_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FC_MAX_DEVICES 8

/* Completion of one point in a stream (an event's record, a free): waits
 * capture the marker, so a later re-record does not change what they wait
 * for.  Reference-counted under fc.lock. */
struct fc_marker {
  int refs;
  bool done;
};

enum fc_op_kind { FC_COPY, FC_HOSTFN, FC_RECORD, FC_WAIT, FC_RELEASE };

struct fc_block;

struct fc_op {
  enum fc_op_kind kind;
  struct fc_op *next;
  void *dst;
  const void *src;
  size_t bytes;
  void *staging;         /* a pageable source's snapshot, freed after the copy */
  bool dev_dst, dev_src; /* COPY: which sides are device memory */
  void (*fn)(void *);
  void *user;
  struct fc_marker *marker; /* RECORD: completes it; WAIT: waits for it; RELEASE: the free's */
  struct fc_block *block;   /* RELEASE: the block a cudaFreeAsync frees */
};

/* A stream is a FIFO worker thread: ops run in submission order, each only
 * once everything before it on the stream has finished. */
struct CUstream_st {
  int device;
  struct fc_op *head, *tail;
  bool stop;
  struct CUstream_st *next_live; /* fc.streams */
};

struct CUevent_st {
  int device;
  struct fc_marker *marker; /* NULL until first recorded */
};

struct CUctx_st {
  int device;
};

struct fc_device {
  uint64_t total;   /* MLO_FAKECUDA_MEMORY */
  uint64_t used;    /* bytes handed out by the device (pool reserves, cudaMalloc) */
  bool ctx_created; /* its primary context was ever created */
  struct CUctx_st primary;
  struct CUstream_st *legacy; /* the NULL stream, created on first use */
};

struct fc_global {
  pthread_mutex_t lock; /* guards everything below and every marker/op/block */
  pthread_cond_t cond;  /* broadcast on every completion and every new op */
  int ndevices;
  struct fc_device dev[FC_MAX_DEVICES];
  uint64_t ctx_reserve; /* what a context costs: cudaMemGetInfo shows it used */
  uint64_t copy_delay_us, copy_bw;
  bool host_alloc_fails, no_host_register, free_fails;
  uint64_t use_after_free;     /* device accesses of freed memory, seen at run time */
  uint64_t host_fns;           /* cudaLaunchHostFunc calls (fakecuda_host_fns) */
  uint64_t free_host_calls;    /* cudaFreeHost calls (fakecuda_free_host_calls) */
  struct CUstream_st *streams; /* live streams, for device-wide synchronize */
};

extern struct fc_global fc;

void fc_init(void);
/* The calling thread's context, binding the current device's primary one
 * (and creating it) when there is none, as every runtime call that needs
 * a context does. */
struct CUctx_st *fc_need_ctx(void);
/* The record of a failed call: the thread's last error, and e. */
cudaError_t fc_fail(cudaError_t e);
/* The injected sticky error, counted and recorded, or cudaSuccess. */
cudaError_t fc_sticky(void);
/* The stream behind a handle (NULL and the legacy/per-thread handles are
 * the current device's default stream); NULL if the handle is bad. */
struct CUstream_st *fc_stream(cudaStream_t s);
/* Queues an op (ownership passes to the stream); fc.lock held. */
void fc_enqueue(struct CUstream_st *s, struct fc_op *op);
struct fc_marker *fc_marker_new(void);   /* one reference; fc.lock held */
void fc_marker_put(struct fc_marker *m); /* fc.lock held */
/* Waits until s has run everything queued on it; fc.lock held. */
void fc_drain(struct CUstream_st *s);
/* Runs a FREE op's release (fakecuda_mem.c); fc.lock held. */
void fc_block_freed(struct fc_block *b, struct fc_marker *m);
/* Checks that [p, p+n) lies in device memory that is not freed, counting a
 * use-after-free otherwise; fc.lock held. */
void fc_check_device_access(const void *p, size_t n);
/* Pools give back what they hold over their release threshold (at
 * synchronize points, as the real allocator does). */
void fc_trim_pools(int device);

#endif
