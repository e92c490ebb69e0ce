/*
 * module_shim.c — compiled into every module (module.h), never into libmlo:
 * the library's internal helpers a module's sources call, forwarded through
 * the services table libmlo passed to mlo_module_init.  The module's sources
 * stay the same whether they are built into a module or read beside the
 * library, and every piece of shared state (the log sink, the fault points
 * of allocation, the platform's call counts) stays libmlo's one copy.
 *
 * Modules are built with hidden visibility: these definitions bind inside
 * the module only, and mlo_module_init is its one exported symbol.
 */
#include "platform/module.h"

#include "base/log.h"
#include "base/sysio.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* The libmlo this module serves.  A module file is loaded once per process
 * (dlopen hands the same copy to every caller), so it can serve one libmlo:
 * a second copy of libmlo in the same process (a program with libmlo.a and
 * a plugin with libmlo.so) is refused rather than silently taking the
 * module over — its log sink, fault counters and, were it unloaded, its
 * table would become the first copy's. */
static _Atomic(const struct mlo_module_host *) host;

/* The module's own description, from its entry file (MLO_MODULE_DEFINE_*). */
extern const struct mlo_module mlo_this_module;

__attribute__((visibility("default"))) int mlo_module_init(const struct mlo_module_host *h,
                                                           const struct mlo_module **out, char *err,
                                                           size_t errlen) {
  if (!h || !out) return MLO_EINVAL;
  if (h->abi != MLO_MODULE_ABI || !h->version || strcmp(h->version, MLO_MODULE_VERSION) ||
      h->platform_size != sizeof(struct mlo_platform) ||
      h->ops_size != sizeof(struct mlo_platform_ops)) {
    if (err && errlen)
      snprintf(err, errlen, "built for mlo %s (module ABI %u), loaded by mlo %s (ABI %u)",
               MLO_MODULE_VERSION, MLO_MODULE_ABI, h->version ? h->version : "?", h->abi);
    return MLO_EINVAL;
  }
  const struct mlo_module_host *none = NULL;
  if (!atomic_compare_exchange_strong(&host, &none, h) && none != h) {
    if (err && errlen)
      snprintf(err, errlen,
               "already serves another copy of libmlo in this process (one libmlo per process "
               "may use device modules: link libmlo once, shared)");
    return MLO_EINVAL;
  }
  *out = &mlo_this_module;
  return MLO_OK;
}

void mlo_logf(mlo_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  host->vlogf(level, fmt, ap);
  va_end(ap);
}
bool mlo_log_enabled(mlo_log_level level) {
  return host->log_enabled(level);
}
void *mlo_malloc(size_t n) {
  return host->malloc_(n);
}
void *mlo_calloc(size_t n, size_t size) {
  return host->calloc_(n, size);
}
void *mlo_realloc(void *p, size_t n) {
  return host->realloc_(p, n);
}
void *mlo_aligned_alloc(size_t align, size_t n) {
  return host->aligned_alloc_(align, n);
}
bool mlo_env_flag(const char *name) {
  return host->env_flag(name);
}
int mlo_parse_size(const char *text, bool allow_zero, uint64_t *out) {
  return host->parse_size(text, allow_zero, out);
}
char *mlo_format_size(uint64_t bytes, char *buf, size_t buflen) {
  return host->format_size(bytes, buf, buflen);
}
mlo_stamp *mlo_stamp_new(void) {
  return host->stamp_new();
}
void mlo_stamp_fire(mlo_stamp *s) {
  host->stamp_fire(s);
}
void mlo_stamp_put(mlo_stamp *s) {
  host->stamp_put(s);
}
int mlo_stamp_time(mlo_stamp *s, uint64_t *t_ns) {
  return host->stamp_time(s, t_ns);
}
int mlo_spec_parse_indexed(const char *name, const char *args, unsigned long max_index,
                           unsigned long *index, mlo_spec_kv_fn fn, void *user, char *err,
                           size_t errlen) {
  return host->spec_parse_indexed(name, args, max_index, index, fn, user, err, errlen);
}
int mlo_plat_dev_alloc(mlo_platform *p, size_t bytes, void **block) {
  return host->dev_alloc(p, bytes, block);
}
int mlo_plat_dev_alloc_compute(mlo_platform *p, size_t bytes, void **block) {
  return host->dev_alloc_compute(p, bytes, block);
}
int mlo_plat_dev_free(mlo_platform *p, void *block, size_t bytes) {
  return host->dev_free(p, block, bytes);
}
int mlo_plat_event_create(mlo_platform *p, mlo_event **ev) {
  return host->event_create(p, ev);
}
void mlo_plat_event_destroy(mlo_platform *p, mlo_event *ev) {
  host->event_destroy(p, ev);
}
int mlo_plat_event_record_copy(mlo_platform *p, mlo_event *ev) {
  return host->event_record_copy(p, ev);
}
int mlo_plat_compute_wait(mlo_platform *p, mlo_event *ev) {
  return host->compute_wait(p, ev);
}
void *mlo_platform_compute_queue(mlo_platform *p) {
  return host->compute_queue(p);
}
void *mlo_plat_compute_context(mlo_platform *p) {
  return host->compute_context(p);
}
