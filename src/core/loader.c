/*
 * loader.c — reading a component's file-backed tensors into its host slab
 * at disk speed, without leaving a second copy of the weights in the page
 * cache (docs/architecture.md, "Cold start").
 *
 * The reads are cut into chunks of at most LOAD_CHUNK bytes (a tensor is
 * one chunk or several) and taken by a small pool of threads, so the disk
 * sees a queue of requests instead of one at a time, and the slab's pages
 * are faulted in by several threads at once (a pread into untouched memory
 * faults it in the kernel).  Behind every chunk the file's pages are
 * dropped from the page cache (posix_fadvise DONTNEED): the weights end up
 * in host memory once, in the slab, instead of twice.  Direct I/O was
 * measured and not taken: docs/architecture.md says why.
 *
 * A rank reading its share of a node-shared slab (the others read the rest
 * of the same files at the same time) turns read-ahead off and drops only
 * the pages it read: read-ahead past its share fetched pages a neighbour
 * then fetched again, and dropping whole files at the end threw away pages
 * the neighbours were still to read (4 ranks read 1.17-1.23x the weights,
 * measured in /proc/PID/io; issue 26.4).
 *
 * Every file is opened once, by the calling thread, and checked to still
 * be the file that was validated; the workers only pread, so the number of
 * opens and reads does not depend on how the chunks fall to threads (the
 * fault sweeps count on that).  The first failure stops the others; the
 * caller frees the slab, so nothing half-read is ever used.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOAD_CHUNK ((uint64_t)16 << 20)
#define LOAD_MAX_THREADS 8
#define LOAD_DROP_MIN ((uint64_t)1 << 20)      /* per-chunk page dropping from here */
#define LOAD_PARALLEL_MIN ((uint64_t)32 << 20) /* reader threads from here */

typedef struct {
  const mlo_tensor *t;
  int fd;
  uint64_t off, len; /* within the tensor */
} load_job;

typedef struct {
  mlo_component *c;
  load_job *jobs;
  size_t njobs;
  atomic_size_t next;
  atomic_uint_fast64_t done; /* bytes read */
  atomic_int failed;         /* a worker failed: the others stop */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  size_t running;
  /* the first failure, reported by the calling thread */
  int rc;
  const load_job *bad;
  int bad_errno;
  bool drop_cache;
  bool share; /* this rank reads a share of files other ranks read too */
} load_ctx;

void mlo_drop_pages(int fd, uint64_t off, uint64_t len) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t lo = (off + page - 1) / page * page, hi = (off + len) / page * page;
  if (hi > lo) posix_fadvise(fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
}

#define CHANGED (-1) /* read_job's err_no: the file changed while it was read */

static int read_job(load_ctx *lc, const load_job *j, int *err_no) {
  char *dst = (char *)lc->c->slab + j->t->dev_offset + j->off;
  uint64_t got = 0, at = j->t->src_offset + j->off;
  while (got < j->len) {
    if (atomic_load(&lc->failed)) return MLO_OK; /* someone else's error is the one said */
    ssize_t n = mlo_pread(j->fd, dst + got, (size_t)(j->len - got), at + got);
    if (n < 0) {
      *err_no = errno;
      return MLO_EIO;
    }
    if (n == 0) return MLO_EFORMAT; /* the file shrank */
    got += (uint64_t)n;
    atomic_fetch_add(&lc->done, (uint64_t)n);
  }
  /* what was read is the file's as declared only if it is unchanged now */
  if (mlo_fd_id_recheck(j->fd, j->t->src_file, &j->t->src_id, NULL, 0)) {
    *err_no = CHANGED;
    return MLO_EIO;
  }
  /* small chunks are dropped with their whole file at the end: the call
   * costs more than the pages it would free early (a share drops its own
   * pages only, each chunk's at once) */
  if (lc->drop_cache && (j->len >= LOAD_DROP_MIN || lc->share)) mlo_drop_pages(j->fd, at, j->len);
  return MLO_OK;
}

static void fail_once(load_ctx *lc, int rc, const load_job *j, int err_no) {
  pthread_mutex_lock(&lc->lock);
  if (!lc->rc) {
    lc->rc = rc;
    lc->bad = j;
    lc->bad_errno = err_no;
  }
  pthread_mutex_unlock(&lc->lock);
  atomic_store(&lc->failed, 1);
}

static void *worker(void *arg) {
  load_ctx *lc = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&lc->next, 1);
    if (i >= lc->njobs || atomic_load(&lc->failed)) break;
    int err_no = 0, rc = read_job(lc, &lc->jobs[i], &err_no);
    if (rc) {
      fail_once(lc, rc, &lc->jobs[i], err_no);
      break;
    }
  }
  pthread_mutex_lock(&lc->lock);
  lc->running--;
  pthread_cond_signal(&lc->cond);
  pthread_mutex_unlock(&lc->lock);
  return NULL;
}

/* Reader threads: MLO_LOAD_THREADS, else 4 (the disk wants a queue of
 * requests, whatever the cores; more only contend). */
static size_t load_threads(size_t njobs) {
  const char *env = getenv("MLO_LOAD_THREADS");
  long n = env && *env ? strtol(env, NULL, 10) : 0;
  if (n <= 0) n = 4;
  if (n > LOAD_MAX_THREADS) n = LOAD_MAX_THREADS;
  return (size_t)n < njobs ? (size_t)n : njobs;
}

int mlo_open_checked(const mlo_component *c, mlo_tensor *const *files, size_t nfiles, int *fds,
                     bool share, char *why, size_t whylen) {
  for (size_t i = 0; i < nfiles; i++) fds[i] = -1;
  for (size_t i = 0; i < nfiles; i++) {
    if (i && !strcmp(files[i]->src_file, files[i - 1]->src_file)) {
      fds[i] = fds[i - 1];
      continue;
    }
    char err[512];
    mlo_file_id now;
    int rc = mlo_open_regular(files[i]->src_file, &fds[i], &now, err, sizeof err);
    if (rc) {
      snprintf(why, whylen, "%s: %s", c->name, err);
      return rc;
    }
    if (!mlo_file_id_equal(&now, &files[i]->src_id)) {
      snprintf(why, whylen,
               "%s: '%s' changed since its tensors were declared (another file, size, "
               "modification or change time); open the checkpoint again",
               c->name, files[i]->src_file);
      return MLO_EIO;
    }
    posix_fadvise(fds[i], 0, 0, share ? POSIX_FADV_RANDOM : POSIX_FADV_SEQUENTIAL);
  }
  return MLO_OK;
}

static int open_files(mlo_component *c, mlo_tensor **files, size_t nfiles, int *fds, bool share) {
  char why[768];
  int rc = mlo_open_checked(c, files, nfiles, fds, share, why, sizeof why);
  return rc ? mlo_fail(c->pipe, rc, "%s", why) : MLO_OK;
}

void mlo_close_files(size_t nfiles, const int *fds, bool drop) {
  for (size_t i = 0; i < nfiles; i++) {
    if (fds[i] < 0 || (i && fds[i] == fds[i - 1])) continue;
    if (drop) posix_fadvise(fds[i], 0, 0, POSIX_FADV_DONTNEED); /* the edges chunks left */
    close(fds[i]);
  }
}

static int by_file_then_offset(const void *a, const void *b) {
  const mlo_tensor *x = *(mlo_tensor *const *)a, *y = *(mlo_tensor *const *)b;
  int cmp = strcmp(x->src_file, y->src_file);
  if (cmp) return cmp;
  return x->src_offset < y->src_offset ? -1 : x->src_offset > y->src_offset;
}

void mlo_sort_by_file(mlo_tensor **files, size_t nfiles) {
  qsort(files, nfiles, sizeof *files, by_file_then_offset);
}

int mlo_load_files(mlo_component *c, mlo_tensor **files, size_t nfiles, uint64_t total, bool share,
                   mlo_progress_fn progress, void *user) {
  mlo_sort_by_file(files, nfiles);
  int *fds = mlo_malloc(nfiles * sizeof *fds);
  size_t njobs = 0;
  for (size_t i = 0; i < nfiles; i++)
    njobs += (size_t)((files[i]->nbytes + LOAD_CHUNK - 1) / LOAD_CHUNK);
  load_job *jobs = mlo_malloc((njobs ? njobs : 1) * sizeof *jobs);
  if (!fds || !jobs) {
    free(fds);
    free(jobs);
    return mlo_fail(c->pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
  }
  int rc = open_files(c, files, nfiles, fds, share);
  size_t k = 0;
  for (size_t i = 0; i < nfiles && !rc; i++)
    for (uint64_t off = 0; off < files[i]->nbytes; off += LOAD_CHUNK) {
      uint64_t left = files[i]->nbytes - off;
      jobs[k++] = (load_job){files[i], fds[i], off, left < LOAD_CHUNK ? left : LOAD_CHUNK};
    }
  load_ctx lc = {.c = c,
                 .jobs = jobs,
                 .njobs = njobs,
                 .drop_cache = !mlo_env_flag("MLO_KEEP_PAGE_CACHE"),
                 .share = share};
  atomic_init(&lc.next, 0);
  atomic_init(&lc.done, 0);
  atomic_init(&lc.failed, 0);
  pthread_mutex_init(&lc.lock, NULL);
  pthread_cond_init(&lc.cond, NULL);
  pthread_t threads[LOAD_MAX_THREADS];
  /* a small component is read on the calling thread: starting readers
   * would cost more than they save */
  size_t want = rc || total < LOAD_PARALLEL_MIN ? 0 : load_threads(njobs), started = 0;
  for (; started < want; started++) {
    pthread_mutex_lock(&lc.lock);
    lc.running++;
    pthread_mutex_unlock(&lc.lock);
    if (pthread_create(&threads[started], NULL, worker, &lc) != 0) {
      pthread_mutex_lock(&lc.lock);
      lc.running--;
      pthread_mutex_unlock(&lc.lock);
      break; /* fewer threads; the calling one reads if none started */
    }
  }
  if (!rc && started == 0) { /* small, or no thread could start: read here */
    lc.running = 1;
    worker(&lc);
  }
  /* The calling thread reports progress while the workers read. */
  uint64_t said = 0;
  for (;;) {
    pthread_mutex_lock(&lc.lock);
    if (lc.running) { /* woken when a worker ends, else every 50 ms */
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 50 * 1000000L;
      if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&lc.cond, &lc.lock, &until);
    }
    size_t running = lc.running;
    pthread_mutex_unlock(&lc.lock);
    uint64_t done = atomic_load(&lc.done);
    if (progress && done != said && !atomic_load(&lc.failed)) {
      progress(c, done, total, user);
      said = done;
    }
    if (!running) break;
  }
  for (size_t i = 0; i < started; i++) pthread_join(threads[i], NULL);
  if (!rc && lc.rc) {
    const mlo_tensor *t = lc.bad->t;
    char why[600];
    if (lc.rc == MLO_EIO && lc.bad_errno == CHANGED) {
      snprintf(why, sizeof why, "'%s' changed while it was read", t->src_file);
      mlo_fd_id_recheck(lc.bad->fd, t->src_file, &t->src_id, why, sizeof why);
      rc = mlo_fail(c->pipe, MLO_EIO, "%s: tensor '%s': %s", c->name, t->name, why);
    } else if (lc.rc == MLO_EIO)
      rc = mlo_fail(c->pipe, MLO_EIO, "%s: reading tensor '%s' from '%s': %s", c->name, t->name,
                    t->src_file, strerror(lc.bad_errno));
    else
      rc = mlo_fail(c->pipe, MLO_EFORMAT,
                    "%s: tensor '%s': '%s' ended early (it shrank since it was opened)", c->name,
                    t->name, t->src_file);
  }
  if (!rc && progress && said != total) progress(c, total, total, user);
  mlo_close_files(nfiles, fds, lc.drop_cache && !rc && !share); /* the others still read them */
  pthread_cond_destroy(&lc.cond);
  pthread_mutex_destroy(&lc.lock);
  free(jobs);
  free(fds);
  return rc;
}
