/*
 * mpi_comm.c — libmlo-mpi, mlo's communicator over the caller's MPI job (a
 * library of its own, so that only a program that asks for ranks links
 * MPI; it fills in dist.h's ops table and libmlo does the rest): a duplicate of
 * the caller's communicator (mlo's messages never mix with the caller's),
 * split into the ranks that share a node, and on it node-shared windows
 * (MPI_Win_allocate_shared) for the host slabs, an in-place all-gather for
 * sharded loads, and the agreement step that turns a mismatched or missing
 * rank into an error on every rank within a timeout (dist.h).
 *
 * The agreement is point to point, nonblocking and polled, because MPI's
 * collectives cannot time out: each rank sends its vote (sequence number,
 * operation, status, message) to the node's rank 0, which waits for all of
 * them until the timeout and sends every rank the verdict.  A rank that is
 * late still finds the verdict waiting (its vote matches the receive the
 * coordinator left posted), and after a timeout the communicator is broken
 * on every rank that learns of it, so nothing ever waits on it again.
 */
#include "dist/dist.h"
#include "mlo/mpi.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAG_VOTE 0x6d10
#define TAG_VERDICT 0x6d11
#define GATHER_UNIT 4096

enum { V_OK, V_MISMATCH, V_MISSING, V_FAILED, V_DIFFERS };

typedef struct {
  uint64_t seq, id, check;
  int32_t status;
  char msg[200];
} vote;

typedef struct {
  int32_t code, rank_a, rank_b, status;
  uint64_t id_a, id_b;
  char msg[256];
} verdict;

/* One line of agreements over one communicator of the node's ranks.  The
 * coordinator's receives (one per node rank) and its verdicts may still be
 * pending after a timeout, so they live as long as the communicator does. */
typedef struct {
  MPI_Comm comm;
  uint64_t seq;
  vote *votes;
  verdict *sent;
  MPI_Request *reqs;
  vote my_vote;
  verdict my_verdict;
} agreement;

typedef struct mpi_ctx {
  mlo_comm pub;   /* first: the handle the caller holds is this struct */
  MPI_Comm world; /* the timeout is pub.timeout_ms, which core reads too */
  /* the node's agreements and collectives; and the gather lane's, a
   * duplicate of it that one other thread drives (pub.gather_lane: MPI
   * initialized with MPI_THREAD_MULTIPLE), so the two threads' collectives
   * never meet on one communicator */
  agreement node, lane;
  /* set by either thread, read by both */
  pthread_mutex_t broken_lock;
  bool broken;
  char broken_why[800];
} mpi_ctx;

/* libmlo's mlo_errf, which this library does not reach (it links libmlo's
 * public API only): the message into err, the status back. */
static int errf(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int errf(char *err, size_t errlen, int status, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return status;
}

static int mpi_fail(char *err, size_t errlen, const char *what, int code) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(code, text, &len);
  return errf(err, errlen, MLO_EPLATFORM, "MPI: %s: %s", what, text);
}

static void mpi_destroy(void *ctx);
static int mpi_shared_alloc(void *ctx, size_t bytes, void **ptr, void **handle, char *err,
                            size_t errlen);
static void mpi_shared_free(void *ctx, void *handle);
static int mpi_allgather(void *ctx, void *buf, size_t slice, char *err, size_t errlen);
static int mpi_agree(void *ctx, uint64_t id, uint64_t check, int status, const char *msg,
                     mlo_dist_namer name, void *user, bool *together, char *err, size_t errlen);
static int mpi_bcast(void *ctx, void *buf, size_t len, int root, char *err, size_t errlen);
static int mpi_lane_gather(void *ctx, uint64_t id, uint64_t check, int status, const char *msg,
                           mlo_dist_namer name, void *user, void *buf, size_t slice, char *err,
                           size_t errlen);

static const struct mlo_comm_ops mpi_ops = {
    .destroy = mpi_destroy,
    .shared_alloc = mpi_shared_alloc,
    .shared_free = mpi_shared_free,
    .allgather = mpi_allgather,
    .agree = mpi_agree,
    .bcast = mpi_bcast,
    .lane_gather = mpi_lane_gather,
};

/* Whether a collective may still run; else its message, in err. */
static bool usable(mpi_ctx *c, char *err, size_t errlen) {
  pthread_mutex_lock(&c->broken_lock);
  bool broken = c->broken;
  if (broken) errf(err, errlen, MLO_ESTATE, "%s", c->broken_why);
  pthread_mutex_unlock(&c->broken_lock);
  return !broken;
}

/* The communicator is broken from now on (the first reason stays);
 * MLO_ESTATE with that reason. */
static int set_broken(mpi_ctx *c, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int set_broken(mpi_ctx *c, char *err, size_t errlen, const char *fmt, ...) {
  pthread_mutex_lock(&c->broken_lock);
  if (!c->broken) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->broken_why, sizeof c->broken_why, fmt, ap);
    va_end(ap);
    c->broken = true;
  }
  errf(err, errlen, MLO_ESTATE, "%s", c->broken_why);
  pthread_mutex_unlock(&c->broken_lock);
  return MLO_ESTATE;
}

/* An agreement line over comm (owned: freed with it). */
static int agreement_init(agreement *a, MPI_Comm comm, size_t n) {
  a->comm = comm;
  a->votes = calloc(n, sizeof *a->votes);
  a->sent = calloc(n, sizeof *a->sent);
  a->reqs = calloc(n, sizeof *a->reqs);
  if (!a->votes || !a->sent || !a->reqs) return MLO_ENOMEM;
  for (size_t i = 0; i < n; i++) a->reqs[i] = MPI_REQUEST_NULL;
  return MLO_OK;
}

static void agreement_free(agreement *a, int n) {
  /* a receive the coordinator left posted for a rank that never came */
  for (int i = 0; a->reqs && i < n; i++)
    if (a->reqs[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&a->reqs[i]);
      MPI_Request_free(&a->reqs[i]);
    }
  if (a->comm != MPI_COMM_NULL && a->comm) MPI_Comm_free(&a->comm);
  free(a->votes);
  free(a->sent);
  free(a->reqs);
}

#define MLO_MPI_STR_(x) #x
#define MLO_MPI_STR(x) MLO_MPI_STR_(x)
#define MLO_MPI_VERSION                                                                            \
  MLO_MPI_STR(MLO_VERSION_MAJOR)                                                                   \
  "." MLO_MPI_STR(MLO_VERSION_MINOR) "." MLO_MPI_STR(MLO_VERSION_PATCH)

int mlo_comm_create_mpi(MPI_Comm comm, const mlo_comm_options *opts, mlo_comm **out, char *err,
                        size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (out) *out = NULL;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!out || !inited)
    return errf(err, errlen, MLO_EINVAL, "mlo_comm_create_mpi: %s",
                out ? "MPI is not initialized (MPI_Init first)" : "no output");
  if (opts && opts->size < sizeof *opts)
    return errf(err, errlen, MLO_EINVAL, "mlo_comm_create_mpi: options of an unknown size");
  /* One build: this library's dist.h must be the libmlo's it talks to. */
  if (strcmp(mlo_version(), MLO_MPI_VERSION))
    return errf(err, errlen, MLO_EINVAL,
                "libmlo-mpi %s cannot drive libmlo %s (install both "
                "from one build)",
                MLO_MPI_VERSION, mlo_version());
  mpi_ctx *c = calloc(1, sizeof *c);
  if (!c) return MLO_ENOMEM;
  pthread_mutex_init(&c->broken_lock, NULL);
  c->pub.ops = &mpi_ops;
  c->pub.ctx = c;
  c->pub.timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : MLO_COMM_DEFAULT_TIMEOUT_MS;
  int rc = MPI_Comm_dup(comm, &c->world);
  if (rc != MPI_SUCCESS) {
    free(c);
    return mpi_fail(err, errlen, "duplicating the communicator", rc);
  }
  MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->world, &c->pub.rank);
  MPI_Comm_size(c->world, &c->pub.size);
  MPI_Comm node = MPI_COMM_NULL;
  rc = MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->pub.rank, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&c->world);
    pthread_mutex_destroy(&c->broken_lock);
    free(c);
    return mpi_fail(err, errlen, "splitting the ranks by node", rc);
  }
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  MPI_Comm_rank(node, &c->pub.node_rank);
  MPI_Comm_size(node, &c->pub.node_size);
  size_t n = (size_t)c->pub.node_size;
  if (agreement_init(&c->node, node, n)) {
    mpi_destroy(c);
    return MLO_ENOMEM;
  }
  /* The gather lane, where MPI lets a second thread call it: the host's
   * gathers of sharded pieces then run off the forward's thread, as NCCL's
   * run on a copy stream (docs/distributed.md).  Every rank of the node
   * decides alike: the thread level is the job's. */
  int level = MPI_THREAD_SINGLE, mine = 0, all = 0;
  MPI_Query_thread(&level);
  mine = level == MPI_THREAD_MULTIPLE; /* per process: the node takes the least */
  if (n > 1 && MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, node) != MPI_SUCCESS) all = 0;
  if (all && n > 1) {
    MPI_Comm lane = MPI_COMM_NULL;
    if ((rc = MPI_Comm_dup(node, &lane)) != MPI_SUCCESS) {
      mpi_destroy(c);
      return mpi_fail(err, errlen, "duplicating the node's communicator", rc);
    }
    MPI_Comm_set_errhandler(lane, MPI_ERRORS_RETURN);
    if (agreement_init(&c->lane, lane, n)) {
      mpi_destroy(c);
      return MLO_ENOMEM;
    }
    c->pub.gather_lane = true;
  }
  *out = &c->pub;
  return MLO_OK;
}

static void mpi_destroy(void *ctx) {
  mpi_ctx *c = ctx;
  agreement_free(&c->lane, c->pub.node_size);
  agreement_free(&c->node, c->pub.node_size);
  if (c->world != MPI_COMM_NULL && c->world) MPI_Comm_free(&c->world);
  pthread_mutex_destroy(&c->broken_lock);
  free(c);
}

/* Stored only: it is checked against the node and the platform's device
 * where both are known, at every sharded pipeline's materialization and
 * loads (core), and refused there on every rank. */
int mlo_comm_set_nccl(mlo_comm *c, void *nccl_comm) {
  if (!c) return MLO_EINVAL;
  if (c->nccl_platform) return MLO_ESTATE; /* mlo made one: mlo_comm_destroy_nccl first */
  c->nccl = nccl_comm;
  return MLO_OK;
}

static int mpi_bcast(void *ctx, void *buf, size_t len, int root, char *err, size_t errlen) {
  mpi_ctx *c = ctx;
  /* after an agreement every rank passed (dist.h): run even if the other
   * line broke since, or the ranks that passed it would wait here for ever */
  if (len > (size_t)INT_MAX) return errf(err, errlen, MLO_EINVAL, "broadcast of %zu bytes", len);
  int rc = MPI_Bcast(buf, (int)len, MPI_BYTE, root, c->node.comm);
  return rc == MPI_SUCCESS ? MLO_OK : mpi_fail(err, errlen, "broadcast", rc);
}

/* ---- node-shared memory ---------------------------------------------------- */

typedef struct {
  MPI_Win win;
} shared_handle;

static int mpi_shared_alloc(void *ctx, size_t bytes, void **ptr, void **handle, char *err,
                            size_t errlen) {
  mpi_ctx *c = ctx;
  shared_handle *h = calloc(1, sizeof *h);
  if (!h) return MLO_ENOMEM;
  void *base = NULL;
  MPI_Aint mine = c->pub.node_rank == 0 ? (MPI_Aint)bytes : 0;
  int rc = MPI_Win_allocate_shared(mine, 1, MPI_INFO_NULL, c->node.comm, &base, &h->win);
  if (rc != MPI_SUCCESS) {
    free(h);
    return mpi_fail(err, errlen, "allocating node-shared memory", rc);
  }
  MPI_Aint size = 0;
  int unit = 0;
  void *at = NULL;
  rc = MPI_Win_shared_query(h->win, 0, &size, &unit, &at);
  if (rc != MPI_SUCCESS || (size_t)size < bytes) {
    MPI_Win_free(&h->win);
    free(h);
    return rc != MPI_SUCCESS ? mpi_fail(err, errlen, "mapping node-shared memory", rc)
                             : errf(err, errlen, MLO_ENOMEM, "node-shared memory is short");
  }
  *ptr = at;
  *handle = h;
  return MLO_OK;
}

static void mpi_shared_free(void *ctx, void *handle) {
  (void)ctx;
  shared_handle *h = handle;
  if (!h) return;
  MPI_Win_free(&h->win);
  free(h);
}

/* ---- all-gather -------------------------------------------------------------- */

static int allgather_on(MPI_Comm comm, void *buf, size_t slice, char *err, size_t errlen) {
  if (slice % GATHER_UNIT)
    return errf(err, errlen, MLO_EINVAL, "all-gather slice %zu is not a multiple of %d", slice,
                GATHER_UNIT);
  /* after an agreement every rank passed: run even where the other line
   * broke since (checking the shared flag here left the ranks that passed
   * it in the all-gather for ever) */
  MPI_Datatype unit;
  MPI_Type_contiguous(GATHER_UNIT, MPI_BYTE, &unit);
  MPI_Type_commit(&unit);
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(slice / GATHER_UNIT), unit,
                         comm);
  MPI_Type_free(&unit);
  return rc == MPI_SUCCESS ? MLO_OK : mpi_fail(err, errlen, "all-gather", rc);
}

static int mpi_allgather(void *ctx, void *buf, size_t slice, char *err, size_t errlen) {
  mpi_ctx *c = ctx;
  return allgather_on(c->node.comm, buf, slice, err, errlen);
}

/* ---- the agreement step ------------------------------------------------------ */

static uint64_t now_ms(void) {
  return mlo_now_ns() / 1000000;
}

static void nap(void) {
  struct timespec ts = {0, 200000}; /* 0.2 ms: MPI_Test drives progress */
  nanosleep(&ts, NULL);
}

/* Waits for req until deadline; true if it completed. */
static bool wait_until(MPI_Request *req, uint64_t deadline) {
  for (;;) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (now_ms() >= deadline) return false;
    nap();
  }
}

/* Into buf: a namer may answer from one buffer of its own every time. */
static const char *name_of(mlo_dist_namer name, void *user, uint64_t id, char *buf, size_t len) {
  const char *n = name ? name(id, user) : NULL;
  if (n)
    snprintf(buf, len, "%s", n);
  else
    snprintf(buf, len, "#%llu", (unsigned long long)id);
  return buf;
}

/* The coordinator: collects every vote (or the timeout) and decides. */
static void coordinate(mpi_ctx *c, agreement *a, verdict *v) {
  int n = c->pub.node_size;
  uint64_t deadline = now_ms() + c->pub.timeout_ms;
  a->votes[0] = a->my_vote;
  for (int i = 1; i < n; i++)
    if (a->reqs[i] == MPI_REQUEST_NULL)
      MPI_Irecv(&a->votes[i], (int)sizeof(vote), MPI_BYTE, i, TAG_VOTE, a->comm, &a->reqs[i]);
  bool all = true;
  for (int i = 1; i < n; i++) all = wait_until(&a->reqs[i], deadline) && all;
  memset(v, 0, sizeof *v);
  if (!all) {
    v->code = V_MISSING;
    size_t len = 0;
    for (int i = 1; i < n; i++) {
      int done = 0;
      MPI_Test(&a->reqs[i], &done, MPI_STATUS_IGNORE);
      if (!done && len + 16 < sizeof v->msg)
        len += (size_t)snprintf(v->msg + len, sizeof v->msg - len, "%s%d", len ? ", " : "", i);
    }
    return;
  }
  /* A rank's own failure first: one that failed and went on to another
   * step is at a mismatch because it failed, and its failure is what every
   * rank must hear, at once. */
  for (int i = 0; i < n; i++)
    if (a->votes[i].status) {
      v->code = V_FAILED;
      v->rank_a = i, v->id_a = a->votes[i].id;
      v->status = a->votes[i].status;
      snprintf(v->msg, sizeof v->msg, "%s", a->votes[i].msg);
      return;
    }
  for (int i = 1; i < n; i++)
    if (a->votes[i].seq != a->votes[0].seq || a->votes[i].id != a->votes[0].id) {
      v->code = V_MISMATCH;
      v->rank_a = 0, v->id_a = a->votes[0].id;
      v->rank_b = i, v->id_b = a->votes[i].id;
      return;
    }
  /* what the ranks hold, compared once every rank's own part succeeded */
  for (int i = 1; i < n; i++)
    if (a->votes[i].check != a->votes[0].check) {
      v->code = V_DIFFERS;
      v->rank_a = 0, v->id_a = a->votes[0].check;
      v->rank_b = i, v->id_b = a->votes[i].check;
      return;
    }
  v->code = V_OK;
}

static int agree_on(mpi_ctx *c, agreement *a, uint64_t id, uint64_t check, int status,
                    const char *msg, mlo_dist_namer name, void *user, bool *together, char *err,
                    size_t errlen) {
  if (together) *together = false;
  if (!usable(c, err, errlen)) return MLO_ESTATE;
  char nb[200], nb2[200];
  const char *what = name_of(name, user, id, nb, sizeof nb);
  a->seq++;
  memset(&a->my_vote, 0, sizeof a->my_vote);
  a->my_vote.seq = a->seq;
  a->my_vote.id = id;
  a->my_vote.check = check;
  a->my_vote.status = status;
  if (msg) snprintf(a->my_vote.msg, sizeof a->my_vote.msg, "%s", msg);
  verdict *v = &a->my_verdict;
  if (c->pub.node_size == 1) {
    memset(v, 0, sizeof *v);
    if (status) {
      v->code = V_FAILED;
      v->id_a = id;
      v->status = status;
      snprintf(v->msg, sizeof v->msg, "%s", a->my_vote.msg);
    }
  } else if (c->pub.node_rank == 0) {
    coordinate(c, a, v);
    for (int i = 1; i < c->pub.node_size; i++) {
      MPI_Request r;
      a->sent[i] = *v;
      MPI_Isend(&a->sent[i], (int)sizeof(verdict), MPI_BYTE, i, TAG_VERDICT, a->comm, &r);
      MPI_Request_free(&r); /* sent[] outlives it */
    }
  } else {
    MPI_Request s, r;
    MPI_Isend(&a->my_vote, (int)sizeof(vote), MPI_BYTE, 0, TAG_VOTE, a->comm, &s);
    MPI_Request_free(&s);
    MPI_Irecv(v, (int)sizeof(verdict), MPI_BYTE, 0, TAG_VERDICT, a->comm, &r);
    /* the coordinator decides at its timeout; its verdict gets a second */
    if (!wait_until(&r, now_ms() + c->pub.timeout_ms + 1000)) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
      return set_broken(c, err, errlen,
                        "rank %d: node rank 0 (the coordinator) did not answer within %.1f s at "
                        "'%s'; the communicator is unusable",
                        c->pub.rank, c->pub.timeout_ms / 1000.0, what);
    }
  }
  if (together) *together = v->code == V_OK || v->code == V_FAILED || v->code == V_DIFFERS;
  switch (v->code) {
  case V_OK:
    return MLO_OK;
  case V_MISMATCH:
    return errf(err, errlen, MLO_ESTATE,
                "collective sequence mismatch: node rank %d is at '%s', node rank %d at '%s' "
                "(every rank must acquire the same components in the same order)",
                v->rank_a, name_of(name, user, v->id_a, nb, sizeof nb), v->rank_b,
                name_of(name, user, v->id_b, nb2, sizeof nb2));
  case V_DIFFERS:
    return errf(err, errlen, MLO_ESTATE,
                "node ranks %d and %d differ at '%s' (%016llx against %016llx): they must hold "
                "the same thing there",
                v->rank_a, v->rank_b, what, (unsigned long long)v->id_a,
                (unsigned long long)v->id_b);
  case V_MISSING:
    return set_broken(c, err, errlen,
                      "node rank(s) %s did not arrive within %.1f s at '%s'; the communicator "
                      "is unusable",
                      v->msg, c->pub.timeout_ms / 1000.0, what);
  default:
    return errf(err, errlen, v->status ? v->status : MLO_EPLATFORM,
                "node rank %d failed at '%s': %s", v->rank_a,
                v->id_a == id ? what : name_of(name, user, v->id_a, nb2, sizeof nb2),
                v->msg[0] ? v->msg : mlo_strerror(v->status));
  }
}

static int mpi_agree(void *ctx, uint64_t id, uint64_t check, int status, const char *msg,
                     mlo_dist_namer name, void *user, bool *together, char *err, size_t errlen) {
  mpi_ctx *c = ctx;
  return agree_on(c, &c->node, id, check, status, msg, name, user, together, err, errlen);
}

/* The gather lane's step: agreed (every rank at this piece, none failed),
 * then gathered, both on the lane's own communicator (one thread's). */
static int mpi_lane_gather(void *ctx, uint64_t id, uint64_t check, int status, const char *msg,
                           mlo_dist_namer name, void *user, void *buf, size_t slice, char *err,
                           size_t errlen) {
  mpi_ctx *c = ctx;
  if (!c->pub.gather_lane)
    return errf(err, errlen, MLO_EUNSUPPORTED, "no gather lane (MPI_THREAD_MULTIPLE)");
  int rc = agree_on(c, &c->lane, id, check, status, msg, name, user, NULL, err, errlen);
  return rc ? rc : allgather_on(c->lane.comm, buf, slice, err, errlen);
}

void mlo_comm_free(mlo_comm *c) {
  if (c) c->ops->destroy(c->ctx);
}

bool mlo_comm_broken(const mlo_comm *c) {
  if (!c) return false;
  mpi_ctx *m = c->ctx;
  return !usable(m, NULL, 0);
}
