/*
 * fault.c — a platform that wraps another and fails one chosen call.
 *
 * Device APIs fail in ways a CPU test never sees: an allocation refused
 * half-way through a load, a copy that cannot be queued, an event that
 * cannot be recorded.  Each of those must come back to the caller as a
 * status with every piece of state rolled back (docs/reliability.md).  This wrapper
 * makes any of them happen on demand, on any platform, so the reliability
 * tests can fail every call of a cycle in turn (tests/reliability) and the
 * CLI can be pointed at a failing device ("--platform fault:...").
 *
 * The wrapper forwards through the inner platform's own wrappers (so the
 * inner's defaults for optional slots apply) and counts calls per kind
 * under a mutex; the one armed fault fires once and never again.
 */
#include "base/sysio.h"
#include "platform/fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fault_ctx {
  mlo_platform *inner;
  struct mlo_platform_ops ops; /* fault_ops, named after the inner platform */
  pthread_mutex_t lock;
  mlo_fault_kind armed; /* MLO_FAULT_ANY counts every kind */
  uint64_t nth;         /* 0: never fail */
  uint64_t counts[MLO_FAULT_KINDS];
  uint64_t any_count;
  uint64_t h2d_bytes; /* queued by copy_h2d calls that succeeded, since open */
  bool fired, paused;
};

static const char *const kind_names[] = {"dev_alloc", "host_alloc", "copy", "event", "sync", "any"};

const char *mlo_fault_kind_name(mlo_fault_kind kind) {
  return (unsigned)kind <= MLO_FAULT_ANY ? kind_names[kind] : "unknown";
}

int mlo_fault_kind_from_name(const char *name, mlo_fault_kind *out) {
  for (unsigned k = 0; name && k <= MLO_FAULT_ANY; k++)
    if (!strcmp(name, kind_names[k])) {
      *out = (mlo_fault_kind)k;
      return MLO_OK;
    }
  return MLO_EINVAL;
}

int mlo_fault_status(mlo_fault_kind kind) {
  switch (kind) {
  case MLO_FAULT_DEV_ALLOC:
    return MLO_ENOMEM_DEVICE;
  case MLO_FAULT_HOST_ALLOC:
    return MLO_ENOMEM;
  default:
    return MLO_EPLATFORM;
  }
}

/* Counts one call of kind; true when this is the call that must fail. */
static bool hit(struct fault_ctx *f, mlo_fault_kind kind) {
  pthread_mutex_lock(&f->lock);
  if (f->paused) {
    pthread_mutex_unlock(&f->lock);
    return false;
  }
  uint64_t n = ++f->counts[kind];
  uint64_t any = ++f->any_count;
  bool fail = false;
  if (!f->fired && f->nth) {
    uint64_t seen = f->armed == MLO_FAULT_ANY ? any : f->armed == kind ? n : 0;
    fail = seen == f->nth;
    f->fired = fail;
  }
  pthread_mutex_unlock(&f->lock);
  return fail;
}

#define FAULT_OR(f, kind, call) (hit((f), (kind)) ? mlo_fault_status(kind) : (call))

/* ---- the vtable: every slot forwards unless its call is the armed one ---- */

static void fault_destroy(void *ctx) {
  struct fault_ctx *f = ctx;
  mlo_platform_close(f->inner);
  pthread_mutex_destroy(&f->lock);
  free(f);
}

static void fault_get_caps(void *ctx, mlo_platform_caps *caps) {
  mlo_platform_get_caps(((struct fault_ctx *)ctx)->inner, caps);
}

static int fault_get_memory(void *ctx, uint64_t *total, uint64_t *free_bytes) {
  mlo_platform_memory mem;
  int rc = mlo_platform_get_memory(((struct fault_ctx *)ctx)->inner, &mem);
  *total = rc ? 0 : mem.total_bytes;
  *free_bytes = rc ? 0 : mem.free_bytes;
  return rc;
}

static int fault_dev_alloc(void *ctx, size_t bytes, void **block) {
  struct fault_ctx *f = ctx;
  *block = NULL;
  return FAULT_OR(f, MLO_FAULT_DEV_ALLOC, mlo_plat_dev_alloc(f->inner, bytes, block));
}

static int fault_dev_free(void *ctx, void *block, size_t bytes) {
  return mlo_plat_dev_free(((struct fault_ctx *)ctx)->inner, block, bytes);
}

static int fault_dev_free_after(void *ctx, void *block, size_t bytes, mlo_event *used) {
  return mlo_plat_dev_free_after(((struct fault_ctx *)ctx)->inner, block, bytes, used);
}

static int fault_host_alloc(void *ctx, size_t bytes, bool pinned, void **ptr, bool *got_pinned) {
  struct fault_ctx *f = ctx;
  *ptr = NULL;
  *got_pinned = false;
  return FAULT_OR(f, MLO_FAULT_HOST_ALLOC,
                  mlo_plat_host_alloc(f->inner, bytes, pinned, ptr, got_pinned));
}

static void fault_host_free(void *ctx, void *ptr, size_t bytes, bool pinned) {
  mlo_plat_host_free(((struct fault_ctx *)ctx)->inner, ptr, bytes, pinned);
}

static int fault_copy_h2d(void *ctx, void *block, size_t offset, const void *src, size_t bytes) {
  struct fault_ctx *f = ctx;
  int rc = FAULT_OR(f, MLO_FAULT_COPY, mlo_plat_copy_h2d(f->inner, block, offset, src, bytes));
  if (!rc) {
    pthread_mutex_lock(&f->lock);
    f->h2d_bytes += bytes;
    pthread_mutex_unlock(&f->lock);
  }
  return rc;
}

static int fault_copy_d2h(void *ctx, void *dst, const void *block, size_t offset, size_t bytes) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_COPY, mlo_plat_copy_d2h(f->inner, dst, block, offset, bytes));
}

static int fault_event_create(void *ctx, mlo_event **ev) {
  struct fault_ctx *f = ctx;
  *ev = NULL;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_event_create(f->inner, ev));
}

static void fault_event_destroy(void *ctx, mlo_event *ev) {
  mlo_plat_event_destroy(((struct fault_ctx *)ctx)->inner, ev);
}

static int fault_event_record_copy(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_event_record_copy(f->inner, ev));
}

static int fault_event_record_compute(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_event_record_compute(f->inner, ev));
}

static int fault_compute_wait(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_compute_wait(f->inner, ev));
}

static int fault_copy_wait(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_copy_wait(f->inner, ev));
}

/* Accounting only, never a fault point: passed through. */
static int fault_reserved_peak(void *ctx, uint64_t *bytes) {
  mlo_platform_memory mem;
  int rc = mlo_platform_get_memory(((struct fault_ctx *)ctx)->inner, &mem);
  if (!rc) *bytes = mem.reserved_peak_bytes;
  return rc;
}

static void fault_reset_reserved_peak(void *ctx) {
  mlo_platform_reset_peak(((struct fault_ctx *)ctx)->inner);
}

static int fault_event_record_readback(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_event_record_readback(f->inner, ev));
}

static int fault_readback_wait(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_readback_wait(f->inner, ev));
}

static int fault_event_sync(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_event_sync(f->inner, ev));
}

/* Trace timing only: passed through, never failed. */
static void fault_want_stamps(void *ctx, int delta) {
  struct fault_ctx *f = ctx;
  mlo_plat_want_stamps(f->inner, delta);
}

static int fault_event_time(void *ctx, mlo_event *ev, uint64_t *t_ns) {
  struct fault_ctx *f = ctx;
  return mlo_plat_event_time(f->inner, ev, t_ns);
}

static int fault_event_query(void *ctx, mlo_event *ev) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_EVENT, mlo_plat_event_query(f->inner, ev));
}

static int fault_synchronize(void *ctx) {
  struct fault_ctx *f = ctx;
  return FAULT_OR(f, MLO_FAULT_SYNC, mlo_plat_synchronize(f->inner));
}

static void *fault_compute_queue(void *ctx) {
  return mlo_platform_compute_queue(((struct fault_ctx *)ctx)->inner);
}

static void *fault_compute_context(void *ctx) {
  return mlo_plat_compute_context(((struct fault_ctx *)ctx)->inner);
}

/* The inner platform's clock (never a fault point: it only measures). */
static uint64_t fault_now_ns(void *ctx) {
  return mlo_plat_now(((struct fault_ctx *)ctx)->inner);
}

static const struct mlo_platform_model_ops fault_model_ops = {.now_ns = fault_now_ns};

static const struct mlo_platform_ops fault_ops = {
    .name = "fault",
    .destroy = fault_destroy,
    .get_caps = fault_get_caps,
    .get_memory = fault_get_memory,
    .dev_alloc = fault_dev_alloc,
    .dev_free = fault_dev_free,
    .dev_free_after = fault_dev_free_after,
    .host_alloc = fault_host_alloc,
    .host_free = fault_host_free,
    .copy_h2d = fault_copy_h2d,
    .copy_d2h = fault_copy_d2h,
    .event_create = fault_event_create,
    .event_destroy = fault_event_destroy,
    .event_record_copy = fault_event_record_copy,
    .event_record_compute = fault_event_record_compute,
    .compute_wait = fault_compute_wait,
    .copy_wait = fault_copy_wait,
    .reserved_peak = fault_reserved_peak,
    .reset_reserved_peak = fault_reset_reserved_peak,
    .event_record_readback = fault_event_record_readback,
    .readback_wait = fault_readback_wait,
    .event_sync = fault_event_sync,
    .event_query = fault_event_query,
    .event_time = fault_event_time,
    .want_stamps = fault_want_stamps,
    .synchronize = fault_synchronize,
    .compute_queue = fault_compute_queue,
    .compute_context = fault_compute_context,
    .model = &fault_model_ops,
};

/* ---- the spec ---------------------------------------------------------- */

struct fault_options {
  mlo_fault_kind kind;
  uint64_t nth;
  bool have_kind, have_nth;
};

static int fault_option(const char *key, const char *value, void *user, char *err, size_t errlen) {
  struct fault_options *o = user;
  if (!strcmp(key, "kind")) {
    o->have_kind = true;
    if (!mlo_fault_kind_from_name(value, &o->kind)) return MLO_OK;
    snprintf(err, errlen,
             "fault platform: kind=%s is not one of dev_alloc, host_alloc, copy, event, sync, any",
             value);
    return MLO_EINVAL;
  }
  if (!strcmp(key, "nth")) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (value[0] >= '0' && value[0] <= '9' && !*end && !errno) {
      o->nth = v;
      o->have_nth = true;
      return MLO_OK;
    }
    snprintf(err, errlen, "fault platform: nth=%s is not a non-negative integer", value);
    return MLO_EINVAL;
  }
  snprintf(err, errlen,
           "unknown fault platform option %s=%s (known: kind, nth, and inner=SPEC last)", key,
           value);
  return MLO_EINVAL;
}

/* Splits "opts,inner=SPEC" at the first inner= that starts an option: the
 * inner spec has its own commas and colons, so it takes the rest. */
static const char *split_inner(const char *args, size_t *opts_len) {
  const char *p = args;
  for (;;) {
    if (!strncmp(p, "inner=", 6)) {
      *opts_len = (size_t)(p - args) ? (size_t)(p - args) - 1 : 0;
      return p + 6;
    }
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  *opts_len = strlen(args);
  return NULL;
}

int mlo_fault_platform_create(const char *spec_args, mlo_platform_open_fn open_inner,
                              mlo_platform *p, char *err, size_t errlen) {
  size_t opts_len = 0;
  const char *inner_spec = split_inner(spec_args, &opts_len);
  if (inner_spec && !*inner_spec) {
    snprintf(err, errlen, "fault platform: inner= is empty (expected a platform spec)");
    return MLO_EINVAL;
  }
  /* One level only: nesting adds nothing, and an unbounded chain of
   * "fault:inner=fault:..." would recurse as deep as the string is long. */
  if (inner_spec && !strncmp(inner_spec, "fault", 5)) {
    snprintf(err, errlen, "fault platform: inner= cannot be another fault platform");
    return MLO_EINVAL;
  }
  char *opts = mlo_malloc(opts_len + 1);
  if (!opts) return MLO_ENOMEM;
  memcpy(opts, spec_args, opts_len);
  opts[opts_len] = '\0';
  struct fault_options o = {MLO_FAULT_ANY, 0, false, false};
  int rc = mlo_spec_parse_kv(opts, fault_option, &o, err, errlen);
  free(opts);
  if (rc) return rc;
  /* Without both the spec means nothing: it would never fail a call. */
  if (!o.have_kind || !o.have_nth) {
    snprintf(err, errlen,
             "fault platform: needs kind=K and nth=N (which call to fail), e.g. "
             "fault:kind=copy,nth=3,inner=host");
    return MLO_EINVAL;
  }
  struct fault_ctx *f = mlo_calloc(1, sizeof *f);
  if (!f) return MLO_ENOMEM;
  char inner_err[200] = "";
  rc = open_inner(inner_spec ? inner_spec : "host", &f->inner, inner_err, sizeof inner_err);
  if (rc) {
    snprintf(err, errlen, "fault platform: inner platform: %s", inner_err);
    free(f);
    return rc;
  }
  pthread_mutex_init(&f->lock, NULL);
  f->armed = o.kind;
  f->nth = o.nth;
  f->ops = fault_ops;
  f->ops.name = mlo_platform_name(f->inner);   /* the workload picks by name */
  if (!mlo_plat_separate_readback(f->inner)) { /* one copy queue inside: so outside */
    f->ops.event_record_readback = NULL;
    f->ops.readback_wait = NULL;
  }
  if (!f->inner->ops->dev_free_after) f->ops.dev_free_after = NULL; /* as inside */
  p->ops = &f->ops;
  p->ctx = f;
  snprintf(p->description, sizeof p->description, "fault injection (%s #%llu) over %.100s",
           mlo_fault_kind_name(o.kind), (unsigned long long)o.nth,
           mlo_platform_description(f->inner));
  return MLO_OK;
}

/* ---- test controls ----------------------------------------------------- */

bool mlo_fault_is(const mlo_platform *p) {
  return p && p->ops && p->ops->destroy == fault_destroy;
}

mlo_platform *mlo_fault_inner(mlo_platform *p) {
  return mlo_fault_is(p) ? ((struct fault_ctx *)p->ctx)->inner : NULL;
}

void mlo_fault_arm(mlo_platform *p, mlo_fault_kind kind, uint64_t nth) {
  if (!mlo_fault_is(p)) return;
  struct fault_ctx *f = p->ctx;
  pthread_mutex_lock(&f->lock);
  memset(f->counts, 0, sizeof f->counts);
  f->any_count = 0;
  f->armed = kind;
  f->nth = nth;
  f->fired = false;
  pthread_mutex_unlock(&f->lock);
}

void mlo_fault_counts(mlo_platform *p, uint64_t counts[MLO_FAULT_KINDS]) {
  if (!mlo_fault_is(p)) {
    memset(counts, 0, MLO_FAULT_KINDS * sizeof *counts);
    return;
  }
  struct fault_ctx *f = p->ctx;
  pthread_mutex_lock(&f->lock);
  memcpy(counts, f->counts, sizeof f->counts);
  pthread_mutex_unlock(&f->lock);
}

uint64_t mlo_fault_h2d_bytes(mlo_platform *p) {
  if (!mlo_fault_is(p)) return 0;
  struct fault_ctx *f = p->ctx;
  pthread_mutex_lock(&f->lock);
  uint64_t n = f->h2d_bytes;
  pthread_mutex_unlock(&f->lock);
  return n;
}

bool mlo_fault_fired(mlo_platform *p) {
  if (!mlo_fault_is(p)) return false;
  struct fault_ctx *f = p->ctx;
  pthread_mutex_lock(&f->lock);
  bool fired = f->fired;
  pthread_mutex_unlock(&f->lock);
  return fired;
}

void mlo_fault_pause(mlo_platform *p, bool paused) {
  if (!mlo_fault_is(p)) return;
  struct fault_ctx *f = p->ctx;
  pthread_mutex_lock(&f->lock);
  f->paused = paused;
  pthread_mutex_unlock(&f->lock);
}
