/*
 * test_gguf.c — the GGUF reader: every file of tests/format/hostile_gguf/
 * refused with its own message (from disk and from memory), every prefix
 * of a valid file refused, the files PyPI's gguf wrote (tests/format/real/
 * single/) read as gguf reads them, and a GGUF component loaded under every
 * injected allocation, open and read failure: a clean error, nothing half
 * loaded, and a retry that gives the same bytes.
 *
 *   test_gguf HOSTILE_DIR REAL_SINGLE_DIR SEED_DIR
 */
#include "testutil.h"

#include "base/sysio.h"
#include "format/gguf.h"
#include "mlo/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *hostile_dir, *real_dir, *seed_dir;

typedef struct {
  const char *file;  /* without .gguf */
  const char *words; /* a distinguishing part of the message */
} hostile_case;

static const hostile_case cases[] = {
    {"not_gguf", "not a GGUF file"},
    {"truncated_magic", "not a GGUF file"},
    {"version1", "GGUF version 1 (32-bit counts) is not supported"},
    {"version_big_endian", "looks like a big-endian file"},
    {"version4", "GGUF version 4 is not supported (v2 and v3 are)"},
    {"truncated_counts", "truncated: the tensor count at byte 8 needs 8 bytes"},
    {"too_many_tensors", "claims 1099511627776 tensors, more than the file could hold"},
    {"too_many_kv", "claims 1099511627776 metadata key-values"},
    {"key_too_long", "70000 bytes long, over the cap of 65535"},
    {"key_empty", "metadata key at byte 24 is empty"},
    {"key_bad_utf8", "is not valid UTF-8 (byte 0xff at 1)"},
    {"string_past_end", "truncated: a metadata key at byte 32 needs 1000 bytes"},
    {"value_type_unknown", "key 'k': unknown value type 13"},
    {"array_type_unknown", "key 'k': array at byte 37 has unknown element type 14"},
    {"array_count_huge", "claims 1152921504606846976 u32 elements, more than the"},
    {"array_too_deep", "arrays nested more than 4 deep"},
    {"bool_not_0_1", "key 'k': bool value is 2, not 0 or 1"},
    {"duplicate_key", "duplicate metadata key 'k'"},
    {"alignment_not_u32", "general.alignment is a u64, not a u32"},
    {"alignment_not_pow2", "general.alignment 48 is not a power of two"},
    {"arch_not_string", "general.architecture is a u32, not a string"},
    {"tensor_name_empty", "tensor name at byte 67 is empty"},
    {"tensor_name_duplicate", "tensor 'w': duplicate tensor name"},
    {"tensor_too_many_dims", "tensor 'w': 5 dimensions, more than GGUF's 4"},
    {"tensor_dim_over_2_63", "dimension 0 is 9223372036854775808, over 2^63"},
    {"tensor_dims_overflow", "dimensions multiply past 2^64 elements"},
    {"tensor_bytes_overflow", "tensor 'w': its size passes 2^64 bytes"},
    {"tensor_type_unknown", "tensor 'w': unknown GGML type 99"},
    {"tensor_block_rows", "rows of 33 elements are not whole 32-element Q4_0 blocks"},
    {"tensor_offset_unaligned", "offset 4 is not a multiple of the 32-byte alignment"},
    {"tensor_past_end", "run past the end of the data section (16 bytes from byte 128)"},
    {"tensor_overlap", "tensor 'b': bytes from 32 overlap tensor 'a' (ends at 64)"},
    {"tensor_info_truncated", "truncated: a dimension at byte 45 needs 8 bytes"},
};
#define NCASES (sizeof cases / sizeof *cases)

static int open_any(const char *path, void **out, char *err, size_t errlen) {
  return mlo_gguf_open(path, (mlo_gguf_file **)out, err, errlen);
}
static int parse_any(const char *name, const uint8_t *bytes, size_t len, void **out, char *err,
                     size_t errlen) {
  return mlo_gguf_parse(name, bytes, len, (mlo_gguf_file **)out, err, errlen);
}

static void test_each_case_refused(void **state) {
  (void)state;
  const tu_reader reader = {open_any, parse_any};
  for (size_t i = 0; i < NCASES; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", hostile_dir, cases[i].file);
    tu_assert_refused(&reader, path, "mem.gguf", "", cases[i].words);
  }
}

static void test_every_file_has_a_case(void **state) {
  (void)state;
  const char *names[NCASES];
  for (size_t i = 0; i < NCASES; i++) names[i] = cases[i].file;
  tu_assert_corpus_covered(hostile_dir, ".gguf", names, NCASES);
}

/* Every prefix of a valid file with every value type is refused. */
static void test_every_truncation_refused(void **state) {
  (void)state;
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/seed_every_type.gguf", seed_dir);
  size_t full;
  uint8_t *file = tu_read_file(path, &full);
  mlo_gguf_file *f = NULL;
  assert_int_equal(mlo_gguf_parse("cut", file, full, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->alignment, 64);
  assert_int_equal(f->count, 3);
  assert_int_equal(f->kv_count, 15);
  mlo_gguf_close(f);
  /* the data section ends with the last tensor's bytes: any cut inside the
   * header or the tensors is refused */
  for (size_t len = 0; len < full - 8; len++) {
    uint8_t *cut = malloc(len ? len : 1);
    memcpy(cut, file, len);
    f = (mlo_gguf_file *)1;
    int rc = mlo_gguf_parse("cut", cut, len, &f, err, sizeof err);
    if (rc != MLO_EFORMAT) fail_msg("a %zu-byte prefix gave %s", len, mlo_err_name(rc));
    assert_null(f);
    assert_true(strncmp(err, "cut: ", 5) == 0);
    free(cut);
  }
  free(file);
}

/* What PyPI's gguf wrote, read back: types, shapes innermost-last,
 * alignment (32 by default, 64 where the writer set it), offsets. */
static void test_reads_gguf_package_files(void **state) {
  (void)state;
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/wan2.2_t2v_high_noise_14B_Q4_K_M.gguf", real_dir);
  mlo_gguf_file *f = NULL;
  assert_int_equal(mlo_gguf_open(path, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->version, 3);
  assert_int_equal(f->alignment, 32);
  assert_string_equal(f->architecture, "wan");
  assert_int_equal(f->count, 6);
  bool saw_q4k = false;
  for (size_t i = 0; i < f->count; i++) {
    const mlo_gguf_tensor *t = &f->tensors[i];
    assert_int_equal(t->file_offset % 32, 0);
    if (!strcmp(t->name, "blocks.0.self_attn.q.weight")) {
      saw_q4k = true;
      assert_int_equal(t->dtype, MLO_DTYPE_Q4_K);
      assert_int_equal(t->n_dims, 2);
      assert_int_equal(t->shape[0], 16); /* rows */
      assert_int_equal(t->shape[1], 256);
      assert_int_equal(t->nbytes, 16 * 144); /* one 256-element block per row */
    }
  }
  assert_true(saw_q4k);
  mlo_gguf_close(f);
  snprintf(path, sizeof path, "%s/umt5-xxl-encoder-Q8_0.gguf", real_dir);
  assert_int_equal(mlo_gguf_open(path, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->alignment, 64);
  assert_string_equal(f->architecture, "t5encoder");
  for (size_t i = 0; i < f->count; i++) assert_int_equal(f->tensors[i].file_offset % 64, 0);
  mlo_gguf_close(f);
}

/* ---- a GGUF component under injected faults ------------------------------ */

typedef struct {
  int rc;
  uint64_t digest; /* of the host slab's bytes, tensor by tensor */
  char msg[512];
} load_result;

static void load(const char *path, load_result *r) {
  memset(r, 0, sizeof *r);
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  r->rc = mlo_platform_open("host", &plat, r->msg, sizeof r->msg);
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_component_file file = {"transformer", MLO_ROLE_DIT, path};
  if (!r->rc) r->rc = mlo_pipeline_open_files(&po, &file, 1, NULL, &pipe, r->msg, sizeof r->msg);
  if (!r->rc) {
    r->rc = mlo_pipeline_materialize(pipe);
    if (r->rc) snprintf(r->msg, sizeof r->msg, "%s", mlo_pipeline_errmsg(pipe));
  }
  if (!r->rc) {
    mlo_component *c = mlo_pipeline_component_at(pipe, 0);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < mlo_component_tensor_count(c); i++) {
      const mlo_tensor *t = mlo_component_tensor_at(c, i);
      const uint8_t *p = mlo_tensor_host_data(t);
      for (uint64_t k = 0; k < mlo_tensor_nbytes(t); k++) h = (h ^ p[k]) * 1099511628211ull;
    }
    r->digest = h;
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
}

static void test_faults_fail_cleanly_and_retry(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/wan2.2_t2v_high_noise_14B_Q4_K_M.gguf", real_dir);
  load_result clean, r;
  load(path, &clean);
  if (clean.rc) fail_msg("clean load: %s (%s)", mlo_err_name(clean.rc), clean.msg);
  /* the bytes loaded are the file's: compare one tensor with a direct read */
  for (int kind = 0; kind < MLO_SYSFAULT_KINDS; kind++) {
    mlo_sysfault_arm((mlo_sysfault_kind)kind, 0);
    load(path, &r);
    uint64_t calls = mlo_sysfault_calls((mlo_sysfault_kind)kind);
    mlo_sysfault_disarm();
    assert_int_equal(r.rc, MLO_OK);
    for (uint64_t n = 1; n <= calls; n++) {
      mlo_sysfault_arm((mlo_sysfault_kind)kind, n);
      load(path, &r);
      bool fired = mlo_sysfault_fired();
      mlo_sysfault_disarm();
      assert_true(fired);
      int want = kind == MLO_SYSFAULT_ALLOC ? MLO_ENOMEM : MLO_EIO;
      if (kind == MLO_SYSFAULT_SHORT || r.rc == MLO_OK) {
        /* a short read is no error (callers loop); a failure the library
         * absorbs (a best-effort allocation) must change nothing */
        if (r.rc != MLO_OK || r.digest != clean.digest)
          fail_msg("%s #%llu: %s (%s)", mlo_sysfault_name((mlo_sysfault_kind)kind),
                   (unsigned long long)n, mlo_err_name(r.rc), r.msg);
      } else if (r.rc != want || !r.msg[0]) {
        fail_msg("%s #%llu: %s (%s), expected %s", mlo_sysfault_name((mlo_sysfault_kind)kind),
                 (unsigned long long)n, mlo_err_name(r.rc), r.msg, mlo_err_name(want));
      }
      load(path, &r); /* the retry */
      assert_int_equal(r.rc, MLO_OK);
      assert_int_equal(r.digest, clean.digest);
    }
  }
}

/* A header may cost at most twice its file in host memory (or 64 MiB):
 * 140000 one-float tensors in a 5 MB file would take about 68 MiB to hold,
 * and are refused at once; the same header in front of a file large enough
 * is read. */
static void put_u(uint8_t **p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}

static void test_header_cost_bounded_by_file(void **state) {
  (void)state;
  const uint64_t nt = 140000;
  size_t header_cap = 64 + nt * 48, data = nt * 32, pad = (size_t)30 << 20;
  uint8_t *buf = calloc(1, header_cap + data + pad);
  assert_non_null(buf);
  uint8_t *p = buf;
  memcpy(p, "GGUF", 4), p += 4;
  put_u(&p, 3, 4), put_u(&p, nt, 8), put_u(&p, 0, 8);
  for (uint64_t i = 0; i < nt; i++) {
    char name[32];
    int n = snprintf(name, sizeof name, "t%llu", (unsigned long long)i);
    put_u(&p, (uint64_t)n, 8);
    memcpy(p, name, (size_t)n), p += n;
    put_u(&p, 1, 4), put_u(&p, 1, 8), put_u(&p, 0, 4), put_u(&p, i * 32, 8); /* F32 [1] */
  }
  size_t header = (size_t)(p - buf);
  header += (32 - header % 32) % 32;
  size_t len = header + data;
  mlo_gguf_file *f = NULL;
  char err[512];
  assert_int_equal(mlo_gguf_parse("many", buf, len, &f, err, sizeof err), MLO_EFORMAT);
  if (!strstr(err, "140000 tensors") || !strstr(err, "more than twice the file"))
    fail_msg("message \"%s\"", err);
  assert_int_equal(mlo_gguf_parse("many", buf, len + pad, &f, err, sizeof err), MLO_OK);
  assert_int_equal(f->count, nt);
  mlo_gguf_close(f);
  free(buf);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s HOSTILE_DIR REAL_SINGLE_DIR SEED_DIR\n", argv[0]);
    return 2;
  }
  hostile_dir = argv[1];
  real_dir = argv[2];
  seed_dir = argv[3];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_case_refused),
      cmocka_unit_test(test_every_file_has_a_case),
      cmocka_unit_test(test_every_truncation_refused),
      cmocka_unit_test(test_reads_gguf_package_files),
      cmocka_unit_test(test_faults_fail_cleanly_and_retry),
      cmocka_unit_test(test_header_cost_bounded_by_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
