/*
 * test_safetensors.c — the dtype table, and writer -> reader round trips.
 *
 * The writer and the reader are each other's first check: every dtype
 * (sub-byte, 0-rank and empty tensors included) and the metadata must come
 * back exactly, and the bytes on disk (read here with pread, independently
 * of the library) must be the bytes given.  The cross-check against the
 * reference implementation is st_crosscheck; hostile input is
 * test_safetensors_hostile.
 */
#include "testutil.h"

#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int make_tmpdir(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mlo_st_test_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
  (void)state;
  DIR *d = opendir(tmpdir);
  if (!d) return -1;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
    unlink(p);
  }
  closedir(d);
  return rmdir(tmpdir);
}

static const char *tmp_path(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  return p;
}

/* Reads [off, off+len) of a file, independently of the library. */
static void *pread_range(const char *path, uint64_t off, size_t len) {
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  uint8_t *buf = malloc(len ? len : 1);
  assert_non_null(buf);
  assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
  close(fd);
  return buf;
}

static void *slurp(const char *path, size_t *len) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  *len = (size_t)st.st_size;
  return pread_range(path, 0, *len);
}

static void fill_bytes(uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

/* ---------------------------------------------------------------- dtypes */

static void test_dtype_names(void **state) {
  (void)state;
  static const char *names[] = {"BOOL", "U8",  "I8",   "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
                                "U16",  "F16", "BF16", "I32",     "U32",     "F32",     "F64",
                                "I64",  "U64", "C64",  "F4",      "F6_E2M3", "F6_E3M2"};
  static const unsigned bits[] = {8,  8,  8,  8,  8,  8,  16, 16, 16, 16,
                                  32, 32, 32, 64, 64, 64, 64, 4,  6,  6};
  assert_int_equal(sizeof names / sizeof *names, MLO_DTYPE_FIRST_BLOCK);
  for (int i = 0; i < MLO_DTYPE_FIRST_BLOCK; i++) {
    assert_string_equal(mlo_dtype_name((mlo_dtype)i), names[i]);
    assert_int_equal(mlo_dtype_bits((mlo_dtype)i), bits[i]);
    mlo_dtype d = MLO_DTYPE_COUNT;
    assert_int_equal(mlo_dtype_from_name(names[i], &d), MLO_OK);
    assert_int_equal(d, i);
  }
  mlo_dtype d;
  assert_int_equal(mlo_dtype_from_name("f32", &d), MLO_EINVAL); /* exact spelling only */
  assert_int_equal(mlo_dtype_from_name("", &d), MLO_EINVAL);
  assert_int_equal(mlo_dtype_from_name("F128", &d), MLO_EINVAL);
  assert_int_equal(mlo_dtype_from_name(NULL, &d), MLO_EINVAL);
  assert_null(mlo_dtype_name(MLO_DTYPE_COUNT));
  assert_null(mlo_dtype_name((mlo_dtype)-1));
  assert_int_equal(mlo_dtype_bits(MLO_DTYPE_COUNT), 0);
  /* GGML's block types: named, sized by block, never a whole bit width */
  uint32_t elems = 0, bytes = 0;
  assert_true(mlo_dtype_block(MLO_DTYPE_Q4_K, &elems, &bytes));
  assert_int_equal(elems, 256);
  assert_int_equal(bytes, 144);
  assert_false(mlo_dtype_block(MLO_DTYPE_BF16, &elems, &bytes));
  assert_false(mlo_dtype_block(MLO_DTYPE_COUNT, NULL, NULL));
  assert_int_equal(mlo_dtype_from_name("Q8_0", &d), MLO_OK);
  assert_int_equal(d, MLO_DTYPE_Q8_0);
  for (int i = MLO_DTYPE_FIRST_BLOCK; i < MLO_DTYPE_COUNT; i++) {
    assert_int_equal(mlo_dtype_bits((mlo_dtype)i), 0);
    assert_true(mlo_dtype_block((mlo_dtype)i, NULL, NULL));
  }
}

static void test_dtype_nbytes(void **state) {
  (void)state;
  uint64_t b = 0;
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F32, 6, &b), MLO_OK);
  assert_int_equal(b, 24);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_BF16, 0, &b), MLO_OK);
  assert_int_equal(b, 0);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F4, 4, &b), MLO_OK);
  assert_int_equal(b, 2);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F4, 3, &b), MLO_EINVAL);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F6_E3M2, 4, &b), MLO_OK);
  assert_int_equal(b, 3);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F6_E2M3, 3, &b), MLO_EINVAL);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F6_E2M3, 2, &b), MLO_EINVAL);
  /* the largest sizes that fit, although numel*bits itself would wrap */
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_U64, (UINT64_MAX >> 3), &b), MLO_OK);
  assert_int_equal(b, UINT64_MAX & ~(uint64_t)7);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F4, UINT64_MAX - 1, &b), MLO_OK);
  assert_int_equal(b, (UINT64_MAX - 1) / 2);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_F6_E2M3, UINT64_MAX - 3, &b), MLO_OK);
  assert_int_equal(b, (UINT64_MAX - 3) / 4 * 3);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_U64, (UINT64_MAX >> 3) + 1, &b), MLO_EFORMAT);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_U16, UINT64_MAX, &b), MLO_EFORMAT);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_COUNT, 1, &b), MLO_EINVAL);
  /* block types: whole blocks only, overflow-checked */
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_Q4_0, 64, &b), MLO_OK);
  assert_int_equal(b, 36);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_Q4_0, 33, &b), MLO_EINVAL);
  assert_int_equal(mlo_dtype_nbytes(MLO_DTYPE_Q8_K, UINT64_MAX / 256 * 256, &b), MLO_EFORMAT);
}

/* ------------------------------------------------------------- round trip */

typedef struct {
  char name[32];
  mlo_dtype dtype;
  int ndim;
  int64_t shape[MLO_MAX_DIMS];
  uint64_t nbytes;
  uint8_t *data;
} expect_t;

static size_t build_all_dtypes(mlo_st_writer *w, expect_t *ex) {
  size_t n = 0;
  /* [2, 4]: 8 elements, a whole number of bytes for every dtype */
  for (int d = 0; d < MLO_DTYPE_FIRST_BLOCK; d++, n++) {
    expect_t *e = &ex[n];
    snprintf(e->name, sizeof e->name, "t.%s", mlo_dtype_name((mlo_dtype)d));
    e->dtype = (mlo_dtype)d;
    e->ndim = 2;
    e->shape[0] = 2;
    e->shape[1] = 4;
  }
  expect_t extra[] = {
      {"scalar.f32", MLO_DTYPE_F32, 0, {0}, 0, NULL},
      {"scalar.bf16", MLO_DTYPE_BF16, 0, {0}, 0, NULL},
      {"empty.f16", MLO_DTYPE_F16, 2, {0, 3}, 0, NULL},
      {"empty.f4", MLO_DTYPE_F4, 3, {5, 0, 7}, 0, NULL},
      {"f4.odd_dims", MLO_DTYPE_F4, 2, {3, 2}, 0, NULL},
      {"f6.four", MLO_DTYPE_F6_E3M2, 1, {4}, 0, NULL},
      {"deep", MLO_DTYPE_U8, 8, {1, 2, 1, 2, 1, 2, 1, 3}, 0, NULL},
      {"unicode.\xc3\xa9\"q\"", MLO_DTYPE_I8, 1, {3}, 0, NULL},
  };
  for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) ex[n++] = extra[i];
  for (size_t i = 0; i < n; i++) {
    expect_t *e = &ex[i];
    uint64_t numel = 1;
    for (int k = 0; k < e->ndim; k++) numel *= (uint64_t)e->shape[k];
    assert_int_equal(mlo_dtype_nbytes(e->dtype, numel, &e->nbytes), MLO_OK);
    e->data = malloc(e->nbytes ? e->nbytes : 1);
    fill_bytes(e->data, e->nbytes, (unsigned)i);
    /* half copied, half borrowed: both must write the same bytes */
    assert_int_equal(
        mlo_st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, e->data, e->nbytes, i % 2 == 0),
        MLO_OK);
  }
  return n;
}

static void check_file(const char *path, const mlo_st_file *f, const expect_t *ex, size_t n) {
  assert_int_equal(f->count, n);
  assert_int_equal(f->data_start % 8, 0);
  uint64_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    const mlo_st_tensor *t = mlo_st_find(f, ex[i].name);
    assert_non_null(t);
    assert_ptr_equal(t, &f->tensors[i]); /* laid out in the order added */
    assert_string_equal(t->name, ex[i].name);
    assert_int_equal(t->dtype, ex[i].dtype);
    assert_int_equal(t->ndim, ex[i].ndim);
    for (int k = 0; k < t->ndim; k++) assert_int_equal(t->shape[k], ex[i].shape[k]);
    assert_int_equal(t->begin, pos);
    assert_int_equal(t->end - t->begin, ex[i].nbytes);
    assert_int_equal(t->file_offset, f->data_start + t->begin);
    pos = t->end;
    uint8_t *got = pread_range(path, t->file_offset, (size_t)ex[i].nbytes);
    assert_memory_equal(got, ex[i].data, ex[i].nbytes ? ex[i].nbytes : 0);
    free(got);
  }
  assert_int_equal(f->data_start + pos, f->file_size);
  assert_null(mlo_st_find(f, "t.nope"));
}

static void test_round_trip_every_dtype(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_int_equal(mlo_st_writer_create(&w), MLO_OK);
  expect_t ex[MLO_DTYPE_COUNT + 16];
  size_t n = build_all_dtypes(w, ex);
  assert_int_equal(mlo_st_writer_set_metadata(w, "format", "pt"), MLO_OK);
  assert_int_equal(mlo_st_writer_set_metadata(w, "note", "first"), MLO_OK);
  assert_int_equal(mlo_st_writer_set_metadata(w, "note", "a \"quoted\" \xe2\x9c\x93"), MLO_OK);
  char err[512];
  const char *path = tmp_path("all.safetensors");
  assert_int_equal(mlo_st_writer_write(w, path, err, sizeof err), MLO_OK);
  mlo_st_writer_free(w);

  mlo_st_file *f = NULL;
  assert_int_equal(mlo_st_open(path, &f, err, sizeof err), MLO_OK);
  check_file(path, f, ex, n);
  assert_int_equal(f->meta_count, 2);
  assert_string_equal(f->meta[0].key, "format");
  assert_string_equal(f->meta[0].value, "pt");
  assert_string_equal(f->meta[1].key, "note");
  assert_string_equal(f->meta[1].value, "a \"quoted\" \xe2\x9c\x93");
  assert_string_equal(f->path, path);
  mlo_st_close(f);

  /* the in-memory entry point sees the same file */
  size_t len;
  uint8_t *bytes = slurp(path, &len);
  assert_int_equal(mlo_st_parse(path, bytes, len, &f, err, sizeof err), MLO_OK);
  check_file(path, f, ex, n);
  mlo_st_close(f);
  free(bytes);
  for (size_t i = 0; i < n; i++) free(ex[i].data);
}

static void test_empty_file_round_trip(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_int_equal(mlo_st_writer_create(&w), MLO_OK);
  const char *path = tmp_path("empty.safetensors");
  char err[256];
  assert_int_equal(mlo_st_writer_write(w, path, err, sizeof err), MLO_OK);
  mlo_st_writer_free(w);
  mlo_st_file *f;
  assert_int_equal(mlo_st_open(path, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->count, 0);
  assert_int_equal(f->meta_count, 0);
  assert_int_equal(f->file_size, f->data_start);
  mlo_st_close(f);
}

/* Generated tensors: produced in chunks, never whole in memory. */
typedef struct {
  size_t calls, max_len;
  uint64_t next;
} gen_state;

static uint8_t gen_byte(uint64_t i) {
  return (uint8_t)(i * 2654435761u >> 13);
}

static void gen_fill(void *buf, uint64_t offset, size_t len, void *user) {
  gen_state *g = user;
  g->calls++;
  if (len > g->max_len) g->max_len = len;
  if (offset != g->next)
    g->next = UINT64_MAX; /* must be sequential */
  else
    g->next += len;
  for (size_t i = 0; i < len; i++) ((uint8_t *)buf)[i] = gen_byte(offset + i);
}

static void test_generated_in_chunks(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_int_equal(mlo_st_writer_create(&w), MLO_OK);
  gen_state g = {0, 0, 0};
  int64_t shape[2] = {3, (9 << 20) / 3 + 1}; /* 9 MiB + 3 bytes of U8 */
  uint64_t total = (uint64_t)shape[0] * (uint64_t)shape[1];
  uint8_t head[5] = {1, 2, 3, 4, 5};
  int64_t hs[1] = {5};
  assert_int_equal(mlo_st_writer_add(w, "head", MLO_DTYPE_U8, 1, hs, head, 5, false), MLO_OK);
  assert_int_equal(mlo_st_writer_add_generated(w, "big", MLO_DTYPE_U8, 2, shape, gen_fill, &g),
                   MLO_OK);
  const char *path = tmp_path("gen.safetensors");
  char err[256];
  assert_int_equal(mlo_st_writer_write(w, path, err, sizeof err), MLO_OK);
  mlo_st_writer_free(w);
  assert_int_equal(g.next, total);
  assert_true(g.calls >= 3);
  assert_true(g.max_len <= (4u << 20));

  mlo_st_file *f;
  assert_int_equal(mlo_st_open(path, &f, err, sizeof err), MLO_OK);
  const mlo_st_tensor *t = mlo_st_find(f, "big");
  assert_non_null(t);
  assert_int_equal(t->begin, 5); /* unaligned data is normal */
  uint8_t *got = pread_range(path, t->file_offset, (size_t)total);
  size_t bad = 0;
  while (bad < total && got[bad] == gen_byte(bad)) bad++;
  assert_int_equal(bad, total);
  free(got);
  mlo_st_close(f);
}

static void test_writer_rejects(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_int_equal(mlo_st_writer_create(&w), MLO_OK);
  uint8_t buf[64] = {0};
  int64_t s2[1] = {2}, s3[1] = {3}, neg[1] = {-1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  int64_t huge[2] = {INT64_MAX, 4};
  gen_state g = {0, 0, 0};
  assert_int_equal(mlo_st_writer_add(w, "a", MLO_DTYPE_F32, 1, s2, buf, 8, true), MLO_OK);
  assert_int_equal(mlo_st_writer_add(w, "a", MLO_DTYPE_F32, 1, s2, buf, 8, true), MLO_EEXIST);
  assert_int_equal(mlo_st_writer_add_generated(w, "a", MLO_DTYPE_U8, 1, s2, gen_fill, &g),
                   MLO_EEXIST);
  assert_int_equal(mlo_st_writer_add(w, "b", MLO_DTYPE_F32, 1, s2, buf, 7, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, "b", MLO_DTYPE_F32, 1, neg, buf, 0, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, "b", MLO_DTYPE_U8, 9, nine, buf, 1, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, "b", MLO_DTYPE_F4, 1, s3, buf, 1, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, "b", MLO_DTYPE_COUNT, 1, s2, buf, 2, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, "q", MLO_DTYPE_Q4_0, 1, (int64_t[]){32}, buf, 18, true),
                   MLO_EINVAL); /* a GGML block type is not a safetensors dtype */
  assert_int_equal(mlo_st_writer_add(w, "__metadata__", MLO_DTYPE_U8, 1, s2, buf, 2, true),
                   MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, NULL, MLO_DTYPE_U8, 1, s2, buf, 2, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add(w, "b", MLO_DTYPE_U8, 1, s2, NULL, 2, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add_generated(w, "b", MLO_DTYPE_U8, 2, huge, gen_fill, &g),
                   MLO_EINVAL);
  assert_int_equal(mlo_st_writer_add_generated(w, "b", MLO_DTYPE_U8, 1, s2, NULL, &g), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_set_metadata(w, "k", NULL), MLO_EINVAL);
  /* text the reader would refuse is refused when added */
  assert_int_equal(mlo_st_writer_add(w, "bad\xff", MLO_DTYPE_U8, 1, s2, buf, 2, true), MLO_EINVAL);
  assert_int_equal(mlo_st_writer_set_metadata(w, "k", "\xc0\x80"), MLO_EINVAL);
  mlo_st_writer_free(w);
  mlo_st_writer_free(NULL);
  mlo_st_close(NULL);
}

static size_t count_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* A failed write leaves nothing behind; a good one replaces atomically. */
static void test_writer_atomic(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_int_equal(mlo_st_writer_create(&w), MLO_OK);
  uint8_t v[4] = {9, 8, 7, 6};
  int64_t s[1] = {4};
  assert_int_equal(mlo_st_writer_add(w, "v", MLO_DTYPE_U8, 1, s, v, 4, false), MLO_OK);
  char err[512];
  assert_int_equal(mlo_st_writer_write(w, "/nonexistent-dir/x.safetensors", err, sizeof err),
                   MLO_EIO);
  assert_non_null(strstr(err, "/nonexistent-dir/x.safetensors"));
  assert_non_null(strstr(err, "No such file"));

  const char *path = tmp_path("atomic.safetensors");
  FILE *old = fopen(path, "w");
  assert_non_null(old);
  fputs("old content", old);
  fclose(old);
  size_t before = count_dir_entries(tmpdir);
  assert_int_equal(mlo_st_writer_write(w, path, err, sizeof err), MLO_OK);
  assert_int_equal(count_dir_entries(tmpdir), before); /* no temp file left */
  mlo_st_file *f;
  assert_int_equal(mlo_st_open(path, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->count, 1);
  mlo_st_close(f);
  mlo_st_writer_free(w);
}

static void test_open_errors(void **state) {
  (void)state;
  char err[512];
  mlo_st_file *f = (mlo_st_file *)1;
  assert_int_equal(mlo_st_open(tmp_path("missing.safetensors"), &f, err, sizeof err), MLO_EIO);
  assert_null(f);
  assert_non_null(strstr(err, "missing.safetensors"));
  assert_non_null(strstr(err, "No such file"));
  assert_int_equal(mlo_st_open(tmpdir, &f, err, sizeof err), MLO_EIO);
  assert_non_null(strstr(err, "not a regular file"));
  /* a too-small buffer truncates the message, never overflows */
  char tiny[8];
  assert_int_equal(mlo_st_open(tmp_path("missing.safetensors"), &f, tiny, sizeof tiny), MLO_EIO);
  assert_true(strlen(tiny) < sizeof tiny);
  assert_int_equal(mlo_st_open(tmp_path("missing.safetensors"), &f, NULL, 0), MLO_EIO);
}

/* Hand-built headers the reference format allows. */
static void test_reader_accepts(void **state) {
  (void)state;
  /* unpadded header (odd length), keys in any order, unknown keys, several
   * empty tensors sharing an offset, "__metadata__": null */
  const char *h = "{\"b\":{\"data_offsets\":[2,6],\"shape\":[1],\"dtype\":\"F32\",\"x\":1},"
                  "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
                  "\"y\":{\"dtype\":\"U8\",\"shape\":[2,0],\"data_offsets\":[2,2]},"
                  "\"a\":{\"dtype\":\"I16\",\"shape\":[],\"data_offsets\":[0,2]},"
                  "\"__metadata__\":null}\n ";
  size_t hl = strlen(h);
  uint8_t file[512] = {0};
  for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(file + 8, h, hl);
  size_t len = 8 + hl + 6;
  char err[256];
  mlo_st_file *f;
  assert_int_equal(mlo_st_parse("mem", file, len, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->count, 4);
  assert_int_equal(f->meta_count, 0);
  assert_int_equal(f->data_start, 8 + hl);
  assert_string_equal(f->tensors[0].name, "a");
  assert_int_equal(f->tensors[0].ndim, 0);
  assert_string_equal(f->tensors[3].name, "b");
  assert_int_equal(f->tensors[3].file_offset, 8 + hl + 2);
  assert_non_null(mlo_st_find(f, "y"));
  assert_non_null(mlo_st_find(f, "z"));
  mlo_st_close(f);
}

/* A program that uses cJSON itself keeps its own allocator: reading a
 * header does not install mlo's hooks over the program's (cJSON's hooks are
 * process-wide), and mlo parses correctly under the program's hooks. */
static size_t program_mallocs;
static void *program_malloc(size_t n) {
  program_mallocs++;
  return malloc(n);
}

static void test_cjson_hooks_stay_the_programs(void **state) {
  (void)state;
  cJSON_Hooks hooks = {program_malloc, free};
  cJSON_InitHooks(&hooks);
  const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  size_t hl = strlen(h);
  uint8_t file[128] = {0};
  for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(file + 8, h, hl);
  char err[256];
  mlo_st_file *f = NULL;
  size_t before = program_mallocs;
  assert_int_equal(mlo_st_parse("mem", file, 8 + hl + 4, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->count, 1);
  mlo_st_close(f);
  /* mlo's parse allocated through the hooks the program installed ... */
  assert_true(program_mallocs > before);
  /* ... and left them installed: the program's own parse still uses them */
  before = program_mallocs;
  cJSON *mine = cJSON_Parse("{\"k\":[1,2,3]}");
  assert_non_null(mine);
  assert_true(program_mallocs > before);
  cJSON_Delete(mine);
  cJSON_InitHooks(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cjson_hooks_stay_the_programs),
      cmocka_unit_test(test_dtype_names),
      cmocka_unit_test(test_dtype_nbytes),
      cmocka_unit_test(test_round_trip_every_dtype),
      cmocka_unit_test(test_empty_file_round_trip),
      cmocka_unit_test(test_generated_in_chunks),
      cmocka_unit_test(test_writer_rejects),
      cmocka_unit_test(test_writer_atomic),
      cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_reader_accepts),
  };
  return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
