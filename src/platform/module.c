/*
 * module.c — finding, loading and checking the modules of module.h, and the
 * services table libmlo lends them.  A module is loaded once per process and
 * never unloaded: a device runtime (CUDA's above all) must not be torn down
 * under a program that may still hold its handles, and a second
 * mlo_platform_open of the same platform should not pay the load again.
 */
#define _GNU_SOURCE /* dladdr */
#include "platform/module.h"

#include "base/log.h"
#include "base/sysio.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef MLO_MODULE_DIR
#define MLO_MODULE_DIR "" /* a build that does not say where it installs */
#endif

static void host_vlogf(mlo_log_level level, const char *fmt, va_list ap) {
  if (!mlo_log_enabled(level)) return;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  mlo_logf(level, "%s", msg);
}

static const struct mlo_module_host host_table = {
    .abi = MLO_MODULE_ABI,
    .version = MLO_MODULE_VERSION, /* what mlo_version() answers */
    .platform_size = sizeof(struct mlo_platform),
    .ops_size = sizeof(struct mlo_platform_ops),
    .vlogf = host_vlogf,
    .log_enabled = mlo_log_enabled,
    .malloc_ = mlo_malloc,
    .calloc_ = mlo_calloc,
    .realloc_ = mlo_realloc,
    .aligned_alloc_ = mlo_aligned_alloc,
    .env_flag = mlo_env_flag,
    .parse_size = mlo_parse_size,
    .format_size = mlo_format_size,
    .stamp_new = mlo_stamp_new,
    .stamp_fire = mlo_stamp_fire,
    .stamp_put = mlo_stamp_put,
    .stamp_time = mlo_stamp_time,
    .spec_parse_indexed = mlo_spec_parse_indexed,
    .dev_alloc = mlo_plat_dev_alloc,
    .dev_free = mlo_plat_dev_free,
    .event_create = mlo_plat_event_create,
    .event_destroy = mlo_plat_event_destroy,
    .event_record_copy = mlo_plat_event_record_copy,
    .compute_wait = mlo_plat_compute_wait,
    .compute_queue = mlo_platform_compute_queue,
};

/* Loaded modules, by file name; a short list (a process loads a few). */
struct loaded {
  char file[64];
  const struct mlo_module *module;
  char *path;
  struct loaded *next;
};
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static struct loaded *modules;

/* Appends "s" to buf at *used, keeping it terminated and never past cap. */
static void append(char *buf, size_t cap, size_t *used, const char *s) {
  if (!buf || !cap || *used >= cap - 1) return;
  int n = snprintf(buf + *used, cap - *used, "%s", s);
  if (n > 0) *used += (size_t)n < cap - *used ? (size_t)n : cap - 1 - *used;
}

/* The folder of the object holding libmlo's code (libmlo.so, or the
 * program libmlo.a was linked into), into dir; false if unknown. */
static bool self_dir(char *dir, size_t cap) {
  Dl_info info;
  if (!dladdr((void *)mlo_module_load, &info) || !info.dli_fname) return false;
  /* libmlo.so: its path as loaded; libmlo.a: the program, whose name here
   * is argv[0]-like (relative, or bare): the kernel's word for it then */
  char *real =
      info.dli_fname[0] == '/' ? realpath(info.dli_fname, NULL) : realpath("/proc/self/exe", NULL);
  if (!real) return false;
  const char *slash = strrchr(real, '/');
  size_t n = slash ? (size_t)(slash - real) : 0;
  bool ok = slash && n + 1 <= cap;
  if (ok) {
    memcpy(dir, real, n);
    dir[n] = '\0';
  }
  free(real);
  return ok;
}

/* One attempt: dlopen `path` and check its init.  TRY_ABSENT when the file
 * is not there, so the search goes on; TRY_OK; or TRY_FAILED, which ends the
 * search (found but unusable), with the reason in why. */
enum { TRY_OK, TRY_ABSENT, TRY_FAILED };
static int try_load(const char *path, mlo_module_kind kind, const char *file,
                    const struct mlo_module **out, char *why, size_t whylen) {
  struct stat st;
  if (stat(path, &st) != 0) return TRY_ABSENT;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, whylen, "%s could not be loaded: %s", path, e ? e : "unknown loader error");
    return TRY_FAILED;
  }
  mlo_module_init_fn init = NULL;
  *(void **)&init = dlsym(h, MLO_MODULE_INIT_SYMBOL);
  if (!init) {
    snprintf(why, whylen, "%s is not an mlo module (no %s)", path, MLO_MODULE_INIT_SYMBOL);
    dlclose(h);
    return TRY_FAILED;
  }
  char err[256] = "";
  const struct mlo_module *m = NULL;
  int rc = init(&host_table, &m, err, sizeof err); /* the module keeps the pointer */
  if (rc || !m) {
    snprintf(why, whylen, "%s refused to start: %s", path, err[0] ? err : mlo_strerror(rc));
    dlclose(h);
    return TRY_FAILED;
  }
  if (m->abi != MLO_MODULE_ABI || !m->version || strcmp(m->version, mlo_version())) {
    snprintf(why, whylen,
             "%s is from another build (module ABI %u, mlo %s; this libmlo: ABI %u, mlo %s)", path,
             m->abi, m->version ? m->version : "?", MLO_MODULE_ABI, mlo_version());
    dlclose(h);
    return TRY_FAILED;
  }
  if (m->kind != kind) {
    snprintf(why, whylen, "%s is a %s module, not the %s module '%s' names", path,
             m->kind == MLO_MODULE_PLATFORM ? "platform" : "workload",
             kind == MLO_MODULE_PLATFORM ? "platform" : "workload", file);
    dlclose(h);
    return TRY_FAILED;
  }
  *out = m; /* the handle stays open for the life of the process */
  return TRY_OK;
}

/* A search for one module: where it was tried, and how it went. */
struct search {
  const char *file;
  mlo_module_kind kind;
  const struct mlo_module **out;
  char name[96];        /* libmlo-<file>.so */
  char candidate[4096]; /* the last place tried: where it is, once found */
  char looked[1024];    /* every place tried, for the message */
  size_t used;
  char why[768]; /* what was wrong with a module found but not usable */
  int result;    /* TRY_ABSENT until found, or found unusable */
};

/* Tries the n bytes of folder dir, unless the search is over already. */
static void attempt(struct search *s, const char *dir, size_t n) {
  if (s->result != TRY_ABSENT || !n || n >= sizeof s->candidate - sizeof s->name - 2) return;
  snprintf(s->candidate, sizeof s->candidate, "%.*s/%s", (int)n, dir, s->name);
  append(s->looked, sizeof s->looked, &s->used, s->used ? ", " : "");
  append(s->looked, sizeof s->looked, &s->used, s->candidate);
  s->result = try_load(s->candidate, s->kind, s->file, s->out, s->why, sizeof s->why);
}

int mlo_module_load(const char *file, mlo_module_kind kind, const struct mlo_module **out,
                    const char **path, char *err, size_t errlen) {
  if (!file || !*file || !out || strchr(file, '/') ||
      strlen(file) >= sizeof(((struct loaded *)0)->file))
    return mlo_errf(err, errlen, MLO_EINVAL, "bad module name");
  *out = NULL;
  pthread_mutex_lock(&modules_lock);
  for (struct loaded *l = modules; l; l = l->next)
    if (!strcmp(l->file, file)) {
      int rc = l->module->kind == kind
                   ? MLO_OK
                   : mlo_errf(err, errlen, MLO_ENODEV, "%s is not the kind of module wanted here",
                              l->path);
      if (!rc) *out = l->module;
      if (!rc && path) *path = l->path;
      pthread_mutex_unlock(&modules_lock);
      return rc;
    }

  struct search sr = {.file = file, .kind = kind, .out = out, .result = TRY_ABSENT};
  snprintf(sr.name, sizeof sr.name, "libmlo-%s.so", file);
  const char *env = getenv("MLO_MODULE_PATH");
  if (env && *env) {
    for (const char *p = env; *p;) {
      size_t n = strcspn(p, ":");
      attempt(&sr, p, n);
      p += n + (p[n] == ':');
    }
  } else {
    char dir[2048];
    if (self_dir(dir, sizeof dir - 4)) {
      strcat(dir, "/mlo");
      attempt(&sr, dir, strlen(dir));
    }
    attempt(&sr, MLO_MODULE_DIR, strlen(MLO_MODULE_DIR));
    /* The program's own library path: its RUNPATH (a build tree's module
     * folder), LD_LIBRARY_PATH and the system folders, as the loader would
     * search them for it; tried by full path, since a bare-name dlopen
     * searches the RUNPATH of whoever called dlopen, which is not us under
     * a sanitizer's interceptor. */
    if (sr.result == TRY_ABSENT) {
      Dl_serinfo size, *info = NULL;
      void *self = dlopen(NULL, RTLD_LAZY);
      if (self && dlinfo(self, RTLD_DI_SERINFOSIZE, &size) == 0 && size.dls_size >= sizeof size &&
          (info = mlo_malloc(size.dls_size)) != NULL) {
        /* as dlinfo(3) says: the sizes into the buffer, then the paths */
        if (dlinfo(self, RTLD_DI_SERINFOSIZE, info) == 0 &&
            dlinfo(self, RTLD_DI_SERINFO, info) == 0)
          for (unsigned i = 0; i < info->dls_cnt; i++) {
            const char *d = info->dls_serpath[i].dls_name;
            if (d) attempt(&sr, d, strlen(d));
          }
      }
      free(info);
      if (self) dlclose(self);
    }
  }
  int rc = MLO_OK;
  if (sr.result == TRY_OK) {
    struct loaded *l = mlo_calloc(1, sizeof *l);
    char *where = mlo_strdup(sr.candidate);
    if (!l || !where) {
      free(l);
      free(where);
      *out = NULL;
      rc = mlo_errf(err, errlen, MLO_ENOMEM, "out of host memory loading %s", sr.name);
    } else {
      snprintf(l->file, sizeof l->file, "%s", file);
      l->module = *out;
      l->path = where;
      l->next = modules;
      modules = l;
      if (path) *path = where;
    }
  } else if (sr.result == TRY_FAILED) {
    rc = mlo_errf(err, errlen, MLO_ENODEV, "%s (looked in: %s)", sr.why, sr.looked);
  } else {
    rc = mlo_errf(err, errlen, MLO_ENODEV,
                  "module %s not found (looked in: %s%s); set MLO_MODULE_PATH to the folder "
                  "that holds it",
                  sr.name, sr.looked[0] ? sr.looked : "nowhere",
                  env && *env ? ", from MLO_MODULE_PATH" : "");
  }
  pthread_mutex_unlock(&modules_lock);
  /* outside the lock: a log callback may open a platform itself */
  if (rc == MLO_OK) mlo_logf(MLO_LOG_DEBUG, "module %s loaded from %s", sr.name, sr.candidate);
  return rc;
}
