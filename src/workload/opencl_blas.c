/*
 * opencl_blas.c — the reference workload's backend for the OpenCL platform.
 *
 * Y = X * W^T runs as CLBlastSgemm (Debian libclblast) on the platform's
 * compute queue, so it is ordered after the load's barrier like any user
 * kernel.  CLBlast has no bf16 input and its f16 path needs cl_khr_fp16
 * (PoCL lacks it), so bf16/f16 weights are first widened to f32 by a tiny
 * kernel of ours, a slice of rows at a time into a reused scratch buffer;
 * the slice size is a constant, so the work done, hence the digest, does not
 * depend on run-time state.  X is exactly mlo_workload_input's f32 values.
 * Y is read back (blocking, on the compute queue) and folded on the host.
 *
 * One context is used by one thread at a time (mlo run's schedule).
 */
#define CL_TARGET_OPENCL_VERSION 120

#include "base/sysio.h"
#include "base/log.h"
#include "workload/workload.h"
#include "platform/module.h"

#include <CL/cl.h>
#include <clblast_c.h>
#include <stdlib.h>
#include <string.h>

/* f32 bytes of widened weight rows per sgemm call. */
#define SLICE_BYTES ((size_t)16 << 20)

/* bf16 is the high half of an f32; f16 goes through vload_half, which is
 * core OpenCL C 1.2 even without cl_khr_fp16. */
static const char widen_source[] =
    "__kernel void widen_bf16(__global const ushort *src, ulong first, __global float *dst) {\n"
    "  size_t i = get_global_id(0);\n"
    "  dst[i] = as_float((uint)src[first + i] << 16);\n"
    "}\n"
    "__kernel void widen_f16(__global const half *src, ulong first, __global float *dst) {\n"
    "  size_t i = get_global_id(0);\n"
    "  dst[i] = vload_half(first + i, src);\n"
    "}\n";

/* A device buffer that only grows. */
struct dev_buf {
  cl_mem mem;
  size_t bytes;
};

struct ocl_blas {
  cl_command_queue queue;
  cl_context context;
  cl_program program;
  cl_kernel widen_bf16, widen_f16;
  struct dev_buf x, y, w; /* X (tokens x in), Y (tokens x rows), widened W */
  float *host_y;          /* Y read back for folding */
  size_t host_y_bytes;
  /* X is a pure function of these; regenerate only when they change. */
  uint64_t x_seed;
  int64_t x_in;
  int x_tokens;
  bool x_valid;
};

static int cl_status(cl_int err, const char *what) {
  if (err == CL_SUCCESS) return MLO_OK;
  if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES)
    return MLO_ENOMEM_DEVICE;
  if (err == CL_OUT_OF_HOST_MEMORY) return MLO_ENOMEM;
  mlo_logf(MLO_LOG_ERROR, "opencl workload: %s failed (OpenCL error %d)", what, (int)err);
  return MLO_EPLATFORM;
}

static int ensure(struct ocl_blas *b, struct dev_buf *buf, size_t bytes) {
  if (bytes <= buf->bytes) return MLO_OK;
  if (buf->mem) clReleaseMemObject(buf->mem); /* deferred past queued users */
  buf->mem = NULL;
  buf->bytes = 0;
  cl_int err = CL_SUCCESS;
  buf->mem = clCreateBuffer(b->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
  if (err != CL_SUCCESS) {
    buf->mem = NULL;
    return cl_status(err, "clCreateBuffer (workload scratch)");
  }
  buf->bytes = bytes;
  return MLO_OK;
}

static int build_kernels(struct ocl_blas *b) {
  cl_device_id dev = NULL;
  cl_int err = clGetCommandQueueInfo(b->queue, CL_QUEUE_DEVICE, sizeof dev, &dev, NULL);
  const char *src = widen_source;
  if (err == CL_SUCCESS) b->program = clCreateProgramWithSource(b->context, 1, &src, NULL, &err);
  if (err == CL_SUCCESS) err = clBuildProgram(b->program, 1, &dev, "", NULL, NULL);
  if (err == CL_BUILD_PROGRAM_FAILURE) {
    char log[2048] = "";
    clGetProgramBuildInfo(b->program, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
    mlo_logf(MLO_LOG_ERROR, "opencl workload: widen kernels did not build: %s", log);
  }
  if (err == CL_SUCCESS) b->widen_bf16 = clCreateKernel(b->program, "widen_bf16", &err);
  if (err == CL_SUCCESS) b->widen_f16 = clCreateKernel(b->program, "widen_f16", &err);
  return cl_status(err, "building the widen kernels");
}

static void ocl_blas_destroy(void *ctx) {
  struct ocl_blas *b = ctx;
  if (!b) return;
  if (b->queue) clFinish(b->queue);
  struct dev_buf *bufs[] = {&b->x, &b->y, &b->w};
  for (size_t i = 0; i < 3; i++)
    if (bufs[i]->mem) clReleaseMemObject(bufs[i]->mem);
  if (b->widen_bf16) clReleaseKernel(b->widen_bf16);
  if (b->widen_f16) clReleaseKernel(b->widen_f16);
  if (b->program) clReleaseProgram(b->program);
  if (b->context) clReleaseContext(b->context);
  if (b->queue) clReleaseCommandQueue(b->queue);
  free(b->host_y);
  free(b);
}

static int ocl_blas_create(mlo_platform *p, void **ctx) {
  *ctx = NULL;
  cl_command_queue q = mlo_platform_compute_queue(p);
  if (!q) return MLO_EINVAL;
  struct ocl_blas *b = mlo_calloc(1, sizeof *b);
  if (!b) return MLO_ENOMEM;
  cl_int err = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof b->context, &b->context, NULL);
  if (err != CL_SUCCESS) {
    free(b);
    return cl_status(err, "clGetCommandQueueInfo");
  }
  clRetainCommandQueue(q);
  clRetainContext(b->context);
  b->queue = q;
  int rc = build_kernels(b);
  if (rc) {
    ocl_blas_destroy(b);
    return rc;
  }
  *ctx = b;
  return MLO_OK;
}

/* Makes X (tokens x in, f32) current on the device. */
static int ensure_input(struct ocl_blas *b, uint64_t seed, int tokens, int64_t in) {
  if (b->x_valid && b->x_seed == seed && b->x_tokens == tokens && b->x_in == in) return MLO_OK;
  size_t n = (size_t)tokens * (size_t)in;
  int rc = ensure(b, &b->x, n * sizeof(float));
  if (rc) return rc;
  float *x = mlo_malloc(n * sizeof(float));
  if (!x) return MLO_ENOMEM;
  for (int t = 0; t < tokens; t++)
    for (int64_t k = 0; k < in; k++)
      x[(size_t)t * (size_t)in + (size_t)k] = mlo_workload_input(seed, t, k);
  b->x_valid = false;
  cl_int err =
      clEnqueueWriteBuffer(b->queue, b->x.mem, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL);
  free(x);
  if (err != CL_SUCCESS) return cl_status(err, "clEnqueueWriteBuffer (X)");
  b->x_seed = seed;
  b->x_tokens = tokens;
  b->x_in = in;
  b->x_valid = true;
  return MLO_OK;
}

/* Widens `rows` rows of W starting at `row` into b->w. */
static int widen_rows(struct ocl_blas *b, cl_mem block, size_t offset, mlo_dtype dtype, int64_t in,
                      int64_t row, int64_t rows) {
  cl_kernel k = dtype == MLO_DTYPE_BF16 ? b->widen_bf16 : b->widen_f16;
  cl_ulong first = (cl_ulong)(offset / 2) + (cl_ulong)row * (cl_ulong)in;
  size_t global = (size_t)rows * (size_t)in;
  cl_int err = clSetKernelArg(k, 0, sizeof block, &block);
  if (err == CL_SUCCESS) err = clSetKernelArg(k, 1, sizeof first, &first);
  if (err == CL_SUCCESS) err = clSetKernelArg(k, 2, sizeof b->w.mem, &b->w.mem);
  if (err == CL_SUCCESS)
    err = clEnqueueNDRangeKernel(b->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL);
  return cl_status(err, "the widen kernel");
}

static int sgemm_status(CLBlastStatusCode s) {
  if (s == CLBlastSuccess) return MLO_OK;
  if (s == CLBlastOpenCLOutOfResources || s == CLBlastTempBufferAllocFailure)
    return MLO_ENOMEM_DEVICE;
  mlo_logf(MLO_LOG_ERROR, "opencl workload: CLBlastSgemm failed (CLBlast status %d)", (int)s);
  return MLO_EPLATFORM;
}

/* Y[:, row:row+rows] = X * W[row:row+rows, :]^T, W at (wmem, w_first floats). */
static int sgemm_rows(struct ocl_blas *b, cl_mem wmem, size_t w_first, int64_t out, int64_t in,
                      int tokens, int64_t row, int64_t rows) {
  CLBlastStatusCode s =
      CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, (size_t)tokens,
                   (size_t)rows, (size_t)in, 1.0f, b->x.mem, 0, (size_t)in, wmem, w_first,
                   (size_t)in, 0.0f, b->y.mem, (size_t)row, (size_t)out, &b->queue, NULL);
  return sgemm_status(s);
}

static int fold_y(struct ocl_blas *b, size_t bytes, uint64_t *digest) {
  if (bytes > b->host_y_bytes) {
    float *grown = mlo_realloc(b->host_y, bytes);
    if (!grown) return MLO_ENOMEM;
    b->host_y = grown;
    b->host_y_bytes = bytes;
  }
  cl_int err = clEnqueueReadBuffer(b->queue, b->y.mem, CL_TRUE, 0, bytes, b->host_y, 0, NULL, NULL);
  if (err != CL_SUCCESS) return cl_status(err, "clEnqueueReadBuffer (Y)");
  *digest = mlo_digest_fold(*digest, b->host_y, bytes);
  return MLO_OK;
}

static int ocl_blas_gemm_digest(void *ctx, void *block, size_t offset, mlo_dtype dtype, int64_t out,
                                int64_t in, int tokens, uint64_t seed, uint64_t *digest) {
  struct ocl_blas *b = ctx;
  size_t esize = dtype == MLO_DTYPE_F32 ? 4 : 2;
  if (dtype != MLO_DTYPE_F32 && dtype != MLO_DTYPE_BF16 && dtype != MLO_DTYPE_F16)
    return MLO_EUNSUPPORTED;
  if (out <= 0 || in <= 0 || tokens <= 0 || offset % esize) return MLO_EINVAL;
  if ((uint64_t)in > SIZE_MAX / 4 / (uint64_t)(out > tokens ? out : tokens)) return MLO_EINVAL;
  int rc = ensure_input(b, seed, tokens, in);
  if (!rc) rc = ensure(b, &b->y, (size_t)tokens * (size_t)out * sizeof(float));
  int64_t slice_rows = (int64_t)(SLICE_BYTES / ((size_t)in * sizeof(float)));
  if (slice_rows < 1) slice_rows = 1;
  if (!rc && dtype != MLO_DTYPE_F32)
    rc = ensure(b, &b->w, (size_t)(slice_rows < out ? slice_rows : out) * (size_t)in * 4);
  for (int64_t row = 0; !rc && row < out; row += slice_rows) {
    int64_t rows = out - row < slice_rows ? out - row : slice_rows;
    if (dtype == MLO_DTYPE_F32) {
      rc = sgemm_rows(b, (cl_mem)block, offset / 4 + (size_t)row * (size_t)in, out, in, tokens, row,
                      rows);
    } else {
      rc = widen_rows(b, (cl_mem)block, offset, dtype, in, row, rows);
      if (!rc) rc = sgemm_rows(b, b->w.mem, 0, out, in, tokens, row, rows);
    }
  }
  if (!rc) rc = fold_y(b, (size_t)tokens * (size_t)out * sizeof(float), digest);
  return rc;
}

static int ocl_blas_bytes_digest(void *ctx, void *block, size_t offset, uint64_t nbytes,
                                 uint64_t *digest) {
  struct ocl_blas *b = ctx;
  if (nbytes > SIZE_MAX) return MLO_EINVAL;
  void *host = mlo_malloc(nbytes ? (size_t)nbytes : 1);
  if (!host) return MLO_ENOMEM;
  cl_int err = clEnqueueReadBuffer(b->queue, (cl_mem)block, CL_TRUE, offset, (size_t)nbytes, host,
                                   0, NULL, NULL);
  int rc = cl_status(err, "clEnqueueReadBuffer (tensor bytes)");
  if (!rc) *digest = mlo_digest_fold(*digest, host, (size_t)nbytes);
  free(host);
  return rc;
}

static const struct mlo_workload_ops opencl_workload_ops = {
    .platform = "opencl",
    .create = ocl_blas_create,
    .destroy = ocl_blas_destroy,
    .gemm_digest = ocl_blas_gemm_digest,
    .bytes_digest = ocl_blas_bytes_digest,
};

/* The module's description (platform/module.h): libmlo-workload-opencl.so. */
MLO_MODULE_DEFINE_WORKLOAD("opencl", &opencl_workload_ops);
