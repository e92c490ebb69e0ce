/*
 * cuda_open.c — opening a CUDA device for the platform in cuda.c: the
 * spec's options (N, capacity=, pinned=, chunk=, stream=), checking the
 * device is there, its stream-ordered memory pool (so frees never block
 * the host), the copy, readback and release streams (and the compute one,
 * unless the caller's is given), and the description a report prints.
 */
#include "base/sysio.h"
#include "base/log.h"
#include "platform/cuda_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cu_option(const char *key, const char *value, void *user, char *err, size_t errlen) {
  struct cuda_options *o = user;
  if (!strcmp(key, "pinned")) {
    if (strcmp(value, "0") && strcmp(value, "1")) {
      snprintf(err, errlen, "cuda platform option pinned=%s: expected 0 or 1", value);
      return MLO_EINVAL;
    }
    o->pinned = value[0] == '1';
    return MLO_OK;
  }
  if (!strcmp(key, "chunk")) {
    if (mlo_parse_size(value, false, &o->chunk) || o->chunk < 4096 ||
        o->chunk > ((uint64_t)1 << 40)) {
      snprintf(err, errlen, "cuda platform option chunk=%s: expected a size from 4K to 1T", value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  if (!strcmp(key, "capacity")) {
    if (mlo_parse_size(value, false, &o->capacity)) {
      snprintf(err, errlen, "cuda platform option capacity=%s: expected a size such as 24G", value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  if (!strcmp(key, "stream")) {
    /* A framework's stream (torch.cuda.current_stream().cuda_stream), so
     * compute waits for loads on the stream the framework launches on.  0
     * is the legacy default stream: torch's default stream's handle. */
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 0);
    if (!value[0] || *end || errno || value[0] == '-') {
      snprintf(err, errlen,
               "cuda platform option stream=%s: expected a cudaStream_t handle such as 0x5555 "
               "(0: the legacy default stream)",
               value);
      return MLO_EINVAL;
    }
    /* 1 (cudaStreamLegacy) and 2 (cudaStreamPerThread) are not streams but
     * names the runtime resolves per call, the latter per calling thread:
     * "compute" would then be each thread's own stream, and a free queued
     * from the disk reader's thread would not be ordered after the user's
     * kernels.  0 names the legacy stream already. */
    if (v == (uintptr_t)cudaStreamLegacy || v == (uintptr_t)cudaStreamPerThread) {
      snprintf(err, errlen,
               "cuda platform option stream=%s: %s is a special handle, not a stream; give "
               "the stream the framework launches on (0: the legacy default stream)",
               value,
               v == (uintptr_t)cudaStreamLegacy ? "cudaStreamLegacy" : "cudaStreamPerThread");
      return MLO_EINVAL;
    }
    o->stream = (uintptr_t)v;
    o->stream_given = true;
    return MLO_OK;
  }
  snprintf(err, errlen,
           "unknown cuda platform option %s=%s (known: pinned, chunk, capacity, stream)", key,
           value);
  return MLO_EINVAL;
}

/* "" | "N" | "N:opts" | "opts".
 * Parsed before any CUDA call, so a bad spec is MLO_EINVAL even without a GPU. */
int cu_parse_spec(const char *args, struct cuda_options *o, char *err, size_t errlen) {
  return mlo_spec_parse_indexed("cuda", args, 1024, &o->index, cu_option, o, err, errlen);
}

int cu_find_device(unsigned long index, char *err, size_t errlen) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    snprintf(err, errlen, "no CUDA device visible (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return MLO_ENODEV;
  }
  if (index >= (unsigned long)count) {
    snprintf(err, errlen, "CUDA device %lu not present (%d visible)", index, count);
    return MLO_ENODEV;
  }
  return MLO_OK;
}

/* Our own pool, so that its reserve is ours to report and reuse.  Capped
 * (capacity=), the pool may not grow past the cap (maxSize) and keeps up to
 * it in reserve; uncapped, the release threshold is 0, so memory freed by
 * evictions goes back to the driver at synchronize points and can serve the
 * user's own allocations and other processes (docs/platforms.md). */
static cudaError_t create_pool(struct cuda_ctx *c) {
  int supported = 0;
  cudaError_t e = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, c->device);
  if (e != cudaSuccess || !supported) {
    (void)cudaGetLastError();
    mlo_logf(MLO_LOG_WARN, "cuda: no stream-ordered allocator on device %d: frees will synchronize",
             c->device);
    return cudaSuccess;
  }
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = c->device;
  bool capped = c->capacity != 0;
  if (capped) props.maxSize = (size_t)c->capacity;
  e = cudaMemPoolCreate(&c->pool, &props);
  uint64_t threshold = capped ? c->capacity : 0;
  int on = 1;
  if (e == cudaSuccess)
    e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (e == cudaSuccess)
    e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolReuseAllowInternalDependencies, &on);
  return e;
}

/* On the caller's thread: our device's primary context is created and made
 * current for the setup (cudaSetDevice), then the caller's context, or
 * none, is current again. */
int cu_create_streams(struct cuda_ctx *c, char *err, size_t errlen) {
  void *prev = NULL;
  cudaError_t e = mlo_cu_ctx_current(&prev);
  const char *what = "cuCtxGetCurrent (through cudaGetDriverEntryPointByVersion)";
  if (e == cudaSuccess) {
    what = "cudaSetDevice";
    e = cudaSetDevice(c->device);
  }
  if (e == cudaSuccess) {
    what = "cuCtxGetCurrent";
    e = mlo_cu_ctx_current(&c->primary);
  }
  cudaStream_t *streams[] = {&c->copy, &c->readback, &c->compute, &c->release};
  for (int i = 0; i < 4 && e == cudaSuccess; i++) {
    if (streams[i] == &c->compute && c->compute_external) continue; /* the caller's */
    what = "cudaStreamCreateWithFlags";
    e = cudaStreamCreateWithFlags(streams[i], cudaStreamNonBlocking);
  }
  cudaEvent_t *tails[] = {&c->copy_tail, &c->readback_tail, &c->compute_tail};
  for (int i = 0; i < 3 && e == cudaSuccess; i++)
    e = cudaEventCreateWithFlags(tails[i], cudaEventDisableTiming);
  if (e == cudaSuccess) {
    what = "creating the memory pool";
    e = create_pool(c);
  }
  int rc = MLO_OK;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(err, errlen, "cuda platform: %s failed: %s", what, cudaGetErrorString(e));
    rc = e == cudaErrorMemoryAllocation ? MLO_ENOMEM_DEVICE : MLO_EPLATFORM;
  }
  if (mlo_cu_ctx_set(prev) != cudaSuccess) (void)cudaGetLastError(); /* the caller's, back */
  return rc;
}

void cu_describe(struct cuda_ctx *c, mlo_platform *p) {
  struct cudaDeviceProp prop;
  memset(&prop, 0, sizeof prop);
  if (cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(prop.name, sizeof prop.name, "?");
  }
  int reg = 0;
  if (cudaDeviceGetAttribute(&reg, cudaDevAttrHostRegisterSupported, c->device) != cudaSuccess)
    (void)cudaGetLastError();
  c->host_register = reg != 0;
  /* capacity=: never more than the device has; unknown size: no cap. */
  uint64_t total = prop.totalGlobalMem ? (uint64_t)prop.totalGlobalMem : UINT64_MAX;
  bool capped = c->capacity && c->capacity < total;
  c->capacity = capped ? c->capacity : total;
  char mem[32], cap[48] = "";
  mlo_format_size(prop.totalGlobalMem, mem, sizeof mem);
  if (capped) {
    char size[32];
    snprintf(cap, sizeof cap, ", capacity %s", mlo_format_size(c->capacity, size, sizeof size));
  }
  snprintf(p->description, sizeof p->description, "CUDA device %d: %.80s (%s, cc %d.%d)%s%s",
           c->device, prop.name, mem, prop.major, prop.minor, cap,
           c->pinned ? "" : ", pageable host memory");
}
