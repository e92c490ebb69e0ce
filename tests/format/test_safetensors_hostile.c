/*
 * test_safetensors_hostile.c — every file of tests/format/hostile/ must be
 * refused with its own message.
 *
 * Each corpus file (made by hostile/generate.py) breaks one rule of
 * docs/formats.md; the table below says which error and which words must
 * name it, so a reader that refuses a file for the wrong reason fails
 * here.  Every file is read both from disk and from memory (the fuzz
 * target's entry point), and every file in the directory must have a row.
 */
#include "testutil.h"

#include "format/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *corpus_dir;

typedef struct {
  const char *file;   /* without .safetensors */
  const char *tensor; /* the tensor the message must name, or NULL */
  const char *words;  /* a distinguishing part of the message */
} hostile_case;

static const hostile_case cases[] = {
    {"truncated", NULL, "truncated: 5 bytes"},
    {"header_past_file", NULL, "header length 1000 runs past the end of the file"},
    {"header_over_cap", NULL, "header length 200000000 is over the cap"},
    {"not_json", NULL, "header is not valid JSON at byte 16: unexpected end of text"},
    {"json_trailing_text", NULL, "not valid JSON at byte 3: trailing characters"},
    {"not_object", NULL, "header JSON is not an object"},
    {"bad_utf8", NULL, "not valid UTF-8 (byte 0xff at 2)"},
    {"entry_not_object", "a", "entry is not an object"},
    {"dtype_not_string", "a", "\"dtype\" is not a string"},
    {"missing_offsets", "a", "no \"data_offsets\""},
    {"offsets_not_pair", "a", "\"data_offsets\" is not an array of two numbers"},
    {"shape_not_array", "a", "\"shape\" is not an array"},
    {"dim_not_whole", "a", "unsigned integers (no sign, point or exponent); '1.5' is not one"},
    {"unknown_dtype", "a", "unknown dtype 'F128'"},
    {"negative_dim", "a", "unsigned integers (no sign, point or exponent); '-2' is not one"},
    {"too_many_dims", "a", "shape has 9 dims, more than MLO_MAX_DIMS (8)"},
    {"end_before_begin", "a", "data_offsets [4, 0) end before they begin"},
    {"size_mismatch", "blocks.0.w", "data_offsets [0, 10) but shape [2, 3] of F32 needs 24 bytes"},
    {"shape_overflow", "a", "shape [4294967296, 4294967296, 4294967296] has more than 2^64"},
    {"bytes_overflow", "a", "shape [2147483648, 2147483648] of U64 needs more than 2^64 bytes"},
    {"subbyte_fraction", "a", "shape [3] of F4 is not a whole number of bytes"},
    {"offsets_past_end", "a", "[0, 16) run past the end of the data section (8 bytes)"},
    {"offsets_overlap", "b", "data_offsets [4, 12) overlap tensor 'a' (ends at 8)"},
    {"offsets_gap", "b", "gap of 4 bytes after tensor 'a' (ends at 4)"},
    {"offsets_not_from_zero", "a", "gap: the data section starts with 4 unused bytes"},
    {"trailing_bytes", NULL, "4 trailing bytes after the last tensor's data"},
    {"duplicate_name", "a", "duplicate tensor name"},
    {"duplicate_metadata", NULL, "duplicate key \"__metadata__\""},
    {"metadata_duplicate_key", NULL, "duplicate __metadata__ key 'k'"},
    {"metadata_not_object", NULL, "__metadata__ is not an object"},
    {"metadata_not_string", NULL, "__metadata__ value of 'step' is not a string"},
};
#define NCASES (sizeof cases / sizeof *cases)

static int open_any(const char *path, void **out, char *err, size_t errlen) {
  return mlo_st_open(path, (mlo_st_file **)out, err, errlen);
}
static int parse_any(const char *name, const uint8_t *bytes, size_t len, void **out, char *err,
                     size_t errlen) {
  return mlo_st_parse(name, bytes, len, (mlo_st_file **)out, err, errlen);
}

/* Each file refused from disk and from memory, naming the tensor. */
static void test_each_case_refused(void **state) {
  (void)state;
  const tu_reader reader = {open_any, parse_any};
  for (size_t i = 0; i < NCASES; i++) {
    const hostile_case *c = &cases[i];
    char path[512], lead[256] = "";
    snprintf(path, sizeof path, "%s/%s.safetensors", corpus_dir, c->file);
    if (c->tensor) snprintf(lead, sizeof lead, "tensor '%s': ", c->tensor);
    tu_assert_refused(&reader, path, "mem.safetensors", lead, c->words);
  }
}

static void test_every_file_has_a_case(void **state) {
  (void)state;
  const char *names[NCASES];
  for (size_t i = 0; i < NCASES; i++) names[i] = cases[i].file;
  tu_assert_corpus_covered(corpus_dir, ".safetensors", names, NCASES);
}

/* Prefix lengths of a valid file: every cut is refused, never a crash. */
static void test_every_truncation_refused(void **state) {
  (void)state;
  static const char h[] = "{\"__metadata__\":{\"k\":\"v\"},"
                          "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  uint8_t file[8 + sizeof h + 8];
  size_t hl = sizeof h - 1;
  for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(file + 8, h, hl);
  memset(file + 8 + hl, 0x3f, 8);
  size_t full = 8 + hl + 8;
  char err[512];
  mlo_st_file *f;
  assert_int_equal(mlo_st_parse("cut", file, full, &f, err, sizeof err), MLO_OK);
  mlo_st_close(f);
  for (size_t len = 0; len < full; len++) {
    /* copy so ASan sees reads past the cut */
    uint8_t *cut = malloc(len ? len : 1);
    memcpy(cut, file, len);
    f = (mlo_st_file *)1;
    assert_int_equal(mlo_st_parse("cut", cut, len, &f, err, sizeof err), MLO_EFORMAT);
    assert_null(f);
    assert_true(strncmp(err, "cut: ", 5) == 0);
    free(cut);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s HOSTILE_CORPUS_DIR\n", argv[0]);
    return 2;
  }
  corpus_dir = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_case_refused),
      cmocka_unit_test(test_every_file_has_a_case),
      cmocka_unit_test(test_every_truncation_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
