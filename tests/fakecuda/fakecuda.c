/*
 * fakecuda.c — a fake CUDA runtime (libcudart.so.<major>) for tests, on
 * host memory and threads.
 *
 * Why: CI and the development machines have the CUDA toolkit but no GPU,
 * so the CUDA platform (src/platform/cuda.c, cuda_open.c) would otherwise
 * never run before a card is lent.  Put on LD_LIBRARY_PATH in place of the
 * real runtime, this library makes the platform's device paths run here,
 * with a GPU's asynchrony, so that ordering defects show as wrong bytes
 * instead of passing by luck.  Nothing outside tests/ may depend on it.
 *
 * What it models:
 *  - streams: each a FIFO worker thread; a call queues an op and returns;
 *    events complete when their stream reaches them (a wait captures the
 *    record it waits for); cudaStreamWaitEvent holds that stream's worker;
 *    cudaLaunchHostFunc runs on the worker, in order;
 *  - host registration is page-granular: a range on a page already
 *    page-locked is refused as already registered;
 *  - copies run when their stream reaches them, optionally slowed
 *    (MLO_FAKECUDA_COPY_US per copy, MLO_FAKECUDA_BW bytes/s) to widen
 *    races; a copy from a pageable source first waits for the stream to
 *    run everything queued before it (the driver synchronizes with the
 *    stream to stage it, review D8) and snapshots the source then, a copy
 *    into pageable memory returns once done (as the driver's staging
 *    does); a copy into memory registered read-only fails;
 *  - stream-ordered memory: pools (maxSize, release threshold, internal
 *    reuse dependencies; new memory mapped in 2 MiB granules, refused past
 *    maxSize counted in them, the idle reserve given back only at a
 *    synchronize over the threshold or cudaMemPoolTrimTo), cudaFreeAsync
 *    frees when its stream reaches it
 *    and fills the memory with 0xA5, so a use after the free reads
 *    garbage; a device access of freed memory is also counted
 *    (fakecuda_use_after_free);
 *  - contexts: a per-thread current context, none until a call needs one
 *    (then the current device's primary context is created and bound);
 *    cudaSetDevice creates and binds the device's primary context at once
 *    (CUDA 12 semantics); which devices' primary contexts were ever
 *    created is fakecuda_contexts_created(); cuCtxGetCurrent,
 *    cuCtxSetCurrent and cuStreamGetCtx through cudaGetDriverEntryPoint*;
 *  - configuration: MLO_FAKECUDA_DEVICES (default 1), MLO_FAKECUDA_MEMORY
 *    (bytes per device, default 4G, K/M/G suffixes), MLO_FAKECUDA_CONTEXT
 *    (what a context takes, default 64M), MLO_FAKECUDA_HOSTALLOC_FAIL=1
 *    (cudaHostAlloc/cudaMallocHost fail), MLO_FAKECUDA_NO_REGISTER=1
 *    (cudaHostRegister unsupported), MLO_FAKECUDA_FREE_FAIL=1 (frees fail
 *    and free nothing);
 *  - the per-thread last error (fc_fail), cudaErrorNotReady included, and
 *    sticky errors a test injects (fakecuda_inject_sticky).
 * What it does not: kernels (no cuBLAS: the workload backend cannot run on
 * it), the legacy default stream's implicit synchronization with blocking
 * streams (the platform's streams are non-blocking), graphs, IPC, peer
 * access, timing events, several contexts per device, and
 * the cost of anything.  Passing here is evidence about ordering logic, never a claim
 * that anything ran on a GPU.
 */
#include "fakecuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fc_global fc = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static _Thread_local struct CUctx_st *cur_ctx; /* none until a call needs one */
static _Thread_local int selected_device;      /* the runtime's per-thread device */
static _Thread_local cudaError_t last_error;

static uint64_t env_size(const char *name, uint64_t fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  uint64_t n = strtoull(v, &end, 10);
  switch (*end) {
  case 'K':
  case 'k':
    return n << 10;
  case 'M':
  case 'm':
    return n << 20;
  case 'G':
  case 'g':
    return n << 30;
  default:
    return n;
  }
}

static bool env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0");
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
  fc.ndevices = (int)env_size("MLO_FAKECUDA_DEVICES", 1);
  if (fc.ndevices > FC_MAX_DEVICES) fc.ndevices = FC_MAX_DEVICES;
  uint64_t total = env_size("MLO_FAKECUDA_MEMORY", (uint64_t)4 << 30);
  for (int d = 0; d < fc.ndevices; d++) {
    fc.dev[d].total = total;
    fc.dev[d].primary.device = d;
  }
  fc.ctx_reserve = env_size("MLO_FAKECUDA_CONTEXT", (uint64_t)64 << 20);
  fc.copy_delay_us = env_size("MLO_FAKECUDA_COPY_US", 0);
  fc.copy_bw = env_size("MLO_FAKECUDA_BW", 0);
  fc.host_alloc_fails = env_on("MLO_FAKECUDA_HOSTALLOC_FAIL");
  fc.no_host_register = env_on("MLO_FAKECUDA_NO_REGISTER");
  fc.free_fails = env_on("MLO_FAKECUDA_FREE_FAIL");
}

void fc_init(void) {
  pthread_once(&once, init_once);
}

/* The CUDA programming guide (error checking): "the runtime maintains an
 * error variable for each host thread that is initialized to cudaSuccess
 * and is overwritten by the error code each time an error occurs";
 * cudaGetLastError returns it and resets it.  cudaErrorNotReady (a query
 * of unfinished work) is stored like any other: a framework that checks
 * cudaGetLastError after each kernel launch (PyTorch) clears it after
 * each of its own queries for that reason (c10's CUDAEvent::query). */
cudaError_t fc_fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

/* A sticky error (fakecuda_inject_sticky): the runtime API's error list
 * says of them "any further CUDA work will return the same error", and it
 * cannot be reset.  Every call that does work checks here; each refusal
 * is counted (fakecuda_sticky_calls), so a test sees whether the platform
 * kept calling after one. */
static _Atomic int sticky_error;
static _Atomic uint64_t sticky_calls;

cudaError_t fc_sticky(void) {
  cudaError_t e = (cudaError_t)sticky_error;
  if (e == cudaSuccess) return e;
  sticky_calls++;
  return fc_fail(e);
}

static void create_primary(int d) {
  pthread_mutex_lock(&fc.lock);
  fc.dev[d].ctx_created = true;
  pthread_mutex_unlock(&fc.lock);
}

struct CUctx_st *fc_need_ctx(void) {
  fc_init();
  if (!cur_ctx && selected_device < fc.ndevices) {
    create_primary(selected_device);
    cur_ctx = &fc.dev[selected_device].primary;
  }
  return cur_ctx;
}

/* ---- test helpers (looked up with dlsym) -------------------------------- */

/* Bit d set: device d's primary context was created at some point. */
unsigned fakecuda_contexts_created(void) {
  fc_init();
  unsigned mask = 0;
  pthread_mutex_lock(&fc.lock);
  for (int d = 0; d < fc.ndevices; d++)
    if (fc.dev[d].ctx_created) mask |= 1u << d;
  pthread_mutex_unlock(&fc.lock);
  return mask;
}

/* The calling thread's current context's device, -1 for none. */
int fakecuda_current_context(void) {
  return cur_ctx ? cur_ctx->device : -1;
}

/* Waits up to ms for every stream but `except` to have run everything
 * queued on it; true if they all did.  A test holds one stream (a host
 * function that blocks) and asks whether the others depend on it. */
bool fakecuda_idle_except(cudaStream_t except, unsigned ms) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += ms / 1000;
  deadline.tv_nsec += (long)(ms % 1000) * 1000000;
  if (deadline.tv_nsec >= 1000000000) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&fc.lock);
  bool idle = false;
  for (;;) {
    idle = true;
    for (struct CUstream_st *s = fc.streams; s; s = s->next_live) idle &= s == except || !s->head;
    if (idle || pthread_cond_timedwait(&fc.cond, &fc.lock, &deadline)) break;
  }
  pthread_mutex_unlock(&fc.lock);
  return idle;
}

/* Makes e sticky from now on (cudaSuccess: not any more, so that later
 * tests in the process run clean). */
void fakecuda_inject_sticky(cudaError_t e) {
  sticky_error = (int)e;
  sticky_calls = 0;
  if (e == cudaSuccess) last_error = cudaSuccess;
}

/* One of the fake's counters, read under its lock (the tests' getters). */
static uint64_t counter(const uint64_t *n) {
  pthread_mutex_lock(&fc.lock);
  uint64_t v = *n;
  pthread_mutex_unlock(&fc.lock);
  return v;
}

/* Calls refused with the sticky error since it was injected. */
uint64_t fakecuda_sticky_calls(void) {
  return sticky_calls;
}

/* cudaLaunchHostFunc calls so far (each holds its stream until the
 * driver's callback thread has run it, on a real device). */
uint64_t fakecuda_host_fns(void) {
  return counter(&fc.host_fns);
}

/* cudaFreeHost calls so far (each synchronizes the whole device). */
uint64_t fakecuda_free_host_calls(void) {
  return counter(&fc.free_host_calls);
}

uint64_t fakecuda_use_after_free(void) {
  return counter(&fc.use_after_free);
}

/* ---- devices ------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count) {
  fc_init();
  *count = fc.ndevices;
  return fc.ndevices ? cudaSuccess : fc_fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device) {
  fc_init();
  *device = cur_ctx ? cur_ctx->device : selected_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  fc_init();
  if (device < 0 || device >= fc.ndevices) return fc_fail(cudaErrorInvalidDevice);
  selected_device = device;
  create_primary(device);
  cur_ctx = &fc.dev[device].primary;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  fc_init();
  if (device < 0 || device >= fc.ndevices) return fc_fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "fakecuda device %d", device);
  prop->totalGlobalMem = (size_t)fc.dev[device].total;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  fc_init();
  if (device < 0 || device >= fc.ndevices) return fc_fail(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrMemoryPoolsSupported:
  case cudaDevAttrHostRegisterReadOnlySupported:
    *value = 1;
    break;
  case cudaDevAttrHostRegisterSupported:
    *value = !fc.no_host_register;
    break;
  default:
    *value = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

/* ---- errors ------------------------------------------------------------- */

/* A sticky error is never reset (the runtime API's error list). */
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = sticky_error ? (cudaError_t)sticky_error : cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return last_error;
}

static const struct {
  cudaError_t e;
  const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t e) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].e == e) return errors[i].name;
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].e == e) return errors[i].text;
  return "unknown error";
}

/* ---- driver entry points: the context calls ----------------------------- */

static CUresult fc_cuCtxGetCurrent(CUcontext *pctx) {
  *pctx = cur_ctx;
  return CUDA_SUCCESS;
}

static CUresult fc_cuCtxSetCurrent(CUcontext ctx) {
  cur_ctx = ctx;
  return CUDA_SUCCESS;
}

static CUresult fc_cuStreamGetCtx(CUstream stream, CUcontext *pctx) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  *pctx = &fc.dev[s->device].primary;
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)version;
  (void)flags;
  *fn = NULL;
  if (!strcmp(symbol, "cuCtxGetCurrent"))
    *fn = (void *)fc_cuCtxGetCurrent;
  else if (!strcmp(symbol, "cuCtxSetCurrent"))
    *fn = (void *)fc_cuCtxSetCurrent;
  else if (!strcmp(symbol, "cuStreamGetCtx"))
    *fn = (void *)fc_cuStreamGetCtx;
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

/* ---- streams ------------------------------------------------------------ */

struct fc_marker *fc_marker_new(void) {
  struct fc_marker *m = calloc(1, sizeof *m);
  if (m) m->refs = 1;
  return m;
}

void fc_marker_put(struct fc_marker *m) {
  if (m && --m->refs == 0) free(m);
}

static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Runs one op; fc.lock held on entry and exit, dropped for the work. */
static void run_op(struct fc_op *op) {
  switch (op->kind) {
  case FC_WAIT:
    while (!op->marker->done) pthread_cond_wait(&fc.cond, &fc.lock);
    break;
  case FC_RECORD:
    op->marker->done = true;
    break;
  case FC_COPY: {
    if (op->dev_dst) fc_check_device_access(op->dst, op->bytes);
    if (op->dev_src) fc_check_device_access(op->src, op->bytes);
    pthread_mutex_unlock(&fc.lock);
    uint64_t us = fc.copy_delay_us + (fc.copy_bw ? op->bytes * 1000000 / fc.copy_bw : 0);
    if (us) sleep_us(us);
    memmove(op->dst, op->staging ? op->staging : op->src, op->bytes);
    pthread_mutex_lock(&fc.lock);
    break;
  }
  case FC_HOSTFN:
    pthread_mutex_unlock(&fc.lock);
    op->fn(op->user);
    pthread_mutex_lock(&fc.lock);
    break;
  case FC_RELEASE:
    fc_block_freed(op->block, op->marker);
    op->marker->done = true;
    break;
  }
}

static void *worker(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&fc.lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&fc.cond, &fc.lock);
    if (!s->head) break;
    struct fc_op *op = s->head;
    run_op(op);
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    fc_marker_put(op->marker);
    free(op->staging);
    free(op);
    pthread_cond_broadcast(&fc.cond);
  }
  struct CUstream_st **at = &fc.streams;
  while (*at != s) at = &(*at)->next_live;
  *at = s->next_live;
  pthread_mutex_unlock(&fc.lock);
  free(s);
  return NULL;
}

static cudaError_t stream_new(int device, struct CUstream_st **out) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return fc_fail(cudaErrorMemoryAllocation);
  s->device = device;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  pthread_mutex_lock(&fc.lock);
  int rc = pthread_create(&t, &attr, worker, s);
  if (!rc) {
    s->next_live = fc.streams;
    fc.streams = s;
  }
  pthread_mutex_unlock(&fc.lock);
  pthread_attr_destroy(&attr);
  if (rc) {
    free(s);
    return fc_fail(cudaErrorMemoryAllocation);
  }
  *out = s;
  return cudaSuccess;
}

struct CUstream_st *fc_stream(cudaStream_t s) {
  if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return NULL;
  struct fc_device *d = &fc.dev[ctx->device];
  pthread_mutex_lock(&fc.lock);
  struct CUstream_st *legacy = d->legacy;
  pthread_mutex_unlock(&fc.lock);
  if (legacy) return legacy;
  if (stream_new(ctx->device, &legacy) != cudaSuccess) return NULL;
  pthread_mutex_lock(&fc.lock);
  if (d->legacy) { /* another thread won: this one retires */
    legacy->stop = true;
    pthread_cond_broadcast(&fc.cond);
  } else {
    d->legacy = legacy;
  }
  legacy = d->legacy;
  pthread_mutex_unlock(&fc.lock);
  return legacy;
}

void fc_enqueue(struct CUstream_st *s, struct fc_op *op) {
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_broadcast(&fc.cond);
}

void fc_drain(struct CUstream_st *s) {
  while (s->head) pthread_cond_wait(&fc.cond, &fc.lock);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  (void)flags;
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return fc_fail(cudaErrorNoDevice);
  return stream_new(ctx->device, stream);
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  return cudaStreamCreateWithFlags(stream, 0);
}

/* Returns at once; the worker finishes what is queued, then goes. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return fc_fail(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&fc.lock);
  stream->stop = true;
  pthread_cond_broadcast(&fc.cond);
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  pthread_mutex_lock(&fc.lock);
  fc_drain(s);
  pthread_mutex_unlock(&fc.lock);
  fc_trim_pools(s->device);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  pthread_mutex_lock(&fc.lock);
  bool idle = !s->head;
  pthread_mutex_unlock(&fc.lock);
  return idle ? cudaSuccess : fc_fail(cudaErrorNotReady);
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *device) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return fc_fail(cudaErrorInvalidResourceHandle);
  *device = s->device;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  (void)stream;
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return fc_fail(cudaErrorNoDevice);
  pthread_mutex_lock(&fc.lock);
  for (bool busy = true; busy;) {
    busy = false;
    for (struct CUstream_st *s = fc.streams; s; s = s->next_live)
      busy |= s->device == ctx->device && s->head;
    if (busy) pthread_cond_wait(&fc.cond, &fc.lock);
  }
  pthread_mutex_unlock(&fc.lock);
  fc_trim_pools(ctx->device);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *user) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  struct fc_op *op = calloc(1, sizeof *op);
  if (!op) return fc_fail(cudaErrorMemoryAllocation);
  op->kind = FC_HOSTFN;
  op->fn = fn;
  op->user = user;
  pthread_mutex_lock(&fc.lock);
  fc.host_fns++;
  fc_enqueue(s, op);
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

/* ---- events ------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return fc_fail(cudaErrorNoDevice);
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return fc_fail(cudaErrorMemoryAllocation);
  e->device = ctx->device;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return fc_fail(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&fc.lock);
  fc_marker_put(event->marker);
  pthread_mutex_unlock(&fc.lock);
  free(event);
  return cudaSuccess;
}

/* The event and the stream must belong to one device (one context). */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s || !event || s->device != event->device) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  struct fc_op *op = calloc(1, sizeof *op);
  pthread_mutex_lock(&fc.lock);
  struct fc_marker *m = op ? fc_marker_new() : NULL;
  if (!m) {
    pthread_mutex_unlock(&fc.lock);
    free(op);
    return fc_fail(cudaErrorMemoryAllocation);
  }
  op->kind = FC_RECORD;
  op->marker = m;
  m->refs++; /* the event's */
  fc_marker_put(event->marker);
  event->marker = m;
  fc_enqueue(s, op);
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  pthread_mutex_lock(&fc.lock);
  bool done = !event->marker || event->marker->done;
  pthread_mutex_unlock(&fc.lock);
  return done ? cudaSuccess : fc_fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  pthread_mutex_lock(&fc.lock);
  struct fc_marker *m = event->marker;
  if (m) {
    m->refs++;
    while (!m->done) pthread_cond_wait(&fc.cond, &fc.lock);
    fc_marker_put(m);
  }
  pthread_mutex_unlock(&fc.lock);
  fc_trim_pools(event->device);
  return cudaSuccess;
}

/* The stream waits for the event's latest record as of now (none: no
 * wait), whatever is recorded into the event later. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  struct CUstream_st *s = fc_stream(stream);
  if (!s || !event) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  struct fc_op *op = calloc(1, sizeof *op);
  if (!op) return fc_fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&fc.lock);
  if (!event->marker) {
    pthread_mutex_unlock(&fc.lock);
    free(op);
    return cudaSuccess;
  }
  op->kind = FC_WAIT;
  op->marker = event->marker;
  op->marker->refs++;
  fc_enqueue(s, op);
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}
