/*
 * sysio.h — the one place where the library asks the system for host
 * memory and for file bytes, so that a test can fail any of those calls
 * (SQLite's way: fail the Nth call, check the caller's answer, retry).
 *
 * Every host allocation of the library goes through mlo_malloc and friends
 * (cJSON's too, through its hooks); every file the library reads is opened
 * with mlo_open_regular (which never blocks on a FIFO or a device and
 * refuses anything but a regular file) and read with mlo_pread.  Outputs go
 * through mlo_out_* (outfile.c): a regular file is replaced atomically, a
 * symlink is followed, and anything else (a device node, a FIFO, a socket)
 * is refused — never replaced.
 *
 * Internal to the library and its tests.
 */
#ifndef MLO_BASE_SYSIO_H
#define MLO_BASE_SYSIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* ---- host memory ------------------------------------------------------- */
void *mlo_malloc(size_t n);
void *mlo_calloc(size_t n, size_t size);
void *mlo_realloc(void *p, size_t n);
char *mlo_strdup(const char *s);
void *mlo_aligned_alloc(size_t align, size_t n); /* n rounded up to align */
/* Faults in (writes a zero to) every page of [p, p+n), on several threads
 * for large ranges: the first touch of fresh memory costs a fault and a
 * zeroing per 4 KiB page, which one thread does at a fraction of memcpy
 * speed (docs/architecture.md, "Cold start").  Large ranges are first
 * offered transparent huge pages (MADV_HUGEPAGE) unless THP is off, the
 * kernel compacts on every fault (defrag "always"), or MLO_NO_HUGEPAGES
 * is set. */
void mlo_touch_pages(void *p, size_t n);
/* The huge-page offer alone, for memory that will be faulted in by its
 * first writers. */
void mlo_offer_huge_pages(void *p, size_t n);
/* Counts allocations that failed on this thread (real or injected), so a
 * parser that only says "failed" can tell out-of-memory from bad input. */
uint64_t mlo_alloc_failures(void);

/* ---- the environment ---------------------------------------------------- */
/* True if the variable is set to anything but "" or "0": the one reading of
 * switches such as MLO_NO_PINNED, shared by the core and every platform. */
bool mlo_env_flag(const char *name);

/* ---- files in ---------------------------------------------------------- */
/* Identity of an opened file: a file swapped between the validation of its
 * header and the reading of its data is refused, not loaded. */
typedef struct {
  uint64_t dev, ino, size;
  int64_t mtime_ns;
  int64_t ctime_ns; /* change time: moves on any write or metadata change */
} mlo_file_id;
void mlo_file_id_from_stat(const struct stat *st, mlo_file_id *id);
bool mlo_file_id_equal(const mlo_file_id *a, const mlo_file_id *b);
/* MLO_OK if path is still the file id describes (an id of zeros: nothing
 * to check), else MLO_EIO and "PATH: changed while it was being opened". */
int mlo_file_id_recheck(const char *path, const mlo_file_id *id, char *err, size_t errlen);
/* MLO_OK if the open descriptor fd is still the file id describes, else
 * MLO_EIO and "PATH: changed while it was read ...".  Called after a read:
 * a write into the file moves its modification and change times before its
 * bytes land, so a read followed by this check saw only bytes the id
 * describes, or the check fails (a write through a shared mapping counts
 * from when the kernel stamps it). */
int mlo_fd_id_recheck(int fd, const char *path, const mlo_file_id *id, char *err, size_t errlen);

/* "a FIFO", "a character device", "a folder", ... for messages. */
const char *mlo_file_kind(mode_t mode);

/* Opens path for reading without blocking (O_NONBLOCK: a FIFO or a tty
 * cannot hang the open), checks on the descriptor that it is a regular
 * file, then clears O_NONBLOCK.  On failure err gets "PATH: why" and the
 * status is MLO_EIO, a missing file included. */
int mlo_open_regular(const char *path, int *fd, mlo_file_id *id, char *err, size_t errlen);
/* pread through the fault point; EINTR is retried inside. */
ssize_t mlo_pread(int fd, void *buf, size_t n, uint64_t offset);
/* Reads exactly n bytes at offset: 0, or MLO_EIO with errno set (errno 0:
 * the file ended first). */
int mlo_pread_full(int fd, void *buf, size_t n, uint64_t offset);
/* Reads a whole small regular file (at most cap bytes) into a NUL-
 * terminated buffer the caller frees.  MLO_EFORMAT when it is larger. */
int mlo_read_file(const char *path, size_t cap, char **out, size_t *len, char *err, size_t errlen);

/* ---- files out (outfile.c) --------------------------------------------- */
typedef struct {
  int fd;       /* write here */
  char *target; /* the regular file that will be replaced (symlinks resolved) */
  char *tmp;    /* the temporary beside it */
  mode_t mode;  /* mode the result gets */
} mlo_outfile;
/* Checks that path can be written as an output without writing it: its
 * folder exists and is writable, and it is absent, a regular file, or a
 * symlink to one.  Devices, FIFOs, sockets and folders are refused. */
int mlo_out_check(const char *path, char *err, size_t errlen);
/* Starts writing path: a temporary with an unpredictable name created
 * O_EXCL beside the (resolved) target. */
int mlo_out_begin(mlo_outfile *o, const char *path, char *err, size_t errlen);
/* fsyncs the temporary and renames it over the target; on failure the
 * temporary is removed and the target is untouched. */
int mlo_out_commit(mlo_outfile *o, char *err, size_t errlen);
/* Removes the temporary; the target is untouched.  Safe after commit. */
void mlo_out_abort(mlo_outfile *o);
/* begin + one write + commit. */
int mlo_out_write_all(const char *path, const void *data, size_t len, char *err, size_t errlen);
/* write(2) until done; 0 or -1 with errno. */
int mlo_write_full(int fd, const void *data, size_t len);

/* Sleeps until the monotonic clock (mlo_now_ns) reaches deadline; at once
 * if it has (util.c). */
void mlo_sleep_until_ns(uint64_t deadline);

/* ---- fault injection (tests) ------------------------------------------- */
typedef enum {
  MLO_SYSFAULT_ALLOC, /* mlo_malloc/calloc/realloc/strdup return NULL */
  MLO_SYSFAULT_OPEN,  /* mlo_open_regular fails with EIO */
  MLO_SYSFAULT_READ,  /* mlo_pread fails with EIO */
  MLO_SYSFAULT_SHORT, /* mlo_pread returns fewer bytes than asked (callers must loop) */
  MLO_SYSFAULT_KINDS
} mlo_sysfault_kind;
/* Counts calls of every kind from zero and makes the nth call of kind fail
 * once (nth 0: nothing fails, only counting).  Process-wide. */
void mlo_sysfault_arm(mlo_sysfault_kind kind, uint64_t nth);
void mlo_sysfault_disarm(void);
uint64_t mlo_sysfault_calls(mlo_sysfault_kind kind);
bool mlo_sysfault_fired(void);
const char *mlo_sysfault_name(mlo_sysfault_kind kind);

#endif
