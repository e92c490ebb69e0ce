/*
 * core_loader — the parallel reader behind materialization (loader.c):
 * every way of reading (one thread or several, page cache dropped or kept)
 * gives the same slab, byte for byte the file's; tensors at odd offsets,
 * of odd sizes and larger than a read chunk, in a file whose size is no
 * multiple of anything, land where they belong; a read that fails in the
 * middle of a parallel load fails the component cleanly (nothing half
 * loaded, no slab kept) and a retry succeeds; and the pages read from a
 * disk file do not stay in the page cache (on tmpfs, where the file is the
 * cache, they do, and the test says which it saw).
 */
#include "testutil.h"

#include "base/sysio.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#define TMPFS_MAGIC_ 0x01021994

static char dir[256], path[512];
static uint8_t *file_bytes;
static size_t file_len;

/* tensor layout: offsets and sizes chosen to be odd; one spans several
 * 16 MiB chunks */
static const struct {
  const char *name;
  uint64_t off, len;
} layout[] = {
    {"a", 0, 3},
    {"b", 3, 1000003},
    {"big", 1000006, (40u << 20) + 7}, /* three chunks, the last 7 bytes over */
    {"c", 1000006 + (40u << 20) + 7, 12345},
    {"d", 1000006 + (40u << 20) + 7 + 12345, 1},
};
#define NT (sizeof layout / sizeof *layout)

static int setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(dir, sizeof dir, "%s/mlo_core_loader_XXXXXX", base);
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/weights.bin", dir);
  file_len = (size_t)(layout[NT - 1].off + layout[NT - 1].len) + 5; /* trailing bytes */
  file_bytes = malloc(file_len);
  if (!file_bytes) return -1;
  tu_fill_pattern(file_bytes, file_len, 77);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || mlo_write_full(fd, file_bytes, file_len) != 0 || fsync(fd) != 0) return -1;
  close(fd);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(path);
  rmdir(dir);
  free(file_bytes);
  return 0;
}

typedef struct {
  int rc;
  char msg[512];
  bool identical; /* every tensor's host bytes are the file's */
  uint64_t slab_bytes;
  mlo_residency state;
} load_result;

static void load(load_result *r) {
  memset(r, 0, sizeof *r);
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &c));
  for (size_t i = 0; i < NT; i++) {
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = layout[i].name;
    d.dtype = MLO_DTYPE_U8;
    d.ndim = 1;
    d.shape[0] = (int64_t)layout[i].len;
    d.file = path;
    d.file_offset = layout[i].off;
    assert_ok(mlo_tensor_add(c, &d, NULL));
  }
  r->rc = mlo_pipeline_materialize(tp->pipe);
  snprintf(r->msg, sizeof r->msg, "%s", mlo_pipeline_errmsg(tp->pipe));
  r->state = mlo_component_residency(c);
  mlo_pipeline_stats st;
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &st));
  r->slab_bytes = st.host_slab_bytes;
  r->identical = r->rc == MLO_OK;
  for (size_t i = 0; i < NT && r->rc == MLO_OK; i++) {
    const uint8_t *h = mlo_tensor_host_data(mlo_component_find_tensor(c, layout[i].name));
    r->identical &= h && !memcmp(h, file_bytes + layout[i].off, layout[i].len);
  }
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_every_way_gives_the_file(void **state) {
  (void)state;
  static const char *const threads[] = {"1", "2", "4", "8"};
  for (int keep = 0; keep < 2; keep++)
    for (size_t t = 0; t < 4; t++) {
      setenv("MLO_LOAD_THREADS", threads[t], 1);
      setenv("MLO_KEEP_PAGE_CACHE", keep ? "1" : "0", 1);
      load_result r;
      load(&r);
      if (r.rc || !r.identical)
        fail_msg("threads %s, keep cache %d: %s (%s), identical %d", threads[t], keep,
                 mlo_err_name(r.rc), r.msg, r.identical);
    }
  unsetenv("MLO_LOAD_THREADS");
  unsetenv("MLO_KEEP_PAGE_CACHE");
}

static void test_failure_mid_load_is_clean(void **state) {
  (void)state;
  setenv("MLO_LOAD_THREADS", "4", 1);
  mlo_sysfault_arm(MLO_SYSFAULT_READ, 0);
  load_result r;
  load(&r);
  uint64_t reads = mlo_sysfault_calls(MLO_SYSFAULT_READ);
  mlo_sysfault_disarm();
  assert_int_equal(r.rc, MLO_OK);
  assert_true(reads >= 7); /* a read per chunk at least: the load is parallel work */
  for (uint64_t n = 2; n <= reads; n += reads / 4 ? reads / 4 : 1) {
    mlo_sysfault_arm(MLO_SYSFAULT_READ, n);
    load(&r);
    bool fired = mlo_sysfault_fired();
    mlo_sysfault_disarm();
    assert_true(fired);
    if (r.rc != MLO_EIO)
      fail_msg("read #%llu: %s (%s)", (unsigned long long)n, mlo_err_name(r.rc), r.msg);
    assert_non_null(strstr(r.msg, "reading tensor"));
    assert_non_null(strstr(r.msg, "weights.bin"));
    assert_int_equal(r.state, MLO_RES_UNMATERIALIZED); /* nothing half loaded is kept */
    assert_int_equal(r.slab_bytes, 0);
    load(&r); /* the retry */
    assert_int_equal(r.rc, MLO_OK);
    assert_true(r.identical);
  }
  /* short reads are no failure: the workers loop */
  mlo_sysfault_arm(MLO_SYSFAULT_SHORT, 3);
  load(&r);
  mlo_sysfault_disarm();
  assert_int_equal(r.rc, MLO_OK);
  assert_true(r.identical);
  unsetenv("MLO_LOAD_THREADS");
}

/* The pages of the file in the page cache, by mincore. */
static double cached_fraction(void) {
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  void *m = mmap(NULL, file_len, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  size_t page = (size_t)sysconf(_SC_PAGESIZE), npages = (file_len + page - 1) / page, in = 0;
  unsigned char *vec = malloc(npages);
  assert_int_equal(mincore(m, file_len, vec), 0);
  for (size_t i = 0; i < npages; i++) in += vec[i] & 1;
  free(vec);
  munmap(m, file_len);
  close(fd);
  return (double)in / (double)npages;
}

static void test_page_cache_left_behind(void **state) {
  (void)state;
  struct statfs fs;
  assert_int_equal(statfs(path, &fs), 0);
  bool tmpfs = fs.f_type == TMPFS_MAGIC_;
  load_result r;
  setenv("MLO_KEEP_PAGE_CACHE", "1", 1);
  load(&r);
  assert_ok(r.rc);
  double kept = cached_fraction();
  unsetenv("MLO_KEEP_PAGE_CACHE");
  load(&r);
  assert_ok(r.rc);
  double dropped = cached_fraction();
  printf("core_loader: %s: page cache after a load %.0f%% kept, %.0f%% with pages dropped\n",
         tmpfs ? "tmpfs" : "disk", 100 * kept, 100 * dropped);
  if (tmpfs) {
    assert_true(dropped > 0.99); /* the file is its pages: nothing to drop */
  } else {
    assert_true(kept > 0.5);      /* the buffered read filled the cache */
    assert_true(dropped <= 0.10); /* the target: at most 10% of the weights */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_way_gives_the_file),
      cmocka_unit_test(test_failure_mid_load_is_clean),
      cmocka_unit_test(test_page_cache_left_behind),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
