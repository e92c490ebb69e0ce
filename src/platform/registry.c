/*
 * registry.c — the platforms mlo knows, and opening one by its spec: the
 * one table `mlo_platform_open`, `mlo_platform_info_get` and the tools
 * read, each row a built-in constructor (host.c, sim.c, fault.c) or a
 * module loaded on first use (module.c).  Above every platform: it calls
 * their constructors and none of them calls it (the fault platform is
 * handed this file's opener for the platform it wraps).
 */
#include "base/sysio.h"
#include "platform/platform.h"

#include "platform/fault.h"
#include "platform/module.h"

#include "base/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *msg, const char *what) {
  if (err && errlen) snprintf(err, errlen, "%s%s%s", msg, what ? ": " : "", what ? what : "");
}

typedef int (*create_fn)(const char *, mlo_platform *, char *, size_t);

/* The fault platform opens the platform it wraps by spec, through the
 * opener it is handed: this file's, which it so never calls by name. */
static int fault_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  return mlo_fault_platform_create(spec_args, mlo_platform_open, p, err, errlen);
}

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
    {"fault", "fault:kind=K,nth=N[,inner=SPEC]", fault_create},
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
    const struct mlo_platform_coll_ops *c = o->coll; /* all of it, or none */
    if (c && !c->gather) return "coll->gather";
    if (c && !c->check) return "coll->check";
    if (c && !c->id) return "coll->id";
    if (c && !c->init) return "coll->init";
    if (c && !c->destroy) return "coll->destroy";
    if (c && !c->wait) return "coll->wait";
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
