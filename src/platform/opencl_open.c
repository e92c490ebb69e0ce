/*
 * opencl_open.c — opening an OpenCL device for the platform in opencl.c:
 * the spec's options (capacity=, blocking_d2h=, pinned=, max_alloc=),
 * device N counted over every platform the ICD loader lists, what the
 * device is told to be (the XPU rule for Intel GPUs, its largest single
 * allocation, pinning), and its two in-order queues in one context.
 */
#include "base/sysio.h"
#include "base/log.h"
#include "platform/opencl_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An OpenCL status's name, for messages (here, below opencl.c, which
 * calls this file and not the other way round). */
const char *ocl_err_name(cl_int err) {
  switch (err) {
  case CL_DEVICE_NOT_FOUND:
    return "CL_DEVICE_NOT_FOUND";
  case CL_DEVICE_NOT_AVAILABLE:
    return "CL_DEVICE_NOT_AVAILABLE";
  case CL_MEM_OBJECT_ALLOCATION_FAILURE:
    return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
  case CL_OUT_OF_RESOURCES:
    return "CL_OUT_OF_RESOURCES";
  case CL_OUT_OF_HOST_MEMORY:
    return "CL_OUT_OF_HOST_MEMORY";
  case CL_MAP_FAILURE:
    return "CL_MAP_FAILURE";
  case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST:
    return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
  case CL_INVALID_VALUE:
    return "CL_INVALID_VALUE";
  case CL_INVALID_PLATFORM:
    return "CL_INVALID_PLATFORM";
  case CL_INVALID_DEVICE:
    return "CL_INVALID_DEVICE";
  case CL_INVALID_CONTEXT:
    return "CL_INVALID_CONTEXT";
  case CL_INVALID_COMMAND_QUEUE:
    return "CL_INVALID_COMMAND_QUEUE";
  case CL_INVALID_MEM_OBJECT:
    return "CL_INVALID_MEM_OBJECT";
  case CL_INVALID_EVENT:
    return "CL_INVALID_EVENT";
  case CL_INVALID_BUFFER_SIZE:
    return "CL_INVALID_BUFFER_SIZE";
  case CL_INVALID_OPERATION:
    return "CL_INVALID_OPERATION";
  case -1001:
    return "CL_PLATFORM_NOT_FOUND_KHR"; /* the ICD loader: no platform */
  default:
    return "an OpenCL error";
  }
}

static int parse_flag(const char *key, const char *value, int *out, char *err, size_t errlen) {
  if (strcmp(value, "0") && strcmp(value, "1")) {
    snprintf(err, errlen, "opencl platform option %s=%s: expected 0 or 1", key, value);
    return MLO_EINVAL;
  }
  *out = value[0] == '1';
  return MLO_OK;
}

static int ocl_option(const char *key, const char *value, void *user, char *err, size_t errlen) {
  struct ocl_options *o = user;
  if (!strcmp(key, "capacity")) {
    if (mlo_parse_size(value, false, &o->capacity)) {
      snprintf(err, errlen,
               "opencl platform option capacity=%s: expected a size such as 512M or 4G", value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  if (!strcmp(key, "blocking_d2h")) return parse_flag(key, value, &o->blocking_d2h, err, errlen);
  if (!strcmp(key, "pinned")) return parse_flag(key, value, &o->pinned, err, errlen);
  if (!strcmp(key, "max_alloc")) {
    if (mlo_parse_size(value, false, &o->max_alloc) || o->max_alloc < 4096) {
      snprintf(err, errlen,
               "opencl platform option max_alloc=%s: expected a size of at least 4K, such as 1G",
               value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  snprintf(err, errlen,
           "unknown opencl platform option %s=%s (known: capacity, blocking_d2h, pinned, "
           "max_alloc)",
           key, value);
  return MLO_EINVAL;
}

/* "" | "N" | "N:opts" | "opts". */
int ocl_parse_spec(const char *args, struct ocl_options *o, char *err, size_t errlen) {
  return mlo_spec_parse_indexed("opencl", args, 65535, &o->index, ocl_option, o, err, errlen);
}

/* Finds device `index` counting over every platform's devices in order. */
int ocl_find_device(unsigned long index, cl_platform_id *plat_out, cl_device_id *dev_out, char *err,
                    size_t errlen) {
  cl_platform_id plats[16];
  cl_uint nplat = 0;
  cl_int cerr = clGetPlatformIDs(16, plats, &nplat);
  if (cerr != CL_SUCCESS || nplat == 0) {
    snprintf(err, errlen, "no OpenCL platform found (clGetPlatformIDs: %s)",
             cerr ? ocl_err_name(cerr) : "0 platforms");
    return MLO_ENODEV;
  }
  unsigned long seen = 0;
  for (cl_uint i = 0; i < nplat && i < 16; i++) {
    cl_uint ndev = 0;
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 0, NULL, &ndev) != CL_SUCCESS) continue;
    if (index < seen + ndev) {
      cl_device_id *devs = mlo_calloc(ndev, sizeof *devs);
      if (!devs) return MLO_ENOMEM;
      cerr = clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, ndev, devs, NULL);
      *plat_out = plats[i];
      *dev_out = devs[index - seen];
      free(devs);
      if (cerr != CL_SUCCESS) break;
      return MLO_OK;
    }
    seen += ndev;
  }
  snprintf(err, errlen, "OpenCL device %lu not present (%lu visible over %u platforms)", index,
           seen, (unsigned)nplat);
  return MLO_ENODEV;
}

/* Reads the device's limits and decides capacity, the XPU rule and pinning. */
void ocl_configure(struct ocl_ctx *c, const struct ocl_options *o, mlo_platform *p) {
  cl_ulong global = 0, max_alloc = 0;
  cl_device_type type = 0;
  char name[96] = "?", vendor[64] = "?";
  clGetDeviceInfo(c->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
  clGetDeviceInfo(c->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
  clGetDeviceInfo(c->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  clGetDeviceInfo(c->device, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
  clGetDeviceInfo(c->device, CL_DEVICE_VENDOR, sizeof vendor - 1, vendor, NULL);
  c->capacity = o->capacity && o->capacity < global ? o->capacity : global;
  /* max_alloc= only lowers it: buffers past the device's limit do not exist. */
  c->max_alloc = o->max_alloc && o->max_alloc < max_alloc ? o->max_alloc : max_alloc;
  /* Intel GPUs (the XPU rule of the specification) need blocking reads. */
  bool intel_gpu = strstr(vendor, "Intel") && (type & CL_DEVICE_TYPE_GPU);
  c->blocking_d2h = o->blocking_d2h >= 0 ? o->blocking_d2h == 1 : intel_gpu;
  /* The environment is a kill switch: it wins over pinned=1. */
  c->pinned = o->pinned != 0 && !mlo_env_flag("MLO_NO_PINNED");
  char cap[32];
  mlo_format_size(c->capacity, cap, sizeof cap);
  snprintf(p->description, sizeof p->description,
           "OpenCL device %lu: %.80s (%.80s), capacity %s%s%s", o->index, name, vendor, cap,
           c->blocking_d2h ? ", blocking d2h" : "", c->pinned ? "" : ", pageable host memory");
}

int ocl_create_queues(struct ocl_ctx *c, cl_platform_id plat, char *err, size_t errlen) {
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
  cl_int cerr = CL_SUCCESS;
  const char *what = "clCreateContext";
  c->context = clCreateContext(props, 1, &c->device, NULL, NULL, &cerr);
  if (cerr == CL_SUCCESS) {
    what = "clCreateCommandQueue";
    c->copy_q = clCreateCommandQueue(c->context, c->device, 0, &cerr);
  }
  if (cerr == CL_SUCCESS) c->compute_q = clCreateCommandQueue(c->context, c->device, 0, &cerr);
  if (cerr == CL_SUCCESS) return MLO_OK;
  snprintf(err, errlen, "opencl platform: %s failed: %s (%d)", what, ocl_err_name(cerr), (int)cerr);
  return cerr == CL_OUT_OF_HOST_MEMORY ? MLO_ENOMEM : MLO_EPLATFORM;
}
