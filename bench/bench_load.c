/*
 * bench_load.c — how fast a checkpoint becomes host slabs, as a ratio to
 * the plainest possible read of the same files (bench/README.md: ratios
 * in one run, medians, never a bare absolute time).
 *
 * It generates (or takes) a Wan2.2-shaped pipeline, then alternates two
 * measurements, each from a cold page cache (fdatasync + posix_fadvise
 * DONTNEED per file, which needs no privileges for our own clean pages):
 *   plain        read() every .safetensors file whole into one fresh buffer
 *   materialize  mlo_pipeline_open_path + mlo_pipeline_materialize
 * and prints both rates in GB/s and materialize / plain, medians of --runs.
 *
 *   bench_load [--scale S | --gb G] [--dir DIR] [--path PIPELINE] [--runs N] [--warm]
 *
 * --warm keeps the page cache (after one read to fill it): then both sides
 * copy from memory and the ratio shows the loader's own overhead.
 */
#include "mlo/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILES 256

typedef struct {
  char *paths[MAX_FILES];
  uint64_t sizes[MAX_FILES];
  size_t count;
  uint64_t total;
} file_set;

/* Every .safetensors file one level below dir (the component folders). */
static int collect(const char *dir, file_set *fs) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && fs->count < MAX_FILES) {
    if (e->d_name[0] == '.') continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    DIR *s = opendir(sub);
    struct dirent *f;
    while (s && (f = readdir(s)) != NULL && fs->count < MAX_FILES) {
      size_t len = strlen(f->d_name);
      if (len < 12 || strcmp(f->d_name + len - 12, ".safetensors")) continue;
      char path[8192];
      snprintf(path, sizeof path, "%s/%s", sub, f->d_name);
      struct stat st;
      if (stat(path, &st) != 0) continue;
      fs->paths[fs->count] = strdup(path);
      fs->sizes[fs->count++] = (uint64_t)st.st_size;
      fs->total += (uint64_t)st.st_size;
    }
    if (s) closedir(s);
  }
  closedir(d);
  return fs->count ? 0 : -1;
}

static void drop_cache(const file_set *fs) {
  for (size_t i = 0; i < fs->count; i++) {
    int fd = open(fs->paths[i], O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/* Read size of the baseline: the loader reads at most 64 MiB per call, and
 * a single multi-hundred-MiB read() into unfaulted memory is slower on some
 * kernels, which would flatter the loader. */
#define PLAIN_CHUNK ((uint64_t)64 << 20)

/* Seconds for reading every file whole, in order, into one fresh buffer. */
static double plain_read(const file_set *fs) {
  char *buf = malloc(fs->total);
  if (!buf) return -1;
  uint64_t t0 = mlo_now_ns(), at = 0;
  for (size_t i = 0; i < fs->count; i++) {
    int fd = open(fs->paths[i], O_RDONLY);
    if (fd < 0) goto fail;
    for (uint64_t got = 0; got < fs->sizes[i];) {
      uint64_t want = fs->sizes[i] - got < PLAIN_CHUNK ? fs->sizes[i] - got : PLAIN_CHUNK;
      ssize_t n = read(fd, buf + at + got, (size_t)want);
      if (n <= 0) {
        close(fd);
        goto fail;
      }
      got += (uint64_t)n;
    }
    at += fs->sizes[i];
    close(fd);
  }
  double s = (double)(mlo_now_ns() - t0) / 1e9;
  free(buf);
  return s;
fail:
  free(buf);
  return -1;
}

/* Seconds for open + materialize; *bytes gets the tensor bytes loaded. */
static double materialize(mlo_platform *plat, const char *dir, uint64_t *bytes) {
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_pipeline *pipe;
  char err[1024];
  uint64_t t0 = mlo_now_ns();
  if (mlo_pipeline_open_path(&po, dir, NULL, &pipe, err, sizeof err) != MLO_OK) {
    fprintf(stderr, "bench_load: %s\n", err);
    return -1;
  }
  int rc = mlo_pipeline_materialize(pipe);
  double s = (double)(mlo_now_ns() - t0) / 1e9;
  *bytes = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    for (size_t t = 0; t < mlo_component_tensor_count(c); t++)
      *bytes += mlo_tensor_nbytes(mlo_component_tensor_at(c, t));
  }
  if (rc != MLO_OK) fprintf(stderr, "bench_load: materialize: %s\n", mlo_pipeline_errmsg(pipe));
  mlo_pipeline_free(pipe);
  return rc == MLO_OK ? s : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void progress(const char *file, uint64_t done, uint64_t total, void *user) {
  (void)user;
  if (!isatty(STDERR_FILENO)) return; /* a log gets the summary lines only */
  fprintf(stderr, "\rgenerating %5.1f%% %-60s", 100.0 * (double)done / (double)total, file);
  if (done == total) fputc('\n', stderr);
}

int main(int argc, char **argv) {
  double scale = 0, gb = 2.0;
  const char *dir = NULL, *path = NULL;
  int runs = 3;
  bool warm = false;
  for (int i = 1; i < argc; i++) {
    bool more = i + 1 < argc;
    if (!strcmp(argv[i], "--scale") && more)
      scale = atof(argv[++i]);
    else if (!strcmp(argv[i], "--gb") && more)
      gb = atof(argv[++i]);
    else if (!strcmp(argv[i], "--dir") && more)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--path") && more)
      path = argv[++i];
    else if (!strcmp(argv[i], "--runs") && more)
      runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warm"))
      warm = true;
    else {
      fprintf(stderr,
              "usage: %s [--scale S | --gb G] [--dir DIR] [--path PIPELINE] [--runs N] [--warm]\n",
              argv[0]);
      return 2;
    }
  }
  if (runs < 1 || runs > 99) runs = 3;
  mlo_set_log(NULL, NULL, MLO_LOG_ERROR); /* the directory's role guesses warn by design */
  char dirbuf[512], err[1024];
  if (!path) {
    uint64_t full;
    if (mlo_synth_bytes("wan2.2-t2v", 1.0, &full) != MLO_OK) return 1;
    if (scale <= 0) scale = gb * 1e9 / (double)full;
    if (!dir) {
      snprintf(dirbuf, sizeof dirbuf, "/tmp/mlo-bench/wan2.2-t2v-%g", scale);
      mkdir("/tmp/mlo-bench", 0755);
      dir = dirbuf;
    }
    if (mlo_synth_write("wan2.2-t2v", dir, scale, progress, NULL, err, sizeof err) != MLO_OK) {
      fprintf(stderr, "bench_load: %s\n", err);
      return 1;
    }
    path = dir;
  }
  file_set fs = {0};
  if (collect(path, &fs) != 0) {
    fprintf(stderr, "bench_load: no safetensors files under %s\n", path);
    return 1;
  }
  mlo_platform *plat;
  if (mlo_platform_open("host", &plat, err, sizeof err) != MLO_OK) {
    fprintf(stderr, "bench_load: %s\n", err);
    return 1;
  }
  double plain[99], mat[99];
  uint64_t bytes = 0;
  int rc = 0;
  if (warm) plain_read(&fs);
  for (int r = 0; r < runs && !rc; r++) {
    if (!warm) drop_cache(&fs);
    plain[r] = plain_read(&fs);
    if (!warm) drop_cache(&fs);
    mat[r] = materialize(plat, path, &bytes);
    if (plain[r] < 0 || mat[r] < 0) rc = 1;
  }
  if (!rc) {
    double p = median(plain, runs), m = median(mat, runs);
    printf("pipeline   %s (%zu files, %.3f GB of files, %.3f GB of tensors)\n", path, fs.count,
           (double)fs.total / 1e9, (double)bytes / 1e9);
    printf("plain read   %.3f GB/s  (median of %d, %s cache)\n", (double)fs.total / p / 1e9, runs,
           warm ? "warm" : "cold");
    printf("materialize  %.3f GB/s  (median of %d, open + materialize, %s cache)\n",
           (double)bytes / m / 1e9, runs, warm ? "warm" : "cold");
    printf("ratio        %.3f  (materialize rate / plain read rate)\n",
           ((double)bytes / m) / ((double)fs.total / p));
  }
  mlo_platform_close(plat);
  for (size_t i = 0; i < fs.count; i++) free(fs.paths[i]);
  return rc;
}
