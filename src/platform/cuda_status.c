/*
 * cuda_status.c — what the CUDA platform makes of a runtime call's answer
 * (a status, a sticky error remembered, a query that leaves the thread's
 * last error as it found it) and entering the device's context.  Below
 * cuda.c and cuda_nccl.c, which both call it: it calls neither, so the two
 * no longer call each other in a circle.
 */
#include "platform/cuda_internal.h"

#include "base/log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

/* Errors after which the context is unusable: the process must exit to
 * recover.  The CUDA runtime API's error list says of each of these that
 * it "leaves the process in an inconsistent state and any further CUDA
 * work will return the same error" (the kernel faults, cudaErrorContained,
 * cudaErrorTensorMemoryLeak, cudaErrorExternalDevice,
 * cudaErrorMpsClientTerminated), or the context is gone
 * (cudaErrorContextIsDestroyed).  Also, though the list does not say so in
 * those words: an uncorrectable ECC or NVLink error (the driver retires
 * the context; the GPU needs a reset) and cudaErrorUnknown (an internal
 * error, after which nothing is known to work; seen after a refused
 * sanitizer) — treating them as recoverable only repeats the failure, and
 * its log line, at every later call.  Compared by value: the newer codes
 * are absent from older toolkits' headers. */
bool cu_is_sticky(cudaError_t e) {
  switch ((int)e) {
  case 214: /* cudaErrorECCUncorrectable */
  case 220: /* cudaErrorNvlinkUncorrectable */
  case 226: /* cudaErrorContained (CUDA 12.4+) */
  case 700: /* cudaErrorIllegalAddress */
  case 702: /* cudaErrorLaunchTimeout */
  case 709: /* cudaErrorContextIsDestroyed */
  case 710: /* cudaErrorAssert */
  case 714: /* cudaErrorHardwareStackError */
  case 715: /* cudaErrorIllegalInstruction */
  case 716: /* cudaErrorMisalignedAddress */
  case 717: /* cudaErrorInvalidAddressSpace */
  case 718: /* cudaErrorInvalidPc */
  case 719: /* cudaErrorLaunchFailure */
  case 721: /* cudaErrorTensorMemoryLeak (CUDA 12.8+) */
  case 810: /* cudaErrorMpsClientTerminated */
  case 911: /* cudaErrorExternalDevice */
  case 999: /* cudaErrorUnknown */
    return true;
  default:
    return false;
  }
}

/* Maps a runtime error to a status.  A non-sticky error is cleared from the
 * thread's last error (it is ours: the call just returned it), so the next
 * unrelated call does not report it again; a sticky one cannot be cleared
 * and is remembered.  Never called with cudaErrorNotReady (cu_query deals
 * with it: clearing blindly would drop an error the user has not read). */
int cu_status(struct cuda_ctx *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MLO_OK;
  if (cu_is_sticky(e)) {
    pthread_mutex_lock(&c->lock);
    bool first = !c->sticky;
    if (first) {
      c->sticky = true;
      snprintf(c->sticky_msg, sizeof c->sticky_msg, "%s: %s (%s)", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
    }
    pthread_mutex_unlock(&c->lock);
    if (first)
      mlo_logf(MLO_LOG_ERROR,
               "cuda: %s failed: %s (%s); the device context is lost, every "
               "later call fails",
               what, cudaGetErrorString(e), cudaGetErrorName(e));
    return MLO_EPLATFORM;
  }
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    mlo_logf(MLO_LOG_INFO, "cuda: %s: device out of memory", what);
    return MLO_ENOMEM_DEVICE;
  }
  mlo_logf(MLO_LOG_ERROR, "cuda: %s failed: %s (%s)", what, cudaGetErrorString(e),
           cudaGetErrorName(e));
  return MLO_EPLATFORM;
}

/* cudaEventQuery (ev) or cudaStreamQuery (s) that leaves the thread's last
 * error as it found it.  The runtime records cudaErrorNotReady in the
 * per-thread last error like any error ("the runtime maintains an error
 * variable for each host thread ... overwritten by the error code each
 * time an error occurs", CUDA programming guide, error checking), and a
 * framework sharing our libcudart (mlo.torch: torch checks every kernel
 * launch with cudaGetLastError) would raise "device not ready" at its next
 * launch.  So NotReady is consumed, but only when the last error was clean
 * before the query: an error already there is the caller's to read, and
 * is left (as the runtime left it) to fail their next check. */
cudaError_t cu_query(cudaEvent_t ev, cudaStream_t s) {
  cudaError_t before = cudaPeekAtLastError();
  cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(s);
  if (e == cudaErrorNotReady && before == cudaSuccess) (void)cudaGetLastError();
  return e;
}

/* The current context is per host thread and belongs to the caller: every
 * entry point makes our device's primary context current if it is not and
 * puts back exactly what was current on the way out — no context for a
 * thread that had none (cuda_ctx.h: restoring "device 0" there would
 * create a context on GPU 0).  A lost context answers at once. */
int cu_enter(struct cuda_ctx *c, mlo_cu_guard *g) {
  g->switched = false;
  pthread_mutex_lock(&c->lock);
  bool lost = c->sticky;
  pthread_mutex_unlock(&c->lock);
  if (lost) return MLO_EPLATFORM;
  return cu_status(c, mlo_cu_ctx_enter(c->primary, g), "making the device's context current");
}

void cu_leave(struct cuda_ctx *c, const mlo_cu_guard *g) {
  cu_status(c, mlo_cu_ctx_leave(g), "restoring the caller's context");
}
