/*
 * platform.c — the wrappers core uses around the vtable: defaults for
 * optional slots, the fallback from events to synchronize, call counting
 * and used/peak device accounting; closing a platform.  Opening one by its
 * spec is registry.c's, above every platform; parsing a spec's options is
 * platform_spec.c's, below them.
 */
#include "base/sysio.h"
#include "platform/platform.h"

#include "base/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

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

int mlo_plat_all_gather(mlo_platform *p, void *block, size_t offset, size_t slice, int rank,
                        void *coll, unsigned timeout_ms) {
  if (!p->ops->coll) return MLO_EUNSUPPORTED;
  count_call(p);
  return p->ops->coll->gather(p->ctx, block, offset, slice, rank, coll, timeout_ms);
}

static int no_coll(const mlo_platform *p, char *err, size_t errlen) {
  return mlo_errf(err, errlen, MLO_EUNSUPPORTED,
                  "platform '%s' has no device-side communicator (NCCL: cuda, built with NCCL)",
                  p->ops->name);
}

int mlo_plat_coll_check(mlo_platform *p, void *coll, int ranks, int rank, char *err,
                        size_t errlen) {
  if (!p->ops->coll) return no_coll(p, err, errlen);
  return p->ops->coll->check(p->ctx, coll, ranks, rank, err, errlen);
}

int mlo_plat_coll_id(mlo_platform *p, void *id, size_t len, char *err, size_t errlen) {
  if (!p->ops->coll) return no_coll(p, err, errlen);
  return p->ops->coll->id(p->ctx, id, len, err, errlen);
}

int mlo_plat_coll_init(mlo_platform *p, const void *id, size_t len, int ranks, int rank,
                       unsigned timeout_ms, void **coll, char *err, size_t errlen) {
  *coll = NULL;
  if (!p->ops->coll) return no_coll(p, err, errlen);
  return p->ops->coll->init(p->ctx, id, len, ranks, rank, timeout_ms, coll, err, errlen);
}

bool mlo_plat_has_coll(const mlo_platform *p) {
  return p->ops->coll != NULL;
}

void mlo_plat_coll_destroy(mlo_platform *p, void *coll) {
  if (p->ops->coll && coll) p->ops->coll->destroy(p->ctx, coll);
}

int mlo_plat_coll_wait(mlo_platform *p, mlo_event *ev, char *err, size_t errlen) {
  if (!p->ops->coll) return mlo_plat_event_sync(p, ev);
  count_call(p);
  return p->ops->coll->wait(p->ctx, ev, err, errlen);
}

bool mlo_plat_has_all_gather(const mlo_platform *p) {
  return p->ops->coll != NULL;
}

void mlo_plat_gather_pace(mlo_platform *p, size_t slice, int ranks, uint64_t t0_ns) {
  const struct mlo_platform_model_ops *m = p->ops->model;
  if (m && m->gather_pace) m->gather_pace(p->ctx, slice, ranks, t0_ns);
}

int mlo_platform_get_topology(mlo_platform *p, mlo_node_topology *t) {
  if (!p || !t || t->size < sizeof *t) return MLO_EINVAL;
  const struct mlo_platform_model_ops *m = p->ops->model;
  if (!m || !m->topology) return MLO_EUNSUPPORTED;
  mlo_node_topology got = MLO_NODE_TOPOLOGY_INIT;
  int rc = m->topology(p->ctx, &got);
  if (!rc) *t = got;
  return rc;
}

uint64_t mlo_plat_now(const mlo_platform *p) {
  const struct mlo_platform_model_ops *m = p->ops->model;
  return m && m->now_ns ? m->now_ns(p->ctx) : mlo_now_ns();
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
