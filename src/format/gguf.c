/*
 * gguf.c — the GGUF header reader (format: ggml's docs/gguf.md; v2 and v3,
 * little-endian).
 *
 * A GGUF file is: magic "GGUF", a u32 version, u64 tensor and key-value
 * counts, the key-values (a length-prefixed key, a u32 value type, the
 * value; arrays carry an element type and a u64 count), the tensor infos
 * (name, u32 dimension count, u64 dimensions innermost first, u32 GGML
 * type, u64 offset into the data section), padding to general.alignment
 * (default 32), and the data section.
 *
 * Everything in the header is hostile.  Counts are bounded by the bytes
 * left (a count that could not fit is refused before anything is
 * allocated for it), strings by caps and by the file, arrays of arrays by
 * depth, every size and offset is overflow-checked, and the tensors must
 * lie inside the data section without overlapping.  A file is read in
 * growing prefixes (up to MLO_GGUF_HEADER_CAP) until the header parses, so
 * a tokenizer of many MB in the metadata costs only what it occupies.
 */
#include "format/gguf.h"

#include "base/log.h" /* MLO_PRINTF only */
#include "base/sysio.h"
#include "base/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GG_MORE 1 /* internal: the prefix ended before the header did */
#define GG_DEFAULT_ALIGNMENT 32u
/* Host memory mlo keeps per declared tensor (its GGUF entry, its name,
 * the component's tensor, its file name: about 460 bytes measured) and per
 * key-value, for the header's cost bound; and the least any header may
 * cost (a small file with many small tensors, as test files are). */
#define GG_TENSOR_COST 512u
#define GG_KV_COST 256u
#define GG_COST_FLOOR ((uint64_t)64 << 20)
#define GG_TEXT_CAP 160 /* characters of a rendered value */

enum {
  GV_U8,
  GV_I8,
  GV_U16,
  GV_I16,
  GV_U32,
  GV_I32,
  GV_F32,
  GV_BOOL,
  GV_STRING,
  GV_ARRAY,
  GV_U64,
  GV_I64,
  GV_F64,
  GV_COUNT
};
static const char *const gv_names[GV_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
static const unsigned gv_sizes[GV_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* GGML type ids (ggml.h's enum ggml_type) to mlo dtypes; gaps are ids
 * GGML removed. */
static const struct {
  uint32_t id;
  mlo_dtype dtype;
} type_map[] = {
    {0, MLO_DTYPE_F32},     {1, MLO_DTYPE_F16},      {2, MLO_DTYPE_Q4_0},
    {3, MLO_DTYPE_Q4_1},    {6, MLO_DTYPE_Q5_0},     {7, MLO_DTYPE_Q5_1},
    {8, MLO_DTYPE_Q8_0},    {9, MLO_DTYPE_Q8_1},     {10, MLO_DTYPE_Q2_K},
    {11, MLO_DTYPE_Q3_K},   {12, MLO_DTYPE_Q4_K},    {13, MLO_DTYPE_Q5_K},
    {14, MLO_DTYPE_Q6_K},   {15, MLO_DTYPE_Q8_K},    {16, MLO_DTYPE_IQ2_XXS},
    {17, MLO_DTYPE_IQ2_XS}, {18, MLO_DTYPE_IQ3_XXS}, {19, MLO_DTYPE_IQ1_S},
    {20, MLO_DTYPE_IQ4_NL}, {21, MLO_DTYPE_IQ3_S},   {22, MLO_DTYPE_IQ2_S},
    {23, MLO_DTYPE_IQ4_XS}, {24, MLO_DTYPE_I8},      {25, MLO_DTYPE_I16},
    {26, MLO_DTYPE_I32},    {27, MLO_DTYPE_I64},     {28, MLO_DTYPE_F64},
    {29, MLO_DTYPE_IQ1_M},  {30, MLO_DTYPE_BF16},    {34, MLO_DTYPE_TQ1_0},
    {35, MLO_DTYPE_TQ2_0},  {39, MLO_DTYPE_MXFP4},   {40, MLO_DTYPE_NVFP4},
    {41, MLO_DTYPE_Q1_0},
};

bool mlo_gguf_type_dtype(uint32_t ggml_type, mlo_dtype *out) {
  for (size_t i = 0; i < sizeof type_map / sizeof *type_map; i++)
    if (type_map[i].id == ggml_type) {
      if (out) *out = type_map[i].dtype;
      return true;
    }
  return false;
}

bool mlo_gguf_magic(const uint8_t *bytes, size_t len) {
  return len >= 4 && !memcmp(bytes, "GGUF", 4);
}

/* ---- the cursor ---------------------------------------------------------- */

typedef struct {
  const char *path;
  char *err;
  size_t errlen;
  const uint8_t *p;   /* the prefix read so far */
  uint64_t avail;     /* its length */
  uint64_t file_size; /* the whole file's */
  uint64_t pos;
} gg;

static int gg_fail(gg *g, int code, const char *fmt, ...) MLO_PRINTF(3, 4);
static int gg_fail(gg *g, int code, const char *fmt, ...) {
  if (!g->err || !g->errlen) return code;
  int n = snprintf(g->err, g->errlen, "%s: ", g->path);
  if (n < 0 || (size_t)n >= g->errlen) return code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->err + n, g->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return code;
}

/* n more bytes at pos: there, or GG_MORE when the file has them but the
 * prefix does not, or an error naming what was being read. */
static int need(gg *g, uint64_t n, const char *what) {
  if (n <= g->avail && g->pos <= g->avail - n) return MLO_OK;
  if (n <= g->file_size && g->pos <= g->file_size - n) return GG_MORE;
  return gg_fail(g, MLO_EFORMAT, "truncated: %s at byte %llu needs %llu bytes, the file has %llu",
                 what, (unsigned long long)g->pos, (unsigned long long)n,
                 (unsigned long long)g->file_size);
}

static uint64_t le(const uint8_t *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

static int get_u(gg *g, unsigned n, uint64_t *out, const char *what) {
  int rc = need(g, n, what);
  if (rc) return rc;
  *out = le(g->p + g->pos, n);
  g->pos += n;
  return MLO_OK;
}

static uint64_t left(const gg *g) {
  return g->pos < g->file_size ? g->file_size - g->pos : 0;
}

/* A string: u64 length, then bytes (valid UTF-8 without NUL, at most cap).
 * *s points into the prefix; *len is its length. */
static int get_str(gg *g, uint64_t cap, const char *what, const uint8_t **s, uint64_t *len) {
  uint64_t at = g->pos, n;
  int rc = get_u(g, 8, &n, what);
  if (rc) return rc;
  if (n > cap)
    return gg_fail(g, MLO_EFORMAT, "%s at byte %llu is %llu bytes long, over the cap of %llu", what,
                   (unsigned long long)at, (unsigned long long)n, (unsigned long long)cap);
  if ((rc = need(g, n, what))) return rc;
  const uint8_t *b = g->p + g->pos;
  for (uint64_t i = 0; i < n;) {
    size_t k = mlo_utf8_seq_len(b + i, (size_t)(n - i));
    if (!k)
      return gg_fail(g, MLO_EFORMAT, "%s at byte %llu is not valid UTF-8 (byte 0x%02x at %llu)",
                     what, (unsigned long long)at, b[i], (unsigned long long)i);
    i += k;
  }
  g->pos += n;
  *s = b;
  *len = n;
  return MLO_OK;
}

static char *dup_n(const uint8_t *s, uint64_t n) {
  char *d = mlo_malloc((size_t)n + 1);
  if (d) memcpy(d, s, (size_t)n), d[n] = '\0';
  return d;
}

/* ---- values ---------------------------------------------------------------- */

typedef struct {
  char buf[GG_TEXT_CAP + 8];
  size_t len;
} text;

static void text_add(text *t, const char *fmt, ...) MLO_PRINTF(2, 3);
static void text_add(text *t, const char *fmt, ...) {
  if (t->len >= GG_TEXT_CAP) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, GG_TEXT_CAP + 1 - t->len, fmt, ap);
  va_end(ap);
  if (n > 0) t->len += (size_t)n;
  if (t->len > GG_TEXT_CAP) {
    t->len = GG_TEXT_CAP;
    memcpy(t->buf + GG_TEXT_CAP - 3, "...", 4);
  }
}

static void text_scalar(text *t, uint32_t type, uint64_t raw) {
  switch (type) {
  case GV_I8:
    text_add(t, "%d", (int)(int8_t)raw);
    break;
  case GV_I16:
    text_add(t, "%d", (int)(int16_t)raw);
    break;
  case GV_I32:
    text_add(t, "%d", (int)(int32_t)raw);
    break;
  case GV_I64:
    text_add(t, "%lld", (long long)(int64_t)raw);
    break;
  case GV_F32: {
    uint32_t b = (uint32_t)raw;
    float f;
    memcpy(&f, &b, sizeof f);
    text_add(t, "%g", (double)f);
    break;
  }
  case GV_F64: {
    double d;
    memcpy(&d, &raw, sizeof d);
    text_add(t, "%g", d);
    break;
  }
  case GV_BOOL:
    text_add(t, "%s", raw ? "true" : "false");
    break;
  default:
    text_add(t, "%llu", (unsigned long long)raw);
  }
}

static int get_value(gg *g, uint32_t type, int depth, text *t, const char *key);

static int get_array(gg *g, int depth, text *t, const char *key) {
  uint64_t at = g->pos, et, n;
  int rc = get_u(g, 4, &et, "an array's element type");
  if (!rc) rc = get_u(g, 8, &n, "an array's length");
  if (rc) return rc;
  if (et >= GV_COUNT)
    return gg_fail(g, MLO_EFORMAT, "key '%s': array at byte %llu has unknown element type %llu",
                   key, (unsigned long long)at, (unsigned long long)et);
  if (depth >= MLO_GGUF_ARRAY_DEPTH)
    return gg_fail(g, MLO_EFORMAT, "key '%s': arrays nested more than %d deep at byte %llu", key,
                   MLO_GGUF_ARRAY_DEPTH, (unsigned long long)at);
  /* Every element takes at least this much: a count beyond the bytes left
   * is refused before it is looped over. */
  uint64_t min = gv_sizes[et] ? gv_sizes[et] : et == GV_STRING ? 8 : 12;
  if (n > left(g) / min)
    return gg_fail(g, MLO_EFORMAT,
                   "key '%s': array at byte %llu claims %llu %s elements, more than the %llu "
                   "bytes left could hold",
                   key, (unsigned long long)at, (unsigned long long)n, gv_names[et],
                   (unsigned long long)left(g));
  if (gv_sizes[et]) { /* fixed-size elements: checked in one step */
    uint64_t shown = n < 4 ? n : 4;
    if ((rc = need(g, n * gv_sizes[et], "array elements"))) return rc;
    text_add(t, "[");
    for (uint64_t i = 0; i < shown; i++) {
      if (i) text_add(t, ", ");
      uint64_t raw = le(g->p + g->pos + i * gv_sizes[et], gv_sizes[et]);
      if (et == GV_BOOL && raw > 1)
        return gg_fail(g, MLO_EFORMAT, "key '%s': bool element %llu is %llu, not 0 or 1", key,
                       (unsigned long long)i, (unsigned long long)raw);
      text_scalar(t, (uint32_t)et, raw);
    }
    for (uint64_t i = shown; et == GV_BOOL && i < n; i++)
      if (g->p[g->pos + i] > 1)
        return gg_fail(g, MLO_EFORMAT, "key '%s': bool element %llu is %u, not 0 or 1", key,
                       (unsigned long long)i, g->p[g->pos + i]);
    g->pos += n * gv_sizes[et];
    text_add(t, "%s] (%llu %s)", n > shown ? ", ..." : "", (unsigned long long)n, gv_names[et]);
    return MLO_OK;
  }
  text_add(t, "[");
  for (uint64_t i = 0; i < n; i++) {
    text sub = {.len = 0};
    rc = get_value(g, (uint32_t)et, depth + 1, &sub, key);
    if (rc) return rc;
    if (i < 3) text_add(t, "%s%s", i ? ", " : "", sub.buf);
  }
  text_add(t, "%s] (%llu %s)", n > 3 ? ", ..." : "", (unsigned long long)n, gv_names[et]);
  return MLO_OK;
}

static int get_value(gg *g, uint32_t type, int depth, text *t, const char *key) {
  if (type == GV_ARRAY) return get_array(g, depth, t, key);
  if (type == GV_STRING) {
    const uint8_t *s;
    uint64_t n;
    int rc = get_str(g, UINT64_MAX, "a string value", &s, &n);
    if (rc) return rc;
    text_add(t, "\"%.*s\"", (int)(n < GG_TEXT_CAP ? n : GG_TEXT_CAP), (const char *)s);
    return MLO_OK;
  }
  uint64_t raw;
  int rc = get_u(g, gv_sizes[type], &raw, "a value");
  if (rc) return rc;
  if (type == GV_BOOL && raw > 1)
    return gg_fail(g, MLO_EFORMAT, "key '%s': bool value is %llu, not 0 or 1", key,
                   (unsigned long long)raw);
  text_scalar(t, type, raw);
  return MLO_OK;
}

/* ---- the header -------------------------------------------------------------- */

static int cmp_kv(const void *a, const void *b) {
  return strcmp((*(mlo_gguf_kv *const *)a)->key, (*(mlo_gguf_kv *const *)b)->key);
}
static int cmp_name(const void *a, const void *b) {
  return strcmp((*(mlo_gguf_tensor *const *)a)->name, (*(mlo_gguf_tensor *const *)b)->name);
}
static int cmp_offset(const void *a, const void *b) {
  const mlo_gguf_tensor *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : strcmp(x->name, y->name);
}

/* One key-value; general.alignment and general.architecture are read. */
static int parse_kv(gg *g, mlo_gguf_file *f, mlo_gguf_kv *kv) {
  uint64_t at = g->pos, n, type;
  const uint8_t *k;
  int rc = get_str(g, MLO_GGUF_KEY_CAP, "a metadata key", &k, &n);
  if (rc) return rc;
  if (n == 0)
    return gg_fail(g, MLO_EFORMAT, "metadata key at byte %llu is empty", (unsigned long long)at);
  if (!(kv->key = dup_n(k, n))) return gg_fail(g, MLO_ENOMEM, "out of memory");
  if ((rc = get_u(g, 4, &type, "a value type"))) return rc;
  if (type >= GV_COUNT)
    return gg_fail(g, MLO_EFORMAT, "key '%s': unknown value type %llu", kv->key,
                   (unsigned long long)type);
  kv->type = (uint32_t)type;
  uint64_t vpos = g->pos;
  text t = {.len = 0};
  if ((rc = get_value(g, kv->type, 0, &t, kv->key))) return rc;
  if (!(kv->text = mlo_strdup(t.buf))) return gg_fail(g, MLO_ENOMEM, "out of memory");
  if (!strcmp(kv->key, "general.alignment")) {
    if (type != GV_U32)
      return gg_fail(g, MLO_EFORMAT, "general.alignment is a %s, not a u32", gv_names[type]);
    uint64_t a = le(g->p + vpos, 4);
    if (a == 0 || (a & (a - 1)))
      return gg_fail(g, MLO_EFORMAT, "general.alignment %llu is not a power of two",
                     (unsigned long long)a);
    f->alignment = a;
  } else if (!strcmp(kv->key, "general.architecture")) {
    if (type != GV_STRING)
      return gg_fail(g, MLO_EFORMAT, "general.architecture is a %s, not a string", gv_names[type]);
    uint64_t len = le(g->p + vpos, 8);
    free(f->architecture);
    if (!(f->architecture = dup_n(g->p + vpos + 8, len)))
      return gg_fail(g, MLO_ENOMEM, "out of memory");
  }
  return MLO_OK;
}

/* The reference reader (the gguf package) views every tensor as a numpy
 * array: F32, F16, F64 and the integer types as themselves, every other
 * type as bytes, the row (ne[0]) as its blocks' bytes.  numpy refuses a
 * shape whose element size times its non-zero dimensions passes 2^63 - 1,
 * even with no element at all (ne = [0, 2^62]); so does this reader, the
 * two agreeing both ways. */
static int check_view_size(gg *g, const mlo_gguf_tensor *t) {
  uint64_t item = 0;
  bool native = t->ggml_type <= 1 || (t->ggml_type >= 24 && t->ggml_type <= 28);
  uint32_t be = 1, bb = 0;
  if (!mlo_dtype_block(t->dtype, &be, &bb)) {
    be = 1;
    if (mlo_dtype_nbytes(t->dtype, 1, &item)) return MLO_OK; /* sized elsewhere */
    bb = (uint32_t)item;
  }
  uint64_t bytes = native ? bb : 1;
  for (int i = 0; i < t->n_dims; i++) {
    uint64_t d = t->ne[i];
    if (!native && i == 0 && d) d = d / be * bb; /* the row as bytes */
    if (!d) continue;
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > (uint64_t)INT64_MAX)
      return gg_fail(g, MLO_EFORMAT,
                     "tensor '%s': its shape spans more than 2^63 - 1 bytes (the gguf reference "
                     "refuses it, even with no element)",
                     t->name);
  }
  return MLO_OK;
}

static int parse_tensor_info(gg *g, mlo_gguf_tensor *t) {
  uint64_t at = g->pos, n, nd, type;
  const uint8_t *s;
  int rc = get_str(g, MLO_GGUF_NAME_CAP, "a tensor name", &s, &n);
  if (rc) return rc;
  if (n == 0)
    return gg_fail(g, MLO_EFORMAT, "tensor name at byte %llu is empty", (unsigned long long)at);
  if (!(t->name = dup_n(s, n))) return gg_fail(g, MLO_ENOMEM, "out of memory");
  if ((rc = get_u(g, 4, &nd, "a dimension count"))) return rc;
  if (nd > MLO_GGUF_MAX_DIMS)
    return gg_fail(g, MLO_EFORMAT, "tensor '%s': %llu dimensions, more than GGUF's %d", t->name,
                   (unsigned long long)nd, MLO_GGUF_MAX_DIMS);
  t->n_dims = (int)nd;
  uint64_t numel = 1;
  for (int i = 0; i < t->n_dims; i++) {
    if ((rc = get_u(g, 8, &t->ne[i], "a dimension"))) return rc;
    if (t->ne[i] > (uint64_t)INT64_MAX)
      return gg_fail(g, MLO_EFORMAT, "tensor '%s': dimension %d is %llu, over 2^63", t->name, i,
                     (unsigned long long)t->ne[i]);
    if (__builtin_mul_overflow(numel, t->ne[i], &numel))
      return gg_fail(g, MLO_EFORMAT, "tensor '%s': dimensions multiply past 2^64 elements",
                     t->name);
    t->shape[t->n_dims - 1 - i] = (int64_t)t->ne[i];
  }
  if ((rc = get_u(g, 4, &type, "a tensor type"))) return rc;
  t->ggml_type = (uint32_t)type;
  if (type > UINT32_MAX || !mlo_gguf_type_dtype(t->ggml_type, &t->dtype))
    return gg_fail(g, MLO_EFORMAT, "tensor '%s': unknown GGML type %llu", t->name,
                   (unsigned long long)type);
  uint32_t be = 0;
  if (mlo_dtype_block(t->dtype, &be, NULL) && t->n_dims && t->ne[0] % be)
    return gg_fail(g, MLO_EFORMAT,
                   "tensor '%s': rows of %llu elements are not whole %u-element %s blocks", t->name,
                   (unsigned long long)t->ne[0], be, mlo_dtype_name(t->dtype));
  rc = mlo_dtype_nbytes(t->dtype, numel, &t->nbytes);
  if (rc == MLO_EFORMAT)
    return gg_fail(g, MLO_EFORMAT, "tensor '%s': its size passes 2^64 bytes", t->name);
  if (rc) /* a 0-D block tensor: one element is not a block */
    return gg_fail(g, MLO_EFORMAT, "tensor '%s': %llu elements are not whole %s blocks", t->name,
                   (unsigned long long)numel, mlo_dtype_name(t->dtype));
  if ((rc = check_view_size(g, t))) return rc;
  return get_u(g, 8, &t->offset, "a tensor offset");
}

/* After the infos: alignment of offsets, the data section's bounds, no
 * overlap, unique names. */
static int check_tensors(gg *g, mlo_gguf_file *f) {
  uint64_t pad = (f->alignment - g->pos % f->alignment) % f->alignment;
  if (__builtin_add_overflow(g->pos, pad, &f->data_start))
    return gg_fail(g, MLO_EFORMAT, "the data section starts past 2^64");
  if (f->count && f->data_start > f->file_size)
    return gg_fail(g, MLO_EFORMAT,
                   "truncated: the data section would start at byte %llu, past the end of the "
                   "file (%llu bytes)",
                   (unsigned long long)f->data_start, (unsigned long long)f->file_size);
  uint64_t data_len = f->data_start <= f->file_size ? f->file_size - f->data_start : 0;
  for (size_t i = 0; i < f->count; i++) {
    mlo_gguf_tensor *t = &f->tensors[i];
    if (t->offset % f->alignment)
      return gg_fail(g, MLO_EFORMAT,
                     "tensor '%s': offset %llu is not a multiple of the %llu-byte "
                     "alignment",
                     t->name, (unsigned long long)t->offset, (unsigned long long)f->alignment);
    if (t->offset > data_len || t->nbytes > data_len - t->offset)
      return gg_fail(g, MLO_EFORMAT,
                     "tensor '%s': bytes [%llu, +%llu) run past the end of the data section "
                     "(%llu bytes from byte %llu)",
                     t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                     (unsigned long long)data_len, (unsigned long long)f->data_start);
    t->file_offset = f->data_start + t->offset;
  }
  if (!f->count) return MLO_OK;
  mlo_gguf_tensor **byname = mlo_calloc(f->count, sizeof *byname);
  if (!byname) return gg_fail(g, MLO_ENOMEM, "out of memory");
  for (size_t i = 0; i < f->count; i++) byname[i] = &f->tensors[i];
  qsort(byname, f->count, sizeof *byname, cmp_name);
  int rc = MLO_OK;
  for (size_t i = 1; i < f->count && !rc; i++)
    if (!strcmp(byname[i - 1]->name, byname[i]->name))
      rc = gg_fail(g, MLO_EFORMAT, "tensor '%s': duplicate tensor name", byname[i]->name);
  free(byname);
  if (rc) return rc;
  qsort(f->tensors, f->count, sizeof *f->tensors, cmp_offset);
  /* the furthest end so far, and whose: a tensor of no bytes in between
   * must not hide an overlap with the one before it */
  const mlo_gguf_tensor *last = NULL;
  for (size_t i = 0; i < f->count; i++) {
    const mlo_gguf_tensor *b = &f->tensors[i];
    if (!b->nbytes) continue;
    if (last && last->offset + last->nbytes > b->offset)
      return gg_fail(g, MLO_EFORMAT,
                     "tensor '%s': bytes from %llu overlap tensor '%s' (ends at %llu)", b->name,
                     (unsigned long long)b->offset, last->name,
                     (unsigned long long)(last->offset + last->nbytes));
    last = b;
  }
  return MLO_OK;
}

static int check_unique_keys(gg *g, mlo_gguf_file *f) {
  if (f->kv_count < 2) return MLO_OK;
  mlo_gguf_kv **sorted = mlo_calloc(f->kv_count, sizeof *sorted);
  if (!sorted) return gg_fail(g, MLO_ENOMEM, "out of memory");
  for (size_t i = 0; i < f->kv_count; i++) sorted[i] = &f->kv[i];
  qsort(sorted, f->kv_count, sizeof *sorted, cmp_kv);
  int rc = MLO_OK;
  for (size_t i = 1; i < f->kv_count && !rc; i++)
    if (!strcmp(sorted[i - 1]->key, sorted[i]->key))
      rc = gg_fail(g, MLO_EFORMAT, "duplicate metadata key '%s'", sorted[i]->key);
  free(sorted);
  return rc;
}

/* Parses the header from g's prefix into a new file; GG_MORE when the
 * prefix is too short. */
static int parse(gg *g, mlo_gguf_file **out) {
  g->pos = 0;
  uint64_t magic_len = g->file_size < 4 ? g->file_size : 4;
  if (g->file_size < 4 || !mlo_gguf_magic(g->p, (size_t)magic_len))
    return gg_fail(g, MLO_EFORMAT, "not a GGUF file (it does not start with \"GGUF\")");
  g->pos = 4;
  uint64_t version, nt, nkv;
  int rc = get_u(g, 4, &version, "the version");
  if (rc) return rc;
  if (version == 1)
    return gg_fail(g, MLO_EFORMAT,
                   "GGUF version 1 (32-bit counts) is not supported; v2 and v3 "
                   "are (convert it with a current gguf tool)");
  if (version != 2 && version != 3)
    return gg_fail(g, MLO_EFORMAT, "GGUF version %llu is not supported (v2 and v3 are%s)",
                   (unsigned long long)version,
                   (version & 0xffff) == 0 ? "; this looks like a big-endian file" : "");
  if ((rc = get_u(g, 8, &nt, "the tensor count"))) return rc;
  if ((rc = get_u(g, 8, &nkv, "the key-value count"))) return rc;
  /* a key-value takes at least 8+1+4+1 bytes, a tensor info 8+1+4+4+8 */
  if (nkv > left(g) / 14)
    return gg_fail(g, MLO_EFORMAT, "claims %llu metadata key-values, more than the file could hold",
                   (unsigned long long)nkv);
  if (nt > left(g) / 25)
    return gg_fail(g, MLO_EFORMAT, "claims %llu tensors, more than the file could hold",
                   (unsigned long long)nt);
  /* What holding the header costs, bounded by the file: a million tiny
   * tensors in an 81 MB file took 443 MiB and 2.9 s to declare.  A real
   * checkpoint's tensors are kilobytes to gigabytes each, far inside. */
  uint64_t cost, kv_cost, allowed;
  bool over = __builtin_mul_overflow(nt, (uint64_t)GG_TENSOR_COST, &cost) ||
              __builtin_mul_overflow(nkv, (uint64_t)GG_KV_COST, &kv_cost) ||
              __builtin_add_overflow(cost, kv_cost, &cost);
  if (__builtin_mul_overflow(g->file_size, (uint64_t)2, &allowed)) allowed = UINT64_MAX;
  if (allowed < GG_COST_FLOOR) allowed = GG_COST_FLOOR;
  if (over || cost > allowed)
    return gg_fail(g, MLO_EFORMAT,
                   "claims %llu tensors and %llu key-values: holding them would take about "
                   "%llu MiB, more than twice the file's %llu MiB (a header may cost at most "
                   "that, or %llu MiB)",
                   (unsigned long long)nt, (unsigned long long)nkv,
                   (unsigned long long)(cost >> 20), (unsigned long long)(g->file_size >> 20),
                   (unsigned long long)(GG_COST_FLOOR >> 20));
  mlo_gguf_file *f = mlo_calloc(1, sizeof *f);
  if (!f) return gg_fail(g, MLO_ENOMEM, "out of memory");
  f->file_size = g->file_size;
  f->version = (uint32_t)version;
  f->alignment = GG_DEFAULT_ALIGNMENT;
  if (!(f->path = mlo_strdup(g->path)) || (nkv && !(f->kv = mlo_calloc(nkv, sizeof *f->kv))) ||
      (nt && !(f->tensors = mlo_calloc(nt, sizeof *f->tensors)))) {
    mlo_gguf_close(f);
    return gg_fail(g, MLO_ENOMEM, "out of memory for %llu tensors and %llu key-values",
                   (unsigned long long)nt, (unsigned long long)nkv);
  }
  for (uint64_t i = 0; i < nkv && !rc; i++, f->kv_count++) rc = parse_kv(g, f, &f->kv[i]);
  if (!rc) rc = check_unique_keys(g, f);
  for (uint64_t i = 0; i < nt && !rc; i++, f->count++) rc = parse_tensor_info(g, &f->tensors[i]);
  if (!rc && g->pos > MLO_GGUF_HEADER_CAP)
    rc = gg_fail(g, MLO_EFORMAT, "header of %llu bytes is over the cap of %u",
                 (unsigned long long)g->pos, MLO_GGUF_HEADER_CAP);
  if (!rc) rc = check_tensors(g, f);
  if (rc) {
    mlo_gguf_close(f);
    return rc;
  }
  *out = f;
  return MLO_OK;
}

int mlo_gguf_parse(const char *name, const uint8_t *bytes, size_t len, mlo_gguf_file **out,
                   char *err, size_t errlen) {
  gg g = {name ? name : "(memory)", err, errlen, bytes, len, len, 0};
  if (err && errlen) err[0] = '\0';
  if (!out || (!bytes && len)) return gg_fail(&g, MLO_EINVAL, "invalid arguments");
  *out = NULL;
  int rc = parse(&g, out);
  return rc == GG_MORE ? MLO_EFORMAT : rc; /* cannot happen: the prefix is the file */
}

int mlo_gguf_open(const char *path, mlo_gguf_file **out, char *err, size_t errlen) {
  gg g = {path ? path : "(null)", err, errlen, NULL, 0, 0, 0};
  if (err && errlen) err[0] = '\0';
  if (!path || !out) return gg_fail(&g, MLO_EINVAL, "invalid arguments");
  *out = NULL;
  int fd;
  mlo_file_id id;
  int rc = mlo_open_regular(path, &fd, &id, err, errlen);
  if (rc) return rc;
  g.file_size = id.size;
  uint8_t *buf = NULL;
  uint64_t want = 1u << 20;
  for (;;) {
    uint64_t cap = (uint64_t)MLO_GGUF_HEADER_CAP + 64;
    if (want > g.file_size) want = g.file_size;
    if (want > cap) want = cap;
    uint8_t *grown = mlo_realloc(buf, want ? (size_t)want : 1);
    if (!grown) {
      rc =
          gg_fail(&g, MLO_ENOMEM, "out of memory for a %llu-byte header", (unsigned long long)want);
      break;
    }
    buf = grown;
    if (mlo_pread_full(fd, buf + g.avail, (size_t)(want - g.avail), g.avail) != 0) {
      rc = errno ? gg_fail(&g, MLO_EIO, "read failed: %s", strerror(errno))
                 : gg_fail(&g, MLO_EIO, "file shrank while reading the header");
      break;
    }
    g.avail = want;
    g.p = buf;
    rc = parse(&g, out);
    if (rc != GG_MORE) break;
    if (want >= cap) {
      rc = gg_fail(&g, MLO_EFORMAT, "header is over the cap of %u bytes", MLO_GGUF_HEADER_CAP);
      break;
    }
    want *= 4;
  }
  free(buf);
  close(fd);
  if (rc == MLO_OK) (*out)->id = id;
  return rc;
}

void mlo_gguf_close(mlo_gguf_file *f) {
  if (!f) return;
  for (size_t i = 0; i < f->count; i++) free(f->tensors[i].name);
  for (size_t i = 0; i < f->kv_count; i++) {
    free(f->kv[i].key);
    free(f->kv[i].text);
  }
  free(f->tensors);
  free(f->kv);
  free(f->architecture);
  free(f->path);
  free(f);
}
