/*
 * dist.h — what core needs from a communicator (the caller's MPI job,
 * wrapped by mlo_comm_create_mpi in libmlo-mpi, mpi_comm.c): the ranks of one node,
 * node-shared host memory, an in-place all-gather among them, and the
 * agreement step that makes every collective acquire checked — the same
 * component on every rank, every rank present within the timeout — so a
 * mismatch or a missing rank is an error on every rank, never a hang.
 * Core includes this header only; MPI's types stay in mpi_comm.c, which is
 * not part of libmlo but a library of its own (libmlo-mpi), so a program
 * that runs one process links no MPI.  The communicator is an ops table,
 * as a platform is: libmlo-mpi fills one in, and comm.c (in libmlo) answers
 * the queries and forwards the collective calls through it.  Both are built
 * from one tree: mlo_comm_create_mpi refuses a libmlo of another version.
 */
#ifndef MLO_DIST_H
#define MLO_DIST_H

#include "mlo/mlo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef const char *(*mlo_dist_namer)(uint64_t id, void *user);
/* Ids of a program's own agreement steps (the tool's "measuring the
 * ranks") carry this bit, so they never collide with a pipeline's steps
 * (component index and step) and each side's namer can say whose a step is. */
#define MLO_DIST_PROGRAM_STEP ((uint64_t)1 << 62)

/* What a communicator does, behind its own ctx (see the wrappers below for
 * each call's contract). */
struct mlo_comm_ops {
  void (*destroy)(void *ctx);
  int (*shared_alloc)(void *ctx, size_t bytes, void **ptr, void **handle, char *err, size_t errlen);
  void (*shared_free)(void *ctx, void *handle);
  int (*allgather)(void *ctx, void *buf, size_t slice, char *err, size_t errlen);
  int (*agree)(void *ctx, uint64_t id, uint64_t check, int status, const char *msg,
               mlo_dist_namer name, void *user, bool *together, char *err, size_t errlen);
  /* len bytes of node rank root's buf to every node rank's; only after an
   * agreement every rank passed (a broadcast cannot time out). */
  int (*bcast)(void *ctx, void *buf, size_t len, int root, char *err, size_t errlen);
  /* Optional (where gather_lane is set): an agreement and then an
   * all-gather, as agree and allgather, on a line of their own that one
   * other thread drives while the caller's collectives go on. */
  int (*lane_gather)(void *ctx, uint64_t id, uint64_t check, int status, const char *msg,
                     mlo_dist_namer name, void *user, void *buf, size_t slice, char *err,
                     size_t errlen);
};

/* The handle behind the public mlo_comm. */
struct mlo_comm {
  const struct mlo_comm_ops *ops;
  void *ctx;
  int rank, size, node_rank, node_size; /* in the job, and among this node's ranks */
  void *nccl;                           /* the node's NCCL communicator, or NULL */
  unsigned timeout_ms;                  /* mlo_comm_options.timeout_ms: agreements, gathers */
  mlo_platform *nccl_platform;          /* made nccl (mlo_comm_create_nccl): destroys it */
  bool gather_lane;                     /* lane_gather may run on a thread of its own */
  void *lane_owner;                     /* the one pipeline whose thread uses it now */
};

/* Ranks on this node (the ones that share slabs and gather loads). */
int mlo_dist_node_rank(const mlo_comm *c);
int mlo_dist_node_size(const mlo_comm *c);

/* The node's NCCL communicator (mlo_comm_set_nccl), or NULL. */
void *mlo_dist_nccl(const mlo_comm *c);
/* How long a collective waits for a missing rank, gathers included. */
unsigned mlo_dist_timeout_ms(const mlo_comm *c);
/* Ids of the communicator's own agreement steps (creating the NCCL
 * communicator): apart from a pipeline's and a program's. */
#define MLO_DIST_COMM_STEP ((uint64_t)1 << 61)

/* Node-shared memory of `bytes`, collective over the node: every rank gets
 * a mapping of the same pages at *ptr; *handle frees it (collectively). */
int mlo_dist_shared_alloc(mlo_comm *c, size_t bytes, void **ptr, void **handle, char *err,
                          size_t errlen);
void mlo_dist_shared_free(mlo_comm *c, void *handle);

/* In place over the node: rank i holds bytes [i*slice, (i+1)*slice) of buf
 * (slice a multiple of 4096); afterwards every rank holds all of them. */
int mlo_dist_allgather(mlo_comm *c, void *buf, size_t slice, char *err, size_t errlen);

/* The agreement step before a collective operation: every node rank
 * states which operation it is at (`id`, e.g. a component's index, with
 * `what` naming it in messages) and whether its own part succeeded
 * (status, msg).  Returns MLO_OK when every rank arrived with the same id
 * and MLO_OK; check is what the ranks must also agree on at this step (a
 * digest of what each rank is about to share: 0 when nothing), and ranks
 * that arrive with different checks fail together (MLO_ESTATE, naming the
 * two ranks).  Otherwise an error on every rank that arrived, with a message
 * naming both sides of a mismatch, the ranks that did not arrive within the
 * communicator's timeout, or the rank that failed and why.  After a
 * timeout the communicator is broken: every later collective fails at once
 * (the late rank learns it too) instead of waiting. */
/* *together (may be NULL) says whether every node rank reached this same
 * step (the verdict is OK or a rank's failure): only then may the ranks
 * undo together what they did collectively. */
int mlo_dist_agree(mlo_comm *c, uint64_t id, uint64_t check, int status, const char *msg,
                   mlo_dist_namer name, void *user, bool *together, char *err, size_t errlen);

/* Whether gathers may run on a thread of their own (mlo_dist_lane_gather):
 * the caller's MPI allows two threads (MPI_THREAD_MULTIPLE) and the node
 * has more than one rank.  Every node rank answers alike. */
bool mlo_dist_gather_lane(const mlo_comm *c);

/* The lane serves one thread: the pipeline that claims it first (at its
 * first sliced load, a collective step, so the same pipeline on every
 * rank) has it until it releases it (its free, collective too); another
 * gathers on its own forward's thread meanwhile.  true where owner has it. */
bool mlo_dist_lane_claim(mlo_comm *c, void *owner);
void mlo_dist_lane_release(mlo_comm *c, void *owner);

/* From that one thread, in the same order on every node rank: the
 * agreement step of mlo_dist_agree (id, check, status, msg as there), then
 * mlo_dist_allgather of buf, on the lane's communicator apart from the
 * caller's other collectives.  A failure or a timeout is every rank's, as
 * there. */
int mlo_dist_lane_gather(mlo_comm *c, uint64_t id, uint64_t check, int status, const char *msg,
                         mlo_dist_namer name, void *user, void *buf, size_t slice, char *err,
                         size_t errlen);

#endif
