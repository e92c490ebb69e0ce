/*
 * st_writer.c — writes safetensors files that the reference loader reads.
 *
 * Used by the checkpoint synthesizer (generated pipelines of many GiB) and
 * by tests.  Tensors are laid out in the order added; the JSON header is
 * padded with spaces so the data section starts on an 8-byte boundary, as
 * the reference writer does.  Generated tensors are produced in bounded
 * chunks so that no tensor is ever held whole in memory.  The file appears
 * atomically (base/outfile.c: a temporary beside it, fsync, rename; never
 * over a device or a FIFO), so
 * a failure never leaves a partial checkpoint behind.
 */
#include "base/nameset.h"
#include "base/sysio.h"
#include "format/safetensors.h"

#include "base/log.h" /* mlo_errf */

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_CHUNK (4u << 20) /* bytes generated per fill call */

typedef struct {
  char *name;
  mlo_dtype dtype;
  int ndim;
  int64_t shape[MLO_MAX_DIMS];
  uint64_t nbytes;
  const void *data; /* borrowed or == owned */
  void *owned;
  mlo_st_fill_fn fill;
  void *user;
} w_tensor;

struct mlo_st_writer {
  w_tensor *t;
  size_t count, cap;
  mlo_nameset names; /* a repeated name is refused in O(1) */
  mlo_st_meta *meta;
  size_t meta_count, meta_cap;
};

int mlo_st_writer_create(mlo_st_writer **out) {
  if (!out) return MLO_EINVAL;
  *out = mlo_calloc(1, sizeof **out);
  return *out ? MLO_OK : MLO_ENOMEM;
}

void mlo_st_writer_free(mlo_st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->count; i++) {
    free(w->t[i].name);
    free(w->t[i].owned);
  }
  for (size_t i = 0; i < w->meta_count; i++) {
    free(w->meta[i].key);
    free(w->meta[i].value);
  }
  free(w->t);
  mlo_nameset_free(&w->names);
  free(w->meta);
  free(w);
}

/* Validates name, dtype and shape and computes the byte size. */
static bool valid_text(const char *s) {
  size_t n = strlen(s);
  return mlo_st_utf8_bad_offset((const uint8_t *)s, n) == n;
}

static int check_new(const mlo_st_writer *w, const char *name, mlo_dtype dtype, int ndim,
                     const int64_t *shape, uint64_t *nbytes) {
  if (!w || !name || strcmp(name, "__metadata__") == 0 || !mlo_dtype_name(dtype) ||
      dtype >= MLO_DTYPE_FIRST_BLOCK)
    return MLO_EINVAL;
  if (!valid_text(name)) return MLO_EINVAL;
  if (ndim < 0 || ndim > MLO_MAX_DIMS || (ndim > 0 && !shape)) return MLO_EINVAL;
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return MLO_EINVAL;
    if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel)) return MLO_EINVAL;
  }
  if (mlo_dtype_nbytes(dtype, numel, nbytes) != MLO_OK) return MLO_EINVAL;
  if (mlo_nameset_get(&w->names, name, NULL)) return MLO_EEXIST;
  return MLO_OK;
}

/* Appends a slot with the common fields filled; the caller sets the data. */
static int push(mlo_st_writer *w, const char *name, mlo_dtype dtype, int ndim, const int64_t *shape,
                uint64_t nbytes, w_tensor **out) {
  if (w->count == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 16;
    w_tensor *t = mlo_realloc(w->t, cap * sizeof *t);
    if (!t) return MLO_ENOMEM;
    w->t = t;
    w->cap = cap;
  }
  if (mlo_nameset_reserve(&w->names, 1)) return MLO_ENOMEM;
  w_tensor *t = &w->t[w->count];
  memset(t, 0, sizeof *t);
  t->name = mlo_strdup(name);
  if (!t->name) return MLO_ENOMEM;
  mlo_nameset_put(&w->names, t->name, w->count);
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->nbytes = nbytes;
  *out = t;
  return MLO_OK;
}

int mlo_st_writer_add(mlo_st_writer *w, const char *name, mlo_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, uint64_t nbytes, bool copy) {
  uint64_t need;
  int rc = check_new(w, name, dtype, ndim, shape, &need);
  if (rc) return rc;
  if (need != nbytes || (nbytes && !data) || nbytes > SIZE_MAX) return MLO_EINVAL;
  void *owned = NULL;
  if (copy && nbytes) {
    owned = mlo_malloc((size_t)nbytes);
    if (!owned) return MLO_ENOMEM;
    memcpy(owned, data, (size_t)nbytes);
  }
  w_tensor *t;
  rc = push(w, name, dtype, ndim, shape, nbytes, &t);
  if (rc) {
    free(owned);
    return rc;
  }
  t->owned = owned;
  t->data = owned ? owned : data;
  w->count++;
  return MLO_OK;
}

int mlo_st_writer_add_generated(mlo_st_writer *w, const char *name, mlo_dtype dtype, int ndim,
                                const int64_t *shape, mlo_st_fill_fn fill, void *user) {
  uint64_t need;
  if (!fill) return MLO_EINVAL;
  int rc = check_new(w, name, dtype, ndim, shape, &need);
  if (rc) return rc;
  w_tensor *t;
  rc = push(w, name, dtype, ndim, shape, need, &t);
  if (rc) return rc;
  t->fill = fill;
  t->user = user;
  w->count++;
  return MLO_OK;
}

int mlo_st_writer_set_metadata(mlo_st_writer *w, const char *key, const char *value) {
  if (!w || !key || !value || !valid_text(key) || !valid_text(value)) return MLO_EINVAL;
  char *v = mlo_strdup(value);
  if (!v) return MLO_ENOMEM;
  for (size_t i = 0; i < w->meta_count; i++) {
    if (strcmp(w->meta[i].key, key) == 0) {
      free(w->meta[i].value);
      w->meta[i].value = v;
      return MLO_OK;
    }
  }
  if (w->meta_count == w->meta_cap) {
    size_t cap = w->meta_cap ? w->meta_cap * 2 : 8;
    mlo_st_meta *m = mlo_realloc(w->meta, cap * sizeof *m);
    if (!m) goto fail_free_value;
    w->meta = m;
    w->meta_cap = cap;
  }
  char *k = mlo_strdup(key);
  if (!k) goto fail_free_value;
  w->meta[w->meta_count].key = k;
  w->meta[w->meta_count].value = v;
  w->meta_count++;
  return MLO_OK;
fail_free_value:
  free(v);
  return MLO_ENOMEM;
}

/* Integers go in as raw text: cJSON would print large doubles as 1e+16,
 * which the reference loader (serde, integers only) refuses. */
static bool add_uint(cJSON *array, uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  cJSON *n = cJSON_CreateRaw(buf);
  return n && cJSON_AddItemToArray(array, n);
}

static bool add_entry(cJSON *root, const w_tensor *t, uint64_t begin) {
  cJSON *e = cJSON_CreateObject();
  if (!e || !cJSON_AddItemToObject(root, t->name, e)) {
    cJSON_Delete(e);
    return false;
  }
  cJSON *shape = cJSON_AddArrayToObject(e, "shape");
  cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
  if (!cJSON_AddStringToObject(e, "dtype", mlo_dtype_name(t->dtype)) || !shape || !off)
    return false;
  for (int i = 0; i < t->ndim; i++)
    if (!add_uint(shape, (uint64_t)t->shape[i])) return false;
  return add_uint(off, begin) && add_uint(off, begin + t->nbytes);
}

/* Builds the header text, space-padded to a multiple of 8 bytes. */
static int build_header(const mlo_st_writer *w, char **out, size_t *len) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return MLO_ENOMEM;
  int rc = MLO_ENOMEM;
  if (w->meta_count) {
    cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
    if (!m) goto free_root;
    for (size_t i = 0; i < w->meta_count; i++)
      if (!cJSON_AddStringToObject(m, w->meta[i].key, w->meta[i].value)) goto free_root;
  }
  uint64_t pos = 0;
  for (size_t i = 0; i < w->count; i++) {
    if (!add_entry(root, &w->t[i], pos)) goto free_root;
    if (__builtin_add_overflow(pos, w->t[i].nbytes, &pos)) {
      rc = MLO_EINVAL;
      goto free_root;
    }
  }
  char *text = cJSON_PrintUnformatted(root);
  if (!text) goto free_root;
  size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
  char *buf = mlo_realloc(text, padded);
  if (!buf) {
    free(text);
    goto free_root;
  }
  memset(buf + n, ' ', padded - n);
  *out = buf;
  *len = padded;
  rc = MLO_OK;
free_root:
  cJSON_Delete(root);
  return rc;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Writes one generated tensor chunk by chunk through buf. */
static int write_generated(int fd, const w_tensor *t, void *buf) {
  for (uint64_t off = 0; off < t->nbytes;) {
    size_t n = t->nbytes - off < ST_CHUNK ? (size_t)(t->nbytes - off) : ST_CHUNK;
    t->fill(buf, off, n, t->user);
    if (write_all(fd, buf, n)) return -1;
    off += n;
  }
  return 0;
}

static int write_body(const mlo_st_writer *w, int fd, const char *hdr, size_t hlen) {
  uint8_t prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  if (write_all(fd, prefix, 8) || write_all(fd, hdr, hlen)) return -1;
  void *chunk = NULL;
  int rc = 0;
  for (size_t i = 0; i < w->count && rc == 0; i++) {
    const w_tensor *t = &w->t[i];
    if (!t->fill) {
      rc = write_all(fd, t->data, (size_t)t->nbytes);
      continue;
    }
    if (!chunk && !(chunk = mlo_malloc(ST_CHUNK))) {
      errno = ENOMEM;
      rc = -1;
      break;
    }
    rc = write_generated(fd, t, chunk);
  }
  free(chunk);
  return rc;
}

int mlo_st_writer_write(mlo_st_writer *w, const char *path, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!w || !path) return mlo_errf(err, errlen, MLO_EINVAL, "invalid arguments");
  char *hdr = NULL;
  size_t hlen = 0;
  int rc = build_header(w, &hdr, &hlen);
  if (rc)
    return mlo_errf(err, errlen, rc, "%s: cannot build the header: %s", path,
                    rc == MLO_ENOMEM ? "out of memory" : "data larger than 2^64 bytes");
  mlo_outfile out;
  rc = mlo_out_begin(&out, path, err, errlen);
  if (rc) goto free_header;
  if (write_body(w, out.fd, hdr, hlen) != 0) {
    rc = mlo_errf(err, errlen, errno == ENOMEM ? MLO_ENOMEM : MLO_EIO, "%s: cannot write: %s", path,
                  strerror(errno));
    mlo_out_abort(&out);
    goto free_header;
  }
  rc = mlo_out_commit(&out, err, errlen);
free_header:
  free(hdr);
  return rc;
}
