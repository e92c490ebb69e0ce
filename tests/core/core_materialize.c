/*
 * core_materialize — tensors come from a file range, from memory or start
 * zero-filled, and land in the host slab byte for byte; bad descriptions
 * (negative dims, ranges past the end of a file, missing files, duplicate
 * names, two sources, odd sub-byte sizes) give clear errors and leave the
 * component as it was.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#define FILE_BYTES 8192

static char path[64];

static int make_file(void **state) {
  (void)state;
  snprintf(path, sizeof path, "/tmp/mlo_core_materialize_%ld.bin", (long)getpid());
  uint8_t *bytes = malloc(FILE_BYTES);
  if (!bytes) return -1;
  tu_fill_pattern(bytes, FILE_BYTES, tu_seed("file", "whole"));
  FILE *f = fopen(path, "wb");
  size_t wrote = f ? fwrite(bytes, 1, FILE_BYTES, f) : 0;
  if (f) fclose(f);
  free(bytes);
  return wrote == FILE_BYTES ? 0 : -1;
}

static int remove_file(void **state) {
  (void)state;
  unlink(path);
  return 0;
}

static mlo_tensor_desc desc_1d(const char *name, mlo_dtype dtype, int64_t n) {
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = name;
  d.dtype = dtype;
  d.ndim = 1;
  d.shape[0] = n;
  return d;
}

static void test_file_memory_zero(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *comp = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &comp));
  /* From the file: [1000, 1000+1024) as 256 F32, and a 2-D U8 at 3 */
  mlo_tensor_desc a = desc_1d("from_file", MLO_DTYPE_F32, 256);
  a.file = path;
  a.file_offset = 1000;
  mlo_tensor_desc b = desc_1d("from_file_2d", MLO_DTYPE_U8, 0);
  b.ndim = 2;
  b.shape[0] = 7;
  b.shape[1] = 9;
  b.file = path;
  b.file_offset = 3;
  uint8_t mem[96];
  tu_fill_pattern(mem, sizeof mem, tu_seed("mem", "m"));
  mlo_tensor_desc c = desc_1d("from_memory", MLO_DTYPE_BF16, 48);
  c.data = mem;
  mlo_tensor_desc z = desc_1d("zeros", MLO_DTYPE_F16, 300);
  mlo_tensor *ta = NULL, *tb = NULL, *tc = NULL, *tz = NULL;
  assert_ok(mlo_tensor_add(comp, &a, &ta));
  assert_ok(mlo_tensor_add(comp, &b, &tb));
  assert_ok(mlo_tensor_add(comp, &c, &tc));
  assert_ok(mlo_tensor_add(comp, &z, &tz));
  assert_int_equal(mlo_tensor_nbytes(tb), 63);
  assert_int_equal(mlo_tensor_ndim(tb), 2);
  assert_int_equal(mlo_tensor_shape(tb)[1], 9);
  assert_int_equal(mlo_tensor_dtype(tc), MLO_DTYPE_BF16);
  assert_ok(mlo_component_materialize(comp));
  uint8_t whole[FILE_BYTES];
  tu_fill_pattern(whole, FILE_BYTES, tu_seed("file", "whole"));
  assert_memory_equal(mlo_tensor_host_data(ta), whole + 1000, 1024);
  assert_memory_equal(mlo_tensor_host_data(tb), whole + 3, 63);
  assert_memory_equal(mlo_tensor_host_data(tc), mem, sizeof mem);
  assert_ptr_not_equal(mlo_tensor_host_data(tc), mem); /* copied, not borrowed */
  mem[0] ^= 0xff;
  assert_int_not_equal(((const uint8_t *)mlo_tensor_host_data(tc))[0], mem[0]);
  const uint8_t *zeros = mlo_tensor_host_data(tz);
  for (size_t i = 0; i < 600; i++) assert_int_equal(zeros[i], 0);
  /* Slab alignment: every tensor starts on a 256-byte boundary. */
  assert_int_equal((uintptr_t)mlo_tensor_host_data(tb) % 256, 0);
  assert_int_equal((uintptr_t)mlo_tensor_host_data(tz) % 256, 0);
  /* Declared once materialized: refused. */
  mlo_tensor_desc late = desc_1d("late", MLO_DTYPE_F32, 4);
  mlo_tensor *tl = NULL;
  assert_status(mlo_tensor_add(comp, &late, &tl), MLO_ESTATE);
  assert_int_equal(mlo_component_tensor_count(comp), 4);
  /* The same bytes arrive on the device. */
  assert_ok(mlo_component_load(comp));
  assert_ok(mlo_platform_synchronize(plat));
  uint8_t dev[1024];
  assert_ok(tu_read_device(tp, ta, dev, sizeof dev));
  assert_memory_equal(dev, whole + 1000, 1024);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

typedef struct {
  const char *what;
  mlo_tensor_desc desc;
} bad_case;

/* Each bad description is refused with a message, at add or at the latest
 * at materialize; the component is left as it was. */
static void test_bad_descriptions(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *comp = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &comp));
  mlo_tensor *good = tu_add_tensor(tp, comp, "w", 1024, 0);
  (void)good;
  static const uint8_t mem[64];
  bad_case cases[12];
  size_t n = 0;
  cases[n] = (bad_case){"negative dim", desc_1d("neg", MLO_DTYPE_F32, -4)};
  n++;
  cases[n] = (bad_case){"too many dims", desc_1d("dims", MLO_DTYPE_F32, 4)};
  cases[n].desc.ndim = MLO_MAX_DIMS + 1;
  n++;
  cases[n] = (bad_case){"negative ndim", desc_1d("ndim", MLO_DTYPE_F32, 4)};
  cases[n].desc.ndim = -1;
  n++;
  cases[n] = (bad_case){"bad dtype", desc_1d("dtype", (mlo_dtype)MLO_DTYPE_COUNT, 4)};
  n++;
  cases[n] = (bad_case){"size overflow", desc_1d("huge", MLO_DTYPE_F64, INT64_MAX / 2)};
  cases[n].desc.ndim = 2;
  cases[n].desc.shape[1] = INT64_MAX / 2;
  n++;
  cases[n] = (bad_case){"odd F4 count", desc_1d("f4", MLO_DTYPE_F4, 3)};
  n++;
  cases[n] = (bad_case){"duplicate name", desc_1d("w", MLO_DTYPE_F32, 4)};
  n++;
  cases[n] = (bad_case){"no name", desc_1d(NULL, MLO_DTYPE_F32, 4)};
  n++;
  cases[n] = (bad_case){"data and file", desc_1d("both", MLO_DTYPE_U8, 64)};
  cases[n].desc.data = mem;
  cases[n].desc.file = path;
  n++;
  cases[n] = (bad_case){"range past EOF", desc_1d("eof", MLO_DTYPE_U8, 200)};
  cases[n].desc.file = path;
  cases[n].desc.file_offset = FILE_BYTES - 100;
  n++;
  cases[n] = (bad_case){"offset past EOF", desc_1d("eof2", MLO_DTYPE_U8, 1)};
  cases[n].desc.file = path;
  cases[n].desc.file_offset = FILE_BYTES + 5;
  n++;
  cases[n] = (bad_case){"missing file", desc_1d("missing", MLO_DTYPE_U8, 16)};
  cases[n].desc.file = "/nonexistent/mlo/weights.bin";
  n++;
  for (size_t i = 0; i < n; i++) {
    mlo_tensor *t = NULL;
    int rc = mlo_tensor_add(comp, &cases[i].desc, &t);
    if (rc == MLO_OK) {
      /* Accepted at declaration: materialize must refuse it, whole. */
      rc = mlo_component_materialize(comp);
      if (rc == MLO_OK) fail_msg("%s: accepted", cases[i].what);
      const char *msg = mlo_pipeline_errmsg(tp->pipe);
      if (!msg[0]) fail_msg("%s: no message", cases[i].what);
      assert_int_equal(mlo_component_residency(comp), MLO_RES_UNMATERIALIZED);
      assert_int_equal(tu_pstats(tp).host_slab_bytes, 0);
      /* Only file problems may wait until materialize. */
      if (!cases[i].desc.file) fail_msg("%s: not refused at mlo_tensor_add", cases[i].what);
      tu_pipe_free(tp); /* the bad tensor is in; start over for the next case */
      tp = tu_pipe_new(plat, true);
      assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &comp));
      tu_add_tensor(tp, comp, "w", 1024, 0);
      continue;
    }
    const char *msg = mlo_pipeline_errmsg(tp->pipe);
    if (!msg[0]) fail_msg("%s: %s with no message", cases[i].what, mlo_err_name(rc));
    /* The message names the tensor it is about. */
    if (cases[i].desc.name && !strstr(msg, cases[i].desc.name))
      fail_msg("%s: message \"%s\" does not name tensor %s", cases[i].what, msg,
               cases[i].desc.name);
    assert_null(t);
    assert_int_equal(mlo_component_tensor_count(comp), 1);
    assert_int_equal(mlo_component_residency(comp), MLO_RES_UNMATERIALIZED);
  }
  assert_ok(mlo_component_materialize(comp));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* A file that disappears between declaration and materialize: EIO, and
 * the component stays unmaterialized so a retry can work. */
static void test_file_vanishes(void **state) {
  (void)state;
  char tmp[80];
  snprintf(tmp, sizeof tmp, "%s.gone", path);
  FILE *f = fopen(tmp, "wb");
  assert_non_null(f);
  uint8_t bytes[512];
  tu_fill_pattern(bytes, sizeof bytes, 9);
  assert_int_equal(fwrite(bytes, 1, sizeof bytes, f), sizeof bytes);
  fclose(f);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *comp = NULL;
  assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &comp));
  mlo_tensor_desc d = desc_1d("w", MLO_DTYPE_U8, 512);
  d.file = tmp;
  mlo_tensor *t = NULL;
  assert_ok(mlo_tensor_add(comp, &d, &t));
  char keep[sizeof tmp + 8];
  snprintf(keep, sizeof keep, "%s.keep", tmp);
  assert_int_equal(link(tmp, keep), 0); /* the same file, to put back later */
  unlink(tmp);
  assert_status(mlo_component_materialize(comp), MLO_EIO);
  if (!strstr(mlo_pipeline_errmsg(tp->pipe), tmp))
    fail_msg("message \"%s\" does not name the file", mlo_pipeline_errmsg(tp->pipe));
  assert_int_equal(mlo_component_residency(comp), MLO_RES_UNMATERIALIZED);
  assert_null(mlo_tensor_host_data(t));
  /* Another file with the same bytes at the path is not the file that was
   * declared: refused, naming the change (a swapped shard must not load). */
  f = fopen(tmp, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, sizeof bytes, f), sizeof bytes);
  fclose(f);
  assert_status(mlo_component_materialize(comp), MLO_EIO);
  if (!strstr(mlo_pipeline_errmsg(tp->pipe), "changed since"))
    fail_msg("message \"%s\" does not say the file changed", mlo_pipeline_errmsg(tp->pipe));
  assert_int_equal(mlo_component_residency(comp), MLO_RES_UNMATERIALIZED);
  /* The declared file linked back in place is the same inode, but its
   * change time moved (each link and unlink does): refused too, since the
   * identity cannot tell that from a rewrite in place with its
   * modification time restored (below).  Declared again, it loads. */
  unlink(tmp);
  assert_int_equal(link(keep, tmp), 0);
  assert_status(mlo_component_materialize(comp), MLO_EIO);
  tu_pipe_free(tp);
  tp = tu_pipe_new(plat, true);
  assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &comp));
  assert_ok(mlo_tensor_add(comp, &d, &t));
  assert_ok(mlo_component_materialize(comp));
  assert_memory_equal(mlo_tensor_host_data(t), bytes, sizeof bytes);
  /* The same size rewritten in place, its modification time put back
   * (touch -r): the bytes are not the ones declared, and only the change
   * time, which no user can set, says so. */
  tu_pipe_free(tp);
  tp = tu_pipe_new(plat, true);
  assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &comp));
  assert_ok(mlo_tensor_add(comp, &d, &t));
  struct stat before;
  assert_int_equal(stat(tmp, &before), 0);
  struct timespec pause = {0, 20 * 1000 * 1000}; /* past the file system's clock tick */
  nanosleep(&pause, NULL);
  int fd = open(tmp, O_WRONLY);
  assert_true(fd >= 0);
  uint8_t other[16] = {0xEE};
  assert_int_equal(pwrite(fd, other, sizeof other, 100), (ssize_t)sizeof other);
  close(fd);
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  assert_int_equal(utimensat(AT_FDCWD, tmp, times, 0), 0);
  struct stat after;
  assert_int_equal(stat(tmp, &after), 0);
  assert_int_equal(after.st_size, before.st_size);
  assert_int_equal(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  assert_status(mlo_component_materialize(comp), MLO_EIO);
  if (!strstr(mlo_pipeline_errmsg(tp->pipe), "changed since"))
    fail_msg("message \"%s\" does not say the file changed", mlo_pipeline_errmsg(tp->pipe));
  unlink(keep);
  unlink(tmp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

typedef struct {
  unsigned calls;
  uint64_t last_done, last_total;
} progress;

static void on_progress(const mlo_component *comp, uint64_t done, uint64_t total, void *user) {
  (void)comp;
  progress *p = user;
  p->calls++;
  p->last_done = done;
  p->last_total = total;
}

static void test_progress_reports_completion(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *comp = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &comp));
  mlo_tensor_desc d = desc_1d("w", MLO_DTYPE_U8, FILE_BYTES);
  d.file = path;
  mlo_tensor *t = NULL;
  assert_ok(mlo_tensor_add(comp, &d, &t));
  progress p = {0};
  mlo_pipeline_set_progress(tp->pipe, on_progress, &p);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  assert_true(p.calls >= 1);
  assert_int_equal(p.last_done, p.last_total);
  assert_true(p.last_total >= FILE_BYTES);
  unsigned calls = p.calls;
  assert_ok(mlo_pipeline_materialize(tp->pipe)); /* idempotent: no work, no reports */
  assert_int_equal(p.calls, calls);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_file_memory_zero),
      cmocka_unit_test(test_bad_descriptions),
      cmocka_unit_test(test_file_vanishes),
      cmocka_unit_test(test_progress_reports_completion),
  };
  return cmocka_run_group_tests(tests, make_file, remove_file);
}
