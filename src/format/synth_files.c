/*
 * synth_files.c — the generator's dealings with the file system: files
 * written atomically (temporary name, then rename), and the stamp
 * `.mlo-synth.json` that says which run wrote a directory, which files it
 * wrote and whether it finished.  The stamp is what lets `mlo demo` reuse a
 * generated pipeline, lets a changed run remove exactly the earlier run's
 * files (no strays left for the loader to reject), and keeps the generator
 * off folders it did not make.
 */
#include "format/synth.h"

#include "format/index.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STAMP_NAME ".mlo-synth.json"

/* ---- writing files atomically -------------------------------------------------------------- */

int syn_make_dir(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (mkdir(path, 0755) == 0 || (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
    return MLO_OK;
  return mlo_errf(err, errlen, MLO_EIO, "%s: cannot create folder: %s", path, strerror(errno));
}

/* Writes text to dir/rel through a temporary file renamed into place. */
int syn_write_text(const char *dir, const char *rel, const char *text, char *err, size_t errlen) {
  char *path = mlo_path_join(dir, rel);
  if (!path) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", dir);
  size_t len = strlen(path) + 16;
  char *tmp = malloc(len);
  int rc = MLO_OK, fd = -1;
  if (!tmp) {
    rc = mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", path);
    goto out_free_path;
  }
  snprintf(tmp, len, "%s.tmp.XXXXXX", path);
  if ((fd = mkstemp(tmp)) < 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot create: %s", path, strerror(errno));
    goto out_free_tmp;
  }
  size_t n = strlen(text);
  bool ok = fchmod(fd, 0644) == 0 && write(fd, text, n) == (ssize_t)n;
  ok = (close(fd) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot write: %s", path, strerror(errno));
    unlink(tmp);
  }
out_free_tmp:
  free(tmp);
out_free_path:
  free(path);
  return rc;
}

int syn_write_json(const char *dir, const char *rel, cJSON *json, bool pretty, char *err,
                   size_t errlen) {
  char *text = json ? (pretty ? cJSON_Print(json) : cJSON_PrintUnformatted(json)) : NULL;
  int rc = text ? syn_write_text(dir, rel, text, err, errlen)
                : mlo_errf(err, errlen, MLO_ENOMEM, "%s/%s: out of memory", dir, rel);
  free(text);
  return rc;
}

/* ---- the stamp: what was written, and whether it finished ---------------- */

static cJSON *read_stamp(const char *dir) {
  char *path = mlo_path_join(dir, STAMP_NAME);
  FILE *f = path ? fopen(path, "rb") : NULL;
  free(path);
  if (!f) return NULL;
  size_t cap = 1u << 20;
  char *buf = malloc(cap + 1);
  size_t n = buf ? fread(buf, 1, cap, f) : 0;
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  cJSON *stamp = cJSON_Parse(buf);
  free(buf);
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
  if (!cJSON_IsString(p) || strcmp(p->valuestring, preset) || !cJSON_IsNumber(s) ||
      fabs(s->valuedouble - scale) > 1e-12 * scale || !cJSON_IsTrue(done) || !cJSON_IsArray(files))
    return false;
  cJSON_ArrayForEach(it, files) { /* a deleted shard must not pass for a cache hit */
    if (!cJSON_IsString(it) || !safe_relative(it->valuestring)) return false;
    char *path = mlo_path_join(dir, it->valuestring);
    struct stat st;
    bool present = path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
    free(path);
    if (!present) return false;
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

/* Removes the files an earlier run listed, and then their folders if empty. */
static void remove_listed(const char *dir, const cJSON *stamp) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(stamp, "files"), *it;
  cJSON_ArrayForEach(it, files) {
    if (!cJSON_IsString(it) || !safe_relative(it->valuestring)) continue;
    char *path = mlo_path_join(dir, it->valuestring);
    if (path) unlink(path);
    char *slash = path ? strrchr(path, '/') : NULL;
    if (slash && strchr(it->valuestring, '/')) {
      *slash = '\0';
      rmdir(path); /* fails harmlessly while other files remain */
    }
    free(path);
  }
}

static bool dir_is_empty(const char *dir) {
  bool empty = true;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
  if (d) closedir(d);
  return empty;
}

int syn_stamp_write(const char *dir, const char *preset, double scale, uint64_t bytes,
                    bool complete, cJSON *files, char *err, size_t errlen) {
  cJSON *stamp = cJSON_CreateObject();
  cJSON_AddStringToObject(stamp, "generator", "mlo synth");
  cJSON_AddNumberToObject(stamp, "version", 1);
  cJSON_AddStringToObject(stamp, "preset", preset);
  cJSON_AddNumberToObject(stamp, "scale", scale);
  cJSON_AddNumberToObject(stamp, "tensor_bytes", (double)bytes);
  cJSON_AddBoolToObject(stamp, "complete", complete);
  cJSON_AddItemToObject(stamp, "files", files);
  int rc = syn_write_json(dir, STAMP_NAME, stamp, true, err, errlen);
  cJSON_Delete(stamp);
  return rc;
}

int syn_stamp_prepare(const char *dir, const char *preset, double scale, bool *cached, char *err,
                      size_t errlen) {
  *cached = false;
  int rc = syn_make_dir(dir, err, errlen);
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
