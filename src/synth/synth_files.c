/*
 * synth_files.c — the generator's dealings with the file system: files
 * written atomically (outfile.c) and only inside the folder (paths walked
 * from its descriptor, links refused), and the stamp
 * `.mlo-synth.json` that says which run wrote a directory, which files it
 * wrote and whether it finished.  The stamp is what lets `mlo demo` reuse a
 * generated pipeline, lets a changed run remove exactly the earlier run's
 * files (no strays left for the loader to reject), and keeps the generator
 * off folders it did not make.
 */
#include "base/sysio.h"
#include "synth/synth.h"

#include "base/log.h"
#include "format/index.h"
#include "format/json.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STAMP_NAME ".mlo-synth.json"

/* ---- paths inside the generated folder, never through a link ------------------------------ */

/* A planted symlink (lnk -> /etc) inside a folder the generator manages must
 * not let it write or delete outside: every relative path is walked from
 * the folder's descriptor with O_NOFOLLOW, component by component. */

/* Opens the folder that holds rel's last component; *base points into rel.
 * Refuses a link or a non-folder on the way (ELOOP/ENOTDIR). */
static int open_parent(const char *dir, const char *rel, int *pfd, const char **base) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  const char *p = rel;
  for (const char *slash; (slash = strchr(p, '/')) != NULL; p = slash + 1) {
    char part[256];
    size_t n = (size_t)(slash - p);
    if (n == 0 || n >= sizeof part) {
      close(fd);
      errno = EINVAL;
      return -1;
    }
    memcpy(part, p, n);
    part[n] = '\0';
    int next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    if (next < 0) return -1;
    fd = next;
  }
  *pfd = fd;
  *base = p;
  return 0;
}

typedef enum { ENTRY_ABSENT, ENTRY_REGULAR, ENTRY_FOLDER, ENTRY_OTHER } entry_kind;

/* What rel is inside dir, links not followed (a link is ENTRY_OTHER, and so
 * is a path through one). */
static entry_kind entry_at(const char *dir, const char *rel) {
  int pfd;
  const char *base;
  if (open_parent(dir, rel, &pfd, &base) != 0) return errno == ENOENT ? ENTRY_ABSENT : ENTRY_OTHER;
  struct stat st;
  entry_kind k = ENTRY_OTHER;
  if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0)
    k = errno == ENOENT ? ENTRY_ABSENT : ENTRY_OTHER;
  else if (S_ISREG(st.st_mode))
    k = ENTRY_REGULAR;
  else if (S_ISDIR(st.st_mode))
    k = ENTRY_FOLDER;
  close(pfd);
  return k;
}

int mlo_syn_make_dir(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (mkdir(path, 0755) == 0 || (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
    return MLO_OK;
  return mlo_errf(err, errlen, MLO_EIO, "%s: cannot create folder: %s", path, strerror(errno));
}

int mlo_syn_make_subdir(const char *dir, const char *rel, char *err, size_t errlen) {
  int pfd;
  const char *base;
  if (open_parent(dir, rel, &pfd, &base) != 0)
    return mlo_errf(err, errlen, MLO_EIO, "%s/%s: cannot create folder: %s", dir, rel,
                    strerror(errno));
  int rc = MLO_OK;
  struct stat st;
  if (mkdirat(pfd, base, 0755) != 0 &&
      !(errno == EEXIST && fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)))
    rc = mlo_errf(err, errlen, MLO_EIO, "%s/%s: cannot create folder (%s)", dir, rel,
                  errno == EEXIST ? "something that is not a folder is there" : strerror(errno));
  close(pfd);
  return rc;
}

int mlo_syn_check_target(const char *dir, const char *rel, char *err, size_t errlen) {
  entry_kind k = entry_at(dir, rel);
  if (k == ENTRY_ABSENT || k == ENTRY_REGULAR) return MLO_OK;
  return mlo_errf(err, errlen, MLO_EIO,
                  "%s/%s: is a link, a folder or a special file inside the generated folder; "
                  "refusing to write through it",
                  dir, rel);
}

/* Writes text to dir/rel, replacing only a regular file (outfile.c). */
int mlo_syn_write_text(const char *dir, const char *rel, const char *text, char *err,
                       size_t errlen) {
  int rc = mlo_syn_check_target(dir, rel, err, errlen);
  if (rc) return rc;
  char *path = mlo_path_join(dir, rel);
  if (!path) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", dir);
  rc = mlo_out_write_all(path, text, strlen(text), err, errlen);
  free(path);
  return rc;
}

int mlo_syn_write_json(const char *dir, const char *rel, cJSON *json, bool pretty, char *err,
                       size_t errlen) {
  char *text = json ? (pretty ? cJSON_Print(json) : cJSON_PrintUnformatted(json)) : NULL;
  int rc = text ? mlo_syn_write_text(dir, rel, text, err, errlen)
                : mlo_errf(err, errlen, MLO_ENOMEM, "%s/%s: out of memory", dir, rel);
  free(text);
  return rc;
}

/* ---- the stamp: what was written, and whether it finished ---------------- */

/* Bumped when what a preset writes changes (2: Wan's real scheduler
 * config), so a cache written by an older mlo is rewritten, not reused. */
#define SYNTH_LAYOUT 2

static cJSON *read_stamp(const char *dir) {
  if (entry_at(dir, STAMP_NAME) != ENTRY_REGULAR) return NULL; /* a link is no stamp */
  char *path = mlo_path_join(dir, STAMP_NAME);
  char why[512];
  cJSON *stamp = NULL;
  int rc = path ? mlo_json_read_file(path, 1u << 20, 0, &stamp, why, sizeof why) : MLO_ENOMEM;
  free(path);
  if (rc) return NULL;
  const cJSON *gen = cJSON_GetObjectItemCaseSensitive(stamp, "generator");
  if (!cJSON_IsString(gen) || strcmp(gen->valuestring, "mlo synth")) {
    cJSON_Delete(stamp);
    return NULL;
  }
  return stamp;
}

/* A stamp's file entry is only trusted when it stays inside dir. */
static bool safe_relative(const char *rel) {
  if (!rel[0] || rel[0] == '/') return false;
  for (const char *p = rel; *p;) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (len == 0 || (len == 2 && !strncmp(p, "..", 2)) || (len == 1 && p[0] == '.')) return false;
    p += len + (slash ? 1 : 0);
  }
  return true;
}

static bool stamp_matches(const cJSON *stamp, const char *dir, const char *preset, double scale) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(stamp, "preset");
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(stamp, "scale");
  const cJSON *done = cJSON_GetObjectItemCaseSensitive(stamp, "complete");
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(stamp, "files"), *it;
  const cJSON *layout = cJSON_GetObjectItemCaseSensitive(stamp, "layout");
  if (!cJSON_IsNumber(layout) || layout->valuedouble != SYNTH_LAYOUT) return false;
  if (!cJSON_IsString(p) || strcmp(p->valuestring, preset) || !cJSON_IsNumber(s) ||
      fabs(s->valuedouble - scale) > 1e-12 * scale || !cJSON_IsTrue(done) || !cJSON_IsArray(files))
    return false;
  cJSON_ArrayForEach(it, files) { /* a deleted shard must not pass for a cache hit */
    if (!cJSON_IsString(it) || !safe_relative(it->valuestring)) return false;
    if (entry_at(dir, it->valuestring) != ENTRY_REGULAR) return false;
  }
  return true;
}

bool mlo_synth_is_complete(const char *preset, const char *dir, double scale) {
  if (!preset || !dir) return false;
  cJSON *stamp = read_stamp(dir);
  bool ok = stamp && stamp_matches(stamp, dir, preset, scale);
  cJSON_Delete(stamp);
  return ok;
}

/* Removes the files an earlier run listed, and then their folders if empty.
 * Only regular files inside dir go: a listed name that is a link, or lies
 * behind one, is left alone (and said). */
static void remove_listed(const char *dir, const cJSON *stamp) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(stamp, "files"), *it;
  cJSON_ArrayForEach(it, files) {
    const char *rel = cJSON_IsString(it) ? it->valuestring : NULL;
    if (!rel || !safe_relative(rel)) continue;
    int pfd;
    const char *base;
    if (open_parent(dir, rel, &pfd, &base) != 0) {
      if (errno != ENOENT)
        mlo_logf(MLO_LOG_WARN, "%s: not removing %s: a link or a non-folder is on its path", dir,
                 rel);
      continue;
    }
    struct stat st;
    if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISREG(st.st_mode))
        unlinkat(pfd, base, 0);
      else
        mlo_logf(MLO_LOG_WARN, "%s: not removing %s: it is not a regular file", dir, rel);
    }
    close(pfd);
    const char *slash = strrchr(rel, '/');
    if (slash) { /* its folder, if now empty (fails harmlessly otherwise) */
      char folder[512];
      snprintf(folder, sizeof folder, "%.*s", (int)(slash - rel), rel);
      if (open_parent(dir, folder, &pfd, &base) == 0) {
        if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
          unlinkat(pfd, base, AT_REMOVEDIR);
        close(pfd);
      }
    }
  }
}

/* Whether dir holds nothing (but, where `but` is not NULL, that name). */
static bool dir_is_empty_but(const char *dir, const char *but) {
  bool empty = true;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && (!but || strcmp(e->d_name, but)))
      empty = false;
  if (d) closedir(d);
  return empty;
}

static bool dir_is_empty(const char *dir) {
  return dir_is_empty_but(dir, NULL);
}

int mlo_syn_stamp_write(const char *dir, const char *preset, double scale, uint64_t bytes,
                        bool complete, cJSON *files, char *err, size_t errlen) {
  cJSON *stamp = cJSON_CreateObject();
  cJSON_AddStringToObject(stamp, "generator", "mlo synth");
  cJSON_AddNumberToObject(stamp, "layout", SYNTH_LAYOUT);
  cJSON_AddNumberToObject(stamp, "version", 1);
  cJSON_AddStringToObject(stamp, "preset", preset);
  cJSON_AddNumberToObject(stamp, "scale", scale);
  cJSON_AddNumberToObject(stamp, "tensor_bytes", (double)bytes);
  cJSON_AddBoolToObject(stamp, "complete", complete);
  cJSON_AddItemToObject(stamp, "files", files);
  int rc = mlo_syn_write_json(dir, STAMP_NAME, stamp, true, err, errlen);
  cJSON_Delete(stamp);
  return rc;
}

void mlo_syn_stamp_undo(const char *dir, bool created) {
  cJSON *stamp = read_stamp(dir);
  if (stamp) {
    remove_listed(dir, stamp);
    cJSON_Delete(stamp);
    /* the stamp goes only with the rest: where something it lists could not
     * be removed (a link planted there), it stays, incomplete, so that the
     * next run knows the folder as its own and cleans it */
    char *path = dir_is_empty_but(dir, STAMP_NAME) ? mlo_path_join(dir, STAMP_NAME) : NULL;
    if (path) unlink(path);
    free(path);
  }
  if (created) rmdir(dir); /* only if nothing else is left in it */
}

int mlo_syn_stamp_prepare(const char *dir, const char *preset, double scale, bool *cached,
                          char *err, size_t errlen) {
  *cached = false;
  int rc = mlo_syn_make_dir(dir, err, errlen);
  if (rc != MLO_OK) return rc;
  cJSON *stamp = read_stamp(dir);
  if (!stamp) {
    return dir_is_empty(dir) ? MLO_OK
                             : mlo_errf(err, errlen, MLO_EEXIST,
                                        "%s: folder is not empty and was not written by mlo synth "
                                        "(no " STAMP_NAME "); refusing to write into it",
                                        dir);
  }
  if (stamp_matches(stamp, dir, preset, scale))
    *cached = true;
  else
    remove_listed(dir, stamp);
  cJSON_Delete(stamp);
  return MLO_OK;
}
