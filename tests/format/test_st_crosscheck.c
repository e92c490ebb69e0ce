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
  uint8_t *bufs[MLO_DTYPE_COUNT * 3];
  size_t nb = 0;
  for (int d = 0; d < MLO_DTYPE_COUNT; d++) {
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
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  cJSON *j = cJSON_Parse(buf);
  free(buf);
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
  };
  return cmocka_run_group_tests(tests, NULL, remove_tmpdir);
}
