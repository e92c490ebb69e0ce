/*
 * opencl.c — the OpenCL platform: "opencl[:N][:key=value,...]".
 *
 * Written against the OpenCL 1.2 API so that it runs on PoCL (the CPU
 * device CI has) as well as on GPU drivers.  Device N counts over every
 * platform's devices in the order the ICD loader lists them.
 *
 * The model of platform.h maps onto two in-order command queues in one
 * context, COPY and COMPUTE.  A device block is a cl_mem (not addressable:
 * caps.device_pointers is false).  OpenCL events only come from commands, so
 * an mlo_event holds the cl_event of the latest marker enqueued by a record;
 * "queue waits for event" is a barrier with that event in its wait list.
 * Releasing a cl_mem is already ordered after the commands that use it (the
 * runtime deletes it only once they have finished: OpenCL 1.2 §5.4.1), so
 * dev_free never blocks and never races a queued copy or kernel.
 *
 * Options: capacity=SIZE caps the memory we hand out (to force eviction on
 * a big device), blocking_d2h=0|1 overrides the XPU rule (on by default for
 * Intel GPUs), pinned=0|1 (MLO_NO_PINNED=1 also turns pinning off).
 * docs/platforms.md has the ordering argument in full.
 */
#include "base/sysio.h"
#include "base/log.h"
#include "platform/opencl_internal.h"
#include "platform/module.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The segmented block behind a handle, or NULL for a plain cl_mem. */
static struct seg_block *find_seg(struct ocl_ctx *c, const void *block) {
  pthread_mutex_lock(&c->lock);
  struct seg_block *b = c->segs;
  while (b && (const void *)b != block) b = b->next;
  pthread_mutex_unlock(&c->lock);
  return b;
}

/* Maps an OpenCL error to a status; device exhaustion is MLO_ENOMEM_DEVICE
 * (CL_OUT_OF_RESOURCES is how most drivers report a buffer they could not
 * back at first use), everything else is logged and MLO_EPLATFORM. */
static bool is_oom(cl_int err) {
  return err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES;
}

static int map_err(cl_int err, const char *what) {
  if (err == CL_SUCCESS) return MLO_OK;
  if (is_oom(err)) {
    mlo_logf(MLO_LOG_INFO, "opencl: %s: device out of memory (%s)", what, ocl_err_name(err));
    return MLO_ENOMEM_DEVICE;
  }
  if (err == CL_OUT_OF_HOST_MEMORY) return MLO_ENOMEM;
  mlo_logf(MLO_LOG_ERROR, "opencl: %s failed: %s (%d)", what, ocl_err_name(err), (int)err);
  return MLO_EPLATFORM;
}

/* ---- device blocks ------------------------------------------------------ */

/* The memory of released buffers returns only when the commands that used
 * them finish, and implementations allocate a buffer's memory lazily, at
 * its first command: an allocation failure right after evictions may be
 * room not yet given back.  Drain both queues (once) before believing it. */
static void drain_for_memory(struct ocl_ctx *c) {
  clFinish(c->copy_q);
  clFinish(c->compute_q);
}

/* One buffer, with the drain-and-retry of a failure that may be room not
 * yet given back. */
static int create_buffer(struct ocl_ctx *c, size_t bytes, cl_mem *out) {
  cl_int err = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(c->context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &err);
  if (is_oom(err)) {
    drain_for_memory(c);
    mem = clCreateBuffer(c->context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &err);
  }
  if (err != CL_SUCCESS) return map_err(err, "clCreateBuffer");
  *out = mem;
  return MLO_OK;
}

static int ocl_dev_alloc(void *ctx, size_t bytes, void **block) {
  struct ocl_ctx *c = ctx;
  *block = NULL;
  /* Reserve first, so that two threads cannot both pass the capacity check. */
  pthread_mutex_lock(&c->lock);
  bool fits = bytes <= c->capacity - c->used;
  if (fits) c->used += bytes;
  pthread_mutex_unlock(&c->lock);
  if (!fits) return MLO_ENOMEM_DEVICE;
  int rc = MLO_OK;
  if (bytes <= c->max_alloc) {
    rc = create_buffer(c, bytes, (cl_mem *)block);
  } else { /* several buffers under the limit, one range */
    struct seg_block *b = mlo_calloc(1, sizeof *b);
    size_t n = (size_t)((bytes + c->max_alloc - 1) / c->max_alloc);
    if (!b || !(b->mems = mlo_calloc(n, sizeof *b->mems))) rc = MLO_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
      size_t len = i + 1 < n ? (size_t)c->max_alloc : bytes - (n - 1) * (size_t)c->max_alloc;
      rc = create_buffer(c, len, &b->mems[i]);
      if (!rc) b->n = i + 1;
    }
    if (!rc) {
      b->bytes = bytes;
      b->seg = (size_t)c->max_alloc;
      pthread_mutex_lock(&c->lock);
      b->next = c->segs;
      c->segs = b;
      pthread_mutex_unlock(&c->lock);
      *block = b;
    } else if (b) {
      for (size_t i = 0; i < b->n; i++) clReleaseMemObject(b->mems[i]);
      free(b->mems);
      free(b);
    }
  }
  if (rc) {
    pthread_mutex_lock(&c->lock);
    c->used -= bytes;
    pthread_mutex_unlock(&c->lock);
  }
  return rc;
}

/* No wait needed: the runtime deletes the buffer only after every command
 * already queued on either queue that uses it has finished. */
static int ocl_dev_free(void *ctx, void *block, size_t bytes) {
  struct ocl_ctx *c = ctx;
  struct seg_block *b = find_seg(c, block);
  int rc = MLO_OK;
  if (b) {
    pthread_mutex_lock(&c->lock);
    struct seg_block **pp = &c->segs;
    while (*pp != b) pp = &(*pp)->next;
    *pp = b->next;
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < b->n; i++) {
      int r = map_err(clReleaseMemObject(b->mems[i]), "clReleaseMemObject");
      if (!rc) rc = r;
    }
    free(b->mems);
    free(b);
  } else {
    rc = map_err(clReleaseMemObject((cl_mem)block), "clReleaseMemObject");
  }
  if (rc) return rc; /* an object the runtime did not know: nothing was released */
  pthread_mutex_lock(&c->lock);
  c->used -= bytes <= c->used ? bytes : c->used;
  pthread_mutex_unlock(&c->lock);
  return MLO_OK;
}

static int ocl_get_memory(void *ctx, uint64_t *total, uint64_t *free_bytes) {
  struct ocl_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  *total = c->capacity;
  *free_bytes = c->capacity - c->used;
  pthread_mutex_unlock(&c->lock);
  return MLO_OK;
}

/* ---- host memory -------------------------------------------------------- */

static void warn_pageable_once(struct ocl_ctx *c, const char *why) {
  pthread_mutex_lock(&c->lock);
  bool first = !c->warned_pageable;
  c->warned_pageable = true;
  pthread_mutex_unlock(&c->lock);
  if (first) mlo_logf(MLO_LOG_WARN, "opencl: host memory is pageable: %s", why);
}

/* A CL_MEM_ALLOC_HOST_PTR buffer mapped for the host: the driver's pinned
 * memory, which its DMA engine reads without a staging copy. */
static int pinned_alloc(struct ocl_ctx *c, size_t bytes, void **ptr) {
  struct host_map *m = mlo_calloc(1, sizeof *m);
  if (!m) return MLO_ENOMEM;
  cl_int err = CL_SUCCESS;
  m->mem = clCreateBuffer(c->context, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
  if (err != CL_SUCCESS) goto out_free_entry;
  m->ptr = clEnqueueMapBuffer(c->copy_q, m->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0,
                              NULL, NULL, &err);
  if (err != CL_SUCCESS || !m->ptr) goto out_release_buffer;
  pthread_mutex_lock(&c->lock);
  m->next = c->maps;
  c->maps = m;
  pthread_mutex_unlock(&c->lock);
  *ptr = m->ptr;
  return MLO_OK;
out_release_buffer:
  clReleaseMemObject(m->mem);
out_free_entry:
  free(m);
  return MLO_EPLATFORM;
}

static int ocl_host_alloc(void *ctx, size_t bytes, bool pinned, void **ptr, bool *got_pinned) {
  struct ocl_ctx *c = ctx;
  *ptr = NULL;
  *got_pinned = false;
  if (pinned && !c->pinned) warn_pageable_once(c, "pinning disabled (pinned=0 or MLO_NO_PINNED=1)");
  if (pinned && c->pinned && bytes > c->max_alloc) {
    /* One host range cannot be made of several mapped buffers (each maps
     * where the runtime puts it), and the slab is one range: it stays
     * pageable, and says so — a block, by contrast, is built from segments. */
    char a[32], b[32];
    mlo_logf(MLO_LOG_WARN,
             "opencl: a %s host slab is larger than the device's largest allocation (%s): it "
             "stays pageable, and loads from it are staged by the driver",
             mlo_format_size(bytes, a, sizeof a), mlo_format_size(c->max_alloc, b, sizeof b));
  } else if (pinned && c->pinned && bytes) {
    if (pinned_alloc(c, bytes, ptr) == MLO_OK) {
      *got_pinned = true;
      return MLO_OK;
    }
    warn_pageable_once(c, "a CL_MEM_ALLOC_HOST_PTR buffer could not be created or mapped");
  }
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  if (rounded < bytes) return MLO_ENOMEM;
  *ptr = mlo_aligned_alloc(4096, rounded ? rounded : 4096);
  return *ptr ? MLO_OK : MLO_ENOMEM;
}

/* Looks the pointer up rather than trusting `pinned`, so a pageable buffer
 * is never handed to the OpenCL runtime and a mapped one never to free(). */
static void ocl_host_free(void *ctx, void *ptr, size_t bytes, bool pinned) {
  struct ocl_ctx *c = ctx;
  (void)bytes;
  (void)pinned;
  pthread_mutex_lock(&c->lock);
  struct host_map **link = &c->maps;
  while (*link && (*link)->ptr != ptr) link = &(*link)->next;
  struct host_map *m = *link;
  if (m) *link = m->next;
  pthread_mutex_unlock(&c->lock);
  if (!m) {
    free(ptr);
    return;
  }
  /* Queued behind any copy still reading the slab (in-order copy queue). */
  map_err(clEnqueueUnmapMemObject(c->copy_q, m->mem, m->ptr, 0, NULL, NULL),
          "clEnqueueUnmapMemObject");
  clFlush(c->copy_q);
  clReleaseMemObject(m->mem);
  free(m);
}

/* ---- copies ------------------------------------------------------------- */

static cl_int write_one(struct ocl_ctx *c, cl_mem mem, size_t offset, const void *src,
                        size_t bytes) {
  cl_int err = clEnqueueWriteBuffer(c->copy_q, mem, CL_FALSE, offset, bytes, src, 0, NULL, NULL);
  if (is_oom(err)) { /* the lazy allocation of the buffer, at its first write */
    drain_for_memory(c);
    err = clEnqueueWriteBuffer(c->copy_q, mem, CL_FALSE, offset, bytes, src, 0, NULL, NULL);
  }
  return err;
}

/* With the XPU rule the read blocks until the data is on the host. */
static cl_int read_one(struct ocl_ctx *c, void *dst, cl_mem mem, size_t offset, size_t bytes) {
  cl_bool blocking = c->blocking_d2h ? CL_TRUE : CL_FALSE;
  return clEnqueueReadBuffer(c->copy_q, mem, blocking, offset, bytes, dst, 0, NULL, NULL);
}

/* A copy into or out of a block: one command, or one per segment it spans
 * in a segmented block (all on the copy queue, in order). */
static int copy_block(struct ocl_ctx *c, bool to_device, void *block, size_t offset, void *host,
                      size_t bytes) {
  struct seg_block *b = find_seg(c, block);
  cl_int err = CL_SUCCESS;
  if (!b) {
    err = to_device ? write_one(c, (cl_mem)block, offset, host, bytes)
                    : read_one(c, host, (cl_mem)block, offset, bytes);
  } else {
    if (offset > b->bytes || bytes > b->bytes - offset) return MLO_EINVAL;
    for (size_t done = 0; err == CL_SUCCESS && done < bytes;) {
      size_t at = offset + done, i = at / b->seg, local = at % b->seg;
      size_t n = b->seg - local < bytes - done ? b->seg - local : bytes - done;
      char *h = (char *)host + done;
      err =
          to_device ? write_one(c, b->mems[i], local, h, n) : read_one(c, h, b->mems[i], local, n);
      done += n;
    }
  }
  if (err != CL_SUCCESS)
    return map_err(err, to_device ? "clEnqueueWriteBuffer" : "clEnqueueReadBuffer");
  /* Start the copy now, so that it overlaps whatever the host does next. */
  return map_err(clFlush(c->copy_q), "clFlush");
}

static int ocl_copy_h2d(void *ctx, void *block, size_t offset, const void *src, size_t bytes) {
  return copy_block(ctx, true, block, offset, (void *)(uintptr_t)src, bytes);
}

static int ocl_copy_d2h(void *ctx, void *dst, const void *block, size_t offset, size_t bytes) {
  return copy_block(ctx, false, (void *)(uintptr_t)block, offset, dst, bytes);
}

/* The cl_mem and offset within it of a byte of a block. */
static void ocl_resolve(void *ctx, void *block, size_t offset, void **handle, size_t *local) {
  struct seg_block *b = find_seg(ctx, block);
  if (!b) {
    *handle = block;
    *local = offset;
    return;
  }
  size_t i = offset / b->seg < b->n ? offset / b->seg : b->n - 1;
  *handle = b->mems[i];
  *local = offset - i * b->seg;
}

/* ---- events ------------------------------------------------------------- */

static int ocl_event_create(void *ctx, mlo_event **ev) {
  (void)ctx;
  *ev = mlo_calloc(1, sizeof **ev);
  return *ev ? MLO_OK : MLO_ENOMEM;
}

static void ocl_event_destroy(void *ctx, mlo_event *ev) {
  (void)ctx;
  if (ev->last) clReleaseEvent(ev->last);
  mlo_stamp_put(ev->stamp);
  free(ev);
}

static void CL_CALLBACK stamp_on_complete(cl_event e, cl_int status, void *user) {
  (void)e, (void)status; /* an error completes the command too */
  mlo_stamp_fire(user);
}

/* A marker completes when everything enqueued before it has.  The flush is
 * required: a command on another queue may only wait on this event once
 * it has been submitted (OpenCL 1.2 §5.13). */
static int record_on(struct ocl_ctx *c, cl_command_queue q, mlo_event *ev, bool stamped) {
  cl_event marker = NULL;
  cl_int err = clEnqueueMarkerWithWaitList(q, 0, NULL, &marker);
  if (err != CL_SUCCESS) return map_err(err, "clEnqueueMarkerWithWaitList");
  /* The completion time, for traces; best effort (no stamp: unknown). */
  mlo_stamp *stamp = stamped ? mlo_stamp_new() : NULL;
  if (stamp && clSetEventCallback(marker, CL_COMPLETE, stamp_on_complete, stamp) != CL_SUCCESS) {
    mlo_stamp_put(stamp);
    mlo_stamp_put(stamp);
    stamp = NULL;
  }
  err = clFlush(q);
  pthread_mutex_lock(&c->lock);
  cl_event old = ev->last;
  mlo_stamp *old_stamp = ev->stamp;
  ev->last = marker;
  ev->stamp = stamp;
  pthread_mutex_unlock(&c->lock);
  if (old) clReleaseEvent(old);
  mlo_stamp_put(old_stamp);
  return map_err(err, "clFlush");
}

static int ocl_event_record_copy(void *ctx, mlo_event *ev) {
  struct ocl_ctx *c = ctx;
  return record_on(c, c->copy_q, ev, true);
}

static int ocl_event_record_compute(void *ctx, mlo_event *ev) {
  struct ocl_ctx *c = ctx;
  return record_on(c, c->compute_q, ev, false);
}

static int ocl_event_time(void *ctx, mlo_event *ev, uint64_t *t_ns) {
  struct ocl_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  int rc = mlo_stamp_time(ev->stamp, t_ns);
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* The event's current cl_event, retained so that a concurrent record cannot
 * release it under us; NULL if never recorded. */
static cl_event take_event(struct ocl_ctx *c, mlo_event *ev) {
  pthread_mutex_lock(&c->lock);
  cl_event e = ev->last;
  if (e) clRetainEvent(e);
  pthread_mutex_unlock(&c->lock);
  return e;
}

/* Everything enqueued on q after this waits for the event. */
static int queue_wait(struct ocl_ctx *c, cl_command_queue q, mlo_event *ev) {
  cl_event e = take_event(c, ev);
  if (!e) return MLO_OK;
  cl_int err = clEnqueueBarrierWithWaitList(q, 1, &e, NULL);
  clReleaseEvent(e);
  if (err != CL_SUCCESS) return map_err(err, "clEnqueueBarrierWithWaitList");
  return map_err(clFlush(q), "clFlush");
}

static int ocl_compute_wait(void *ctx, mlo_event *ev) {
  struct ocl_ctx *c = ctx;
  return queue_wait(c, c->compute_q, ev);
}

static int ocl_copy_wait(void *ctx, mlo_event *ev) {
  struct ocl_ctx *c = ctx;
  return queue_wait(c, c->copy_q, ev);
}

static int ocl_event_sync(void *ctx, mlo_event *ev) {
  cl_event e = take_event(ctx, ev);
  if (!e) return MLO_OK;
  cl_int err = clWaitForEvents(1, &e);
  clReleaseEvent(e);
  return map_err(err, "clWaitForEvents");
}

static int ocl_event_query(void *ctx, mlo_event *ev) {
  cl_event e = take_event(ctx, ev);
  if (!e) return MLO_OK;
  cl_int status = CL_QUEUED;
  cl_int err = clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  clReleaseEvent(e);
  if (err != CL_SUCCESS) return map_err(err, "clGetEventInfo");
  if (status < 0) return map_err(status, "a command before the event");
  return status == CL_COMPLETE ? MLO_OK : MLO_EBUSY;
}

static int ocl_synchronize(void *ctx) {
  struct ocl_ctx *c = ctx;
  int rc = map_err(clFinish(c->copy_q), "clFinish(copy)");
  int rc2 = map_err(clFinish(c->compute_q), "clFinish(compute)");
  return rc ? rc : rc2;
}

static void *ocl_compute_queue(void *ctx) {
  return ((struct ocl_ctx *)ctx)->compute_q;
}

static void ocl_get_caps(void *ctx, mlo_platform_caps *caps) {
  struct ocl_ctx *c = ctx;
  *caps = (mlo_platform_caps){
      .async_copy = true,
      .events = true,
      .pinned_host = c->pinned,
      .host_register = false, /* CL_MEM_USE_HOST_PTR may copy; never promised */
      .blocking_d2h = c->blocking_d2h,
      .device_pointers = false,
      .max_block_bytes = c->max_alloc,
  };
}

static void ocl_destroy(void *ctx) {
  struct ocl_ctx *c = ctx;
  if (!c) return;
  if (c->copy_q) clFinish(c->copy_q);
  if (c->compute_q) clFinish(c->compute_q);
  while (c->maps) { /* slabs the caller forgot: unmap so the runtime can free them */
    struct host_map *m = c->maps;
    c->maps = m->next;
    clEnqueueUnmapMemObject(c->copy_q, m->mem, m->ptr, 0, NULL, NULL);
    clFinish(c->copy_q);
    clReleaseMemObject(m->mem);
    free(m);
  }
  if (c->copy_q) clReleaseCommandQueue(c->copy_q);
  if (c->compute_q) clReleaseCommandQueue(c->compute_q);
  if (c->context) clReleaseContext(c->context);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static const struct mlo_platform_ops opencl_ops = {
    .name = "opencl",
    .destroy = ocl_destroy,
    .get_caps = ocl_get_caps,
    .get_memory = ocl_get_memory,
    .dev_alloc = ocl_dev_alloc,
    .dev_free = ocl_dev_free,
    .host_alloc = ocl_host_alloc,
    .host_free = ocl_host_free,
    .copy_h2d = ocl_copy_h2d,
    .copy_d2h = ocl_copy_d2h,
    .event_create = ocl_event_create,
    .event_destroy = ocl_event_destroy,
    .event_record_copy = ocl_event_record_copy,
    .event_time = ocl_event_time,
    .event_record_compute = ocl_event_record_compute,
    .compute_wait = ocl_compute_wait,
    .copy_wait = ocl_copy_wait,
    .event_sync = ocl_event_sync,
    .event_query = ocl_event_query,
    .resolve = ocl_resolve,
    .synchronize = ocl_synchronize,
    .compute_queue = ocl_compute_queue,
};

static int mlo_opencl_platform_create(const char *spec_args, mlo_platform *p, char *err,
                                      size_t errlen) {
  struct ocl_options opt = {.index = 0, .capacity = 0, .blocking_d2h = -1, .pinned = -1};
  int rc = ocl_parse_spec(spec_args ? spec_args : "", &opt, err, errlen);
  if (rc) return rc;
  cl_platform_id plat = NULL;
  struct ocl_ctx *c = mlo_calloc(1, sizeof *c);
  if (!c) return MLO_ENOMEM;
  pthread_mutex_init(&c->lock, NULL);
  rc = ocl_find_device(opt.index, &plat, &c->device, err, errlen);
  if (!rc) rc = ocl_create_queues(c, plat, err, errlen);
  if (rc) {
    ocl_destroy(c);
    return rc;
  }
  ocl_configure(c, &opt, p);
  p->ops = &opencl_ops;
  p->ctx = c;
  return MLO_OK;
}

/* The module's description (module.h): libmlo-opencl.so is this file. */
MLO_MODULE_DEFINE_PLATFORM("opencl", mlo_opencl_platform_create);
