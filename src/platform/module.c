/*
 * module.c — finding, loading and checking the modules of module.h, and the
 * services table libmlo lends them.  A module is loaded once per process and
 * never unloaded: a device runtime (CUDA's above all) must not be torn down
 * under a program that may still hold its handles, and a second
 * mlo_platform_open of the same platform should not pay the load again.
 *
 * A module is code run in this process as soon as it is opened (its
 * constructors run inside dlopen, before mlo_module_init is even looked
 * up), so what may be opened is checked first (issue 44): only folders named
 * by absolute path are searched (an empty or relative element of a search
 * path would be the current folder, wherever the program was started), and
 * only a regular file that no one but root and this process's user can
 * have written, in a folder no one else can write to, is opened.  A module
 * refused is remembered as a loaded one is, so a second probe answers the
 * refusal without running the module's code again.
 */
#define _GNU_SOURCE /* dladdr */
#include "platform/module.h"

#include "base/log.h"
#include "base/sysio.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    .dev_alloc_compute = mlo_plat_dev_alloc_compute,
    .compute_context = mlo_plat_compute_context,
};

/* Modules loaded or refused, by file name; a short list (a process loads a
 * few).  A refused one keeps its error: a second load answers that, rather
 * than opening the file again and running its constructors again. */
struct loaded {
  char file[64];
  const struct mlo_module *module; /* NULL: refused */
  char *path;                      /* where it was loaded from */
  char *refusal;                   /* the error, when refused */
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
 * program libmlo.a was linked into), into dir; false if unknown.
 *
 * dladdr's dli_fname is the name the object was opened by: relative when a
 * program dlopen()ed "lib/libmlo.so", and relative then to a current folder
 * that may have changed since (taking the program's folder for it instead,
 * as this did before issue 44, searched beside the wrong object).  The
 * kernel keeps every mapped file's absolute path, symlinks resolved, in
 * /proc/self/maps: the mapping that holds this function's code names the
 * object it is in, whoever opened it and however.  Without /proc an
 * absolute dli_fname serves, and a relative one gives no folder: no guess. */
static bool self_dir(char *dir, size_t cap) {
  uintptr_t at = (uintptr_t)self_dir;
  char found[PATH_MAX] = "";
  FILE *maps = fopen("/proc/self/maps", "re");
  if (maps) {
    char line[PATH_MAX + 256];
    bool starts = true; /* the line read next starts a record */
    while (fgets(line, sizeof line, maps)) {
      size_t len = strlen(line);
      bool first = starts;
      starts = len && line[len - 1] == '\n';
      if (!first) continue; /* the rest of a record too long for line */
      unsigned long lo, hi;
      int off = -1;
      /* start-end perms offset dev inode path */
      if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) != 2 || off < 0) continue;
      if (at < lo || at >= hi) continue;
      if (starts && line[off] == '/') {
        line[len - 1] = '\0';
        snprintf(found, sizeof found, "%s", line + off);
      }
      break;
    }
    fclose(maps);
  }
  Dl_info info;
  if (!found[0] && dladdr((void *)self_dir, &info) && info.dli_fname && info.dli_fname[0] == '/' &&
      !realpath(info.dli_fname, found))
    snprintf(found, sizeof found, "%s", info.dli_fname);
  /* the folder: what is before the last '/' (a " (deleted)" the kernel
   * adds to a file replaced since is after it) */
  const char *slash = strrchr(found, '/');
  size_t n = slash ? (size_t)(slash - found) : 0;
  if (!slash || n + 1 > cap) return false;
  memcpy(dir, found, n);
  dir[n] = '\0';
  return true;
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
  char skipped[512]; /* the folders not searched, for the debug log */
  size_t skipped_used;
  char why[768]; /* what was wrong with a module found but not usable */
  int result;    /* TRY_ABSENT until found, or found unusable */
};

/* What was wrong with the candidate, into s->why (cut short if long). */
MLO_PRINTF(2, 3) static void whyf(struct search *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->why, sizeof s->why, fmt, ap);
  va_end(ap);
}

/* TRY_ABSENT when the file is not there, so the search goes on; TRY_OK; or
 * TRY_FAILED, which ends the search (found but unusable, or refused), with
 * the reason in why. */
enum { TRY_OK, TRY_ABSENT, TRY_FAILED };

/* Whether st, of a module file (or the symbolic link naming it) or of a
 * folder holding one, may be trusted with code run in this process: owned
 * by root or by this process's user, and writable by no one else.  A folder
 * others may write to is excused when sticky (/tmp's mode): no one but a
 * file's owner may then replace or rename it, and the file's owner is
 * checked.  Otherwise why names the candidate, `what` and why not. */
static bool trusted(struct search *s, const struct stat *st, const char *what) {
  uid_t euid = geteuid();
  if (st->st_uid != 0 && st->st_uid != euid) {
    whyf(s, "%s refused: %s is owned by uid %u, neither root nor this process's user (uid %u)",
         s->candidate, what, (unsigned)st->st_uid, (unsigned)euid);
    return false;
  }
  bool sticky_dir = S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX);
  if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_IWGRP | S_IWOTH)) && !sticky_dir) {
    whyf(s, "%s refused: %s is writable by others than its owner and root (mode %04o)",
         s->candidate, what, (unsigned)(st->st_mode & 07777));
    return false;
  }
  return true;
}

static const char *file_type(mode_t m) {
  return S_ISFIFO(m)   ? "a FIFO"
         : S_ISDIR(m)  ? "a folder"
         : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
                       : "not a file";
}

/* Whether the candidate, found in folder dir, may be opened: a regular file
 * (dlopen of a FIFO waits for a writer forever), and it, the symbolic link
 * naming it if any, the folder it was found in and the folder it really is
 * in all trusted.  TRY_ABSENT, TRY_OK (open it) or TRY_FAILED. */
static int check_candidate(struct search *s, const char *dir) {
  const char *path = s->candidate;
  struct stat st;
  if (lstat(path, &st) != 0) return TRY_ABSENT;
  if (S_ISLNK(st.st_mode) && !trusted(s, &st, "the symbolic link")) return TRY_FAILED;
  if (stat(path, &st) != 0) return TRY_ABSENT; /* a link to nothing */
  if (!S_ISREG(st.st_mode)) {
    whyf(s, "%s is not a regular file (%s): not opened", path, file_type(st.st_mode));
    return TRY_FAILED;
  }
  if (!trusted(s, &st, "the file")) return TRY_FAILED;
  char what[PATH_MAX + 16];
  struct stat dst;
  if (stat(dir, &dst) != 0) {
    whyf(s, "%s refused: its folder %s could not be checked: %s", path, dir, strerror(errno));
    return TRY_FAILED;
  }
  snprintf(what, sizeof what, "its folder %s", dir);
  if (!trusted(s, &dst, what)) return TRY_FAILED;
  char real[PATH_MAX];
  if (!realpath(path, real)) {
    whyf(s, "%s refused: its path could not be resolved: %s", path, strerror(errno));
    return TRY_FAILED;
  }
  char *slash = strrchr(real, '/');
  *slash = '\0'; /* realpath's answer is absolute: there is one */
  char named[PATH_MAX];
  if (!realpath(dir, named) || strcmp(named, real)) { /* a link into another folder */
    const char *real_dir = real[0] ? real : "/";
    if (stat(real_dir, &dst) != 0) {
      whyf(s, "%s refused: its folder %s could not be checked: %s", path, real_dir,
           strerror(errno));
      return TRY_FAILED;
    }
    snprintf(what, sizeof what, "its folder %s", real_dir);
    if (!trusted(s, &dst, what)) return TRY_FAILED;
  }
  return TRY_OK;
}

/* Whether p points into the object loaded at base (the module's own image):
 * what a module answers must be its own, and a pointer to anything else
 * (garbage, most likely) is never followed. */
static bool inside(const void *p, const void *base) {
  Dl_info info;
  return p && dladdr(p, &info) && info.dli_fbase == base;
}
static bool fn_inside(void (*fn)(void), const void *base) {
  void *p;
  memcpy(&p, &fn, sizeof p);
  return inside(p, base);
}

static const char *kind_name(mlo_module_kind kind) {
  return kind == MLO_MODULE_PLATFORM ? "platform" : kind == MLO_MODULE_WORKLOAD ? "workload" : NULL;
}

/* What init answered, checked before anything in it is used: a table, in
 * the module, of this build, of the kind wanted, with the members that
 * kind's callers use.  false with the reason in why. */
static bool module_usable(struct search *s, const struct mlo_module *m, const void *base) {
  const char *path = s->candidate;
  if (!m) {
    whyf(s, "%s returned no module table (its %s succeeded without one)", path,
         MLO_MODULE_INIT_SYMBOL);
    return false;
  }
  if (!inside(m, base)) {
    whyf(s, "%s returned a module table outside the module (%p)", path, (void *)m);
    return false;
  }
  if (!m->version) {
    whyf(s, "%s gave no version string (module ABI %u; this libmlo: ABI %u, mlo %s)", path, m->abi,
         MLO_MODULE_ABI, mlo_version());
    return false;
  }
  if (!inside(m->version, base)) {
    whyf(s, "%s gave a version pointer outside the module (%p)", path, (void *)m->version);
    return false;
  }
  if (m->abi != MLO_MODULE_ABI || strcmp(m->version, mlo_version())) {
    whyf(s, "%s is from another build (module ABI %u, mlo %.32s; this libmlo: ABI %u, mlo %s)",
         path, m->abi, m->version, MLO_MODULE_ABI, mlo_version());
    return false;
  }
  if (m->kind != s->kind) {
    const char *is = kind_name(m->kind);
    if (is)
      whyf(s, "%s is a %s module, not the %s module '%s' names", path, is, kind_name(s->kind),
           s->file);
    else
      whyf(s, "%s is a module of unknown kind %d, not the %s module '%s' names", path, (int)m->kind,
           kind_name(s->kind), s->file);
    return false;
  }
  if (!m->name || !inside(m->name, base)) {
    if (m->name)
      whyf(s, "%s gave a name pointer outside the module (%p)", path, (void *)m->name);
    else
      whyf(s, "%s gave no name", path);
    return false;
  }
  if (m->kind == MLO_MODULE_PLATFORM &&
      (!m->create || !fn_inside((void (*)(void))m->create, base))) {
    whyf(s, "%s is a platform module with %s", path,
         m->create ? "a constructor outside the module" : "no constructor (create)");
    return false;
  }
  if (m->kind == MLO_MODULE_WORKLOAD && (!m->impl || !inside(m->impl, base))) {
    whyf(s, "%s is a workload module with %s", path,
         m->impl ? "an ops table outside the module" : "no ops table (impl)");
    return false;
  }
  return true;
}

/* Opens the candidate, once check_candidate allowed it, and checks what its
 * init answers. */
static int try_load(struct search *s) {
  const char *path = s->candidate;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    whyf(s, "%s could not be loaded: %s", path, e ? e : "unknown loader error");
    return TRY_FAILED;
  }
  mlo_module_init_fn init = NULL;
  *(void **)&init = dlsym(h, MLO_MODULE_INIT_SYMBOL);
  Dl_info info;
  if (!init || !dladdr(*(void **)&init, &info)) {
    whyf(s, "%s is not an mlo module (no %s)", path, MLO_MODULE_INIT_SYMBOL);
    dlclose(h);
    return TRY_FAILED;
  }
  char err[256] = "";
  const struct mlo_module *m = NULL;
  int rc = init(&host_table, &m, err, sizeof err); /* the module keeps the pointer */
  err[sizeof err - 1] = '\0';
  if (rc) {
    if (err[0])
      whyf(s, "%s refused to start: %s", path, err);
    else if (!strcmp(mlo_err_name(rc), "MLO_E?"))
      whyf(s, "%s refused to start: unknown error (rc %d, no reason given)", path, rc);
    else
      whyf(s, "%s refused to start: %s (%s, no reason given)", path, mlo_strerror(rc),
           mlo_err_name(rc));
    dlclose(h);
    return TRY_FAILED;
  }
  if (!module_usable(s, m, info.dli_fbase)) {
    dlclose(h);
    return TRY_FAILED;
  }
  *s->out = m; /* the handle stays open for the life of the process */
  return TRY_OK;
}

/* Notes a folder not searched, for the debug log after the search. */
static void skip(struct search *s, const char *dir, size_t n, const char *from) {
  char note[320];
  snprintf(note, sizeof note, "%s'%.*s' (%s)", s->skipped_used ? ", " : "",
           (int)(n < 256 ? n : 256), dir, from);
  append(s->skipped, sizeof s->skipped, &s->skipped_used, note);
}

/* Tries the n bytes of folder dir (from `from`, for the messages), unless
 * the search is over already.  An empty or relative folder is never tried:
 * the loader reads one relative to the current folder, which is wherever
 * the program was started (an empty LD_LIBRARY_PATH element, as
 * `export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/x` leaves, is "."). */
static void attempt(struct search *s, const char *dir, size_t n, const char *from, bool listed) {
  if (s->result != TRY_ABSENT) return;
  if (!n || dir[0] != '/') {
    skip(s, dir, n, from);
    if (listed && n) {
      char note[320];
      snprintf(note, sizeof note, "%s'%.*s' (relative: skipped)", s->used ? ", " : "",
               (int)(n < 256 ? n : 256), dir);
      append(s->looked, sizeof s->looked, &s->used, note);
    }
    return;
  }
  if (n >= sizeof s->candidate - sizeof s->name - 2) return;
  snprintf(s->candidate, sizeof s->candidate, "%.*s/%s", (int)n, dir, s->name);
  append(s->looked, sizeof s->looked, &s->used, s->used ? ", " : "");
  append(s->looked, sizeof s->looked, &s->used, s->candidate);
  char folder[sizeof s->candidate];
  snprintf(folder, sizeof folder, "%.*s", (int)n, dir);
  s->result = check_candidate(s, folder);
  if (s->result == TRY_OK) s->result = try_load(s);
}

/* Remembers a module loaded (m) or refused (why), by file name.  false when
 * out of memory (then nothing is remembered). */
static bool remember(const char *file, const struct mlo_module *m, const char *path,
                     const char *refusal) {
  struct loaded *l = mlo_calloc(1, sizeof *l);
  char *where = path ? mlo_strdup(path) : NULL;
  char *why = refusal ? mlo_strdup(refusal) : NULL;
  if (!l || (path && !where) || (refusal && !why)) {
    free(l);
    free(where);
    free(why);
    return false;
  }
  snprintf(l->file, sizeof l->file, "%s", file);
  l->module = m;
  l->path = where;
  l->refusal = why;
  l->next = modules;
  modules = l;
  return true;
}

int mlo_module_load(const char *file, mlo_module_kind kind, const struct mlo_module **out,
                    const char **path, char *err, size_t errlen) {
  if (!file || !*file || !out || strchr(file, '/') ||
      strlen(file) >= sizeof(((struct loaded *)0)->file) || !kind_name(kind))
    return mlo_errf(err, errlen, MLO_EINVAL, "bad module name");
  *out = NULL;
  pthread_mutex_lock(&modules_lock);
  for (struct loaded *l = modules; l; l = l->next)
    if (!strcmp(l->file, file)) {
      int rc = !l->module ? mlo_errf(err, errlen, MLO_ENODEV, "%s", l->refusal)
               : l->module->kind == kind
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
      attempt(&sr, p, n, "MLO_MODULE_PATH", true);
      p += n + (p[n] == ':');
    }
  } else {
    char dir[2048];
    if (self_dir(dir, sizeof dir - 4)) {
      strcat(dir, "/mlo");
      attempt(&sr, dir, strlen(dir), "beside libmlo", false);
    } else {
      skip(&sr, "", 0, "beside libmlo: libmlo's path is unknown");
    }
    if (MLO_MODULE_DIR[0])
      attempt(&sr, MLO_MODULE_DIR, strlen(MLO_MODULE_DIR), "the install folder", false);
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
            if (d) attempt(&sr, d, strlen(d), "the library path", false);
          }
      }
      free(info);
      if (self) dlclose(self);
    }
  }
  int rc = MLO_OK;
  if (sr.result == TRY_OK) {
    if (!remember(file, *out, sr.candidate, NULL)) {
      *out = NULL;
      rc = mlo_errf(err, errlen, MLO_ENOMEM, "out of host memory loading %s", sr.name);
    } else if (path) {
      *path = modules->path;
    }
  } else if (sr.result == TRY_FAILED) {
    rc = mlo_errf(err, errlen, MLO_ENODEV, "%s (looked in: %s)", sr.why, sr.looked);
    char refusal[sizeof sr.why + sizeof sr.looked + 16];
    snprintf(refusal, sizeof refusal, "%s (looked in: %s)", sr.why, sr.looked);
    remember(file, NULL, NULL, refusal); /* if out of memory, the next load tries again */
  } else {
    rc = mlo_errf(err, errlen, MLO_ENODEV,
                  "module %s not found (looked in: %s%s); set MLO_MODULE_PATH to the folder "
                  "that holds it",
                  sr.name, sr.looked[0] ? sr.looked : "nowhere",
                  env && *env ? ", from MLO_MODULE_PATH" : "");
  }
  pthread_mutex_unlock(&modules_lock);
  /* outside the lock: a log callback may open a platform itself */
  if (sr.skipped[0])
    mlo_logf(MLO_LOG_DEBUG,
             "module search for %s skipped %s: a module is searched for only in folders named "
             "by absolute path, never in the current folder",
             sr.name, sr.skipped);
  if (rc == MLO_OK) mlo_logf(MLO_LOG_DEBUG, "module %s loaded from %s", sr.name, sr.candidate);
  return rc;
}
