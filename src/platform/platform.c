/*
 * platform.c — opening platforms by spec string, and the wrappers core uses
 * around the vtable: defaults for optional slots, the fallback from events
 * to synchronize, call counting and used/peak device accounting.
 */
#include "base/sysio.h"
#include "platform/platform.h"

#include "platform/fault.h"
#include "platform/module.h"

#include "base/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *msg, const char *what) {
  if (err && errlen) snprintf(err, errlen, "%s%s%s", msg, what ? ": " : "", what ? what : "");
}

int mlo_spec_parse_kv(const char *args, mlo_spec_kv_fn fn, void *user, char *err, size_t errlen) {
  if (!args || !*args) return MLO_OK;
  size_t len = strlen(args);
  char *copy = mlo_malloc(len + 1);
  if (!copy) return MLO_ENOMEM;
  memcpy(copy, args, len + 1);
  int rc = MLO_OK;
  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1]) {
      set_err(err, errlen, "expected key=value in platform options, got", item);
      rc = MLO_EINVAL;
      break;
    }
    *eq = '\0';
    rc = fn(item, eq + 1, user, err, errlen);
    if (rc) break;
  }
  free(copy);
  return rc;
}

int mlo_spec_parse_indexed(const char *name, const char *args, unsigned long max_index,
                           unsigned long *index, mlo_spec_kv_fn fn, void *user, char *err,
                           size_t errlen) {
  const char *colon = strchr(args, ':');
  size_t head_len = colon ? (size_t)(colon - args) : strlen(args);
  if (!head_len && !colon) return MLO_OK;
  if (memchr(args, '=', head_len) && !colon) return mlo_spec_parse_kv(args, fn, user, err, errlen);
  char *end = NULL;
  unsigned long n = strtoul(args, &end, 10);
  if (!head_len || args[0] < '0' || args[0] > '9' || end != args + head_len || n > max_index) {
    if (err && errlen)
      snprintf(err, errlen, "%s platform: bad device index '%.*s' in \"%s:%s\" (expected N)", name,
               (int)head_len, args, name, args);
    return MLO_EINVAL;
  }
  *index = n;
  return colon ? mlo_spec_parse_kv(colon + 1, fn, user, err, errlen) : MLO_OK;
}

typedef int (*create_fn)(const char *, mlo_platform *, char *, size_t);

/* Every platform mlo knows, in the order `mlo --version` lists them: the
 * ones built into libmlo, and the ones loaded from a module on first use
 * (module.h).  The one list mlo_platform_open, mlo_platform_info and the
 * tools read. */
static const struct platform_entry {
  const char *name;
  const char *spec; /* the spec's shape, for messages and --help */
  create_fn create; /* built in; NULL: the module libmlo-<name>.so */
} platforms[] = {
    {"host", "host[:opts]", mlo_host_platform_create},
    {"sim", "sim[:capacity=SIZE,link=BYTES_PER_S]", mlo_sim_platform_create},
    {"fault", "fault:kind=K,nth=N[,inner=SPEC]", mlo_fault_platform_create},
    {"cuda", "cuda[:N][:opts]", NULL},
    {"opencl", "opencl[:N][:opts]", NULL},
};
#define NPLATFORMS (sizeof platforms / sizeof platforms[0])

static const struct platform_entry *find_platform(const char *spec, size_t name_len) {
  for (size_t i = 0; i < NPLATFORMS; i++)
    if (strlen(platforms[i].name) == name_len && !strncmp(spec, platforms[i].name, name_len))
      return &platforms[i];
  return NULL;
}

/* The constructor of a platform: built in, or its module's (loaded now). */
static int platform_create_fn(const struct platform_entry *e, create_fn *create, const char **path,
                              char *err, size_t errlen) {
  if (path) *path = NULL;
  if (e->create) {
    *create = e->create;
    return MLO_OK;
  }
  const struct mlo_module *m = NULL;
  int rc = mlo_module_load(e->name, MLO_MODULE_PLATFORM, &m, path, err, errlen);
  if (rc) return rc;
  if (!m->create || !m->name || strcmp(m->name, e->name))
    return mlo_errf(err, errlen, MLO_ENODEV, "module libmlo-%s.so is not the %s platform", e->name,
                    e->name);
  *create = m->create;
  return MLO_OK;
}

size_t mlo_platform_count(void) {
  return NPLATFORMS;
}

int mlo_platform_info_get(size_t index, mlo_platform_info *info) {
  if (!info || info->size < sizeof *info || index >= NPLATFORMS) return MLO_EINVAL;
  const struct platform_entry *e = &platforms[index];
  info->name = e->name;
  info->spec = e->spec;
  info->module = e->create == NULL;
  info->available = !info->module;
  snprintf(info->detail, sizeof info->detail, "%s", info->module ? "not probed" : "built in");
  if (!info->module || !info->probe) return MLO_OK;
  create_fn create = NULL;
  const char *path = NULL;
  char why[sizeof info->detail] = "";
  info->available = platform_create_fn(e, &create, &path, why, sizeof why) == MLO_OK;
  snprintf(info->detail, sizeof info->detail, "%s", info->available ? path : why);
  return MLO_OK;
}

/* The first slot of ops that the wrappers call without a check, missing;
 * NULL if none is.  A constructor is a module's code (module.h): what it
 * hands back is checked before the first call through it.  The events are
 * optional as a set, so they are asked for only where caps.events says they
 * are used; a host_alloc needs its host_free. */
static const char *ops_missing(const struct mlo_platform_ops *o, const mlo_platform_caps *caps) {
  if (!o->name) return "name";
  if (!o->destroy) return "destroy";
  if (!o->get_caps) return "get_caps";
  if (caps) {
    if (!o->get_memory) return "get_memory";
    if (!o->dev_alloc) return "dev_alloc";
    if (!o->dev_free) return "dev_free";
    if (!o->host_alloc != !o->host_free) return o->host_alloc ? "host_free" : "host_alloc";
    if (!o->copy_h2d) return "copy_h2d";
    if (!o->copy_d2h) return "copy_d2h";
    if (!o->synchronize) return "synchronize";
    if (caps->events) {
      if (!o->event_create) return "event_create";
      if (!o->event_destroy) return "event_destroy";
      if (!o->event_record_copy) return "event_record_copy";
      if (!o->event_record_compute) return "event_record_compute";
      if (!o->compute_wait) return "compute_wait";
      if (!o->copy_wait) return "copy_wait";
      if (!o->event_sync) return "event_sync";
      if (!o->event_query) return "event_query";
    }
  }
  return NULL;
}

int mlo_platform_open(const char *spec, mlo_platform **out, char *errbuf, size_t errlen) {
  if (out) *out = NULL;
  if (!spec || !out) {
    set_err(errbuf, errlen, "no platform spec given", NULL);
    return MLO_EINVAL;
  }
  const char *colon = strchr(spec, ':');
  size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *args = colon ? colon + 1 : "";
  const struct platform_entry *e = find_platform(spec, name_len);
  if (!e) {
    char known[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < NPLATFORMS && used < sizeof known; i++) {
      int n = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", platforms[i].spec);
      if (n > 0) used += (size_t)n;
    }
    if (errbuf && errlen)
      snprintf(errbuf, errlen, "unknown platform '%s' (expected %s)", spec, known);
    return MLO_EINVAL;
  }
  create_fn create = NULL;
  const char *module_path = NULL;
  int crc = platform_create_fn(e, &create, &module_path, errbuf, errlen);
  if (crc) return crc;
  mlo_platform *p = mlo_calloc(1, sizeof *p);
  pthread_mutex_t *lock = mlo_malloc(sizeof *lock);
  if (!p || !lock) {
    free(p);
    free(lock);
    set_err(errbuf, errlen, "out of host memory opening the platform", spec);
    return MLO_ENOMEM;
  }
  pthread_mutex_init(lock, NULL);
  p->acct_lock = lock;
  char local_err[256] = "";
  int rc = create(args, p, local_err, sizeof local_err);
  if (rc) {
    set_err(errbuf, errlen, local_err[0] ? local_err : mlo_strerror(rc), NULL);
    pthread_mutex_destroy(lock);
    free(lock);
    free(p);
    return rc;
  }
  /* name, destroy and get_caps first: then the caps say which events */
  const char *missing = p->ops ? ops_missing(p->ops, NULL) : NULL;
  if (p->ops && !missing) {
    p->ops->get_caps(p->ctx, &p->caps);
    missing = ops_missing(p->ops, &p->caps);
  }
  if (!p->ops || missing) {
    if (errbuf && errlen)
      snprintf(errbuf, errlen, "the %s platform's %s%s%s%s%s", e->name,
               p->ops ? "ops table has no " : "constructor returned no ops table",
               p->ops ? missing : "", module_path ? " (module " : "",
               module_path ? module_path : "", module_path ? ")" : "");
    /* the context is freed by destroy where there is one to call; with
     * none it is left (its owner gave no way to free it) */
    if (p->ops && p->ops->destroy) p->ops->destroy(p->ctx);
    pthread_mutex_destroy(lock);
    free(lock);
    free(p);
    return MLO_ENODEV;
  }
  *out = p;
  return MLO_OK;
}

void mlo_platform_close(mlo_platform *p) {
  if (!p) return;
  p->ops->destroy(p->ctx);
  pthread_mutex_destroy(p->acct_lock);
  free(p->acct_lock);
  free(p);
}

const char *mlo_platform_name(const mlo_platform *p) {
  return p ? p->ops->name : "";
}
const char *mlo_platform_description(const mlo_platform *p) {
  return p ? p->description : "";
}

void mlo_platform_get_caps(const mlo_platform *p, mlo_platform_caps *caps) {
  if (p && caps) *caps = p->caps;
}

static void count_call(mlo_platform *p) {
  pthread_mutex_lock(p->acct_lock);
  p->calls++;
  pthread_mutex_unlock(p->acct_lock);
}

uint64_t mlo_plat_call_count(mlo_platform *p) {
  pthread_mutex_lock(p->acct_lock);
  uint64_t n = p->calls;
  pthread_mutex_unlock(p->acct_lock);
  return n;
}

int mlo_platform_get_memory(mlo_platform *p, mlo_platform_memory *mem) {
  if (!p || !mem) return MLO_EINVAL;
  uint64_t total = 0, free_bytes = 0;
  int rc = p->ops->get_memory(p->ctx, &total, &free_bytes);
  if (rc) return rc;
  pthread_mutex_lock(p->acct_lock);
  mlo_framework_cache fw = p->fw;
  mem->total_bytes = total;
  mem->used_bytes = p->used_bytes;
  mem->peak_bytes = p->peak_bytes;
  pthread_mutex_unlock(p->acct_lock);
  /* what another allocator holds cached is free for us: it gives it back
   * when an allocation needs it (mlo_plat_dev_alloc) */
  uint64_t cached = fw.cached_bytes ? fw.cached_bytes(fw.user) : 0;
  if (free_bytes > total) total = free_bytes; /* never wrap below */
  mem->free_bytes = cached > total - free_bytes ? total : free_bytes + cached;
  mem->reserved_peak_bytes = mem->peak_bytes;
  uint64_t reserved = 0;
  if (p->ops->reserved_peak && p->ops->reserved_peak(p->ctx, &reserved) == MLO_OK &&
      reserved > mem->reserved_peak_bytes)
    mem->reserved_peak_bytes = reserved;
  return MLO_OK;
}

void mlo_platform_set_framework_cache(mlo_platform *p, const mlo_framework_cache *cache) {
  if (!p) return;
  pthread_mutex_lock(p->acct_lock);
  p->fw = cache ? *cache : (mlo_framework_cache){0};
  pthread_mutex_unlock(p->acct_lock);
}

void mlo_platform_reset_peak(mlo_platform *p) {
  if (!p) return;
  pthread_mutex_lock(p->acct_lock);
  p->peak_bytes = p->used_bytes;
  pthread_mutex_unlock(p->acct_lock);
  if (p->ops->reset_reserved_peak) p->ops->reset_reserved_peak(p->ctx);
}

void *mlo_platform_compute_queue(mlo_platform *p) {
  return p && p->ops->compute_queue ? p->ops->compute_queue(p->ctx) : NULL;
}

void *mlo_plat_compute_context(mlo_platform *p) {
  return p && p->ops->compute_context ? p->ops->compute_context(p->ctx) : NULL;
}

int mlo_plat_all_gather(mlo_platform *p, void *block, size_t slice, int rank, void *coll,
                        unsigned timeout_ms) {
  if (!p->ops->all_gather) return MLO_EUNSUPPORTED;
  count_call(p);
  return p->ops->all_gather(p->ctx, block, slice, rank, coll, timeout_ms);
}

static int no_coll(const mlo_platform *p, char *err, size_t errlen) {
  return mlo_errf(err, errlen, MLO_EUNSUPPORTED,
                  "platform '%s' has no device-side communicator (NCCL: cuda, built with NCCL)",
                  p->ops->name);
}

int mlo_plat_coll_check(mlo_platform *p, void *coll, int ranks, int rank, char *err,
                        size_t errlen) {
  if (!p->ops->coll_check) return no_coll(p, err, errlen);
  return p->ops->coll_check(p->ctx, coll, ranks, rank, err, errlen);
}

int mlo_plat_coll_id(mlo_platform *p, void *id, size_t len, char *err, size_t errlen) {
  if (!p->ops->coll_id) return no_coll(p, err, errlen);
  return p->ops->coll_id(p->ctx, id, len, err, errlen);
}

int mlo_plat_coll_init(mlo_platform *p, const void *id, size_t len, int ranks, int rank,
                       unsigned timeout_ms, void **coll, char *err, size_t errlen) {
  *coll = NULL;
  if (!p->ops->coll_init) return no_coll(p, err, errlen);
  return p->ops->coll_init(p->ctx, id, len, ranks, rank, timeout_ms, coll, err, errlen);
}

bool mlo_plat_has_coll(const mlo_platform *p) {
  return p->ops->coll_init && p->ops->coll_id && p->ops->coll_check;
}

void mlo_plat_coll_destroy(mlo_platform *p, void *coll) {
  if (p->ops->coll_destroy && coll) p->ops->coll_destroy(p->ctx, coll);
}

int mlo_plat_coll_wait(mlo_platform *p, mlo_event *ev, char *err, size_t errlen) {
  if (!p->ops->coll_wait) return mlo_plat_event_sync(p, ev);
  count_call(p);
  return p->ops->coll_wait(p->ctx, ev, err, errlen);
}

bool mlo_plat_has_all_gather(const mlo_platform *p) {
  return p->ops->all_gather != NULL;
}

void mlo_plat_gather_pace(mlo_platform *p, size_t slice, int ranks, uint64_t t0_ns) {
  if (p->ops->gather_pace) p->ops->gather_pace(p->ctx, slice, ranks, t0_ns);
}

int mlo_platform_get_topology(mlo_platform *p, mlo_node_topology *t) {
  if (!p || !t || t->size < sizeof *t) return MLO_EINVAL;
  if (!p->ops->topology) return MLO_EUNSUPPORTED;
  mlo_node_topology got = MLO_NODE_TOPOLOGY_INIT;
  int rc = p->ops->topology(p->ctx, &got);
  if (!rc) *t = got;
  return rc;
}

uint64_t mlo_plat_now(const mlo_platform *p) {
  return p->ops->now_ns ? p->ops->now_ns(p->ctx) : mlo_now_ns();
}

uint64_t mlo_platform_now_ns(const mlo_platform *p) {
  return p ? mlo_plat_now(p) : mlo_now_ns();
}

int mlo_platform_synchronize(mlo_platform *p) {
  return p ? mlo_plat_synchronize(p) : MLO_EINVAL;
}

static int alloc_with(mlo_platform *p, int (*alloc)(void *, size_t, void **), size_t bytes,
                      void **block) {
  count_call(p);
  int rc = alloc(p->ctx, bytes, block);
  if (rc == MLO_ENOMEM_DEVICE) { /* another allocator's cache may hold what is missing */
    pthread_mutex_lock(p->acct_lock);
    mlo_framework_cache fw = p->fw;
    pthread_mutex_unlock(p->acct_lock);
    if (fw.reclaim) {
      fw.reclaim(fw.user);
      rc = alloc(p->ctx, bytes, block);
    }
  }
  if (rc) return rc;
  pthread_mutex_lock(p->acct_lock);
  p->used_bytes += bytes;
  if (p->used_bytes > p->peak_bytes) p->peak_bytes = p->used_bytes;
  pthread_mutex_unlock(p->acct_lock);
  return MLO_OK;
}

int mlo_plat_dev_alloc(mlo_platform *p, size_t bytes, void **block) {
  return alloc_with(p, p->ops->dev_alloc, bytes, block);
}

int mlo_plat_dev_alloc_compute(mlo_platform *p, size_t bytes, void **block) {
  if (!p->ops->dev_alloc_compute) return MLO_EUNSUPPORTED;
  return alloc_with(p, p->ops->dev_alloc_compute, bytes, block);
}

/* Used bytes follow what the platform did: a free that failed leaves the
 * block's bytes held, as the device still holds them. */
static int account_free(mlo_platform *p, size_t bytes, int rc) {
  if (rc) return rc;
  pthread_mutex_lock(p->acct_lock);
  p->used_bytes -= bytes;
  pthread_mutex_unlock(p->acct_lock);
  return MLO_OK;
}

int mlo_plat_dev_free(mlo_platform *p, void *block, size_t bytes) {
  if (!block) return MLO_OK;
  count_call(p);
  return account_free(p, bytes, p->ops->dev_free(p->ctx, block, bytes));
}

int mlo_plat_dev_free_after(mlo_platform *p, void *block, size_t bytes, mlo_event *used) {
  if (!used || !mlo_plat_has_dev_free_after(p)) return mlo_plat_dev_free(p, block, bytes);
  if (!block) return MLO_OK;
  count_call(p);
  return account_free(p, bytes, p->ops->dev_free_after(p->ctx, block, bytes, used));
}

bool mlo_plat_has_dev_free_after(const mlo_platform *p) {
  return p->ops->dev_free_after && p->caps.events;
}

int mlo_plat_host_alloc(mlo_platform *p, size_t bytes, bool pinned, void **ptr, bool *got_pinned) {
  count_call(p);
  *got_pinned = false;
  if (p->ops->host_alloc) return p->ops->host_alloc(p->ctx, bytes, pinned, ptr, got_pinned);
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  *ptr = mlo_aligned_alloc(4096, rounded ? rounded : 4096);
  return *ptr ? MLO_OK : MLO_ENOMEM;
}

void mlo_plat_host_free(mlo_platform *p, void *ptr, size_t bytes, bool pinned) {
  if (!ptr) return;
  count_call(p);
  if (p->ops->host_free)
    p->ops->host_free(p->ctx, ptr, bytes, pinned);
  else
    free(ptr);
}

int mlo_plat_host_register(mlo_platform *p, void *ptr, size_t bytes, bool read_only) {
  if (!p->ops->host_register || !p->caps.host_register) return MLO_EUNSUPPORTED;
  count_call(p);
  return p->ops->host_register(p->ctx, ptr, bytes, read_only);
}

void mlo_plat_host_unregister(mlo_platform *p, void *ptr) {
  if (!p->ops->host_unregister) return;
  count_call(p);
  p->ops->host_unregister(p->ctx, ptr);
}

int mlo_plat_copy_h2d(mlo_platform *p, void *block, size_t offset, const void *src, size_t bytes) {
  count_call(p);
  return p->ops->copy_h2d(p->ctx, block, offset, src, bytes);
}

int mlo_plat_copy_d2h(mlo_platform *p, void *dst, const void *block, size_t offset, size_t bytes) {
  count_call(p);
  return p->ops->copy_d2h(p->ctx, dst, block, offset, bytes);
}

/* Without events an "event" is a NULL placeholder and every wait is a full
 * synchronize: slower, never unordered. */
int mlo_plat_event_create(mlo_platform *p, mlo_event **ev) {
  count_call(p);
  *ev = NULL;
  return p->caps.events ? p->ops->event_create(p->ctx, ev) : MLO_OK;
}

void mlo_plat_event_destroy(mlo_platform *p, mlo_event *ev) {
  if (!ev) return;
  count_call(p);
  p->ops->event_destroy(p->ctx, ev);
}

int mlo_plat_event_record_copy(mlo_platform *p, mlo_event *ev) {
  count_call(p);
  return p->caps.events ? p->ops->event_record_copy(p->ctx, ev) : MLO_OK;
}

int mlo_plat_event_record_compute(mlo_platform *p, mlo_event *ev) {
  count_call(p);
  return p->caps.events ? p->ops->event_record_compute(p->ctx, ev) : MLO_OK;
}

int mlo_plat_compute_wait(mlo_platform *p, mlo_event *ev) {
  count_call(p);
  return p->caps.events ? p->ops->compute_wait(p->ctx, ev) : p->ops->synchronize(p->ctx);
}

int mlo_plat_copy_wait(mlo_platform *p, mlo_event *ev) {
  count_call(p);
  return p->caps.events ? p->ops->copy_wait(p->ctx, ev) : p->ops->synchronize(p->ctx);
}

int mlo_plat_event_record_readback(mlo_platform *p, mlo_event *ev) {
  if (!p->ops->event_record_readback) return mlo_plat_event_record_copy(p, ev);
  count_call(p);
  return p->caps.events ? p->ops->event_record_readback(p->ctx, ev) : MLO_OK;
}

int mlo_plat_readback_wait(mlo_platform *p, mlo_event *ev) {
  if (!p->ops->readback_wait) return mlo_plat_copy_wait(p, ev);
  count_call(p);
  return p->caps.events ? p->ops->readback_wait(p->ctx, ev) : p->ops->synchronize(p->ctx);
}

bool mlo_plat_separate_readback(const mlo_platform *p) {
  return p->ops->event_record_readback != NULL;
}

int mlo_plat_event_sync(mlo_platform *p, mlo_event *ev) {
  count_call(p);
  return p->caps.events ? p->ops->event_sync(p->ctx, ev) : p->ops->synchronize(p->ctx);
}

int mlo_plat_event_query(mlo_platform *p, mlo_event *ev) {
  count_call(p);
  return p->caps.events ? p->ops->event_query(p->ctx, ev) : p->ops->synchronize(p->ctx);
}

struct mlo_stamp {
  atomic_int refs;
  atomic_uint_fast64_t done_ns; /* 0 until fired */
};

mlo_stamp *mlo_stamp_new(void) {
  mlo_stamp *s = mlo_malloc(sizeof *s);
  if (!s) return NULL;
  atomic_init(&s->refs, 2);
  atomic_init(&s->done_ns, 0);
  return s;
}

void mlo_stamp_put(mlo_stamp *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

void mlo_stamp_fire(mlo_stamp *s) {
  uint64_t now = mlo_now_ns();
  atomic_store(&s->done_ns, now ? now : 1);
  mlo_stamp_put(s);
}

int mlo_stamp_time(mlo_stamp *s, uint64_t *t_ns) {
  if (!s) return MLO_EUNSUPPORTED;
  uint64_t t = atomic_load(&s->done_ns);
  if (!t) return MLO_EBUSY;
  *t_ns = t;
  return MLO_OK;
}

void mlo_plat_want_stamps(mlo_platform *p, int delta) {
  if (p && p->ops->want_stamps) p->ops->want_stamps(p->ctx, delta);
}

int mlo_plat_event_time(mlo_platform *p, mlo_event *ev, uint64_t *t_ns) {
  if (!p->caps.events || !p->ops->event_time || !ev) return MLO_EUNSUPPORTED;
  return p->ops->event_time(p->ctx, ev, t_ns);
}

void mlo_plat_resolve(mlo_platform *p, void *block, size_t offset, void **handle, size_t *local) {
  if (p->ops->resolve) {
    p->ops->resolve(p->ctx, block, offset, handle, local);
    return;
  }
  *handle = block;
  *local = offset;
}

int mlo_plat_synchronize(mlo_platform *p) {
  count_call(p);
  return p->ops->synchronize(p->ctx);
}
