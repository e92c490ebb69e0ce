/*
 * absent.c — constructors for platforms this build does not include, so
 * that "cuda" or "opencl" fail with a clear MLO_ENODEV instead of a link
 * error.  Each real platform file defines MLO_HAVE_<NAME> for the build.
 */
#include "platform/platform.h"

#include <stdio.h>

#ifndef MLO_HAVE_CUDA
int mlo_cuda_platform_create(const char *args, mlo_platform *p, char *err, size_t errlen) {
  (void)args;
  (void)p;
  snprintf(err, errlen, "this mlo was built without CUDA (toolkit not found at configure time)");
  return MLO_ENODEV;
}
#endif

#ifndef MLO_HAVE_OPENCL
int mlo_opencl_platform_create(const char *args, mlo_platform *p, char *err, size_t errlen) {
  (void)args;
  (void)p;
  snprintf(err, errlen, "this mlo was built without OpenCL (headers/ICD loader not found)");
  return MLO_ENODEV;
}
#endif
