/*
 * mlo.h — model-level offload: the public API and its reference manual.
 *
 * mlo runs a multi-component inference pipeline (text encoders, one or more
 * diffusion transformers, a VAE) on an accelerator whose memory cannot hold
 * them all, by keeping only the executing component resident on the device.
 *
 * The shapes, in one paragraph.  A PLATFORM is a device (the host-backed
 * stand-in "host", "cuda:N", "opencl:N").  A PIPELINE owns COMPONENTS; each
 * component has a name, a ROLE (DIT, ENCODER, VAE, OTHER) and TENSORS.  At
 * materialization each component's tensors are packed into one aligned host
 * SLAB (pinned when asked and possible); when resident the component owns
 * one DEVICE BLOCK holding the same layout.  The OFFLOAD BACKEND enforces the
 * mutual-exclusion contract (docs/contract.md, C1–C17): a hooked forward of a
 * DiT evicts encoders and other DiTs first, an encoder's evicts every DiT,
 * VAEs are outside the set.  Eviction of read-only tensors copies nothing
 * back; the host slab stays authoritative.
 *
 * Conventions (libuv/SQLite style):
 *  - Every function that can fail returns an int status: MLO_OK (0) or a
 *    negative MLO_E* code.  mlo_strerror()/mlo_err_name() describe a code;
 *    mlo_pipeline_errmsg() gives the detailed message of the last failure on
 *    a pipeline (per thread is not promised; read it right after the call).
 *  - A call that fails leaves no side effect the caller must undo.
 *  - *_close(NULL) / *_free(NULL) are harmless no-ops.
 *  - Options structs carry their size and come with an _INIT macro.
 *  - Every public function may be called from several threads at once.
 *  - Strings returned by the library are owned by the object they came from
 *    and live as long as it, unless said otherwise.
 *
 * Callbacks.  Some callbacks run while the library holds a pipeline's lock
 * and so must not call back into that pipeline; the library detects it and
 * the call returns MLO_EDEADLK (functions without a status return their
 * "nothing" value: 0, NULL, false) and logs an error instead of hanging:
 *  - trace (mlo_pipeline_set_trace): may call nothing on its pipeline;
 *  - log (mlo_set_log): may be called with a pipeline lock held, so the same
 *    rule; it may call mlo_set_log, and a message logged from inside it goes
 *    to stderr rather than recursing;
 *  - progress (mlo_pipeline_set_progress) and a delegate's enable/disable:
 *    may read the pipeline (stats, residency, tensors) and, for a delegate,
 *    load, evict and build groups; enable, disable, materialize and adding
 *    components or tensors return MLO_EDEADLK;
 *  - forward functions (mlo_component_forward) hold no lock: anything goes,
 *    acquires of other components included.
 */
#ifndef MLO_MLO_H
#define MLO_MLO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions libmlo.so exports; everything else in the library is
 * hidden.  Define MLO_API yourself to override (e.g. empty). */
#ifndef MLO_API
#if defined(__GNUC__) || defined(__clang__)
#define MLO_API __attribute__((visibility("default")))
#else
#define MLO_API
#endif
#endif

#define MLO_VERSION_MAJOR 0
#define MLO_VERSION_MINOR 7
#define MLO_VERSION_PATCH 0
/* The library's version as "MAJOR.MINOR.PATCH"; static storage. */
MLO_API const char *mlo_version(void);

/* ------------------------------------------------------------------------
 * Status codes
 * ---------------------------------------------------------------------- */
enum {
  MLO_OK = 0,
  MLO_EINVAL = -1,        /* an argument or option is invalid */
  MLO_ENOMEM = -2,        /* host memory exhausted */
  MLO_ENOMEM_DEVICE = -3, /* device memory exhausted (state rolled back) */
  MLO_EBUSY = -4,         /* would wait: component in use (try variants) */
  MLO_ESTATE = -5,        /* call not valid in the current state */
  MLO_EUNSUPPORTED = -6,  /* refused before anything changed */
  MLO_EIO = -7,           /* a file could not be read or written */
  MLO_EFORMAT = -8,       /* a file is malformed (checkpoint, index) */
  MLO_ENOTFOUND = -9,     /* a named thing does not exist */
  MLO_EEXIST = -10,       /* a name is already taken */
  MLO_EPLATFORM = -11,    /* the device API reported an error */
  MLO_ENODEV = -12,       /* no such device / platform not built in */
  MLO_EOWNED = -13,       /* another offload strategy owns the hooks (C16) */
  MLO_EDEADLK = -14,      /* the calling thread holds a conflicting component */
  MLO_ECALLBACK = -15,    /* a user callback returned a failure */
};
/* A one-line description of a status code ("device out of memory"). Static
 * storage; unknown codes give "unknown error". */
MLO_API const char *mlo_strerror(int status);
/* The code's name ("MLO_ENOMEM_DEVICE"); static storage. */
MLO_API const char *mlo_err_name(int status);

/* ------------------------------------------------------------------------
 * Logging.  The library logs one line per notable event (a transfer, a
 * fallback to pageable memory, a role guessed from a name).  By default
 * warnings and errors go to stderr; MLO_LOG=debug|info|warn|error|off
 * changes the level.  A callback replaces the default sink process-wide.
 * ---------------------------------------------------------------------- */
typedef enum {
  MLO_LOG_DEBUG,
  MLO_LOG_INFO,
  MLO_LOG_WARN,
  MLO_LOG_ERROR,
  MLO_LOG_OFF
} mlo_log_level;
typedef void (*mlo_log_fn)(mlo_log_level level, const char *msg, void *user);
MLO_API void mlo_set_log(mlo_log_fn fn, void *user, mlo_log_level min_level);

/* ------------------------------------------------------------------------
 * Data types: every dtype of the safetensors format, then the block-
 * quantized types of GGML (GGUF files), which mlo moves as the opaque
 * bytes they are: a block of block_elems elements in block_bytes bytes.
 * ---------------------------------------------------------------------- */
typedef enum {
  MLO_DTYPE_BOOL,
  MLO_DTYPE_U8,
  MLO_DTYPE_I8,
  MLO_DTYPE_F8_E5M2,
  MLO_DTYPE_F8_E4M3,
  MLO_DTYPE_F8_E8M0,
  MLO_DTYPE_I16,
  MLO_DTYPE_U16,
  MLO_DTYPE_F16,
  MLO_DTYPE_BF16,
  MLO_DTYPE_I32,
  MLO_DTYPE_U32,
  MLO_DTYPE_F32,
  MLO_DTYPE_F64,
  MLO_DTYPE_I64,
  MLO_DTYPE_U64,
  MLO_DTYPE_C64,
  MLO_DTYPE_F4,
  MLO_DTYPE_F6_E2M3,
  MLO_DTYPE_F6_E3M2,
  /* GGML block types, named as GGML names them (block elements/bytes) */
  MLO_DTYPE_Q4_0, /* 32/18 */
  MLO_DTYPE_Q4_1, /* 32/20 */
  MLO_DTYPE_Q5_0, /* 32/22 */
  MLO_DTYPE_Q5_1, /* 32/24 */
  MLO_DTYPE_Q8_0, /* 32/34 */
  MLO_DTYPE_Q8_1, /* 32/40 */
  MLO_DTYPE_Q2_K, /* 256/84 */
  MLO_DTYPE_Q3_K, /* 256/110 */
  MLO_DTYPE_Q4_K, /* 256/144 */
  MLO_DTYPE_Q5_K, /* 256/176 */
  MLO_DTYPE_Q6_K, /* 256/210 */
  MLO_DTYPE_Q8_K, /* 256/292 */
  MLO_DTYPE_IQ2_XXS,
  MLO_DTYPE_IQ2_XS,
  MLO_DTYPE_IQ3_XXS,
  MLO_DTYPE_IQ1_S,
  MLO_DTYPE_IQ4_NL,
  MLO_DTYPE_IQ3_S,
  MLO_DTYPE_IQ2_S,
  MLO_DTYPE_IQ4_XS,
  MLO_DTYPE_IQ1_M,
  MLO_DTYPE_TQ1_0,
  MLO_DTYPE_TQ2_0,
  MLO_DTYPE_MXFP4,
  MLO_DTYPE_NVFP4, /* 64/36 */
  MLO_DTYPE_Q1_0,  /* 128/18 */
  MLO_DTYPE_COUNT
} mlo_dtype;
#define MLO_DTYPE_FIRST_BLOCK MLO_DTYPE_Q4_0 /* types below are safetensors' */
/* The name ("BF16", "Q4_K"); NULL for an invalid value. */
MLO_API const char *mlo_dtype_name(mlo_dtype dtype);
/* Parses a dtype name (exact spelling); MLO_EINVAL if unknown.  The
 * safetensors reader accepts only the types below MLO_DTYPE_FIRST_BLOCK. */
MLO_API int mlo_dtype_from_name(const char *name, mlo_dtype *out);
/* Bits per element (4 for F4, 6 for F6_*, 16 for BF16, ...); 0 if invalid
 * and for block types, whose elements have no whole bit width. */
MLO_API unsigned mlo_dtype_bits(mlo_dtype dtype);
/* True for a GGML block type; *elems and *bytes (either may be NULL) get
 * the block's element count and byte size. */
MLO_API bool mlo_dtype_block(mlo_dtype dtype, uint32_t *elems, uint32_t *bytes);
/* Bytes for numel elements, overflow-checked: MLO_EINVAL if numel*bits is
 * not a whole number of bytes (sub-byte types) or numel is not a whole
 * number of blocks (block types), MLO_EFORMAT on overflow. */
MLO_API int mlo_dtype_nbytes(mlo_dtype dtype, uint64_t numel, uint64_t *bytes);

/* ------------------------------------------------------------------------
 * Sizes in human units, shared by the library and the tool.
 * ---------------------------------------------------------------------- */
/* Parses "6G", "512M", "1.5GiB", "4096", "8e9" (K/M/G/T = 1024-based; a
 * plain number is bytes).  MLO_EINVAL for anything else, zero included when
 * allow_zero is false. */
MLO_API int mlo_parse_size(const char *text, bool allow_zero, uint64_t *out);
/* Formats bytes as "1.50 GiB" / "12.0 MiB" / "512 B" into buf; returns buf. */
MLO_API char *mlo_format_size(uint64_t bytes, char *buf, size_t buflen);

/* ------------------------------------------------------------------------
 * Platforms
 * ---------------------------------------------------------------------- */
typedef struct mlo_platform mlo_platform;

/* Opens a platform from a spec string.  host, sim and fault are part of
 * libmlo; cuda and opencl are modules (libmlo-cuda.so, libmlo-opencl.so)
 * loaded on first use from MLO_MODULE_PATH (':'-separated absolute folders;
 * when set, only there), else the folder `mlo` beside libmlo.so, the
 * installed module folder, and the loader's search path; never from the
 * current folder unless named by absolute path (docs/modules.md).  A module
 * that is missing, or whose runtime is (libcudart, an OpenCL ICD loader),
 * that is not a regular file, or that (or whose folder) is writable by
 * others than its owner or owned by another user than root or the
 * process's, is MLO_ENODEV with the file, the reason and every place looked
 * in errbuf.  The specs:
 *   "host[:key=value,...]"  the host-backed device (always available).
 *       capacity=SIZE  device memory (default 8G)
 *       bw=BYTES_PER_S throttle copies to a link bandwidth, at least 1e6
 *                      (default: none)
 *       jitter=0|1     random copy delays, to flush out missing waits
 *       poison=0|1     fill released device memory with 0xA5, off the copy
 *                      queue (default 1)
 *       prefault=0|1   touch all device memory at open, as a GPU driver backs
 *                      it, so no copy pays a page fault (default 0: pages are
 *                      touched on first use and kept, like a caching pool)
 *       seed=N         seed for jitter
 *       blocking_d2h=0|1  declare the XPU rule (device-to-host copies block)
 *   "cuda[:N][:key=value,...]"  NVIDIA GPU N (default 0); MLO_ENODEV if not
 *       built or absent.  capacity=SIZE runs it as a smaller card, pinned=0|1,
 *       chunk=SIZE (bytes per copy call), stream=HANDLE: the compute queue is
 *       the caller's cudaStream_t (a framework's current stream, e.g.
 *       torch.cuda.current_stream().cuda_stream), so compute launched there
 *       waits for loads without a synchronize (C8); mlo never destroys it
 *   "opencl[:N][:key=value,...]"  OpenCL device N; blocking_d2h=0|1 forces
 *       the XPU rule (on by default for Intel GPUs); max_alloc=SIZE lowers
 *       the largest single allocation (larger blocks are built from
 *       segments: see mlo_platform_caps.max_block_bytes).
 *   "sim[:capacity=SIZE,link=BYTES_PER_S]"  a simulated device for
 *       projections (`mlo plan`, docs/plan.md): no byte is stored or read
 *       (slabs are address space, files are never read past their
 *       headers), copies take bytes / link on a virtual clock (default
 *       80G and 25e9), and forwards take the time the caller models
 *       for them; waits, stalls and trace stamps are on that clock
 *       (mlo_platform_now_ns).  Every residency decision is the real one.
 *   "fault:kind=K,nth=N,inner=SPEC"  for testing failure handling: the
 *       platform SPEC, except that its Nth call of kind K (dev_alloc,
 *       host_alloc, copy, event, sync, any) fails once.  kind= and nth= are
 *       required (nth=0 only counts calls, for tests that arm it later);
 *       inner= comes last and defaults to "host".
 * On failure *out is NULL and, when errbuf is given, a message naming the
 * offending part of the spec is written there. */
MLO_API int mlo_platform_open(const char *spec, mlo_platform **out, char *errbuf, size_t errlen);
/* The platforms this libmlo knows (mlo_platform_info_get), for tools that
 * list them instead of keeping a list of their own. */
typedef struct {
  size_t size;       /* in: sizeof(mlo_platform_info) */
  bool probe;        /* in: load the platform's module to fill available and detail */
  const char *name;  /* "host", "cuda", ... (static storage) */
  const char *spec;  /* the spec's shape, "cuda[:N][:opts]" (static storage) */
  bool module;       /* loaded from libmlo-NAME.so rather than built in */
  bool available;    /* built in, or (probed) its module loaded; a device may still be absent */
  char detail[1024]; /* "built in", (probed) the module's path or why it could not be loaded */
} mlo_platform_info;
#define MLO_PLATFORM_INFO_INIT                                                                     \
  { sizeof(mlo_platform_info), false, NULL, NULL, false, false, "" }
MLO_API size_t mlo_platform_count(void);
/* Fills info for platform `index` (0..count-1); with probe, loads its module
 * if it has one, as mlo_platform_open would (a module stays loaded).
 * MLO_EINVAL for a bad index or size. */
MLO_API int mlo_platform_info_get(size_t index, mlo_platform_info *info);
/* The spec grammar, for a caller that reads or composes specs without
 * opening them (a framework binding adding its stream, a tool its
 * capacity): "NAME[:N][:key=value,...]", N only for the platforms that take
 * an index (their info.spec says "[:N]"); a "fault:...,inner=SPEC" wrapper's
 * name, index and options are those of SPEC ("host" where it names none).
 * Each is MLO_ENOTFOUND for a spec whose platform this libmlo does not know
 * (or an option not given) and MLO_EINVAL for a bad argument or an output
 * too small, with the output empty.
 *   parts:   the platform's name, and the index given (-1: none; the
 *            platform's default then applies, 0 for cuda and opencl).
 *   get:     option key's value.
 *   compose: the spec again with index set (-1: as given) and, where key
 *            is not NULL, option key=value set (replacing a value given,
 *            appended otherwise; neither may hold ',', nor key ':' or '=');
 *            the other options kept in their order.  A wrapper keeps its
 *            own options and gets them on its inner platform.
 *   mlo_platform_spec_compose("cuda:pinned=0", 1, "stream", "94", ...)
 *   gives "cuda:1:pinned=0,stream=94". */
MLO_API int mlo_platform_spec_parts(const char *spec, char *name, size_t namelen, int *index);
MLO_API int mlo_platform_spec_get(const char *spec, const char *key, char *value, size_t len);
MLO_API int mlo_platform_spec_compose(const char *spec, int index, const char *key,
                                      const char *value, char *out, size_t outlen);
/* Closes a platform.  All pipelines using it must be freed first.
 * NULL is a no-op. */
MLO_API void mlo_platform_close(mlo_platform *platform);
/* "host", "cuda", "opencl", "sim". */
MLO_API const char *mlo_platform_name(const mlo_platform *platform);
/* A human description of the device ("host-backed, capacity 8.00 GiB"). */
MLO_API const char *mlo_platform_description(const mlo_platform *platform);

typedef struct {
  bool async_copy;          /* copies overlap with the host and with compute */
  bool events;              /* ordering through events is available */
  bool pinned_host;         /* page-locked host memory can be allocated */
  bool host_register;       /* existing host memory can be pinned in place */
  bool blocking_d2h;        /* the XPU rule: device-to-host copies must block */
  bool device_pointers;     /* a device block is addressable as a pointer (by the device) */
  bool host_addressable;    /* ... and the host may read and write it through that pointer
                               (only the host-backed platform: never dereference a CUDA
                               device pointer on the host) */
  uint64_t max_block_bytes; /* 0: a block may be as large as memory.  Else the largest
                               single allocation (OpenCL: CL_DEVICE_MAX_MEM_ALLOC_SIZE): a
                               larger component's block is built from segments this large,
                               no tensor straddling two (a tensor larger than one is
                               refused at materialize), and mlo_tensor_device gives each
                               tensor the segment that holds it */
  bool simulated;           /* a device made of time, not bytes ("sim"): slabs are address
                               space only, never filled, and files are never read past
                               their headers */
} mlo_platform_caps;
MLO_API void mlo_platform_get_caps(const mlo_platform *platform, mlo_platform_caps *caps);

typedef struct {
  uint64_t total_bytes;         /* device capacity */
  uint64_t free_bytes;          /* free now */
  uint64_t used_bytes;          /* allocated through this platform now */
  uint64_t peak_bytes;          /* high-water mark of used_bytes since reset */
  uint64_t reserved_peak_bytes; /* the most device memory the platform's allocator held at
                                   once since reset, its pool's reserve included (CUDA:
                                   cudaMemPoolAttrReservedMemHigh, what nvidia-smi saw);
                                   peak_bytes where there is no pool */
} mlo_platform_memory;
MLO_API int mlo_platform_get_memory(mlo_platform *platform, mlo_platform_memory *mem);
/* Resets peak_bytes to the current used_bytes. */
MLO_API void mlo_platform_reset_peak(mlo_platform *platform);
/* Device memory another allocator in the process keeps cached but unused
 * (a framework's caching allocator: PyTorch's reserved, unallocated
 * blocks, which the device counts as used).  With one set, a device
 * allocation that fails for want of memory calls reclaim() (torch:
 * empty_cache) and is tried once more, and mlo_platform_get_memory counts
 * cached_bytes() as free, so the budget policy's default budget includes
 * it.  Either function may be NULL; NULL cache removes them.  They are
 * called on the thread that allocates (an acquire, a prefetch, enable)
 * with libmlo's locks held, so they may call nothing of libmlo's.  reclaim
 * also runs when it is the platform's own capacity= cap that binds (it
 * cannot tell the two apart): a wasted call, never a wrong answer. */
typedef struct {
  void (*reclaim)(void *user);
  uint64_t (*cached_bytes)(void *user);
  void *user;
} mlo_framework_cache;
MLO_API void mlo_platform_set_framework_cache(mlo_platform *platform,
                                              const mlo_framework_cache *cache);
/* The native compute queue the library orders its loads against: a
 * cudaStream_t for CUDA, a cl_command_queue for OpenCL, NULL for host (host
 * compute runs on the calling thread).  NULL on CUDA too where the platform
 * was opened on the legacy default stream (stream=0, PyTorch's default). */
MLO_API void *mlo_platform_compute_queue(mlo_platform *platform);

/* A node's copy paths, for deciding how a switch loads on its ranks
 * (docs/distributed.md, "Topology").  Rates are bytes per second as copies
 * reach them in practice (pinned host copies, the fabric's achieved
 * all-gather rate), not the links' nominal figures. */
typedef struct {
  size_t size;             /* sizeof(mlo_node_topology): MLO_NODE_TOPOLOGY_INIT */
  double link_bps;         /* each GPU's host-to-device link (> 0) */
  unsigned group;          /* GPUs behind one upstream link (a PCIe switch's uplink
                              to the CPU); 0 or 1: a host path of its own each; more
                              than the GPUs planned for: all of them */
  double uplink_bps;       /* that upstream link's rate; 0: it never binds */
  double fabric_bps;       /* what a GPU receives per second from its peers (NVLink
                              through NVSwitch, PCIe peer-to-peer); 0: no peer
                              path, so gathers cross the host links */
  bool fabric_via_uplinks; /* the fabric is PCIe peer-to-peer: what crosses from
                              one group to another crosses both uplinks (no effect
                              without uplink_bps) */
} mlo_node_topology;
#define MLO_NODE_TOPOLOGY_INIT                                                                     \
  { sizeof(mlo_node_topology), 0, 0, 0, 0, false }

/* What loading one component on every GPU of a node costs each way, in
 * seconds, with every GPU loading at once (a node's ranks switch together:
 * a sharded load is collective, and replicas run the same schedule). */
typedef struct {
  size_t size;         /* sizeof(mlo_load_plan): MLO_LOAD_PLAN_INIT */
  double link_bps;     /* a GPU's host rate while all load: link, or its share of
                          the uplink where that is less */
  double replicated_s; /* every GPU copies the whole component from the host */
  double slice_s;      /* sharded: every GPU copies its 1/n from the host ... */
  double gather_s;     /* ... then receives the other n-1 slices from its peers */
  double sharded_s;    /* slice_s + gather_s (the gather follows the slice) */
  bool sharded;        /* the choice: sharded where it takes at most 95% of the
                          replicated time; a closer call, and one GPU, go to
                          replicated loads, which need no lockstep */
  /* Loads block by block (the default): each piece's gather runs while the
   * next pieces' slices cross the links, so a sharded load takes the slower
   * of the two where the gathers have a fabric of their own (without one
   * they share the links: sharded_s).  A caller built before these fields
   * passes a smaller size and gets the fields above alone. */
  double pipelined_s;
  bool pipelined;        /* the choice for loads block by block, as `sharded` */
  double gather_links_s; /* of gather_s, the time it holds the host links (no
                            fabric: the peers' bytes staged through host memory;
                            PCIe peer-to-peer: what crosses the uplinks); 0 over
                            a fabric of its own */
} mlo_load_plan;
#define MLO_LOAD_PLAN_INIT                                                                         \
  { sizeof(mlo_load_plan), 0, 0, 0, 0, 0, false, 0, false, 0 }

/* Plans a load of `bytes` on `gpus` GPUs (1..4096) of topology t.  MLO_EINVAL
 * (out untouched) for a size field not set by its _INIT, or a rate that is
 * negative, not finite, or a zero link. */
MLO_API int mlo_node_plan_loads(const mlo_node_topology *t, unsigned gpus, uint64_t bytes,
                                mlo_load_plan *out);

/* The node's copy paths as the platform models them (the host platform
 * opened with group=, uplink= or fabric=: docs/platforms.md), for
 * mlo_node_plan_loads; t->size set by MLO_NODE_TOPOLOGY_INIT.
 * MLO_EUNSUPPORTED where it models none: a real device's topology is the
 * machine's, which the caller knows (mlo plan's node profiles describe
 * common ones). */
MLO_API int mlo_platform_get_topology(mlo_platform *platform, mlo_node_topology *t);

/* Waits until everything submitted to the platform has finished. */
MLO_API int mlo_platform_synchronize(mlo_platform *platform);
/* The platform's clock in nanoseconds: the one its stats (wait_ns,
 * forward_ns) and trace stamps use.  mlo_now_ns() on every real device;
 * the virtual clock on "sim".  NULL: mlo_now_ns(). */
MLO_API uint64_t mlo_platform_now_ns(const mlo_platform *platform);

/* ------------------------------------------------------------------------
 * Pipelines, components, tensors
 * ---------------------------------------------------------------------- */
typedef struct mlo_pipeline mlo_pipeline;
typedef struct mlo_component mlo_component;
typedef struct mlo_tensor mlo_tensor;

typedef enum {
  MLO_ROLE_DIT,
  MLO_ROLE_ENCODER,
  MLO_ROLE_VAE,
  MLO_ROLE_OTHER,
  MLO_ROLE_AUTO, /* only as an argument: guess from the name (mlo_pipeline_warn_guessed says so) */
} mlo_role;
MLO_API const char *mlo_role_name(mlo_role role); /* "dit", "encoder", "vae", "other" */
/* Parses "dit", "encoder", "vae", "other" (case-insensitive). */
MLO_API int mlo_role_from_name(const char *name, mlo_role *out);
/* The role a name heuristic gives, first match wins:
 *  - diffusers keys: transformer*, dit*, unet*, prior* -> DIT;
 *    text_encoder*, image_encoder*, mllm*, encoder* -> ENCODER;
 *    vae*, audio_vae*, vqvae* -> VAE;
 *  - class_name (may be NULL) by its words: Transformer2D/3D, UNet -> DIT,
 *    Autoencoder, VAE -> VAE, Encoder, TextModel, CLIP, T5 -> ENCODER;
 *  - the file names users download (ComfyUI, stable-diffusion.cpp), by
 *    their words (split at '.', '_', '-'): vae, ae, autoencoder -> VAE;
 *    t5xxl, umt5, t5, clip, clip_l, clip_g, llava, llama, gemma, qwen..vl,
 *    text_encoder -> ENCODER; flux, wan, dit, transformer, unet, sd3,
 *    sdxl, hunyuan, ltx(v), qwen_image, chroma, hidream, lumina, mochi,
 *    cogvideox, diffusion, high_noise, low_noise -> DIT;
 *  - anything else -> OTHER. */
MLO_API mlo_role mlo_role_guess(const char *name, const char *class_name);
/* The role a model class name declares (diffusers' and transformers'
 * naming: *Transformer2DModel, *Transformer3DModel, UNet*, PriorTransformer
 * -> DIT; Autoencoder*, *VAE, VQModel -> VAE; *EncoderModel, CLIPText*,
 * CLIPVision*, *TextModel*, *ForConditionalGeneration, *ForCausalLM and
 * the Gemma/Qwen/Llama/Mistral/GLM/Bert language models -> ENCODER).
 * MLO_ENOTFOUND for a class it does not know. */
MLO_API int mlo_role_from_class(const char *class_name, mlo_role *out);

/* Where a component's role came from (C1: a declaration always wins). */
typedef enum {
  MLO_ROLE_FROM_DECLARATION, /* given in code by the pipeline author */
  MLO_ROLE_FROM_OVERRIDE,    /* set by the caller over a guess (CLI --role) */
  MLO_ROLE_FROM_HEURISTIC,   /* guessed from the component's name */
  MLO_ROLE_FROM_CLASS,       /* the model class the checkpoint names
                                (model_index.json, config.json) */
} mlo_role_source;
MLO_API const char *mlo_role_source_name(mlo_role_source source);

/* A communicator over the ranks of an MPI job (mlo/mpi.h creates one):
 * with one in the pipeline options, the ranks of a node share one host
 * slab per component and read the checkpoint in parallel, and loads may be
 * sharded across them (docs/distributed.md).  The queries answer 0 / 1 for
 * NULL. */
typedef struct mlo_comm mlo_comm;
MLO_API int mlo_comm_rank(const mlo_comm *comm); /* in the whole job */
MLO_API int mlo_comm_size(const mlo_comm *comm);
MLO_API int mlo_comm_node_rank(const mlo_comm *comm); /* among the ranks of this node */
MLO_API int mlo_comm_node_size(const mlo_comm *comm);

typedef struct {
  size_t size;            /* sizeof(mlo_pipeline_options) */
  mlo_platform *platform; /* required; must outlive the pipeline */
  bool pin_host;          /* pin host slabs when the platform can (default true) */
  size_t slab_alignment;  /* tensor alignment inside a slab (default 256) */
  /* --- since 0.3; a caller built against 0.2 passes the shorter size --- */
  mlo_comm *comm;      /* NULL: this process alone.  Else node-shared slabs, read
                          1/n per rank, and the rule of collectives (mlo/mpi.h);
                          must outlive the pipeline */
  bool sharded_loads;  /* with comm: a load copies this rank's 1/n of the
                          component and all-gathers the rest from the node's
                          ranks (host: MPI over host memory; CUDA: NCCL, see
                          mlo_comm_set_nccl).  false: each rank copies all of
                          it from the shared slab (replicated) */
  bool shard_resident; /* with sharded_loads: keep only this rank's slice on
                          the device and gather nothing: the caller's compute
                          gathers, as FSDP does with sharded parameters.  A
                          resident component then holds its slice alone
                          (mlo_component_shard says where it is) and
                          mlo_tensor_device answers only for tensors inside
                          it (MLO_ESTATE for the others).  Budgets still count
                          whole components */
  /* --- since 0.7; a caller built against 0.3-0.6 passes the shorter size --- */
  mlo_platform *const *devices; /* several devices for one pipeline (docs/placement.md):
                                   ndevices platforms of one kind (the same
                                   mlo_platform_name), each one device with its
                                   own queues and memory; devices[0] must be
                                   `platform` (or `platform` NULL).  Each
                                   component runs on one of them, placed at
                                   enable from the schedule or pinned with
                                   mlo_component_set_device.  Not with comm
                                   (MLO_EUNSUPPORTED): ranks and devices do not
                                   combine yet */
  size_t ndevices;              /* 0 or 1: `platform` alone; at most 16 */
} mlo_pipeline_options;
#define MLO_PIPELINE_OPTIONS_INIT                                                                  \
  { sizeof(mlo_pipeline_options), NULL, true, 256, NULL, false, false, NULL, 0 }

/* Creates an empty pipeline on a platform.  Free with mlo_pipeline_free. */
MLO_API int mlo_pipeline_create(const mlo_pipeline_options *opts, mlo_pipeline **out);
/* Frees the pipeline: disables offload, releases every device block and
 * host slab.  Waits for in-flight copies.  NULL is a no-op.  Never call
 * while another thread is inside a forward on the same pipeline. */
MLO_API void mlo_pipeline_free(mlo_pipeline *pipe);
/* The message of the last failure on this pipeline ("" if none). */
MLO_API const char *mlo_pipeline_errmsg(mlo_pipeline *pipe);
/* The pipeline's first device (its only one unless options gave several). */
MLO_API mlo_platform *mlo_pipeline_platform(mlo_pipeline *pipe);

/* ------------------------------------------------------------------------
 * Several devices (docs/placement.md)
 *
 * A pipeline given several devices keeps each component on one of them:
 * its block lives there, its forward must run there (launch it on
 * mlo_component_platform's compute queue), and its loads use that
 * device's copy queue.  Each device has its own budget under the budget
 * policy and its own exclusion under strict: a switch on one device never
 * waits for another.  At mlo_offload_enable the components not pinned are
 * placed to move the fewest bytes per request (each device's bytes times
 * loads over the declared schedule, or one request in role order without
 * one), each device's room being what the policy keeps to there.
 * ---------------------------------------------------------------------- */
MLO_API size_t mlo_pipeline_device_count(mlo_pipeline *pipe);
/* Device `index`'s platform; NULL outside [0, count). */
MLO_API mlo_platform *mlo_pipeline_device(mlo_pipeline *pipe, size_t index);
/* The device a component is on (0 until placed), and its platform. */
MLO_API size_t mlo_component_device(const mlo_component *comp);
MLO_API mlo_platform *mlo_component_platform(const mlo_component *comp);
/* Pins a component to device `index` (placement leaves it there), or with
 * MLO_DEVICE_ANY lets placement choose again.  MLO_EINVAL for an index
 * past the devices; MLO_ESTATE while offload is enabled (pin before
 * enabling).  A pinned component that cannot fit its device's room fails
 * the enable, naming the sizes. */
#define MLO_DEVICE_ANY (-1)
MLO_API int mlo_component_set_device(mlo_component *comp, int index);
/* The placement the last enable made (zeroes before one): per request, the
 * bytes it moves as the model counts them, and what one device of the
 * first's room would move for the same schedule. */
typedef struct {
  size_t size; /* sizeof(mlo_placement) */
  size_t devices;
  uint64_t moved_bytes;      /* placed over every device, per request */
  uint64_t one_device_bytes; /* every component on device 0 */
  uint64_t room_bytes[16];   /* each device's room as placement saw it */
} mlo_placement;
MLO_API int mlo_pipeline_get_placement(mlo_pipeline *pipe, mlo_placement *out);
/* Device `index`'s bytes resident now and at most (since the last
 * mlo_pipeline_reset_stats), and the budget kept there (0: none). */
typedef struct {
  size_t size; /* sizeof(mlo_device_stats) */
  uint64_t device_bytes, peak_device_bytes, budget_bytes;
} mlo_device_stats;
MLO_API int mlo_pipeline_get_device_stats(mlo_pipeline *pipe, size_t index, mlo_device_stats *out);

/* Adds a component.  role MLO_ROLE_AUTO guesses from the name (see
 * mlo_pipeline_warn_guessed); a concrete role is a declaration (C1).
 * Names are unique (MLO_EEXIST).  The component is owned by the pipeline. */
MLO_API int mlo_component_add(mlo_pipeline *pipe, const char *name, mlo_role role,
                              mlo_component **out);
/* Logs one warning naming every component whose role is still a guess
 * from its name ("roles guessed from the component names: text_encoder
 * (encoder), transformer (dit); ..."), once per pipeline; nothing when no
 * role is guessed.  Materialization and mlo_offload_enable call it, so the
 * warning comes when roles start to matter and after any overrides; a tool
 * that only inspects may call it itself. */
MLO_API void mlo_pipeline_warn_guessed(mlo_pipeline *pipe);
/* Changes a component's role: an override of a guess or of a previous
 * declaration.  Refused (MLO_ESTATE) while offload is enabled. */
MLO_API int mlo_component_set_role(mlo_component *comp, mlo_role role, mlo_role_source source);
MLO_API size_t mlo_pipeline_component_count(mlo_pipeline *pipe);
MLO_API mlo_component *mlo_pipeline_component_at(mlo_pipeline *pipe, size_t index);
MLO_API mlo_component *mlo_pipeline_find(mlo_pipeline *pipe, const char *name);
MLO_API const char *mlo_component_name(const mlo_component *comp);
MLO_API mlo_role mlo_component_role(const mlo_component *comp);
MLO_API mlo_role_source mlo_component_role_source(const mlo_component *comp);
MLO_API mlo_pipeline *mlo_component_pipeline(const mlo_component *comp);

/* Tensor flags. */
enum {
  MLO_TENSOR_PARAMETER = 0,      /* a weight (default) */
  MLO_TENSOR_BUFFER = 1u << 0,   /* a buffer (running stats, caches) */
  MLO_TENSOR_MUTABLE = 1u << 1,  /* written by compute: copied back on eviction.
                                    The copy-back completes asynchronously; the
                                    host bytes (the caller's, for EXTERNAL) are
                                    current once mlo_tensor_host_data() returns,
                                    or when evict returns on a blocking_d2h
                                    platform (the XPU rule). */
  MLO_TENSOR_EXTERNAL = 1u << 2, /* host storage belongs to the caller: used in
                                    place, never copied into a slab or freed
                                    (C7); page-locked in place (CUDA:
                                    cudaHostRegister) where the platform can
                                    and pin_host is on, until the pipeline is
                                    freed */
  MLO_TENSOR_SHARDED = 1u << 3,  /* a shard of a distributed tensor; implies
                                    EXTERNAL (the C form of a DTensor) */
};

#define MLO_MAX_DIMS 8
typedef struct {
  size_t size;      /* sizeof(mlo_tensor_desc) */
  const char *name; /* unique within the component */
  mlo_dtype dtype;
  int ndim; /* 0..MLO_MAX_DIMS; 0 is a scalar */
  int64_t shape[MLO_MAX_DIMS];
  unsigned flags; /* MLO_TENSOR_* */
  /* Where the data comes from; exactly one of these:                       */
  const void *data; /* host memory: copied into the slab at materialize,
                       or (EXTERNAL) used in place for the tensor's life */
  const char *file; /* a file: bytes [file_offset, file_offset+nbytes) */
  uint64_t file_offset;
  /* neither: the tensor starts zero-filled */
} mlo_tensor_desc;
#define MLO_TENSOR_DESC_INIT                                                                       \
  { sizeof(mlo_tensor_desc), NULL, MLO_DTYPE_F32, 0, {0}, 0, NULL, NULL, 0 }

/* Adds a tensor to a component.  Refused (MLO_ESTATE) once the component
 * is materialized; a call made while another thread materializes the same
 * component waits for it and is then refused.  Validates dtype, shape (no
 * negative dims), byte size (overflow checked; a component's total may not
 * pass 2^62 bytes: MLO_EINVAL) and that a file range lies inside a regular
 * file.  The file's identity (device, inode, size, modification time) is
 * recorded: if another file is at the path when the component is
 * materialized, that fails with MLO_EIO instead of loading it. */
MLO_API int mlo_tensor_add(mlo_component *comp, const mlo_tensor_desc *desc, mlo_tensor **out);
/* Adds `name` to comp as another name for `target`.  If target belongs to
 * comp, it is a shared (tied) tensor: stored and moved once (C6).  If it
 * belongs to another component, it is a reference that comp's transfers
 * never follow: it is resident only when its owner is. */
MLO_API int mlo_tensor_add_alias(mlo_component *comp, const char *name, mlo_tensor *target);

MLO_API size_t mlo_component_tensor_count(const mlo_component *comp); /* aliases included */
MLO_API mlo_tensor *mlo_component_tensor_at(const mlo_component *comp, size_t index);
MLO_API mlo_tensor *mlo_component_find_tensor(const mlo_component *comp, const char *name);
/* Bytes this component moves on a load and holds on the device: its own
 * storage, each shared tensor once, references to other components
 * excluded, alignment padding between tensors included, and the whole
 * rounded up to the alignment (so one component's block can take another's
 * tensors, each aligned: the joined switch). */
MLO_API uint64_t mlo_component_bytes(const mlo_component *comp);
/* The sum of its own tensors' bytes (each shared tensor once, references
 * excluded), without padding: the weights' size as a checkpoint states it. */
MLO_API uint64_t mlo_component_tensor_bytes(const mlo_component *comp);

MLO_API const char *mlo_tensor_name(const mlo_tensor *t);
MLO_API mlo_dtype mlo_tensor_dtype(const mlo_tensor *t);
MLO_API int mlo_tensor_ndim(const mlo_tensor *t);
MLO_API const int64_t *mlo_tensor_shape(const mlo_tensor *t);
MLO_API uint64_t mlo_tensor_nbytes(const mlo_tensor *t);
MLO_API unsigned mlo_tensor_flags(const mlo_tensor *t);
/* The file a tensor was declared from and its byte offset there (an
 * alias: its target's); NULL for a tensor from memory or zero-filled. */
MLO_API const char *mlo_tensor_file(const mlo_tensor *t, uint64_t *offset);
/* The component that owns the storage (for a reference: the other one). */
MLO_API mlo_component *mlo_tensor_owner(const mlo_tensor *t);
/* The host copy (NULL before materialization, and for a component the disk
 * tier keeps in its files: host_budget_bytes).  Authoritative whenever the
 * component is not resident; while resident, mutable tensors may be newer on
 * the device. */
MLO_API const void *mlo_tensor_host_data(const mlo_tensor *t);
/* The device copy: the platform's block handle and the byte offset in it.
 * MLO_ESTATE if the owner is not resident.  On pointer platforms (host,
 * CUDA) the address is (char*)block + offset; on OpenCL block is the cl_mem
 * holding the tensor (one segment of a component larger than the device's
 * largest allocation: see max_block_bytes) and offset is within it. */
MLO_API int mlo_tensor_device(const mlo_tensor *t, void **block, size_t *offset);
/* A resident component's device bytes on this rank: its block, the offset
 * in the component's layout where they start, and how many there are.
 * With shard_resident, this rank's slice (every rank holds one, in node
 * rank order; together they are the component); otherwise the whole block
 * from 0.  The block is the same handle mlo_tensor_device gives.
 * MLO_ESTATE if the component is not resident. */
MLO_API int mlo_component_shard(mlo_component *comp, void **block, uint64_t *offset,
                                uint64_t *bytes);
/* Convenience for pointer platforms: the device address or NULL. */
MLO_API void *mlo_tensor_device_ptr(const mlo_tensor *t);

/* ------------------------------------------------------------------------
 * Blocks: a component as the sequence its forward runs
 *
 * A component is a prologue (embeddings, time and text projections), a
 * sequence of repeated blocks, and an epilogue (final norm, output
 * projection).  Its slab lays each out as one contiguous range, in the
 * order they run, so a block moves as one copy (block streaming, below).
 * Blocks are found from the tensors' names for the layouts mlo reads
 * (`blocks.N.`, `transformer_blocks.N.`, `single_transformer_blocks.N.`
 * after them, `double_blocks.N.`, `single_blocks.N.`, `layers.N.`,
 * `block.N.`, GGUF's `blk.N.`; docs/streaming.md) and may be declared
 * instead.  "Block" here is a block of the forward, not the device block
 * of mlo_tensor_device.
 * ---------------------------------------------------------------------- */
#define MLO_BLOCK_PROLOGUE (-1)
#define MLO_BLOCK_EPILOGUE (-2)
#define MLO_BLOCK_MAX 100000000 /* the largest block number a caller may declare */
/* Declares the block a tensor belongs to (0..MLO_BLOCK_MAX, or the
 * prologue or epilogue), before the component is materialized
 * (MLO_ESTATE after).  Once any tensor of a component is declared, names
 * are not read for that component: its tensors never declared are the
 * prologue's.  Declared numbers give the order; gaps close up. */
MLO_API int mlo_tensor_set_block(mlo_tensor *t, int block);
/* Its piece as laid out: MLO_BLOCK_PROLOGUE, MLO_BLOCK_EPILOGUE or the
 * block's index, 0 .. mlo_component_block_count()-1 in the order they run
 * (an alias: its target's; an external tensor: the prologue's). */
MLO_API int mlo_tensor_block(const mlo_tensor *t);
/* The number of repeated blocks (0: a component that is all prologue). */
MLO_API size_t mlo_component_block_count(const mlo_component *comp);
typedef struct {
  size_t size;     /* sizeof(mlo_block_info) */
  int block;       /* MLO_BLOCK_PROLOGUE, a block's index, or MLO_BLOCK_EPILOGUE */
  uint64_t offset; /* where it starts in the slab (and in a whole device block) */
  uint64_t bytes;  /* its range's size, alignment padding between its tensors included */
  size_t tensors;  /* tensors in it */
} mlo_block_info;
/* The prologue, each block, the epilogue, in the order they run: up to cap
 * entries into out; *count (may be NULL) gets how many there are (the
 * block count + 2). */
MLO_API int mlo_component_blocks(mlo_component *comp, mlo_block_info *out, size_t cap,
                                 size_t *count);

/* Load progress for materialization: bytes done of total, per component.
 * A materialization uses the callback set when it started; see "Callbacks"
 * for what the callback may call. */
typedef void (*mlo_progress_fn)(const mlo_component *comp, uint64_t done, uint64_t total,
                                void *user);
MLO_API void mlo_pipeline_set_progress(mlo_pipeline *pipe, mlo_progress_fn fn, void *user);

/* Packs every component's tensors into its host slab (reading file-backed
 * tensors once, sequentially, straight into the slab).  Called implicitly
 * by enable and by the first load; explicit calls let a caller show load
 * progress and measure it.  Idempotent. */
MLO_API int mlo_pipeline_materialize(mlo_pipeline *pipe);
MLO_API int mlo_component_materialize(mlo_component *comp);

/* ------------------------------------------------------------------------
 * Residency
 * ---------------------------------------------------------------------- */
typedef enum {
  MLO_RES_UNMATERIALIZED, /* tensors declared, no slab yet */
  MLO_RES_HOST,           /* host slab only */
  MLO_RES_LOADING,        /* device block allocated, copies in flight */
  MLO_RES_DEVICE,         /* resident (copies may still be completing) */
} mlo_residency;
MLO_API const char *mlo_residency_name(mlo_residency r);
MLO_API mlo_residency mlo_component_residency(mlo_component *comp);
MLO_API bool mlo_component_is_resident(mlo_component *comp); /* LOADING or DEVICE */
/* Resident and its device copy complete (its load or prefetch has landed),
 * asked without waiting: its device bytes may be read now.  false while
 * it is not resident or still loading, and while a block-by-block load has
 * copies still to issue (mlo_tensor_device answers for their tensors all
 * the same; mlo_pipeline_synchronize issues and waits for them). */
MLO_API bool mlo_component_load_done(mlo_component *comp);
/* A load from disk being read (the disk tier, docs/disk.md): *done of the
 * *total bytes of its files read so far; both 0 when none is.  Safe from
 * any thread while another waits for the load (a progress display polls
 * it: the reader itself calls nothing back). */
MLO_API int mlo_component_disk_progress(mlo_component *comp, uint64_t *done, uint64_t *total);

/* Loads a component without evicting anything (no contract applied).
 * Used by the all-resident mode and by callers managing residency by hand
 * while offload is disabled. MLO_ESTATE while offload is enabled. */
MLO_API int mlo_component_load(mlo_component *comp);
/* Evicts a component by hand (mutable tensors written back).  MLO_EBUSY if
 * it is executing; MLO_ESTATE while offload is enabled. */
MLO_API int mlo_component_evict(mlo_component *comp);
/* Loads every component (all-resident mode); MLO_ESTATE while enabled. */
MLO_API int mlo_pipeline_load_all(mlo_pipeline *pipe);

/* Checks the residency invariant now: with offload enabled, no two
 * components that exclude each other are resident at once (STRICT) or the
 * resident bytes are within the budget (BUDGET), no component is
 * executing while non-resident, and device bytes match the resident blocks.
 * MLO_OK, or MLO_ESTATE with the violation in mlo_pipeline_errmsg. */
MLO_API int mlo_pipeline_audit(mlo_pipeline *pipe);
/* Waits until every load this pipeline issued is complete on the device,
 * loads from disk included (the disk tier's reader issues their copies
 * after mlo_platform_synchronize may have returned) and a streamed load's
 * kept blocks (issued between its slots' copies as its forward reaches
 * them: docs/streaming.md), those of a component held now included (its
 * forward may have stopped before reaching them, an exception in the
 * caller's model), then synchronizes the platform: every resident
 * component's mlo_component_load_done is then true unless a copy failed to
 * issue.  For counters that must be final (a report), and before device
 * bytes are read outside a forward; a server need not call it. */
MLO_API int mlo_pipeline_synchronize(mlo_pipeline *pipe);
/* Audit automatically at every acquire (used by `mlo run --verify`). */
MLO_API void mlo_pipeline_set_audit(mlo_pipeline *pipe, bool on);

/* ------------------------------------------------------------------------
 * The offload backend (the contract, C1–C17)
 * ---------------------------------------------------------------------- */
typedef enum {
  MLO_SYNC_EVENT,       /* compute waits on the load's event (default) */
  MLO_SYNC_DEVICE,      /* the specification literally: synchronize the platform
                           before a hooked forward returns control to the model */
  MLO_SYNC_UNSAFE_NONE, /* no ordering at all.  Exists only so tests can
                           prove that the race detector catches a missing
                           wait; never use it for real work. */
} mlo_sync_mode;
MLO_API const char *mlo_sync_name(mlo_sync_mode mode);
MLO_API int mlo_sync_from_name(const char *name, mlo_sync_mode *out);

/* Residency policies (docs/planner.md).
 *
 * STRICT is the specification: the exclusion rule of C3/C4 (a DiT's forward
 * evicts encoders and other DiTs, an encoder's evicts DiTs), nothing kept
 * that the rule excludes, whatever memory is free.  C1–C17 are its tests.
 *
 * BUDGET keeps components on the device while they fit in a budget and
 * evicts one only when a load needs the room.  The victim is an idle
 * resident component chosen by the declared schedule
 * (mlo_pipeline_set_schedule): the smallest that frees enough room, then
 * the one whose next use is farthest away (Belady's rule, optimal for a
 * known call sequence of equal-sized blocks), then the least recently
 * used (all that is left where the schedule says nothing).  No component
 * is evicted while it executes or is acquired; a thread holding one that
 * needs room others hold gets MLO_EDEADLK rather than waiting.  With
 * prefetch on, the components the schedule calls next are loaded on the
 * copy queue as soon as they fit beside what must stay (evicting only
 * components needed after them and one call more), so the copy overlaps
 * the current compute; a forward still waits on its load's event (C8) and
 * nothing is freed under a running copy or compute (C9).  The audit checks
 * device bytes <= budget and every executing component resident. */
typedef enum {
  MLO_POLICY_STRICT, /* the specification (default) */
  MLO_POLICY_BUDGET, /* keep what fits in budget_bytes; evict by next use */
  MLO_POLICY_COUNT   /* how many there are: 0 .. MLO_POLICY_COUNT-1 are policies */
} mlo_policy;
MLO_API const char *
mlo_policy_name(mlo_policy policy); /* "strict", "budget" ("invalid" otherwise) */
/* The policy of that name (case-insensitive); MLO_EINVAL if none is.  Tools
 * list the choices with mlo_policy_name(0 .. MLO_POLICY_COUNT-1). */
MLO_API int mlo_policy_from_name(const char *name, mlo_policy *out);

/* What a pipeline needs, from its declarations alone (nothing need be
 * loaded): the device memory every component takes at once, the least
 * device room each policy runs it in (strict: the larger of its phases;
 * budget: the largest component's least streamed footprint) and the
 * component that sets it, and the host memory its slabs take: all of
 * them; with the disk tier, what cannot stay in its files (caller-owned,
 * mutable, or not from files); and that plus the blocks that stream in
 * device_room, kept in host memory (0: nothing streams there).  The rules
 * are the library's own (the host plan's, each policy's), so a tool asks
 * rather than repeats them. */
typedef struct {
  size_t size; /* sizeof(mlo_pipeline_needs) */
  uint64_t all_resident;
  uint64_t policy_least[MLO_POLICY_COUNT];
  const mlo_component *policy_least_by[MLO_POLICY_COUNT];
  uint64_t host_all, host_least, host_stream_keep;
} mlo_pipeline_needs;
MLO_API int mlo_pipeline_get_needs(mlo_pipeline *pipe, uint64_t device_room,
                                   mlo_pipeline_needs *out);

typedef struct {
  size_t size;            /* sizeof(mlo_offload_settings) */
  mlo_sync_mode sync;     /* default MLO_SYNC_EVENT */
  bool pin_host;          /* pin host copies (default: the pipeline's option) */
  bool distributed;       /* tensors are sharded (HSDP): never re-pinned */
  bool per_tensor_copies; /* one copy per tensor instead of one per slab:
                             the specification-literal baseline for benches */
  bool copy_back;         /* write every tensor back on eviction (baseline) */
  /* --- since 0.2; a caller built against 0.1 passes the shorter size and
   * gets the defaults below --- */
  mlo_policy policy;      /* default MLO_POLICY_STRICT */
  uint64_t budget_bytes;  /* BUDGET: device bytes the pipeline may keep; 0 =
                             the device's free memory at enable (plus what the
                             pipeline already holds) minus reserve_bytes */
  uint64_t reserve_bytes; /* BUDGET with budget_bytes 0: left free for the
                             caller's own allocations (activations,
                             workspaces), as ComfyUI's --reserve-vram */
  bool prefetch;          /* BUDGET: load scheduled components ahead of their
                             forward (default true; needs a schedule) */
  /* --- since 0.6; a caller built against 0.2-0.5 passes the shorter size
   * and gets 0 --- */
  /* the disk tier's staging ring, pinned, besides host_budget_bytes: 4
   * buffers of up to 16 MiB (as large as the largest slab on disk) */
#define MLO_STAGING_MAX_BYTES (64ull << 20)
  uint64_t host_budget_bytes; /* host memory the pipeline's slabs may keep; 0 =
                                 every slab in host memory.  What does not fit
                                 stays in its checkpoint file and each load
                                 reads it through a small pinned staging ring
                                 (the disk tier, docs/disk.md); chosen from the
                                 schedule: a component used least per prompt
                                 goes first; a component that streams keeps
                                 the blocks it streams where they fit, else
                                 reads each from its files at each use.
                                 Only file-backed,
                                 immutable components may live on disk;
                                 MLO_ENOMEM naming what must stay where it
                                 does not fit.  With ranks: the node's budget;
                                 a component on disk is read by each rank in
                                 its slice and gathered by the node, under
                                 replicated loads too (host platform, or
                                 sharded residency; else MLO_EUNSUPPORTED) */
} mlo_offload_settings;
#define MLO_OFFLOAD_SETTINGS_INIT                                                                  \
  {                                                                                                \
    sizeof(mlo_offload_settings), MLO_SYNC_EVENT, true, false, false, false, MLO_POLICY_STRICT, 0, \
        0, true, 0                                                                                 \
  }

/* An offload delegate (C10): a pipeline whose mutually exclusive parts are
 * nested inside one component (a reasoner and a generator inside one
 * transformer) provides its own enable/disable.  With a delegate installed,
 * mlo_offload_enable calls it instead of installing the generic hooks.  The
 * delegate must keep the contract; mlo_group_* does the bookkeeping. */
typedef struct mlo_delegate_ops {
  /* Install the delegate's hooks/contexts.  Called at most once per
   * disabled->enabled transition.  On failure the library calls disable and
   * returns the error. */
  int (*enable)(void *self, mlo_pipeline *pipe, const mlo_offload_settings *settings);
  /* Remove every hook/context enable made; must move nothing. */
  int (*disable)(void *self, mlo_pipeline *pipe);
} mlo_delegate_ops;
/* Installs (ops != NULL) or removes a delegate.  MLO_ESTATE while enabled. */
MLO_API int mlo_pipeline_set_delegate(mlo_pipeline *pipe, const mlo_delegate_ops *ops, void *self);

/* Enables model-level offload.  MLO_EBUSY while any component executes (a
 * forward or acquire made with offload off would escape the hooks).
 * Acquires made by other threads while enable runs wait for it.  Without a
 * delegate: discovers DiTs, encoders
 * and VAEs from the declared roles (C1; refused with MLO_EUNSUPPORTED if no
 * DiT or no encoder is declared), materializes slabs, makes encoders and
 * VAEs resident and leaves DiTs where they are (C2), and installs the
 * exclusion hooks.  settings may be NULL for defaults.  Idempotent with the
 * same settings (C11); MLO_EOWNED if another strategy owns the hooks or
 * the settings differ (C16).  On failure nothing is installed (C15). */
MLO_API int mlo_offload_enable(mlo_pipeline *pipe, const mlo_offload_settings *settings);
/* Removes the hooks.  Moves nothing (C14).  Idempotent (C11).  MLO_EBUSY if
 * a component is executing. */
MLO_API int mlo_offload_disable(mlo_pipeline *pipe);
MLO_API bool mlo_offload_is_enabled(mlo_pipeline *pipe);

/* A hooked forward (C3/C4/C8): applies the exclusion rule for comp (waiting
 * while a conflicting component executes on another thread), loads comp if
 * needed, orders compute after the load and calls fn(comp, user); a later
 * eviction is ordered after the compute submitted while comp was held
 * (between its acquire and its release: compute on a component belongs
 * there while offload is enabled) and after every copy, so it never frees
 * or copies back memory that compute may still use (C9); compute queued
 * later, for other components, does not hold the free back (by hand,
 * with offload off, an eviction waits for all compute), so work queued on
 * its device memory outside a hold (a write into its weights) must be
 * complete before the next call that may evict it.  Without
 * offload, loads comp if needed and evicts nothing.
 * fn's non-zero return is passed through as MLO_ECALLBACK. */
typedef int (*mlo_forward_fn)(mlo_component *comp, void *user);
MLO_API int mlo_component_forward(mlo_component *comp, mlo_forward_fn fn, void *user);

/* Scoped form for entry points other than forward (C17): a VAE's decode,
 * an encoder's encode.  Between acquire and release the component is
 * resident and never evicted.  Every successful acquire needs one release,
 * which may come from any thread (holders are tracked per component, not
 * per thread).  try_acquire returns MLO_EBUSY instead of waiting.  A thread
 * that holds a component and acquires a conflicting one gets MLO_EDEADLK.
 * Freeing a pipeline with acquires outstanding logs an error and frees
 * them with it; nothing of them outlives the pipeline. */
MLO_API int mlo_component_acquire(mlo_component *comp);
MLO_API int mlo_component_try_acquire(mlo_component *comp);
MLO_API int mlo_component_release(mlo_component *comp);

/* ------------------------------------------------------------------------
 * Block streaming (docs/streaming.md)
 *
 * Under the BUDGET policy a component larger than the budget is not
 * refused: it streams.  Its prologue, epilogue and as many of its blocks
 * as the budget allows (the largest first: each one kept saves its bytes
 * every forward) stay resident; the others pass through MLO_STREAM_SLOTS
 * device buffers, each block's copy issued on the copy queue while the
 * blocks before it compute, and the first blocks of the next forward
 * while the last ones of this one compute (when the schedule calls this
 * component again next, or no schedule is declared).  A streamed
 * component's device bytes stay within the budget.
 *
 * The caller's forward says where it is: between acquire and release (or
 * inside a hooked forward), on the thread that holds the component, it
 * calls mlo_block_begin before a block's compute and mlo_block_end after
 * it, for each block in order (MLO_ESTATE from a thread that does not hold
 * it).  The rules
 * are a component's: begin orders compute after the block's copy (C8); a
 * slot is reused only after the compute submitted before its end (C9).
 * A streamed block's tensors have a device copy (mlo_tensor_device) only
 * between its begin and end; resident pieces always have an address, and
 * a kept block's bytes are ordered after its begin (its load is
 * progressive: see mlo_component_set_progressive).  For a component that
 * neither streams nor loads progressively, begin and end check their
 * arguments and their pairing and do nothing else, so a forward may call
 * them always.  Blocks run out of
 * order are loaded on demand (a stall, never an error).  Several threads
 * holding the component may run blocks at once: a block begun twice is
 * shared (each begin needs its end, on the thread that began it: an end
 * with no open begin of that block on its own thread is MLO_ESTATE and
 * changes nothing, so a block is never refilled or handed to the next
 * component while a begin of it is open); a thread that begins a block while
 * every slot holds a block begun elsewhere waits for an end, unless it
 * holds one of them itself (MLO_EBUSY: waiting could deadlock).  A
 * block begun and never ended is ended when the thread that began it
 * releases its last hold (every thread's at the component's last release),
 * with a warning.  A component with
 * mutable tensors keeps the blocks holding them resident; copy_back,
 * per_tensor_copies, sharded loads and segmented devices do not stream.
 * ---------------------------------------------------------------------- */
#define MLO_STREAM_SLOTS 2
MLO_API int mlo_block_begin(mlo_component *comp, size_t block);
MLO_API int mlo_block_end(mlo_component *comp, size_t block);
typedef struct {
  size_t size;             /* sizeof(mlo_stream_info) */
  size_t blocks;           /* its blocks (0 before materialization) */
  size_t resident_blocks;  /* of which resident while it is (all when it moves whole) */
  size_t streamed_blocks;  /* of which passed through the slots at each forward */
  size_t slots;            /* device buffers they pass through (0: not streamed) */
  uint64_t slot_bytes;     /* each */
  uint64_t device_bytes;   /* what it holds on the device while resident */
  uint64_t streamed_bytes; /* bytes copied per forward for its streamed blocks */
  int progressive;         /* its loads go block by block: its forward must begin and
                              end every block (it streams, or mlo_component_set_progressive,
                              and it has blocks and is loaded neither from disk nor sharded) */
} mlo_stream_info;
/* The least budget under which the budget policy runs comp: the least
 * footprint it streams in, or its whole bytes where it cannot stream (too
 * few blocks) or streaming would not save anything.  Known before
 * materialization (settings that never stream — sharded loads, copy_back,
 * segmented devices — are not considered). */
MLO_API uint64_t mlo_component_stream_least(mlo_component *comp);
/* The bytes of the blocks comp would stream under a budget of room (its
 * plan's choice; known before materialization): what a host budget must
 * keep of it in host memory while it streams (docs/disk.md).  0 where it
 * fits room whole; UINT64_MAX where it cannot stream there. */
MLO_API uint64_t mlo_component_streamed_bytes(mlo_component *comp, uint64_t room);
/* How comp moves under the policy in force (whole, or streamed). */
MLO_API int mlo_component_stream_info(mlo_component *comp, mlo_stream_info *out);
/* Progressive loads (docs/streaming.md).  A load normally ends in one
 * event and the acquire waits for all of it, though the forward's first
 * block needs a fraction.  A component declared progressive (on != 0)
 * loads instead block by block in the order the forward runs them: first
 * its head (prologue, epilogue, caller-owned tensors, blocks holding
 * mutable tensors), which the acquire waits for, then each block behind
 * an event of its own, which mlo_block_begin waits for.  At a switch the
 * forward then starts once the head is in, and each block computes as soon
 * as it lands, while the ones after it are still copying.
 *
 * The declaration is a promise: the forward calls mlo_block_begin before
 * each block's compute (and mlo_block_end after), as a streamed forward
 * does — a block's device bytes are ordered only after its begin, though
 * its address (mlo_tensor_device) is valid for the whole hold — and reads
 * a block's tensors only between its begin and end.  A streamed component
 * always loads so.  Takes effect at its next load (a resident one keeps
 * how it was loaded).  Loads from disk, sharded loads, copy_back and
 * per_tensor_copies move whole, as before.
 *
 * The joined switch.  Under the BUDGET policy with prefetch and a schedule
 * (declared or learned), where the component the schedule calls next does
 * not fit beside the one running, and the running one is progressive: in
 * what the schedule says is its last call before the next one, the next
 * one's copies go, block by block, into the memory of the blocks this
 * forward has ended (each copy after the compute that read what it
 * overwrites: C9), and at its last release the next one is resident in its
 * block, its first blocks already landed (mlo_component_stats.joined_loads).
 * In that call a block ended is not begun again (MLO_ESTATE: its memory may
 * hold the next component's bytes), nor are its tensors' addresses given;
 * another thread's acquire of the running component waits for its release
 * and loads it again, as does one of the next component (MLO_EDEADLK on a
 * thread that holds any component: it could wait for itself; MLO_EBUSY for
 * a try).  A schedule not kept costs a reload,
 * never a wrong byte.  It joins where the running component is resident in
 * a block of its own, held once, with no mutable tensor; where the next one
 * has no caller-owned or mutable tensors, and its slab fits the running
 * one's block, or both stream with one plan (every piece at one offset:
 * two experts of one architecture under one budget), when a streamed
 * block ended may be begun again (docs/streaming.md, "The joined switch").  mlo_component_shard of
 * the running component is MLO_ESTATE for that call, as a placed one's is MLO_EUNSUPPORTED. */
MLO_API int mlo_component_set_progressive(mlo_component *comp, int on);

/* ------------------------------------------------------------------------
 * The declared schedule: what the pipeline will call, so the BUDGET policy
 * can keep, evict and prefetch by next use.  A request is a list of runs,
 * each a component called `repeat` times in a row; it repeats request after
 * request (prompt after prompt).  For Wan2.2 with 8 steps split 3/5:
 *
 *     mlo_schedule_entry request[] = {
 *         {text_encoder, 1}, {transformer, 3}, {transformer_2, 5}, {vae, 1}};
 *     mlo_pipeline_set_schedule(pipe, request, 4);
 *
 * A cursor follows every hooked forward and acquire.  A call the schedule
 * does not expect next is still served (on demand) and moves the cursor to
 * the next place the schedule has that component, so a schedule that is
 * wrong or shorter than the request is never incorrect, only unprefetched.
 * STRICT ignores the schedule.
 * ---------------------------------------------------------------------- */
typedef struct {
  mlo_component *comp; /* a component of this pipeline */
  uint32_t repeat;     /* consecutive calls; 0 counts as 1 */
} mlo_schedule_entry;
/* Declares (or, with count 0, clears) the schedule and puts the cursor at
 * its start.  MLO_EINVAL for a component of another pipeline or a request
 * of more than 2^32 calls.  May be called at any time, offload enabled or
 * not. */
MLO_API int mlo_pipeline_set_schedule(mlo_pipeline *pipe, const mlo_schedule_entry *entries,
                                      size_t count);
/* Copies the schedule in force (declared, or learned) into out, at most
 * cap entries, and its length to *count (out may be NULL with cap 0, to ask
 * the length).  A run longer than 2^32 - 1 calls is reported as that many. */
MLO_API int mlo_pipeline_get_schedule(mlo_pipeline *pipe, mlo_schedule_entry *out, size_t cap,
                                      size_t *count);
/* Learns the schedule from the calls themselves, for a caller that cannot
 * declare it (a framework's hooks, a checkpoint opened without a workload):
 * while on, every acquire is recorded, and when a request ends its calls
 * become the schedule (as mlo_pipeline_set_schedule would declare them),
 * so the BUDGET policy prefetches from the second request on.  A request
 * ends where the component it began with is called again after a DiT has
 * run (a pipeline without a DiT: after any other component): encoders,
 * DiT steps, VAE, then the next prompt's encoder.  A request that begins
 * and ends with one component (image to image: VAE encode ... VAE decode)
 * is learned as the cycle it is, its last and the next one's first calls
 * one run, from the end of its second request.  At every end the calls are compared with the
 * schedule in force and replace it where they differ (another step count, another expert boundary),
 * so a learned schedule follows the requests; one wrong for a request costs prefetches, never
 * correctness.  A request whose first component runs again, apart, after a DiT (encoder, DiT,
 * encoder, DiT, VAE) is learned in pieces: declare such a schedule.  On (true) records afresh from
 * the next call; off (false) stops recording and keeps the schedule in force.  Recording is O(1)
 * per call; a request of more than 4096 runs stops learning (with a warning), as does running out
 * of memory for the recording. */
MLO_API int mlo_pipeline_learn_schedule(mlo_pipeline *pipe, bool learn);

/* ------------------------------------------------------------------------
 * Exclusion groups: the building block for delegates (C10)
 * ---------------------------------------------------------------------- */
typedef struct mlo_group mlo_group;
/* Creates a group whose members exclude each other: acquiring one evicts
 * the others first.  Only while the pipeline has a delegate installed
 * (MLO_EOWNED otherwise: the generic hooks own the pipeline).  Freed by
 * mlo_group_free or with the pipeline. */
MLO_API int mlo_group_create(mlo_pipeline *pipe, const char *name, mlo_group **out);
MLO_API int mlo_group_add(mlo_group *group, mlo_component *comp);
/* Removes the group's hooks and frees it; moves nothing.  NULL is a no-op.
 * mlo_offload_disable removes every group's hooks but does not free the
 * group objects: a delegate (or whoever created a group) frees each with
 * this call, before or after disable, or leaves it to mlo_pipeline_free.
 * Adding to a group after disable gives MLO_ESTATE. */
MLO_API void mlo_group_free(mlo_group *group);

/* ------------------------------------------------------------------------
 * Counters and trace
 * ---------------------------------------------------------------------- */
typedef struct {
  uint64_t loads, evictions, forwards;
  uint64_t h2d_bytes, d2h_bytes;
  uint64_t copy_calls;     /* platform copy calls issued */
  uint64_t platform_calls; /* every platform call made for this component */
  uint64_t wait_ns;        /* time the caller waited on transfers, and on the
                              device allocator while a load found no room */
  uint64_t forward_ns;     /* time inside forward callbacks */
  uint64_t prefetches;     /* loads issued ahead of use (BUDGET, counted in loads) */
  /* --- since 0.5 --- */
  uint64_t block_loads;   /* streamed blocks copied into slots (their bytes are in
                             h2d_bytes; not counted in loads) */
  uint64_t block_wait_ns; /* of wait_ns, waiting for a streamed block's copy */
  /* --- since 0.6 --- */
  uint64_t disk_loads;      /* loads read from the checkpoint (the disk tier),
                               counted when issued, as loads are */
  uint64_t disk_read_bytes; /* bytes those loads have read from files (a load
                               still reading, a prefetch, adds them as it ends) */
  uint64_t disk_wait_ns;    /* of wait_ns, waiting for their reads */
  uint64_t joined_loads;    /* of loads, those of a joined switch: copied during the
                               previous component's last forward, into the memory
                               its ended blocks freed (BUDGET with prefetch) */
} mlo_component_stats;
MLO_API int mlo_component_get_stats(mlo_component *comp, mlo_component_stats *out);
/* The counters of mlo_component_stats as a table, in the struct's order
 * (each a uint64_t at `offset`): a writer that lists them (a JSON report, a
 * binding's struct) asks here rather than repeating the list.  seconds: for
 * a time in ns, the name it is reported under in seconds ("stall_s" for
 * wait_ns); NULL for a count.  Returns how many; *fields gets the table. */
typedef struct {
  const char *name;
  size_t offset;
  const char *seconds;
} mlo_stats_field;
MLO_API size_t mlo_component_stats_fields(const mlo_stats_field **fields);
/* Sums over every component, plus pipeline-level figures. */
typedef struct {
  mlo_component_stats total;
  uint64_t device_bytes;      /* bytes of resident blocks now */
  uint64_t peak_device_bytes; /* high-water mark of device_bytes */
  uint64_t host_slab_bytes;   /* host slabs allocated */
  uint64_t pinned_bytes;      /* of which pinned */
  uint64_t budget_bytes;      /* the BUDGET policy's budget while enabled; else 0 */
  /* --- since 0.6 --- */
  uint64_t host_budget_bytes; /* host_budget_bytes in force (0: none) */
  uint64_t disk_bytes;        /* slab bytes left in checkpoint files (disk tier) */
  uint64_t staging_bytes;     /* the disk tier's staging ring (pinned when it can be) */
} mlo_pipeline_stats;
MLO_API int mlo_pipeline_get_stats(mlo_pipeline *pipe, mlo_pipeline_stats *out);
/* What a pipeline's rank did (every pipeline has one; without a
 * communicator it is rank 0 of 1). */
typedef struct {
  size_t size; /* sizeof(mlo_dist_stats) */
  int rank, ranks, node_rank, node_ranks;
  uint64_t read_bytes;   /* checkpoint bytes this rank read into host slabs */
  uint64_t shared_bytes; /* host slabs in node-shared memory (one copy per node) */
  uint64_t gather_bytes; /* bytes this rank received by all-gathers (sharded loads) */
  uint64_t gather_ns;    /* time spent in them (on the forward's thread, counted in wait_ns
                            too; on the gather thread, only what a block waited for is) */
  uint64_t collectives;  /* agreement steps made */
  /* --- since 0.7 (a caller built before passes the smaller size) --- */
  uint64_t lane_gathers; /* of the host's gathers, those run on the pipeline's gather thread,
                            under the compute (the caller's MPI gives MPI_THREAD_MULTIPLE:
                            docs/distributed.md); the rest ran on the forward's thread */
} mlo_dist_stats;
#define MLO_DIST_STATS_INIT                                                                        \
  { sizeof(mlo_dist_stats), 0, 1, 0, 1, 0, 0, 0, 0, 0, 0 }
MLO_API int mlo_pipeline_get_dist_stats(mlo_pipeline *pipe, mlo_dist_stats *out);
MLO_API void mlo_pipeline_reset_stats(mlo_pipeline *pipe);

typedef enum {
  MLO_TRACE_LOAD_BEGIN, /* bytes = component bytes */
  MLO_TRACE_LOAD_END,   /* the load is complete on the device */
  MLO_TRACE_EVICT,      /* bytes = bytes written back (d2h) */
  MLO_TRACE_FORWARD_BEGIN,
  MLO_TRACE_FORWARD_END,
  MLO_TRACE_WAIT_BEGIN, /* the caller starts waiting on a transfer */
  MLO_TRACE_WAIT_END,
  MLO_TRACE_PREFETCH, /* the LOAD_BEGIN just traced for comp is a prefetch */
  /* since 0.5 */
  MLO_TRACE_BLOCK_LOAD, /* a streamed block's copy issued; bytes = its size */
} mlo_trace_kind;
typedef struct {
  mlo_trace_kind kind;
  const mlo_component *comp;
  uint64_t t_ns; /* the platform's clock (mlo_platform_now_ns) */
  uint64_t bytes;
  uint64_t device_bytes; /* pipeline device bytes after the event */
} mlo_trace_event;
/* Called synchronously, possibly from several threads, with the pipeline's
 * lock held: it must be quick, and a call back into the pipeline returns
 * MLO_EDEADLK (see "Callbacks" at the top). */
typedef void (*mlo_trace_fn)(const mlo_trace_event *ev, void *user);
MLO_API void mlo_pipeline_set_trace(mlo_pipeline *pipe, mlo_trace_fn fn, void *user);
/* Monotonic nanoseconds, the clock trace events use. */
MLO_API uint64_t mlo_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* MLO_MLO_H */
