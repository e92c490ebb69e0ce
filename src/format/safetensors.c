/*
 * safetensors.c — the safetensors header reader.
 *
 * Checkpoints come from anywhere, so the header is hostile input
 * (docs/formats.md).  It is validated completely before anything is
 * exposed: the length prefix against a cap and the file size, the bytes as
 * UTF-8 JSON, every entry's types, dtype, shape and byte size with
 * overflow-checked arithmetic, and the offsets as one contiguous, sorted,
 * non-overlapping cover of the data section that ends exactly at the end of
 * the file.  Each violation gets its own message naming the file and the
 * tensor.  The data section itself is never read here: the core reads each
 * tensor's range straight into its slab later.
 */
#include "format/safetensors.h"

#include "base/utf8.h"

#include "base/log.h" /* MLO_PRINTF only */
#include "base/sysio.h"
#include "format/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The public struct plus a name index for mlo_st_find and duplicates. */
typedef struct {
  mlo_st_file pub;
  mlo_st_tensor **by_name; /* sorted by strcmp of name */
} st_file_impl;

/* Where messages go and which file they name. */
typedef struct {
  const char *path;
  char *err;
  size_t errlen;
} st_ctx;

/* JSON numbers are doubles in cJSON; integers above 2^53 cannot be told
 * apart, so anything larger is refused (that is 9 PB: no real file). */
#define ST_MAX_EXACT 9007199254740992.0

static int st_fail(const st_ctx *c, int code, const char *tensor, const char *fmt, ...)
    MLO_PRINTF(4, 5);

static int st_fail(const st_ctx *c, int code, const char *tensor, const char *fmt, ...) {
  if (!c->err || c->errlen == 0) return code;
  int n = tensor ? snprintf(c->err, c->errlen, "%s: tensor '%s': ", c->path, tensor)
                 : snprintf(c->err, c->errlen, "%s: ", c->path);
  if (n < 0 || (size_t)n >= c->errlen) return code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return code;
}

static uint64_t read_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Checks the 8-byte length prefix against the cap and the file size. */
static int check_header_len(const st_ctx *c, uint64_t file_size, uint64_t hlen) {
  if (hlen > MLO_ST_HEADER_CAP) {
    /* a length of eight printable bytes is text: most often a JSON file
     * (model_index.json, config.json) given where a checkpoint goes */
    char text[9];
    bool printable = true;
    for (int i = 0; i < 8; i++) {
      unsigned char b = (unsigned char)(hlen >> (8 * i));
      printable = printable && (b == '\n' || b == '\r' || b == '\t' || (b >= 0x20 && b < 0x7f));
      text[i] = b == '\n' || b == '\r' || b == '\t' ? ' ' : (char)b;
    }
    text[8] = '\0';
    if (printable)
      return st_fail(c, MLO_EFORMAT, NULL,
                     "not a safetensors file: it starts with text ('%s'), not a header length%s",
                     text,
                     text[0] == '{' || text[0] == '['
                         ? " (a JSON file: for a diffusers pipeline give its folder, the one "
                           "holding model_index.json)"
                         : "");
    return st_fail(c, MLO_EFORMAT, NULL, "header length %llu is over the cap of %u bytes",
                   (unsigned long long)hlen, MLO_ST_HEADER_CAP);
  }
  if (hlen > file_size - 8)
    return st_fail(c, MLO_EFORMAT, NULL,
                   "header length %llu runs past the end of the file (%llu bytes)",
                   (unsigned long long)hlen, (unsigned long long)file_size);
  return MLO_OK;
}

/* Returns the offset of the first byte that breaks UTF-8, or len if none.
 * NUL is refused too: C strings made from the header would cut there. */
size_t mlo_st_utf8_bad_offset(const uint8_t *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    size_t n = mlo_utf8_seq_len(s + i, len - i);
    if (!n) return i;
    i += n;
  }
  return len;
}

/* Formats a shape as "[2, 3]" for messages. */
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
  size_t pos = 0;
  pos += (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && pos < len; i++)
    pos += (size_t)snprintf(buf + pos, len - pos, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (pos < len) snprintf(buf + pos, len - pos, "]");
  return buf;
}

/* A JSON number that must be a whole number in [0, 2^53]; `what` names it. */
static int get_uint(const st_ctx *c, const char *tensor, const cJSON *item, const char *what,
                    uint64_t *out) {
  if (!cJSON_IsNumber(item)) return st_fail(c, MLO_EFORMAT, tensor, "%s is not a number", what);
  double v = item->valuedouble;
  if (!isfinite(v) || v != floor(v))
    return st_fail(c, MLO_EFORMAT, tensor, "%s = %g is not a whole number", what, v);
  if (v < 0) return st_fail(c, MLO_EFORMAT, tensor, "%s = %.0f is negative", what, v);
  if (v > ST_MAX_EXACT)
    return st_fail(c, MLO_EFORMAT, tensor, "%s = %g is too large (over 2^53)", what, v);
  *out = (uint64_t)v;
  return MLO_OK;
}

static int parse_shape(const st_ctx *c, const cJSON *entry, mlo_st_tensor *t) {
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
  if (!shape) return st_fail(c, MLO_EFORMAT, t->name, "no \"shape\"");
  if (!cJSON_IsArray(shape)) return st_fail(c, MLO_EFORMAT, t->name, "\"shape\" is not an array");
  int ndim = cJSON_GetArraySize(shape);
  if (ndim > MLO_MAX_DIMS)
    return st_fail(c, MLO_EFORMAT, t->name, "shape has %d dims, more than MLO_MAX_DIMS (%d)", ndim,
                   MLO_MAX_DIMS);
  int i = 0;
  const cJSON *dim;
  cJSON_ArrayForEach(dim, shape) {
    char what[32];
    snprintf(what, sizeof what, "shape[%d]", i);
    if (cJSON_IsNumber(dim) && dim->valuedouble < 0)
      return st_fail(c, MLO_EFORMAT, t->name, "negative dim %g in shape[%d]", dim->valuedouble, i);
    uint64_t v;
    int rc = get_uint(c, t->name, dim, what, &v);
    if (rc) return rc;
    t->shape[i++] = (int64_t)v;
  }
  t->ndim = ndim;
  return MLO_OK;
}

static int parse_offsets(const st_ctx *c, const cJSON *entry, mlo_st_tensor *t) {
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
  if (!off) return st_fail(c, MLO_EFORMAT, t->name, "no \"data_offsets\"");
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
    return st_fail(c, MLO_EFORMAT, t->name, "\"data_offsets\" is not an array of two numbers");
  int rc = get_uint(c, t->name, cJSON_GetArrayItem(off, 0), "data_offsets[0]", &t->begin);
  if (!rc) rc = get_uint(c, t->name, cJSON_GetArrayItem(off, 1), "data_offsets[1]", &t->end);
  if (rc) return rc;
  if (t->end < t->begin)
    return st_fail(c, MLO_EFORMAT, t->name, "data_offsets [%llu, %llu) end before they begin",
                   (unsigned long long)t->begin, (unsigned long long)t->end);
  return MLO_OK;
}

/* Checks that the offsets hold exactly shape x dtype bytes inside the data. */
static int check_size(const st_ctx *c, const mlo_st_tensor *t, uint64_t data_len) {
  char sh[MLO_MAX_DIMS * 24 + 4];
  const char *dt = mlo_dtype_name(t->dtype);
  uint64_t numel = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
      return st_fail(c, MLO_EFORMAT, t->name, "shape %s has more than 2^64 elements",
                     shape_str(t->shape, t->ndim, sh, sizeof sh));
  }
  uint64_t need;
  int rc = mlo_dtype_nbytes(t->dtype, numel, &need);
  if (rc == MLO_EINVAL)
    return st_fail(c, MLO_EFORMAT, t->name, "shape %s of %s is not a whole number of bytes",
                   shape_str(t->shape, t->ndim, sh, sizeof sh), dt);
  if (rc)
    return st_fail(c, MLO_EFORMAT, t->name, "shape %s of %s needs more than 2^64 bytes",
                   shape_str(t->shape, t->ndim, sh, sizeof sh), dt);
  if (t->end - t->begin != need)
    return st_fail(c, MLO_EFORMAT, t->name,
                   "data_offsets [%llu, %llu) but shape %s of %s needs %llu bytes",
                   (unsigned long long)t->begin, (unsigned long long)t->end,
                   shape_str(t->shape, t->ndim, sh, sizeof sh), dt, (unsigned long long)need);
  if (t->end > data_len)
    return st_fail(c, MLO_EFORMAT, t->name,
                   "data_offsets [%llu, %llu) run past the end of the data section (%llu bytes)",
                   (unsigned long long)t->begin, (unsigned long long)t->end,
                   (unsigned long long)data_len);
  return MLO_OK;
}

/* One tensor entry: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}.
 * Other keys are ignored, as the reference implementation does. */
static int parse_entry(const st_ctx *c, const cJSON *entry, mlo_st_tensor *t, uint64_t data_len) {
  if (!cJSON_IsObject(entry)) return st_fail(c, MLO_EFORMAT, t->name, "entry is not an object");
  static const char *const fields[] = {"dtype", "shape", "data_offsets"};
  for (int k = 0; k < 3; k++) { /* serde: "duplicate field" (unknown ones are ignored) */
    int seen = 0;
    for (const cJSON *f = entry->child; f; f = f->next) seen += !strcmp(f->string, fields[k]);
    if (seen > 1) return st_fail(c, MLO_EFORMAT, t->name, "field \"%s\" given twice", fields[k]);
  }
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
  if (!dtype) return st_fail(c, MLO_EFORMAT, t->name, "no \"dtype\"");
  if (!cJSON_IsString(dtype)) return st_fail(c, MLO_EFORMAT, t->name, "\"dtype\" is not a string");
  if (mlo_dtype_from_name(dtype->valuestring, &t->dtype) != MLO_OK ||
      t->dtype >= MLO_DTYPE_FIRST_BLOCK) /* GGML's block types are not safetensors' */
    return st_fail(c, MLO_EFORMAT, t->name, "unknown dtype '%.40s'", dtype->valuestring);
  int rc = parse_shape(c, entry, t);
  if (!rc) rc = parse_offsets(c, entry, t);
  if (!rc) rc = check_size(c, t, data_len);
  return rc;
}

/* "__metadata__": a string-to-string map (null means none). */
static int parse_meta(const st_ctx *c, const cJSON *obj, mlo_st_file *f) {
  if (cJSON_IsNull(obj)) return MLO_OK;
  if (!cJSON_IsObject(obj)) return st_fail(c, MLO_EFORMAT, NULL, "__metadata__ is not an object");
  size_t n = (size_t)cJSON_GetArraySize(obj);
  f->meta = mlo_calloc(n ? n : 1, sizeof *f->meta);
  if (!f->meta) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
  const cJSON *kv;
  cJSON_ArrayForEach(kv, obj) {
    if (!cJSON_IsString(kv))
      return st_fail(c, MLO_EFORMAT, NULL, "__metadata__ value of '%.80s' is not a string",
                     kv->string);
    mlo_st_meta *m = &f->meta[f->meta_count];
    m->key = mlo_strdup(kv->string);
    m->value = mlo_strdup(kv->valuestring);
    f->meta_count++; /* counted before the check so close frees a half pair */
    if (!m->key || !m->value) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
  }
  return MLO_OK;
}

static int cmp_meta_key(const void *a, const void *b) {
  return strcmp((*(mlo_st_meta *const *)a)->key, (*(mlo_st_meta *const *)b)->key);
}

/* cJSON keeps both copies of a repeated key; which one counts would be a
 * guess, so a repeated metadata key is an error (sorted: no n^2 on a
 * hostile header). */
static int check_meta_unique(const st_ctx *c, const mlo_st_file *f) {
  if (f->meta_count < 2) return MLO_OK;
  mlo_st_meta **idx = mlo_malloc(f->meta_count * sizeof *idx);
  if (!idx) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
  for (size_t i = 0; i < f->meta_count; i++) idx[i] = &f->meta[i];
  qsort(idx, f->meta_count, sizeof *idx, cmp_meta_key);
  int rc = MLO_OK;
  for (size_t i = 1; i < f->meta_count && !rc; i++)
    if (strcmp(idx[i - 1]->key, idx[i]->key) == 0)
      rc = st_fail(c, MLO_EFORMAT, NULL, "duplicate __metadata__ key '%.80s'", idx[i]->key);
  free(idx);
  return rc;
}

static int cmp_name(const void *a, const void *b) {
  const mlo_st_tensor *x = *(mlo_st_tensor *const *)a, *y = *(mlo_st_tensor *const *)b;
  return strcmp(x->name, y->name);
}

static int cmp_offset(const void *a, const void *b) {
  const mlo_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Sorted by begin, the tensors must tile [0, data_len) exactly. */
static int check_layout(const st_ctx *c, const mlo_st_file *f, uint64_t data_len) {
  uint64_t pos = 0;
  const char *prev = NULL;
  for (size_t i = 0; i < f->count; i++) {
    const mlo_st_tensor *t = &f->tensors[i];
    if (t->begin > pos) {
      if (!prev)
        return st_fail(c, MLO_EFORMAT, t->name,
                       "gap: the data section starts with %llu unused bytes",
                       (unsigned long long)t->begin);
      return st_fail(c, MLO_EFORMAT, t->name, "gap of %llu bytes after tensor '%s' (ends at %llu)",
                     (unsigned long long)(t->begin - pos), prev, (unsigned long long)pos);
    }
    if (t->begin < pos)
      return st_fail(
          c, MLO_EFORMAT, t->name, "data_offsets [%llu, %llu) overlap tensor '%s' (ends at %llu)",
          (unsigned long long)t->begin, (unsigned long long)t->end, prev, (unsigned long long)pos);
    pos = t->end;
    prev = t->name;
  }
  if (pos != data_len)
    return st_fail(c, MLO_EFORMAT, NULL, "%llu trailing bytes after the last tensor's data",
                   (unsigned long long)(data_len - pos));
  return MLO_OK;
}

/* Counts tensors and __metadata__ keys, parses each child. */
static int parse_root(const st_ctx *c, const cJSON *root, mlo_st_file *f, uint64_t data_len) {
  size_t n = (size_t)cJSON_GetArraySize(root);
  f->tensors = mlo_calloc(n ? n : 1, sizeof *f->tensors);
  if (!f->tensors) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
  int seen_meta = 0;
  const cJSON *child;
  cJSON_ArrayForEach(child, root) {
    if (strcmp(child->string, "__metadata__") == 0) {
      if (seen_meta++) return st_fail(c, MLO_EFORMAT, NULL, "duplicate key \"__metadata__\"");
      int rc = parse_meta(c, child, f);
      if (!rc) rc = check_meta_unique(c, f);
      if (rc) return rc;
      continue;
    }
    if (!child->string[0]) /* stricter than the reference: docs/formats.md */
      return st_fail(c, MLO_EFORMAT, NULL, "a tensor has an empty name");
    mlo_st_tensor *t = &f->tensors[f->count];
    t->name = mlo_strdup(child->string);
    if (!t->name) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
    f->count++;
    int rc = parse_entry(c, child, t, data_len);
    if (rc) return rc;
  }
  return MLO_OK;
}

/* Sorts the name index and refuses duplicate names (cJSON keeps both). */
static int index_names(const st_ctx *c, st_file_impl *impl) {
  mlo_st_file *f = &impl->pub;
  impl->by_name = mlo_malloc((f->count ? f->count : 1) * sizeof *impl->by_name);
  if (!impl->by_name) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
  for (size_t i = 0; i < f->count; i++) impl->by_name[i] = &f->tensors[i];
  qsort(impl->by_name, f->count, sizeof *impl->by_name, cmp_name);
  for (size_t i = 1; i < f->count; i++)
    if (strcmp(impl->by_name[i - 1]->name, impl->by_name[i]->name) == 0)
      return st_fail(c, MLO_EFORMAT, impl->by_name[i]->name, "duplicate tensor name");
  return MLO_OK;
}

/* Parses the JSON text as the reference does (format/json.h): UTF-8 first,
 * then the strict grammar, integers where serde wants usize. */
static int parse_json(const st_ctx *c, const uint8_t *hdr, size_t hlen, cJSON **out) {
  size_t bad = mlo_st_utf8_bad_offset(hdr, hlen);
  if (bad < hlen)
    return st_fail(c, MLO_EFORMAT, NULL, "header is not valid UTF-8 (byte 0x%02x at %zu)", hdr[bad],
                   bad);
  unsigned flags = MLO_JSON_ST_INTEGERS | MLO_JSON_KEEP_DUPLICATES;
  size_t at = 0;
  char why[256];
  if (mlo_json_check((const char *)hdr, hlen, flags, &at, why, sizeof why)) {
    if (!strncmp(why, "tensor '", 8)) /* "tensor 'a': ...": the usual prefix */
      return st_fail(c, MLO_EFORMAT, NULL, "%s (header byte %zu)", why, at);
    return st_fail(c, MLO_EFORMAT, NULL, "header is not valid JSON at byte %zu: %s", at, why);
  }
  char msg[256];
  cJSON *root = NULL;
  int rc = mlo_json_parse("header", NULL, (const char *)hdr, hlen, flags, &root, msg, sizeof msg);
  if (rc) return st_fail(c, rc, NULL, "%s", msg);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return st_fail(c, MLO_EFORMAT, NULL, "header JSON is not an object");
  }
  *out = root;
  return MLO_OK;
}

/* Validates a header of hlen bytes taken from a file of file_size bytes. */
static int st_build(const st_ctx *c, const uint8_t *hdr, uint64_t hlen, uint64_t file_size,
                    mlo_st_file **out) {
  st_file_impl *impl = mlo_calloc(1, sizeof *impl);
  if (!impl) return st_fail(c, MLO_ENOMEM, NULL, "out of memory");
  mlo_st_file *f = &impl->pub;
  cJSON *root = NULL;
  int rc = MLO_ENOMEM;
  f->path = mlo_strdup(c->path);
  if (!f->path) {
    rc = st_fail(c, MLO_ENOMEM, NULL, "out of memory");
    goto fail_free_file;
  }
  f->file_size = file_size;
  f->data_start = 8 + hlen;
  uint64_t data_len = file_size - f->data_start;
  rc = parse_json(c, hdr, (size_t)hlen, &root);
  if (rc) goto fail_free_file;
  rc = parse_root(c, root, f, data_len);
  if (!rc) rc = index_names(c, impl);
  if (rc) goto fail_free_json;
  qsort(f->tensors, f->count, sizeof *f->tensors, cmp_offset);
  /* the name index points into tensors: rebuild it after the move */
  for (size_t i = 0; i < f->count; i++) impl->by_name[i] = &f->tensors[i];
  qsort(impl->by_name, f->count, sizeof *impl->by_name, cmp_name);
  rc = check_layout(c, f, data_len);
  if (rc) goto fail_free_json;
  for (size_t i = 0; i < f->count; i++)
    f->tensors[i].file_offset = f->data_start + f->tensors[i].begin;
  cJSON_Delete(root);
  *out = f;
  return MLO_OK;
fail_free_json:
  cJSON_Delete(root);
fail_free_file:
  mlo_st_close(f);
  return rc;
}

int mlo_st_parse(const char *name, const uint8_t *bytes, size_t len, mlo_st_file **out, char *err,
                 size_t errlen) {
  st_ctx c = {name ? name : "(memory)", err, errlen};
  if (err && errlen) err[0] = '\0';
  if (!out || (!bytes && len)) return st_fail(&c, MLO_EINVAL, NULL, "invalid arguments");
  *out = NULL;
  if (len < 8)
    return st_fail(&c, MLO_EFORMAT, NULL,
                   "truncated: %zu bytes, less than the 8-byte header length", len);
  uint64_t hlen = read_le64(bytes);
  int rc = check_header_len(&c, len, hlen);
  if (rc) return rc;
  /* cJSON gets a NUL-terminated copy: the caller's bytes end exactly at
   * len, and a parser bug must not be able to read past them */
  uint8_t *hdr = mlo_malloc((size_t)hlen + 1);
  if (!hdr) return st_fail(&c, MLO_ENOMEM, NULL, "out of memory");
  memcpy(hdr, bytes + 8, (size_t)hlen);
  hdr[hlen] = '\0';
  rc = st_build(&c, hdr, hlen, len, out);
  free(hdr);
  return rc;
}

/* pread until len bytes arrive; a short file is an error of its own. */
static int pread_full(const st_ctx *c, int fd, void *buf, size_t len, uint64_t off) {
  if (mlo_pread_full(fd, buf, len, off) == 0) return MLO_OK;
  if (errno) return st_fail(c, MLO_EIO, NULL, "read failed: %s", strerror(errno));
  return st_fail(c, MLO_EIO, NULL, "file shrank while reading the header");
}

int mlo_st_open(const char *path, mlo_st_file **out, char *err, size_t errlen) {
  st_ctx c = {path ? path : "(null)", err, errlen};
  if (err && errlen) err[0] = '\0';
  if (!path || !out) return st_fail(&c, MLO_EINVAL, NULL, "invalid arguments");
  *out = NULL;
  int fd;
  mlo_file_id id;
  char why[512];
  int rc = mlo_open_regular(path, &fd, &id, why, sizeof why);
  if (rc) {
    /* why starts with the path already */
    if (err && errlen) snprintf(err, errlen, "%s", why);
    return rc;
  }
  uint8_t *hdr = NULL;
  uint64_t size = id.size;
  if (size < 8) {
    rc = st_fail(&c, MLO_EFORMAT, NULL, "truncated: %llu bytes, less than the 8-byte header length",
                 (unsigned long long)size);
    goto close_fd;
  }
  uint8_t prefix[8];
  rc = pread_full(&c, fd, prefix, 8, 0);
  if (rc) goto close_fd;
  uint64_t hlen = read_le64(prefix);
  rc = check_header_len(&c, size, hlen);
  if (rc) goto close_fd;
  hdr = mlo_malloc((size_t)hlen + 1); /* NUL-terminated, as in mlo_st_parse */
  if (!hdr) {
    rc = st_fail(&c, MLO_ENOMEM, NULL, "out of memory for a %llu-byte header",
                 (unsigned long long)hlen);
    goto close_fd;
  }
  rc = pread_full(&c, fd, hdr, (size_t)hlen, 8);
  hdr[hlen] = '\0';
  if (!rc) rc = st_build(&c, hdr, hlen, size, out);
  if (!rc) (*out)->id = id;
  free(hdr);
close_fd:
  close(fd);
  return rc;
}

void mlo_st_close(mlo_st_file *f) {
  if (!f) return;
  st_file_impl *impl = (st_file_impl *)f;
  for (size_t i = 0; i < f->count; i++) free(f->tensors[i].name);
  for (size_t i = 0; i < f->meta_count; i++) {
    free(f->meta[i].key);
    free(f->meta[i].value);
  }
  free(f->tensors);
  free(f->meta);
  free(f->path);
  free(impl->by_name);
  free(impl);
}

const mlo_st_tensor *mlo_st_find(const mlo_st_file *f, const char *name) {
  if (!f || !name) return NULL;
  const st_file_impl *impl = (const st_file_impl *)f;
  size_t lo = 0, hi = f->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(name, impl->by_name[mid]->name);
    if (c == 0) return impl->by_name[mid];
    if (c < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}
