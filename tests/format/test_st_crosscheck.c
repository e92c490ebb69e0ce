/*
 * test_st_crosscheck.c — mlo's safetensors against the reference package.
 *
 * Round trips through our own writer and reader cannot catch a shared
 * misreading of the format; the reference `safetensors` package can.  In
 * one direction mlo writes a file (every dtype, 0-rank, empty, metadata)
 * and st_crosscheck.py reads it with the reference; in the other the
 * reference writes one and mlo reads it.  Each side checks against a JSON
 * manifest of names, dtypes, shapes and bytes.  Without python3 or the
 * package this FAILS, unless MLO_SKIP_PYTHON=1 (then exit 77, skipped).
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
#include <sys/wait.h>
#include <unistd.h>

static const char *script;
static char tmpdir[256];

/* Runs `python3 script args...`; returns its exit status, 127 if python3
 * could not be started. */
static int run_script(const char *a1, const char *a2, const char *a3) {
  const char *py = getenv("MLO_PYTHON") ? getenv("MLO_PYTHON") : "python3";
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    char *argv[] = {(char *)py, (char *)script, (char *)a1, (char *)a2, (char *)a3, NULL};
    execvp(py, argv);
    _exit(127);
  }
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *tmp_path(const char *name, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", tmpdir, name);
  return buf;
}

static char *hex_of(const uint8_t *p, size_t n) {
  char *s = malloc(2 * n + 1);
  for (size_t i = 0; i < n; i++) sprintf(s + 2 * i, "%02x", p[i]);
  s[2 * n] = '\0';
  return s;
}

static void add_manifest_tensor(cJSON *arr, const char *name, mlo_dtype dt, int ndim,
                                const int64_t *shape, const uint8_t *data, size_t n) {
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "name", name);
  cJSON_AddStringToObject(t, "dtype", mlo_dtype_name(dt));
  cJSON *s = cJSON_AddArrayToObject(t, "shape");
  for (int k = 0; k < ndim; k++) cJSON_AddItemToArray(s, cJSON_CreateNumber((double)shape[k]));
  char *hex = hex_of(data, n);
  cJSON_AddStringToObject(t, "hex", hex);
  free(hex);
  cJSON_AddItemToArray(arr, t);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void test_reference_reads_mlo(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_int_equal(mlo_st_writer_create(&w), MLO_OK);
  cJSON *man = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(man, "metadata");
  cJSON *arr = cJSON_AddArrayToObject(man, "tensors");
  uint8_t *bufs[MLO_DTYPE_FIRST_BLOCK * 3];
  size_t nb = 0;
  for (int d = 0; d < MLO_DTYPE_FIRST_BLOCK; d++) { /* safetensors' own types */
    /* [3, 4], a scalar where whole bytes allow, an empty [0, 2] */
    int64_t shapes[3][2] = {{3, 4}, {0, 0}, {0, 2}};
    int ndims[3] = {2, 0, 2};
    const char *suffix[3] = {"", ".scalar", ".empty"};
    for (int v = 0; v < 3; v++) {
      uint64_t numel = v == 0 ? 12 : v == 1 ? 1 : 0, n;
      if (mlo_dtype_nbytes((mlo_dtype)d, numel, &n) != MLO_OK) continue; /* F4/F6 scalars */
      uint8_t *p = malloc(n ? n : 1);
      for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(d * 37 + v * 11 + i * 5);
      bufs[nb++] = p;
      char name[64];
      snprintf(name, sizeof name, "mlo.%s%s", mlo_dtype_name((mlo_dtype)d), suffix[v]);
      assert_int_equal(mlo_st_writer_add(w, name, (mlo_dtype)d, ndims[v], shapes[v], p, n, false),
                       MLO_OK);
      add_manifest_tensor(arr, name, (mlo_dtype)d, ndims[v], shapes[v], p, (size_t)n);
    }
  }
  assert_int_equal(mlo_st_writer_set_metadata(w, "format", "pt"), MLO_OK);
  assert_int_equal(mlo_st_writer_set_metadata(w, "quote\"d", "\xc3\xa9t\xc3\xa9\n"), MLO_OK);
  cJSON_AddStringToObject(meta, "format", "pt");
  cJSON_AddStringToObject(meta, "quote\"d", "\xc3\xa9t\xc3\xa9\n");

  char fpath[512], mpath[512], err[512];
  assert_int_equal(
      mlo_st_writer_write(w, tmp_path("mlo.safetensors", fpath, sizeof fpath), err, sizeof err),
      MLO_OK);
  mlo_st_writer_free(w);
  for (size_t i = 0; i < nb; i++) free(bufs[i]);
  char *text = cJSON_Print(man);
  write_text(tmp_path("mlo.json", mpath, sizeof mpath), text);
  free(text);
  cJSON_Delete(man);
  assert_int_equal(run_script("read", fpath, mpath), 0);
}

static cJSON *read_json(const char *path) {
  char *text = (char *)tu_read_file(path, NULL);
  cJSON *j = cJSON_Parse(text);
  free(text);
  assert_non_null(j);
  return j;
}

static void check_tensor(const char *path, const mlo_st_file *f, const cJSON *t) {
  const char *name = cJSON_GetObjectItem(t, "name")->valuestring;
  const mlo_st_tensor *st = mlo_st_find(f, name);
  if (!st) fail_msg("tensor %s written by the reference is missing", name);
  assert_string_equal(mlo_dtype_name(st->dtype), cJSON_GetObjectItem(t, "dtype")->valuestring);
  const cJSON *shape = cJSON_GetObjectItem(t, "shape");
  assert_int_equal(st->ndim, cJSON_GetArraySize(shape));
  for (int k = 0; k < st->ndim; k++)
    assert_int_equal(st->shape[k], (int64_t)cJSON_GetArrayItem(shape, k)->valuedouble);
  size_t n = (size_t)(st->end - st->begin);
  uint8_t *got = malloc(n ? n : 1);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(pread(fd, got, n, (off_t)st->file_offset), (ssize_t)n);
  close(fd);
  char *hex = hex_of(got, n);
  if (strcmp(hex, cJSON_GetObjectItem(t, "hex")->valuestring) != 0)
    fail_msg("tensor %s: bytes differ from the reference's", name);
  free(hex);
  free(got);
}

static void test_mlo_reads_reference(void **state) {
  (void)state;
  char fpath[512], mpath[512], err[512];
  tmp_path("ref.safetensors", fpath, sizeof fpath);
  tmp_path("ref.json", mpath, sizeof mpath);
  assert_int_equal(run_script("write", fpath, mpath), 0);
  cJSON *man = read_json(mpath);
  mlo_st_file *f;
  int rc = mlo_st_open(fpath, &f, err, sizeof err);
  if (rc) fail_msg("mlo refuses the reference's file: %s", err);
  const cJSON *tensors = cJSON_GetObjectItem(man, "tensors"), *t;
  assert_int_equal(f->count, cJSON_GetArraySize(tensors));
  assert_true(f->count > 30);
  cJSON_ArrayForEach(t, tensors) check_tensor(fpath, f, t);
  const cJSON *meta = cJSON_GetObjectItem(man, "metadata");
  assert_int_equal(f->meta_count, cJSON_GetArraySize(meta));
  for (size_t i = 0; i < f->meta_count; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, f->meta[i].key);
    assert_non_null(v);
    assert_string_equal(f->meta[i].value, v->valuestring);
  }
  mlo_st_close(f);
  cJSON_Delete(man);
}

static int remove_tmpdir(void **state) {
  (void)state;
  DIR *d = opendir(tmpdir);
  if (!d) return -1;
  char p[512];
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
    unlink(p);
  }
  closedir(d);
  return rmdir(tmpdir);
}

/* ---- the header grammar, against the reference, both ways --------------- */

/* One header text; the data section is 4 bytes (tensor "a": F32 [1] at
 * [0, 4) unless the text says otherwise).  `stricter` is NULL where mlo
 * must decide exactly as the reference does, else why mlo refuses a
 * header the reference reads (docs/formats.md lists the same). */
typedef struct {
  const char *name, *header;
  const char *stricter;
} grammar_case;

#define ENTRY "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"
static const grammar_case grammar[] = {
    {"ok", "{" ENTRY "}", NULL},
    {"leading_space", "  {" ENTRY "}", NULL},
    {"trailing_space", "{" ENTRY "}   ", NULL},
    {"bom", "\xEF\xBB\xBF{" ENTRY "}", NULL},
    {"trailing_nul", "{" ENTRY "}\0", NULL},
    {"nul_then_text", "{" ENTRY "}\0junk", NULL},
    {"float_shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", NULL},
    {"exponent_offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4e0]}}", NULL},
    {"leading_zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", NULL},
    {"negative_zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-0,4]}}", NULL},
    {"plus_sign", "{\"a\":{\"dtype\":\"F32\",\"shape\":[+1],\"data_offsets\":[0,4]}}", NULL},
    {"control_in_name", "{\"a\x01\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     NULL},
    {"tab_in_name", "{\"a\t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL},
    {"vt_between", "{\x0B" ENTRY "}", NULL},
    {"ff_between", "{\x0C" ENTRY "}", NULL},
    {"duplicate_field",
     "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL},
    {"nul_in_dtype", "{\"a\":{\"dtype\":\"F32\\u0000\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     NULL},
    {"lone_surrogate", "{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     NULL},
    {"paired_surrogate",
     "{\"a\\ud83d\\ude00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL},
    {"bad_escape", "{\"a\\x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL},
    {"escaped_name", "{\"\\u0061\\/\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     NULL},
    {"escaped_field", "{\"a\":{\"dtype\":\"F32\",\"sh\\u0061pe\":[1.0],\"data_offsets\":[0,4]}}",
     NULL},
    {"unknown_field_any",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
     "\"x\":[-1.5e3,\"z\",{\"q\":null},true]}}",
     NULL},
    {"trailing_comma", "{" ENTRY ",}", NULL},
    {"metadata_null", "{\"__metadata__\":null," ENTRY "}", NULL},
    {"metadata_number", "{\"__metadata__\":{\"k\":1}," ENTRY "}", NULL},
    {"metadata_twice", "{\"__metadata__\":{},\"__metadata__\":{}," ENTRY "}", NULL},
    {"top_array", "[]", NULL},
    {"del_in_name", "{\"a\x7F\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL},
    {"nul_in_name", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     "a name is a C string: \\u0000 would cut it to another name"},
    {"empty_name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     "a tensor is addressed by its name; an empty one is refused by mlo_tensor_add"},
    {"duplicate_name", "{" ENTRY "," ENTRY "}",
     "the reference keeps the last entry silently; which one was meant is a guess"},
    {"metadata_duplicate_key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," ENTRY "}",
     "the reference keeps the last value silently; which one was meant is a guess"},
};

/* 126 and 127 nested arrays under a tensor entry (two levels): serde_json
 * stops at 128 levels. */
static char *nested(int arrays) {
  size_t n = (size_t)arrays * 2 + 128;
  char *s = malloc(n);
  int k = snprintf(s, n, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":");
  for (int i = 0; i < arrays; i++) s[k++] = '[';
  for (int i = 0; i < arrays; i++) s[k++] = ']';
  snprintf(s + k, n - (size_t)k, "}}");
  return s;
}

static void write_case(const char *dir, const char *name, const char *hdr, size_t hlen) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint8_t prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  static const uint8_t data[4] = {0};
  assert_int_equal(fwrite(prefix, 1, 8, f), 8);
  assert_int_equal(fwrite(hdr, 1, hlen, f), hlen);
  assert_int_equal(fwrite(data, 1, 4, f), 4);
  assert_int_equal(fclose(f), 0);
}

/* Header lengths: the table's texts may hold a NUL, so they are sized by
 * the literal, not by strlen. */
#define GRAMMAR_LEN(i) (strlen(grammar[i].header) + extra_nul(grammar[i].name))
static size_t extra_nul(const char *name) {
  if (!strcmp(name, "trailing_nul")) return 1;
  if (!strcmp(name, "nul_then_text")) return 5;
  return 0;
}

#define GRAMMAR_CASES (sizeof grammar / sizeof grammar[0])
/* The table's cases, then the two nesting-depth cases. */
static const char *case_name(size_t i) {
  return i < GRAMMAR_CASES ? grammar[i].name : i == GRAMMAR_CASES ? "depth_127" : "depth_128";
}

static void test_header_grammar_matches_reference(void **state) {
  (void)state;
  char dir[300], out[320];
  snprintf(dir, sizeof dir, "%s/grammar", tmpdir);
  assert_int_equal(mkdir(dir, 0700), 0);
  size_t n = sizeof grammar / sizeof grammar[0];
  for (size_t i = 0; i < n; i++)
    write_case(dir, grammar[i].name, grammar[i].header, GRAMMAR_LEN(i));
  char *deep_ok = nested(125), *deep_bad = nested(126);
  write_case(dir, "depth_127", deep_ok, strlen(deep_ok));
  write_case(dir, "depth_128", deep_bad, strlen(deep_bad));
  free(deep_ok);
  free(deep_bad);
  snprintf(out, sizeof out, "%s/verdicts.json", tmpdir);
  assert_int_equal(run_script("verdicts", dir, out), 0);
  FILE *f = fopen(out, "rb");
  assert_non_null(f);
  char buf[8192];
  size_t len = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[len] = '\0';
  cJSON *ref = cJSON_Parse(buf);
  assert_non_null(ref);
  int disagree = 0;
  for (size_t i = 0; i < n + 2; i++) {
    const char *name = case_name(i);
    const char *stricter = i < n ? grammar[i].stricter : NULL;
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    mlo_st_file *st = NULL;
    bool mlo_ok = mlo_st_open(path, &st, err, sizeof err) == MLO_OK;
    mlo_st_close(st);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(ref, name);
    assert_true(cJSON_IsBool(v));
    bool ref_ok = cJSON_IsTrue(v);
    bool want = stricter ? false : ref_ok;
    if (stricter && !ref_ok) {
      fprintf(stderr, "grammar %s: marked stricter, but the reference refuses it too\n", name);
      disagree++;
    } else if (mlo_ok != want) {
      fprintf(stderr, "grammar %s: reference %s, mlo %s (%s)\n", name,
              ref_ok ? "accepts" : "refuses", mlo_ok ? "accepts" : "refuses", err);
      disagree++;
    } else if (!mlo_ok && !err[0]) {
      fprintf(stderr, "grammar %s: refused without a message\n", name);
      disagree++;
    }
  }
  cJSON_Delete(ref);
  for (size_t i = 0; i < n + 2; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir,
             i < n    ? grammar[i].name
             : i == n ? "depth_127"
                      : "depth_128");
    unlink(path);
  }
  rmdir(dir);
  assert_int_equal(disagree, 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s st_crosscheck.py\n", argv[0]);
    return 2;
  }
  script = argv[1];
  bool may_skip = getenv("MLO_SKIP_PYTHON") && strcmp(getenv("MLO_SKIP_PYTHON"), "1") == 0;
  int rc = run_script("probe", NULL, NULL);
  if (rc == 77) return 77; /* the script saw MLO_SKIP_PYTHON=1 */
  if (rc == 127) {
    fprintf(stderr, "st_crosscheck: python3 not found%s\n",
            may_skip ? " (skipped: MLO_SKIP_PYTHON=1)" : "; set MLO_SKIP_PYTHON=1 to skip");
    return may_skip ? 77 : 1;
  }
  if (rc != 0) return 1;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mlo_st_xcheck_XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_reads_mlo),
      cmocka_unit_test(test_mlo_reads_reference),
      cmocka_unit_test(test_header_grammar_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, remove_tmpdir);
}
