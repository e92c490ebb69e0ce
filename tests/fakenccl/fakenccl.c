/*
 * fakenccl.c — a fake NCCL (libnccl.so.2) for tests, over the fake CUDA
 * runtime (tests/fakecuda) and shared memory between the ranks' processes.
 *
 * Why: sharded loads on CUDA gather with ncclAllGather on the copy stream,
 * and mlo checks, watches and creates NCCL communicators (issue 25, items
 * 4 and 5).  CI and the development machines have the toolkit's NCCL but
 * no GPU, so none of that would run before a node of cards is lent.  Put
 * on LD_LIBRARY_PATH beside the fake runtime, this library lets the real
 * libmlo-cuda.so and the real `mlo` tool run those paths under mpirun,
 * with bytes that really move between the ranks' processes, so that a
 * slice in the wrong place shows as a wrong digest.  Tests only: nothing
 * outside tests/ links it.
 *
 * What it models:
 *  - ncclGetUniqueId: a memfd (a sparse 2 GiB region) in the calling
 *    process, kept open for the life of the process; the id carries its
 *    pid and descriptor, and ncclCommInitRank on any rank of the machine
 *    maps /proc/<pid>/fd/<fd>.  No file is created anywhere;
 *  - ncclCommInitRank: the communicator's size and rank as given, and the
 *    device current on the calling thread (cudaGetDevice), which
 *    ncclCommCount, ncclCommUserRank and ncclCommCuDevice answer;
 *  - ncclAllGather: queued on the (fake) stream as a host function, so it
 *    runs in stream order and holds the stream until every rank's
 *    contribution is in (as a real gather's kernel does); each rank writes
 *    its slice into the shared region, waits for all, and reads the
 *    others' slices into its buffer (in place or not);
 *  - ncclCommGetAsyncError, ncclCommAbort (ends a gather in flight: the
 *    stream goes on, the buffer keeps what it had), ncclCommDestroy (waits
 *    for the gathers queued on the communicator);
 *  - failures, by environment: MLO_FAKENCCL_ASYNC_ERROR=R makes rank R's
 *    gathers never complete and its asynchronous error ncclSystemError
 *    (a fabric failure NCCL noticed); MLO_FAKENCCL_HANG=R makes rank R's
 *    gathers never complete with no error at all (a peer stalled, a
 *    deadlock); MLO_FAKENCCL_HANG_FROM=K delays that until its K-th gather
 *    (a stall in the middle of a load block by block, issue 40).  R is the
 *    communicator's rank.
 *  - ncclCommInitRankConfig with blocking=0: ncclInProgress, then ready at
 *    once, or never for rank R of MLO_FAKENCCL_INIT_HANG=R;
 *  - on such a non-blocking communicator, NCCL's ncclInProgress: its first
 *    ncclAllGather returns it and is put on the stream only at the third
 *    ncclCommGetAsyncError after it (two answer ncclInProgress), and
 *    ncclCommFinalize returns it, its state ncclInProgress until the
 *    gathers queued have run; fakenccl_in_progress_answers counts them.
 * What it does not: initialization does not wait for the other ranks (no
 * bootstrap; a communicator larger than the ranks that exist is made at
 * once, and hangs only when it gathers); other collectives, groups,
 * several nodes, and the cost of anything.
 * Gathers of more than the region (2 GiB less a page, all ranks together)
 * are refused with ncclInvalidArgument.  An aborted communicator's handle
 * stays allocated (a gather still queued behind it must find it aborted).
 * Passing here is evidence about mlo's logic, never a claim that anything
 * ran on GPUs or NCCL.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FN_MAGIC 0x6c636e66656b6166ull /* "fakencl" */
#define FN_REGION ((size_t)2 << 30)
#define FN_HEADER ((size_t)4096)
#define FN_MAX_RANKS 64

struct fn_id { /* what a ncclUniqueId carries here */
  uint64_t magic;
  int32_t pid, fd;
};

struct fn_shared {                /* the region's first page */
  _Atomic uint64_t arrived, left; /* how many contributions have gone in, and out */
  _Atomic uint64_t bytes[FN_MAX_RANKS];
};

struct ncclComm {
  int nranks, rank, device;
  int fd;
  struct fn_shared *sh;
  char *data;
  uint64_t gathers;              /* run so far (the stream's worker alone counts them) */
  _Atomic int queued;            /* gathers queued and not finished */
  _Atomic int running;           /* gathers inside their host function */
  _Atomic bool aborted;          /* ncclCommAbort */
  struct ncclComm *next_aborted; /* the list of aborted handles kept (ncclCommAbort) */
  _Atomic ncclResult_t async;
  bool fail_async, hang; /* this rank's injected failure */
  uint64_t hang_from;    /* hang from this gather on (1: the first) */
  /* Non-blocking (ncclConfig_t blocking=0): see ncclAllGather and
   * ncclCommFinalize.  Only the calling thread and its polls touch these. */
  bool nonblocking, connected, finalizing;
  int polls;                  /* ncclCommGetAsyncError answers ncclInProgress this often more */
  struct fn_gather *deferred; /* the first gather, issued once the polls run out */
  cudaStream_t deferred_stream;
};

/* Calls that answered ncclInProgress in this process (a test's evidence
 * that mlo polled a non-blocking communicator's calls to their end). */
static _Atomic uint64_t in_progress_answers;

static ncclResult_t in_progress(void) {
  atomic_fetch_add(&in_progress_answers, 1);
  return ncclInProgress;
}

static int env_rank(const char *name) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : -1;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess:
    return "no error (fake NCCL)";
  case ncclUnhandledCudaError:
    return "unhandled cuda error (fake NCCL)";
  case ncclSystemError:
    return "unhandled system error (fake NCCL: injected or real)";
  case ncclInternalError:
    return "internal error (fake NCCL)";
  case ncclInvalidArgument:
    return "invalid argument (fake NCCL)";
  case ncclInvalidUsage:
    return "invalid usage (fake NCCL)";
  case ncclRemoteError:
    return "remote process exited or there was a network error (fake NCCL)";
  case ncclInProgress:
    return "NCCL operation in progress (fake NCCL)";
  default:
    return "unknown result code (fake NCCL)";
  }
}

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
  if (!out) return ncclInvalidArgument;
  int fd = memfd_create("mlo-fakenccl", MFD_CLOEXEC);
  if (fd < 0) return ncclSystemError;
  if (ftruncate(fd, (off_t)FN_REGION)) {
    close(fd);
    return ncclSystemError;
  }
  struct fn_id id = {FN_MAGIC, (int32_t)getpid(), fd};
  memset(out, 0, sizeof *out);
  memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId uid, int rank) {
  if (!out) return ncclInvalidArgument;
  *out = NULL;
  struct fn_id id;
  memcpy(&id, uid.internal, sizeof id);
  if (id.magic != FN_MAGIC || nranks < 1 || nranks > FN_MAX_RANKS || rank < 0 || rank >= nranks)
    return ncclInvalidArgument;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)id.pid, (int)id.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "fake NCCL: cannot open %s: %s\n", path, strerror(errno));
    return ncclSystemError;
  }
  void *map = mmap(NULL, FN_REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return ncclSystemError;
  }
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) {
    munmap(map, FN_REGION);
    close(fd);
    return ncclSystemError;
  }
  c->nranks = nranks;
  c->rank = rank;
  c->fd = fd;
  c->sh = map;
  c->data = (char *)map + FN_HEADER;
  if (cudaGetDevice(&c->device) != cudaSuccess) c->device = -1;
  c->fail_async = env_rank("MLO_FAKENCCL_ASYNC_ERROR") == rank;
  c->hang = env_rank("MLO_FAKENCCL_HANG") == rank;
  const char *from = getenv("MLO_FAKENCCL_HANG_FROM");
  c->hang_from = from && atoi(from) > 0 ? (uint64_t)atoi(from) : 1;
  *out = c;
  return ncclSuccess;
}

/* Non-blocking when config says so: the communicator comes back at once,
 * ncclInProgress, and ncclCommGetAsyncError answers ncclInProgress until
 * it is ready (at once here), or forever for rank R of
 * MLO_FAKENCCL_INIT_HANG=R (a peer that never joins the bootstrap). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId uid, int rank,
                                    ncclConfig_t *config) {
  ncclResult_t r = ncclCommInitRank(out, nranks, uid, rank);
  if (r != ncclSuccess || !config || config->blocking) return r;
  bool hang = env_rank("MLO_FAKENCCL_INIT_HANG") == rank;
  (*out)->nonblocking = true;
  atomic_store(&(*out)->async, hang ? ncclInProgress : ncclSuccess);
  return in_progress();
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (!c || !count) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (!c || !rank) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device) {
  if (!c || !device) return ncclInvalidArgument;
  *device = c->device;
  return ncclSuccess;
}

static void gather_fn(void *user);

/* While a non-blocking call is still being issued: ncclInProgress, as
 * many polls as it takes (the last of them issues a deferred gather onto
 * its stream, and answers what the communicator's state is then); a
 * finalize in progress until every gather queued on the communicator has
 * run (nccl.h: "the state will change to ncclSuccess when the
 * communicator is globally quiescent"). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!c || !err) return ncclInvalidArgument;
  if (c->polls > 0 && --c->polls > 0) {
    *err = ncclInProgress;
    return ncclSuccess;
  }
  if (c->deferred) { /* the state as it is when the gather is issued */
    struct fn_gather *g = c->deferred;
    c->deferred = NULL;
    *err = atomic_load(&c->async);
    if (cudaLaunchHostFunc(c->deferred_stream, gather_fn, g) != cudaSuccess) {
      atomic_fetch_sub(&c->queued, 1);
      free(g);
      *err = ncclUnhandledCudaError;
      atomic_store(&c->async, *err);
    }
    return ncclSuccess;
  }
  if (c->finalizing && atomic_load(&c->queued) && !atomic_load(&c->aborted)) {
    *err = ncclInProgress;
    return ncclSuccess;
  }
  *err = atomic_load(&c->async);
  return ncclSuccess;
}

static void nap(void) {
  struct timespec ts = {0, 50000}; /* 50 us */
  nanosleep(&ts, NULL);
}

/* Waits until *x reaches target; false once the communicator is aborted. */
static bool wait_for(struct ncclComm *c, _Atomic uint64_t *x, uint64_t target) {
  while (atomic_load(x) < target) {
    if (atomic_load(&c->aborted)) return false;
    nap();
  }
  return true;
}

struct fn_gather {
  struct ncclComm *c;
  const char *send;
  char *recv;
  size_t bytes;
};

/* On the stream's worker, in stream order. */
static void gather_fn(void *user) {
  struct fn_gather *g = user;
  struct ncclComm *c = g->c;
  atomic_fetch_add(&c->running, 1);
  uint64_t k = ++c->gathers, n = (uint64_t)c->nranks;
  if (atomic_load(&c->aborted)) goto out;
  if (c->fail_async) /* the fabric fails while the gather runs */
    atomic_store(&c->async, ncclSystemError);
  if (c->fail_async || (c->hang && k >= c->hang_from)) { /* never completes: until aborted */
    while (!atomic_load(&c->aborted)) nap();
    goto out;
  }
  /* the region is free once every rank has read the previous gather out */
  if (!wait_for(c, &c->sh->left, (k - 1) * n)) goto out;
  memmove(c->data + (size_t)c->rank * g->bytes, g->send, g->bytes);
  atomic_store(&c->sh->bytes[c->rank], g->bytes);
  atomic_fetch_add(&c->sh->arrived, 1);
  if (!wait_for(c, &c->sh->arrived, k * n)) goto out;
  bool same = true;
  for (int i = 0; i < c->nranks; i++) same &= atomic_load(&c->sh->bytes[i]) == g->bytes;
  if (!same) /* ranks gathering different sizes: NCCL's behaviour is undefined */
    atomic_store(&c->async, ncclInvalidUsage);
  for (int i = 0; same && i < c->nranks; i++)
    if (i != c->rank || g->recv + (size_t)i * g->bytes != g->send)
      memcpy(g->recv + (size_t)i * g->bytes, c->data + (size_t)i * g->bytes, g->bytes);
  atomic_fetch_add(&c->sh->left, 1);
out:
  atomic_fetch_sub(&c->running, 1);
  atomic_fetch_sub(&c->queued, 1);
  free(g);
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8:
    return 1;
  case ncclFloat16:
  case ncclBfloat16:
    return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32:
    return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64:
    return 8;
  default:
    return 0;
  }
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t c, cudaStream_t stream) {
  if (!c || !recv || !send) return ncclInvalidArgument;
  if (atomic_load(&c->aborted)) return ncclInvalidUsage;
  size_t unit = type_size(type);
  if (!unit || count > (FN_REGION - FN_HEADER) / unit / (size_t)c->nranks)
    return ncclInvalidArgument;
  struct fn_gather *g = calloc(1, sizeof *g);
  if (!g) return ncclSystemError;
  *g = (struct fn_gather){c, send, recv, count * unit};
  atomic_fetch_add(&c->queued, 1);
  if (c->nonblocking && !c->connected) {
    /* NCCL's user guide ("blocking" config option): on a non-blocking
     * communicator any call may return ncclInProgress, and the operation
     * is put on the stream only later, once ncclCommGetAsyncError stops
     * answering ncclInProgress.  The first collective is the one that
     * does (NCCL connects lazily, NCCL_RUNTIME_CONNECT=1): it goes onto
     * the stream at the last of three polls, so a caller that records an
     * event behind it before polling records it before the gather. */
    c->connected = true;
    c->deferred = g;
    c->deferred_stream = stream;
    c->polls = 3;
    return in_progress();
  }
  if (cudaLaunchHostFunc(stream, gather_fn, g) != cudaSuccess) {
    atomic_fetch_sub(&c->queued, 1);
    free(g);
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

/* nccl.h: "flushes all issued communications, and marks communicator
 * state as ncclInProgress"; non-blocking: returns at once, and
 * ncclCommGetAsyncError answers ncclInProgress until the gathers queued on
 * it have run; blocking: returns once they have. */
ncclResult_t ncclCommFinalize(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  if (atomic_load(&c->aborted)) return ncclInvalidUsage;
  if (c->nonblocking) {
    c->finalizing = true;
    c->polls = 2;
    return in_progress();
  }
  while (atomic_load(&c->queued)) nap();
  return ncclSuccess;
}

/* Ends what is in flight; the handle stays (see the header). */
/* Aborted handles stay allocated (a gather still queued behind one must
 * find it aborted) and listed here, so that they stay reachable: NCCL frees
 * them at the abort, and a leak checker must not see one as mlo's leak. */
static pthread_mutex_t aborted_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *aborted_list;

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  if (atomic_exchange(&c->aborted, true)) return ncclSuccess; /* listed already */
  while (atomic_load(&c->running)) nap();
  pthread_mutex_lock(&aborted_lock);
  c->next_aborted = aborted_list;
  aborted_list = c;
  pthread_mutex_unlock(&aborted_lock);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  if (atomic_load(&c->aborted)) return ncclInvalidUsage; /* freed by the abort, in NCCL */
  while (atomic_load(&c->queued)) nap();
  munmap(c->sh, FN_REGION);
  close(c->fd);
  free(c);
  return ncclSuccess;
}

/* For tests (dlsym): calls that answered ncclInProgress in this process. */
uint64_t fakenccl_in_progress_answers(void) {
  return atomic_load(&in_progress_answers);
}

/* For tests (dlsym): gathers this process has queued on c and not finished. */
int fakenccl_queued(ncclComm_t c) {
  return c ? atomic_load(&c->queued) : 0;
}
