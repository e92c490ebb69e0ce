/*
 * module.h — the contract between libmlo and the modules it loads at run
 * time (docs/modules.md): libmlo-cuda.so and libmlo-opencl.so (platforms),
 * and the tool's workload back-ends (libmlo-workload-cuda.so, ...).
 *
 * Why modules: a platform drags its runtime in (the CUDA runtime, the
 * OpenCL ICD loader, NCCL), and the workload's BLAS drags cuBLAS or CLBlast.
 * Linked into libmlo, they made every user of the library need all of them
 * installed to start, even on the host platform.  Loaded on first use, a
 * missing runtime is an error of the one platform that needs it.
 *
 * A module exports one symbol, `mlo_module_init`.  libmlo calls it with the
 * services table below and gets the module's description back.  A module
 * never links libmlo: the internal helpers it calls (logging, allocation with
 * its fault points, completion stamps, spec parsing, the platform wrappers)
 * are forwarded through this table by module_shim.c, which every module
 * compiles in.  So one copy of their state (the log sink, the fault
 * counters) serves the library and every module, whether libmlo is a shared
 * library or linked statically into a program.
 *
 * A module is only ever loaded by the libmlo of the same build: the version
 * string and the sizes of the shared structures are checked both ways, and
 * a mismatch is refused with both sides named.
 */
#ifndef MLO_PLATFORM_MODULE_H
#define MLO_PLATFORM_MODULE_H

#include "mlo/mlo.h"
#include "platform/platform.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bumped whenever either table below changes shape.  2: host_register says
 * whether a range may be registered read-only; 3: dev_free returns whether it
 * freed, dev_free_after, and the topology and gather_pace slots; 4: want_stamps;
 * 5: dev_alloc_compute (both tables); 6: compute_context (both tables); 7: all_gather's
 * offset (a piece of a block loaded block by block, sharded); 8: the collective
 * and model groups (the ops table's coll and model pointers). */
#define MLO_MODULE_ABI 8
/* The version a module is built from, as mlo_version() says it. */
#define MLO_MODULE_STR_(x) #x
#define MLO_MODULE_STR(x) MLO_MODULE_STR_(x)
#define MLO_MODULE_VERSION                                                                         \
  MLO_MODULE_STR(MLO_VERSION_MAJOR)                                                                \
  "." MLO_MODULE_STR(MLO_VERSION_MINOR) "." MLO_MODULE_STR(MLO_VERSION_PATCH)

/* What a module is for. */
typedef enum {
  MLO_MODULE_PLATFORM = 1, /* a device: `create` opens it for mlo_platform_open */
  MLO_MODULE_WORKLOAD = 2, /* the tool's reference workload on a device: `impl` is its ops */
} mlo_module_kind;

/* The services libmlo lends a module (module.c's one static table: a module
 * keeps the pointer for as long as it is loaded). */
struct mlo_module_host {
  uint32_t abi;
  const char *version;  /* mlo_version() of the loading library */
  size_t platform_size; /* sizeof(struct mlo_platform) */
  size_t ops_size;      /* sizeof(struct mlo_platform_ops) */
  void (*vlogf)(mlo_log_level level, const char *fmt, va_list ap);
  bool (*log_enabled)(mlo_log_level level);
  void *(*malloc_)(size_t n);
  void *(*calloc_)(size_t n, size_t size);
  void *(*realloc_)(void *p, size_t n);
  void *(*aligned_alloc_)(size_t align, size_t n);
  bool (*env_flag)(const char *name);
  int (*parse_size)(const char *text, bool allow_zero, uint64_t *out);
  char *(*format_size)(uint64_t bytes, char *buf, size_t buflen);
  mlo_stamp *(*stamp_new)(void);
  void (*stamp_fire)(mlo_stamp *s);
  void (*stamp_put)(mlo_stamp *s);
  int (*stamp_time)(mlo_stamp *s, uint64_t *t_ns);
  int (*spec_parse_indexed)(const char *name, const char *args, unsigned long max_index,
                            unsigned long *index, mlo_spec_kv_fn fn, void *user, char *err,
                            size_t errlen);
  /* The platform wrappers a workload back-end orders its compute with. */
  int (*dev_alloc)(mlo_platform *p, size_t bytes, void **block);
  int (*dev_free)(mlo_platform *p, void *block, size_t bytes);
  int (*event_create)(mlo_platform *p, mlo_event **ev);
  void (*event_destroy)(mlo_platform *p, mlo_event *ev);
  int (*event_record_copy)(mlo_platform *p, mlo_event *ev);
  int (*compute_wait)(mlo_platform *p, mlo_event *ev);
  void *(*compute_queue)(mlo_platform *p);
  int (*dev_alloc_compute)(mlo_platform *p, size_t bytes, void **block);
  void *(*compute_context)(mlo_platform *p);
};

/* What a module answers. */
struct mlo_module {
  uint32_t abi;
  const char *version; /* the mlo version it was built from */
  mlo_module_kind kind;
  const char *name; /* "cuda", "opencl"; for a workload, the platform it serves */
  /* MLO_MODULE_PLATFORM: the constructor mlo_platform_open calls. */
  int (*create)(const char *spec_args, mlo_platform *p, char *err, size_t errlen);
  /* MLO_MODULE_WORKLOAD: the back-end's ops (workload/workload.h). */
  const void *impl;
};

/* A module's description, in its entry file (module_shim.c hands it to
 * libmlo): one of these, naming what the module is and serves. */
#define MLO_MODULE_DEFINE_PLATFORM(platform, create_fn)                                            \
  const struct mlo_module mlo_this_module = {.abi = MLO_MODULE_ABI,                                \
                                             .version = MLO_MODULE_VERSION,                        \
                                             .kind = MLO_MODULE_PLATFORM,                          \
                                             .name = (platform),                                   \
                                             .create = (create_fn)}
#define MLO_MODULE_DEFINE_WORKLOAD(platform, ops)                                                  \
  const struct mlo_module mlo_this_module = {.abi = MLO_MODULE_ABI,                                \
                                             .version = MLO_MODULE_VERSION,                        \
                                             .kind = MLO_MODULE_WORKLOAD,                          \
                                             .name = (platform),                                   \
                                             .impl = (ops)}

/* The one symbol a module exports.  MLO_OK with *out, or an error with a
 * message in err (a host table of another build, say). */
typedef int (*mlo_module_init_fn)(const struct mlo_module_host *host, const struct mlo_module **out,
                                  char *err, size_t errlen);
#define MLO_MODULE_INIT_SYMBOL "mlo_module_init"

/* Loads libmlo-<file>.so once per process (later calls answer the same
 * module, or the same refusal: a module refused is not opened again) and
 * checks it is a `kind` module of this build.  Where it looks,
 * in order: each folder of MLO_MODULE_PATH (':'-separated; when it is set,
 * nothing else), the folder `mlo` beside the object holding libmlo (the
 * installed libmlo.so's module folder; build/mlo beside a build tree's
 * libmlo.so; found by the path the kernel mapped it from, however libmlo
 * was reached), the configured install folder (MLO_MODULE_DIR), then each
 * folder of the program's library path as the loader has it (its RUNPATH,
 * which in a build tree names build/mlo; LD_LIBRARY_PATH; the system's).
 * Only folders named by absolute path are searched: an empty or relative
 * element (the current folder, to the loader) is skipped, which the debug
 * log says and, for MLO_MODULE_PATH, the error too.  Every candidate is
 * opened by its full path, and only if it is a regular file and it, a link
 * naming it and the folders holding it are owned by root or the effective
 * user and writable by no one else (a sticky folder excepted); what its
 * init answers is checked before it is used (docs/modules.md).  On failure err says which file was
 * missing, or which file was refused or failed to load and why (a missing CUDA runtime, say), and
 * every place it looked.  *path (may be NULL) gets where it was found. */
int mlo_module_load(const char *file, mlo_module_kind kind, const struct mlo_module **out,
                    const char **path, char *err, size_t errlen);

#endif /* MLO_PLATFORM_MODULE_H */
