/*
 * sysio.c — host allocations and file reads through one fault point
 * (sysio.h says why).  With no fault armed the cost is one relaxed atomic
 * load per call.
 */
#include "base/sysio.h"

#include "base/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the fault point ---------------------------------------------------- */

static atomic_bool fault_counting;
static atomic_int fault_kind = -1;
static atomic_uint_fast64_t fault_nth;
static atomic_uint_fast64_t fault_calls[MLO_SYSFAULT_KINDS];
static atomic_bool fault_fired;

void mlo_sysfault_arm(mlo_sysfault_kind kind, uint64_t nth) {
  for (int k = 0; k < MLO_SYSFAULT_KINDS; k++) atomic_store(&fault_calls[k], 0);
  atomic_store(&fault_fired, false);
  atomic_store(&fault_nth, nth);
  atomic_store(&fault_kind, (int)kind);
  atomic_store(&fault_counting, true);
}

void mlo_sysfault_disarm(void) {
  atomic_store(&fault_counting, false);
  atomic_store(&fault_kind, -1);
}

uint64_t mlo_sysfault_calls(mlo_sysfault_kind kind) {
  return (unsigned)kind < MLO_SYSFAULT_KINDS ? atomic_load(&fault_calls[kind]) : 0;
}

bool mlo_sysfault_fired(void) {
  return atomic_load(&fault_fired);
}

const char *mlo_sysfault_name(mlo_sysfault_kind kind) {
  static const char *names[] = {"alloc", "open", "read", "short"};
  return (unsigned)kind < MLO_SYSFAULT_KINDS ? names[kind] : "?";
}

/* True if this call of kind is the one to fail. */
static bool fault_hit(mlo_sysfault_kind kind) {
  if (!atomic_load_explicit(&fault_counting, memory_order_relaxed)) return false;
  uint64_t n = atomic_fetch_add(&fault_calls[kind], 1) + 1;
  if (atomic_load(&fault_kind) != (int)kind || n != atomic_load(&fault_nth)) return false;
  atomic_store(&fault_fired, true);
  return true;
}

/* ---- host memory -------------------------------------------------------- */

static _Thread_local uint64_t alloc_failures;

uint64_t mlo_alloc_failures(void) {
  return alloc_failures;
}

static void *note_failure(void *p) {
  if (!p) alloc_failures++;
  return p;
}

void *mlo_malloc(size_t n) {
  if (fault_hit(MLO_SYSFAULT_ALLOC)) return note_failure(NULL);
  return note_failure(malloc(n ? n : 1));
}

void *mlo_calloc(size_t n, size_t size) {
  if (fault_hit(MLO_SYSFAULT_ALLOC)) return note_failure(NULL);
  return note_failure(calloc(n ? n : 1, size ? size : 1));
}

void *mlo_realloc(void *p, size_t n) {
  if (fault_hit(MLO_SYSFAULT_ALLOC)) return note_failure(NULL);
  return note_failure(realloc(p, n ? n : 1));
}

void *mlo_aligned_alloc(size_t align, size_t n) {
  if (fault_hit(MLO_SYSFAULT_ALLOC)) return note_failure(NULL);
  size_t rounded = n ? (n + align - 1) / align * align : align;
  if (rounded < n) return note_failure(NULL);
  return note_failure(aligned_alloc(align, rounded));
}

char *mlo_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = mlo_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

bool mlo_env_flag(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

/* ---- files in ----------------------------------------------------------- */

void mlo_file_id_from_stat(const struct stat *st, mlo_file_id *id) {
  id->dev = (uint64_t)st->st_dev;
  id->ino = (uint64_t)st->st_ino;
  id->size = (uint64_t)st->st_size;
  id->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  /* the change time: a rewrite that restores the modification time
   * (touch -r) still moves it, and no user can set it back */
  id->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

bool mlo_file_id_equal(const mlo_file_id *a, const mlo_file_id *b) {
  return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns &&
         a->ctime_ns == b->ctime_ns;
}

/* ---- touching fresh memory --------------------------------------------- */

#define TOUCH_PARALLEL_MIN ((size_t)64 << 20)
#define TOUCH_MAX_THREADS 4

typedef struct {
  char *p;
  size_t n, page;
} touch_part;

static void *touch_part_run(void *arg) {
  touch_part *t = arg;
  for (size_t off = 0; off < t->n; off += t->page) t->p[off] = 0;
  return NULL;
}

/* Whether MADV_HUGEPAGE is worth asking for: THP is on for madvised
 * regions and the kernel does not compact on every fault; MLO_NO_HUGEPAGES
 * turns it off. */
static bool huge_pages_cheap(void) {
  static atomic_int cached = -1;
  int v = atomic_load(&cached);
  if (v >= 0) return v;
  char en[128] = "", df[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f) {
    if (!fgets(en, sizeof en, f)) en[0] = '\0';
    fclose(f);
  }
  f = fopen("/sys/kernel/mm/transparent_hugepage/defrag", "r");
  if (f) {
    if (!fgets(df, sizeof df, f)) df[0] = '\0';
    fclose(f);
  }
  /* "always" would stall every fault on compaction; with "madvise" only
   * regions that ask may, and fresh slabs are mostly served at once
   * (docs/architecture.md: 10 GB/s touched against 4 GB/s in 4 KiB pages) */
  v = !strstr(en, "[never]") && !strstr(df, "[always]") && !mlo_env_flag("MLO_NO_HUGEPAGES");
  atomic_store(&cached, v);
  return v;
}

void mlo_offer_huge_pages(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (p && n >= TOUCH_PARALLEL_MIN && huge_pages_cheap()) {
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + n) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
  }
#else
  (void)p, (void)n;
#endif
}

void mlo_touch_pages(void *p, size_t n) {
  if (!p || !n) return;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  mlo_offer_huge_pages(p, n);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t nt = n < TOUCH_PARALLEL_MIN || cpus < 2
                  ? 1
                  : (size_t)(cpus < TOUCH_MAX_THREADS ? cpus : TOUCH_MAX_THREADS);
  touch_part parts[TOUCH_MAX_THREADS];
  pthread_t th[TOUCH_MAX_THREADS];
  size_t share = (n / nt + page - 1) / page * page, started = 0;
  for (size_t i = 0; i < nt; i++) {
    size_t off = i * share;
    parts[i] =
        (touch_part){(char *)p + off, off >= n ? 0 : (n - off < share ? n - off : share), page};
  }
  for (size_t i = 1; i < nt; i++, started++)
    if (pthread_create(&th[i - 1], NULL, touch_part_run, &parts[i]) != 0) break;
  touch_part_run(&parts[0]);
  for (size_t i = 1 + started; i < nt; i++) touch_part_run(&parts[i]); /* what no thread took */
  for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
}

/* Whether what stat or fstat answered (rc, st) is still the file id
 * describes; an id of zeros (parsed from memory) has nothing to check. */
static bool still(int rc, const struct stat *st, const mlo_file_id *id) {
  if (id->ino == 0) return true;
  mlo_file_id now = {0};
  if (rc == 0) mlo_file_id_from_stat(st, &now);
  return mlo_file_id_equal(&now, id);
}

int mlo_file_id_recheck(const char *path, const mlo_file_id *id, char *err, size_t errlen) {
  struct stat st;
  if (still(stat(path, &st), &st, id)) return MLO_OK;
  if (err && errlen)
    snprintf(err, errlen, "%s: changed while it was being opened; open it again", path);
  return MLO_EIO;
}

int mlo_fd_id_recheck(int fd, const char *path, const mlo_file_id *id, char *err, size_t errlen) {
  struct stat st;
  if (still(fstat(fd, &st), &st, id)) return MLO_OK;
  if (err && errlen)
    snprintf(err, errlen,
             "'%s' changed while it was read (another size, modification or change time): its "
             "bytes cannot be trusted; open the checkpoint again",
             path);
  return MLO_EIO;
}

const char *mlo_file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int mlo_open_regular(const char *path, int *fd_out, mlo_file_id *id, char *err, size_t errlen) {
  *fd_out = -1;
  if (fault_hit(MLO_SYSFAULT_OPEN))
    return mlo_errf(err, errlen, MLO_EIO, "%s: cannot open: %s", path, strerror(EIO));
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return mlo_errf(err, errlen, MLO_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return mlo_errf(err, errlen, MLO_EIO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return mlo_errf(err, errlen, MLO_EIO, "%s: is %s, not a regular file", path,
                    mlo_file_kind(st.st_mode));
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (id) mlo_file_id_from_stat(&st, id);
  *fd_out = fd;
  return 0;
}

ssize_t mlo_pread(int fd, void *buf, size_t n, uint64_t offset) {
  if (fault_hit(MLO_SYSFAULT_READ)) {
    errno = EIO;
    return -1;
  }
  if (n > 1 && fault_hit(MLO_SYSFAULT_SHORT)) n /= 2;
  for (;;) {
    ssize_t got = pread(fd, buf, n, (off_t)offset);
    if (got >= 0 || errno != EINTR) return got;
  }
}

int mlo_pread_full(int fd, void *buf, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = mlo_pread(fd, (char *)buf + done, n - done, offset + done);
    if (got < 0) return MLO_EIO;
    if (got == 0) {
      errno = 0;
      return MLO_EIO;
    }
    done += (size_t)got;
  }
  return 0;
}

int mlo_read_file(const char *path, size_t cap, char **out, size_t *len, char *err, size_t errlen) {
  *out = NULL;
  if (len) *len = 0;
  int fd;
  mlo_file_id id;
  int rc = mlo_open_regular(path, &fd, &id, err, errlen);
  if (rc) return rc;
  char *buf = NULL;
  if (id.size > cap) {
    rc = mlo_errf(err, errlen, MLO_EFORMAT, "%s: %llu bytes is over the %zu-byte cap", path,
                  (unsigned long long)id.size, cap);
    goto out_close;
  }
  buf = mlo_malloc((size_t)id.size + 1);
  if (!buf) {
    rc = mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of host memory", path);
    goto out_close;
  }
  if (mlo_pread_full(fd, buf, (size_t)id.size, 0) != 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot read: %s", path,
                  errno ? strerror(errno) : "the file shrank while reading");
    free(buf);
    goto out_close;
  }
  buf[id.size] = '\0';
  *out = buf;
  if (len) *len = (size_t)id.size;
out_close:
  close(fd);
  return rc;
}

int mlo_write_full(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}
