/*
 * testutil.h — helpers shared by the test programs (cmocka).
 *
 * The contract tests (tests/contract/C*.c) and the core tests all need the
 * same scaffolding: a platform chosen by the environment (so the suite can be
 * re-run against OpenCL or CUDA), small pipelines whose every tensor holds a
 * known byte pattern, a forward callback that proves the device holds exactly
 * those bytes, and a reference model of the contract to compare counters
 * with.  Keeping it here keeps each test about the rule it checks.
 *
 * Callbacks never call cmocka asserts (they run inside the library, possibly
 * on another thread): they record what they saw in the tu_pipe, and the test
 * asserts on it afterwards with tu_assert_forwards_clean().
 */
#ifndef MLO_TESTUTIL_H
#define MLO_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mlo/mlo.h"

#include <pthread.h>
#include <stdatomic.h>

/* Asserts a status is MLO_OK, printing the code's name if not. */
#define assert_ok(expr)                                                                            \
  do {                                                                                             \
    int rc_ = (expr);                                                                              \
    if (rc_ != MLO_OK) fail_msg("%s -> %s (%s)", #expr, mlo_err_name(rc_), mlo_strerror(rc_));     \
  } while (0)

/* Asserts a status equals an expected code, naming both if not. */
#define assert_status(expr, want)                                                                  \
  do {                                                                                             \
    int rc_ = (expr), want_ = (want);                                                              \
    if (rc_ != want_)                                                                              \
      fail_msg("%s -> %s, expected %s", #expr, mlo_err_name(rc_), mlo_err_name(want_));            \
  } while (0)

/* Thread sanitizer builds: the deliberately racy detector checks are skipped
 * there, since their race is the point. */
#if defined(__SANITIZE_THREAD__)
#define TU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TU_TSAN 1
#endif
#endif
#ifndef TU_TSAN
#define TU_TSAN 0
#endif

/* ------------------------------------------------------------------------
 * Platforms
 * ---------------------------------------------------------------------- */
#define TU_DEFAULT_PLATFORM "host:capacity=64M,jitter=1"

/* The spec tests run against: $MLO_TEST_PLATFORM or TU_DEFAULT_PLATFORM. */
const char *tu_platform_base_spec(void);
/* True when the test platform is the host-backed one (capacity, bw, jitter
 * and blocking_d2h options are host options). */
bool tu_platform_is_host(void);
/* Opens the test platform; host_overrides ("capacity=1M,bw=1e8", may be
 * NULL) replace or add keys of a host spec.  A test that passes overrides
 * needs the host platform and is skipped (cmocka skip) elsewhere.  Fails the
 * test if the platform cannot be opened. */
mlo_platform *tu_platform_open(const char *host_overrides);
/* Opens exactly `spec`; fails the test (naming the spec) if it cannot. */
mlo_platform *tu_open_spec(const char *spec);
/* Writes the merged spec into buf (exposed for the spec-merging logic). */
void tu_merge_host_spec(const char *base, const char *overrides, char *buf, size_t len);
bool tu_device_pointers(const mlo_platform *plat);
/* Whether the host may read device blocks through their pointers (the host
 * platform only); elsewhere tests copy with copy_d2h/copy_h2d. */
bool tu_host_addressable(const mlo_platform *plat);

/* ------------------------------------------------------------------------
 * Deterministic content
 * ---------------------------------------------------------------------- */
uint32_t tu_seed(const char *comp_name, const char *tensor_name);
uint8_t tu_pattern_byte(uint32_t seed, size_t index);
void tu_fill_pattern(void *dst, size_t bytes, uint32_t seed);
/* Index of the first byte that differs from the pattern, or bytes if none. */
size_t tu_pattern_mismatch(const void *src, size_t bytes, uint32_t seed);

/* ------------------------------------------------------------------------
 * Pipelines with known content
 * ---------------------------------------------------------------------- */
#define TU_MAX_COMPS 16
#define TU_MAX_TENSORS 160

typedef struct {
  const char *name;
  mlo_role role;
  unsigned ntensors;   /* own tensors t0..t{n-1}, F32 1-D */
  size_t tensor_bytes; /* bytes of each (a multiple of 4) */
  unsigned nmutable;   /* the last nmutable tensors are BUFFER|MUTABLE */
} tu_comp_spec;

typedef struct {
  const mlo_tensor *tensor;
  mlo_component *comp; /* the component it was added to */
  uint32_t seed;       /* pattern it must hold (the target's, for aliases) */
  size_t bytes;
  bool reference; /* alias of another component's tensor */
} tu_tensor_rec;

typedef struct tu_pipe {
  mlo_platform *plat;
  mlo_pipeline *pipe;
  bool device_pointers;  /* mlo_tensor_device_ptr gives an address (host, CUDA) */
  bool host_addressable; /* the test may dereference it (host only) */
  size_t nrecs;
  tu_tensor_rec recs[TU_MAX_TENSORS];
  size_t nsources;
  void *sources[TU_MAX_TENSORS]; /* pattern buffers handed to desc.data */
  /* What forward callbacks observed (any thread). */
  bool audit_in_forward;         /* tu_forward_check also audits the pipeline */
  bool exclusion_in_forward;     /* ... and checks the role rule (C3/C4/C12) */
  atomic_uint forwards;          /* callbacks run */
  atomic_uint bad_content;       /* callbacks that saw wrong device bytes */
  atomic_uint not_resident;      /* callbacks whose component was not resident */
  atomic_uint audit_failed;      /* callbacks where mlo_pipeline_audit failed */
  atomic_uint excluded_resident; /* callbacks that saw an excluded one resident */
  atomic_flag failure_taken;
  char first_failure[512];
} tu_pipe;

/* An empty pipeline on plat (pin_host as given). */
tu_pipe *tu_pipe_new(mlo_platform *plat, bool pin_host);
/* A pipeline with one component per spec. */
tu_pipe *tu_pipe_build(mlo_platform *plat, const tu_comp_spec *specs, size_t n);
/* Wan2.2-shaped: text_encoder (ENCODER), transformer and transformer_2
 * (DIT), vae (VAE), a few KiB each. */
extern const tu_comp_spec tu_wan_specs[4];
tu_pipe *tu_pipe_build_wan(mlo_platform *plat);
/* The h2d_bytes of all its components. */
uint64_t tu_h2d_counted(tu_pipe *tp);
/* Frees the pipeline and the pattern buffers (not the platform). */
void tu_pipe_free(tu_pipe *tp);

mlo_component *tu_add_component(tu_pipe *tp, const tu_comp_spec *spec);
/* Adds a tensor holding the pattern of (component, name), from memory. */
mlo_tensor *tu_add_tensor(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                          unsigned flags);
/* ... the same, in memory the caller gives (and frees after the pipeline):
 * where two tensors sit decides which pages they share. */
mlo_tensor *tu_add_tensor_at(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                             unsigned flags, void *src);
/* Writes the pattern of (component, name) into path at offset (the file
 * is created if missing), for tu_add_file_tensor: write every tensor of a
 * file before declaring any (a declaration records the file as it is). */
void tu_write_file_pattern(const char *comp_name, const char *name, size_t bytes, const char *path,
                           uint64_t offset);
/* Adds a tensor read from path at offset, recorded as holding the pattern
 * of (component, name). */
mlo_tensor *tu_add_file_tensor(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                               const char *path, uint64_t offset);
/* Adds an alias and records that it must show the target's bytes. */
void tu_add_alias(tu_pipe *tp, mlo_component *comp, const char *name, mlo_tensor *target);
mlo_component *tu_comp(tu_pipe *tp, const char *name); /* fails the test if absent */
tu_tensor_rec *tu_rec(tu_pipe *tp, const mlo_tensor *t);

/* ------------------------------------------------------------------------
 * Content checks
 * ---------------------------------------------------------------------- */
/* Reads a tensor's device bytes into dst: through the pointer on pointer
 * platforms, through the platform (copy + synchronize) otherwise. */
int tu_read_device(tu_pipe *tp, const mlo_tensor *t, void *dst, size_t bytes);
/* Writes bytes to a tensor's device copy (as a compute would). */
int tu_write_device(tu_pipe *tp, const mlo_tensor *t, const void *src, size_t bytes);
/* True when every tensor comp owns (aliases inside it included) holds its
 * pattern on the device; otherwise false with the reason in why. */
bool tu_device_content_ok(tu_pipe *tp, mlo_component *comp, char *why, size_t whylen);
/* True when every tensor comp owns holds its pattern in host_data. */
bool tu_host_content_ok(tu_pipe *tp, mlo_component *comp, char *why, size_t whylen);
/* Gives a mutable tensor new content on the device and records the new
 * pattern it must hold from now on. */
void tu_mutate(tu_pipe *tp, const mlo_tensor *t, uint32_t new_seed);

/* The forward callback: user is the tu_pipe.  Checks the component is
 * resident and its device bytes are right (and audits, when asked); records
 * failures and returns non-zero on any. */
int tu_forward_check(mlo_component *comp, void *user);
/* True when no component that comp excludes by role (C3/C4) is resident;
 * otherwise false with the offender named in why. */
bool tu_exclusion_ok(tu_pipe *tp, mlo_component *comp, char *why, size_t whylen);
/* mlo_component_forward(comp, tu_forward_check, tp). */
int tu_forward(tu_pipe *tp, mlo_component *comp);
/* Records a failure seen by a callback or a worker thread. */
void tu_note_failure(tu_pipe *tp, const char *fmt, ...);
/* Asserts no callback recorded a failure. */
void tu_assert_forwards_clean(tu_pipe *tp);
void tu_reset_observations(tu_pipe *tp);

/* ------------------------------------------------------------------------
 * Counters
 * ---------------------------------------------------------------------- */
mlo_component_stats tu_cstats(mlo_component *comp);
mlo_pipeline_stats tu_pstats(tu_pipe *tp);
uint64_t tu_device_used(mlo_platform *plat);
/* Nanoseconds a copy of bytes takes over a simulated link of link B/s. */
uint64_t tu_copy_ns(uint64_t bytes, uint64_t link);
/* Fails unless got is within 1 us of want: a wait on the simulated clock
 * against the figure computed by hand (the clock rounds per copy). */
void tu_assert_near_ns(uint64_t got, uint64_t want);
/* Asserts the audit passes, printing the pipeline's message if not. */
void tu_assert_audit(tu_pipe *tp);

/* ------------------------------------------------------------------------
 * Fault sweeps: every platform call of a scenario failed in turn
 * ---------------------------------------------------------------------- */
typedef struct {
  /* Builds the scenario on plat (materialized, offload not enabled yet);
   * returns its pipeline. */
  tu_pipe *(*build)(void *self, mlo_platform *plat);
  /* Enables offload if it is not, then runs one prompt: the first status. */
  int (*run)(void *self);
  void (*destroy)(void *self);
} tu_fault_case;
/* For nth = 1, 2, ... until a run makes fewer calls: a fresh fault platform
 * over inner_spec, the scenario built, its nth platform call from the
 * first run on failed.  Each failure must come back as a status with a
 * message (or MLO_ECALLBACK), leave the audit clean and the platform's
 * device bytes the pipeline's; then two more runs must succeed with every
 * forward's checks clean.  Returns how many calls it failed. */
unsigned tu_fault_sweep(const char *inner_spec, const tu_fault_case *fc, void *self);

/* ------------------------------------------------------------------------
 * A reference model of the contract (C2-C5, C12), to compare residency and
 * counters with after a schedule of hooked forwards.  Components with no
 * bytes are left out (C13 has its own tests).
 * ---------------------------------------------------------------------- */
typedef struct {
  size_t n;
  mlo_component *comps[TU_MAX_COMPS];
  bool resident[TU_MAX_COMPS];
  uint64_t loads[TU_MAX_COMPS], evictions[TU_MAX_COMPS], h2d[TU_MAX_COMPS];
  mlo_component_stats base[TU_MAX_COMPS];
} tu_model;

/* Starts the model from the pipeline's present residency and counters. */
void tu_model_init(tu_pipe *tp, tu_model *m);
/* What a successful enable does (C2): encoders and VAEs loaded. */
void tu_model_enable(tu_model *m);
/* What a hooked forward/acquire of comp does (C3/C4/C5/C12). */
void tu_model_forward(tu_model *m, mlo_component *comp);
/* Asserts residency and the load/evict/h2d deltas match the model. */
void tu_model_check(const tu_model *m);
/* The usual start of a contract test: model the pipeline as it is, enable
 * offload with default settings (asserted), and let the model follow. */
void tu_enable_modelled(tu_pipe *tp, tu_model *m);
/* A checked forward (asserted MLO_OK) that the model follows. */
void tu_forward_modelled(tu_pipe *tp, tu_model *m, mlo_component *comp);

/* ------------------------------------------------------------------------
 * Log capture (mlo_set_log)
 * ---------------------------------------------------------------------- */
void tu_log_capture_begin(void);
void tu_log_capture_end(void);
/* Messages at WARN or above since begin. */
unsigned tu_log_warnings(void);
/* True if a captured message contains needle (case-insensitive). */
bool tu_log_contains(const char *needle);

/* Case-insensitive substring test, for error messages. */
bool tu_contains_ci(const char *haystack, const char *needle);
/* Sleeps for ms milliseconds (only to widen a race window, never to time). */
void tu_sleep_ms(unsigned ms);
/* Creates a temporary file from path_template ("/tmp/name_XXXXXX", rewritten
 * in place) holding n bytes of data; fails the test if it cannot. */
void tu_temp_file(char *path_template, const void *data, size_t n);
/* Writes text to path (created or truncated); fails the test if it cannot. */
void tu_write_text(const char *path, const char *text);
/* A whole file in a malloc'd buffer of *len bytes plus a NUL (free it);
 * fails the test if it cannot be read. */
uint8_t *tu_read_file(const char *path, size_t *len);
/* Fails the test unless every DIR/<name><ext> has its name in names[0..n)
 * and there are exactly n such files: a corpus file added without an
 * expectation would otherwise go unchecked. */
void tu_assert_corpus_covered(const char *dir, const char *ext, const char *const *names, size_t n);
/* A hostile file refused twice, from disk (open) and from memory (parse, as
 * mem_name), each with MLO_EFORMAT, no object left, and a message that
 * starts with "<path or mem_name>: <lead>" and contains words.  The reader
 * is given through these (each test wraps its reader's calls). */
typedef struct {
  int (*open)(const char *path, void **out, char *err, size_t errlen);
  int (*parse)(const char *name, const uint8_t *bytes, size_t len, void **out, char *err,
               size_t errlen);
} tu_reader;
void tu_assert_refused(const tu_reader *r, const char *path, const char *mem_name, const char *lead,
                       const char *words);

/* Another thread that acquires a component and holds it until told to go:
 * tu_holder_start returns once the acquire has returned (rc_acquire says
 * how it went); tu_holder_finish lets it release and joins it. */
typedef struct {
  mlo_component *comp;
  atomic_int phase; /* 1: acquire returned, 2: may release */
  int rc_acquire, rc_release;
  pthread_t thread;
} tu_holder;
void tu_holder_start(tu_holder *h, mlo_component *comp);
void tu_holder_finish(tu_holder *h);

#endif
