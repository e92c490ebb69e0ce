/*
 * gatherer.c — the host's gathers of a sharded load's pieces, off the
 * forward's thread.
 *
 * On a GPU node NCCL gathers each piece on the copy stream, under the
 * compute of the blocks before it (progressive.c).  The host platform has
 * no such queue: its gathers are MPI calls, and made at each block's begin
 * they put every agreement and every copy of the peers' slices on the
 * forward's own thread, so a sharded load was slower than a replicated one
 * wherever the links keep up with the compute (the demo's two ranks: 4.25x).
 * Where the caller's MPI lets a second thread call it (MPI_THREAD_MULTIPLE,
 * mlo_dist_gather_lane), each piece's gather is a job posted, in piece
 * order, to one thread of the pipeline's own: it waits for this rank's
 * slice to land (the piece's event), agrees with the node's ranks and
 * all-gathers on the communicator's lane, then holds the piece to the
 * modelled fabric as the sharded gathers there are (mlo_plat_gather_pace).
 * The block's begin waits for its job alone.
 *
 * Every node rank posts the same jobs in the same order (loads are
 * collective and post all their pieces at once), so the lane's steps pair
 * up.  A rank whose load fails part-way posts one job that carries its
 * failure: the agreement fails on every rank, and each rank's thread then
 * fails the rest of that load's jobs without a step (the other ranks posted
 * them; the failed rank did not).  A job's region stays allocated until the
 * job is done: progressive.c waits for a component's jobs before its block
 * is freed.  The thread takes no pipeline lock; the poster and the waiter
 * hold it.
 */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>

struct mlo_gatherer {
  pthread_t thread;
  pthread_mutex_t lock; /* the queue, every job's done, the failed load */
  pthread_cond_t cv;    /* a job posted, a job done, stop */
  struct mlo_gather_job *head, *tail;
  bool stop;
  mlo_comm *comm;
  int ranks;
  uint64_t loads; /* sliced loads so far: each one's epoch */
  /* the load whose step failed (epochs are the pipeline's, never 0): its
   * later jobs fail with it */
  uint64_t failed_epoch;
  int failed_rc;
  char failed_err[sizeof((struct mlo_gather_job *)0)->err];
};

bool mlo_gather_async(const mlo_pipeline *pipe) {
  return pipe->gatherer != NULL;
}

/* The lane's step names for messages: this job's piece, or another's id. */
static const char *job_name(uint64_t id, void *user) {
  const struct mlo_gather_job *j = user;
  static _Thread_local char buf[200];
  if (id == j->id)
    snprintf(buf, sizeof buf, "gather piece %llu of '%.120s'", (unsigned long long)j->check - 1,
             j->what);
  else
    snprintf(buf, sizeof buf, "gather step %llx", (unsigned long long)id);
  return buf;
}

static void run_job(struct mlo_gatherer *g, struct mlo_gather_job *j) {
  int status = j->status;
  char mine[sizeof j->err];
  snprintf(mine, sizeof mine, "%s", j->err); /* the poster's reason, where it failed */
  if (!status && j->ev && (status = mlo_plat_event_sync(j->plat, j->ev)))
    snprintf(mine, sizeof mine, "%s: waiting for its slice of piece %llu failed (%s)", j->what,
             (unsigned long long)j->check - 1, mlo_strerror(status));
  uint64_t t1 = mlo_plat_now(j->plat); /* the gather's own time from here */
  j->err[0] = '\0';
  int rc = mlo_dist_lane_gather(g->comm, j->id, j->check, status, status ? mine : NULL, job_name, j,
                                j->buf, j->slice, j->err, sizeof j->err);
  if (!rc) mlo_plat_gather_pace(j->plat, j->slice, g->ranks, t1);
  j->rc = rc;
  j->stepped = true;
  j->ns = mlo_plat_now(j->plat) - t1;
}

static void *gather_main(void *arg) {
  struct mlo_gatherer *g = arg;
  pthread_mutex_lock(&g->lock);
  for (;;) {
    while (!g->head && !g->stop) pthread_cond_wait(&g->cv, &g->lock);
    struct mlo_gather_job *j = g->head;
    if (!j) break; /* stopped, nothing left */
    g->head = j->next;
    if (!g->head) g->tail = NULL;
    bool skip = g->failed_epoch == j->epoch;
    if (skip) { /* its load failed at an earlier step, on every rank */
      j->rc = g->failed_rc;
      snprintf(j->err, sizeof j->err, "%s", g->failed_err);
      j->ns = 0;
    } else {
      pthread_mutex_unlock(&g->lock);
      run_job(g, j);
      pthread_mutex_lock(&g->lock);
      if (j->rc) {
        g->failed_epoch = j->epoch;
        g->failed_rc = j->rc;
        snprintf(g->failed_err, sizeof g->failed_err, "%s", j->err);
      }
    }
    j->done = true;
    if (j->owned) /* a failure posted for the other ranks: nobody waits for it */
      free(j);
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->lock);
  return NULL;
}

int mlo_gather_start(mlo_pipeline *pipe, char *why, size_t whylen) {
  if (pipe->gatherer || !pipe->comm || !mlo_dist_lane_claim(pipe->comm, pipe))
    return MLO_OK; /* running; or no lane (or another pipeline's): the forward's thread gathers */
  struct mlo_gatherer *g = mlo_calloc(1, sizeof *g);
  if (g) {
    g->comm = pipe->comm;
    g->ranks = mlo_dist_node_size(pipe->comm);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (!pthread_create(&g->thread, NULL, gather_main, g)) {
      pipe->gatherer = g;
      return MLO_OK;
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->lock);
    free(g);
  }
  mlo_dist_lane_release(pipe->comm, pipe);
  snprintf(why, whylen, "could not start its gather thread (out of host memory or threads)");
  return MLO_ENOMEM;
}

uint64_t mlo_gather_epoch(mlo_pipeline *pipe) {
  return pipe->gatherer ? ++pipe->gatherer->loads : 0;
}

static void post(struct mlo_gatherer *g, struct mlo_gather_job *j) {
  j->done = false;
  j->rc = MLO_OK;
  j->ns = 0;
  j->next = NULL;
  j->posted = true;
  j->folded = j->stepped = false;
  pthread_mutex_lock(&g->lock);
  if (g->tail)
    g->tail->next = j;
  else
    g->head = j;
  g->tail = j;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->lock);
}

void mlo_gather_post(mlo_pipeline *pipe, struct mlo_gather_job *j) {
  post(pipe->gatherer, j);
}

void mlo_gather_post_failure(mlo_pipeline *pipe, const struct mlo_gather_job *like) {
  struct mlo_gather_job *j = mlo_calloc(1, sizeof *j);
  if (!j) { /* the others' threads wait out the timeout: the communicator breaks */
    mlo_logf(MLO_LOG_ERROR, "%s: out of host memory telling the other ranks its load failed",
             like->what);
    return;
  }
  *j = *like;
  j->owned = true;
  post(pipe->gatherer, j);
}

int mlo_gather_wait(mlo_pipeline *pipe, struct mlo_gather_job *j) {
  struct mlo_gatherer *g = pipe->gatherer;
  pthread_mutex_lock(&g->lock);
  while (!j->done) pthread_cond_wait(&g->cv, &g->lock);
  pthread_mutex_unlock(&g->lock);
  if (!j->folded) { /* its figures, once: the gather's time and bytes, a step */
    j->folded = true;
    pipe->dist.gather_ns += j->ns;
    pipe->dist.collectives += j->stepped;
    if (!j->rc) {
      mlo_shard_count_gathered(pipe, j->slice);
      pipe->dist.lane_gathers++;
    }
  }
  return j->rc;
}

void mlo_gather_stop(mlo_pipeline *pipe) {
  struct mlo_gatherer *g = pipe->gatherer;
  if (!g) return;
  pthread_mutex_lock(&g->lock);
  g->stop = true; /* what is queued still runs: its ranks wait for it */
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->lock);
  pthread_join(g->thread, NULL);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->lock);
  free(g);
  pipe->gatherer = NULL;
  mlo_dist_lane_release(pipe->comm, pipe); /* another pipeline's thread may take it */
}
