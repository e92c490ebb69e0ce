/*
 * internal.h — the core's data structures, shared by the files of
 * src/core/.  Nothing here is visible to users; mlo.h is the manual.
 *
 * Locking: one mutex per pipeline (`lock`) guards residency, counters and
 * the offload state; a condition variable (`idle`) is signalled whenever a
 * component stops executing or a reconfiguration ends.  A second mutex
 * (`setup_lock`) serializes enable/disable/materialize, which may run long
 * (file reads, delegate callbacks) and must not hold `lock` while doing so.
 * Order: setup_lock before lock.
 *
 * The component and tensor lists (and each tensor's declaration) are
 * written with BOTH locks held and may be read with EITHER: materialize
 * walks them under setup_lock alone, acquire under lock alone, and neither
 * can see a list being grown.
 */
#ifndef MLO_CORE_INTERNAL_H
#define MLO_CORE_INTERNAL_H

#include "base/log.h"
#include "base/nameset.h"
#include "base/sysio.h"
#include "dist/dist.h"
#include "platform/platform.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Where a tensor runs in its component's forward (blocks.c): the
 * prologue, a block (the run of `rank`, the name's first plen bytes, and
 * the block's number), or the epilogue. */
enum { MLO_PIECE_PROLOGUE, MLO_PIECE_BLOCK, MLO_PIECE_EPILOGUE };
struct mlo_block_key {
  unsigned char kind, rank;
  uint32_t plen, num;
};

/* A tensor with its layout key, for sorting (blocks.c). */
struct mlo_keyed {
  mlo_tensor *t;
  struct mlo_block_key key;
  size_t index; /* declaration order breaks ties */
  int piece;
};

/* A piece's bytes in the slab (blocks.c, slab.c). */
struct mlo_span {
  uint64_t off, bytes;
  size_t tensors;
};

struct mlo_tensor {
  char *name;
  mlo_component *comp; /* the component that lists this name */
  mlo_tensor *target;  /* alias: the tensor that owns the storage; else NULL */
  mlo_dtype dtype;
  int ndim;
  int64_t shape[MLO_MAX_DIMS];
  uint64_t nbytes;
  unsigned flags;
  /* source, for materialization */
  const void *src_data;
  char *src_file;
  uint64_t src_offset;
  mlo_file_id src_id; /* the file as it was when the tensor was declared */
  /* storage */
  uint64_t dev_offset; /* offset in the device block (and in the slab) */
  void *host;          /* host copy after materialization */
  bool registered;     /* EXTERNAL: page-locked in place by the platform (in a run) */
  bool registered_ro;  /* ... read-only: nothing may be copied back into it */
  /* its piece of the forward (blocks.c): from the name, or declared */
  struct mlo_block_key bkey;
  bool block_declared;
  int declared_block;
  int block; /* as laid out: MLO_BLOCK_PROLOGUE, _EPILOGUE or 0..nblocks-1 */
  /* where it is in its component's device block while that residency was
   * placed by a joined switch (join.c; comp->placed), instead of dev_offset */
  uint64_t place;
};

/* One device of a pipeline (docs/placement.md): the platform its
 * components' blocks live on and their forwards run on, what is resident
 * on it (counted as pipe->device_bytes is, its share of it), and the
 * budget the budget policy keeps on it while in force.  A pipeline's
 * devices are one kind (the same platform name); the first is also the
 * host side's (slabs are pinned through it: pinned memory is portable). */
#define MLO_MAX_DEVICES 16
struct mlo_device {
  mlo_platform *platform;
  size_t index;
  uint64_t bytes, peak;
  uint64_t budget;     /* the budget policy's, set at its enable */
  uint64_t place_room; /* the room placement saw at the last enable */
};

/* Which strategy owns the pipeline's hooks (C16). */
typedef enum { STRATEGY_NONE, STRATEGY_GENERIC, STRATEGY_DELEGATE } mlo_strategy;

struct mlo_group {
  mlo_pipeline *pipe;
  bool detached; /* disable removed its hooks; only mlo_group_free is left */
  char *name;
  mlo_component **members;
  size_t count, cap;
};

/* A page-rounded range of caller memory registered with the platform, and
 * whether read-only (every tensor in it is only ever read). */
struct mlo_ext_run {
  char *base;
  size_t bytes;
  bool ro;
};

struct mlo_component {
  mlo_pipeline *pipe;
  char *name;
  size_t index;
  /* its device (placement.c): chosen at enable, or pinned by the caller
   * (pinned_dev; -1: placement chooses); changed only while not resident */
  struct mlo_device *dev;
  int pinned_dev;
  mlo_role role;
  mlo_role_source role_source;
  mlo_tensor **tensors; /* in declaration order, aliases included */
  size_t ntensors, tcap;
  mlo_nameset names;         /* name -> index in tensors */
  struct mlo_keyed *scratch; /* tcap entries: the layout sorts here (blocks.c) */
  uint64_t bytes_bound;      /* >= the block's size: each own tensor + alignment */
  bool has_mutable;          /* any own tensor flagged MUTABLE */
  size_t own_count;          /* tensors with storage of their own */

  /* host storage */
  bool materialized;
  void *slab;
  uint64_t slab_bytes; /* packed non-external tensors, the first bytes of a block */
  bool slab_pinned;
  void *slab_shared;       /* with a communicator: the node-shared mapping's handle */
  bool slab_registered;    /* a shared slab page-locked in place (host_register) */
  bool slab_registered_ro; /* ... read-only (no mutable tensor in it) */
  uint64_t block_bytes;    /* slab_bytes + external tensors, aligned */
  uint64_t pageable_bytes; /* of the block, copied from pageable host memory */
  /* caller-owned tensors page-locked in place: one registration per run of
   * tensors whose pages meet (registration is page-granular), slab.c */
  struct mlo_ext_run *ext_runs;
  size_t next_runs;
  bool warned_pageable; /* its first load said so */
  /* the pieces of its forward, as laid out (blocks.c, slab.c) */
  bool blocks_declared; /* a tensor's block was declared: names are not read */
  size_t nblocks;
  struct mlo_span *spans; /* nblocks, in the order they run */
  struct mlo_span pro, epi;
  /* streamed residency (stream.c): NULL while it moves whole */
  struct mlo_stream *stream;
  /* progressive loads (progressive.c): the caller's forward begins and ends
   * every block (mlo_component_set_progressive), so a load goes block by
   * block; prog: the per-block events (NULL until its first such load) */
  bool progressive;
  struct mlo_prog *prog;
  /* the joined switch (join.c): the join this component's memory is being
   * handed from (its source) or its copies are going to (its target);
   * placed: resident in a block a join handed it, each tensor at t->place */
  struct mlo_join *join;
  bool placed;
  uint64_t placed_bytes; /* ... what it counts on the device then: the source's figure */
  /* the disk tier (disk.c): a slab left in its checkpoint files */
  bool want_disk;     /* the host plan at enable chose the disk for it */
  bool want_partial;  /* ... and it streams: its streamed blocks stay in host memory */
  bool partial;       /* on disk but for the streamed blocks in filled[], in its slab */
  bool *filled;       /* per block: read into the slab (partial) */
  void **pinned_runs; /* ranges of the slab registered with the platform (partial) */
  size_t npinned_runs;
  bool on_disk;            /* materialized without a slab: each load reads its files */
  bool disk_busy;          /* a load's reads and copies are being issued by the reader */
  size_t disk_reads;       /* streamed blocks queued to the reader, or being read */
  int disk_rc;             /* the last disk load's failure (0: none), said by disk_err */
  char disk_err[400];      /* written by the reader, read under the lock after disk_busy */
  mlo_tensor **disk_files; /* its file-backed tensors, by file then offset */
  size_t ndisk_files;
  mlo_component *disk_next;           /* the reader's queue */
  uint64_t disk_lo, disk_hi, disk_at; /* the load's slab bytes, and where lo goes */
  uint64_t disk_done, disk_total; /* of its files, read so far (the reader's, atomic) and in all */
  bool disk_tell; /* a sharded load from disk failed: its wait tells the other ranks */
  void (*disk_undo)(mlo_component *c); /* how a failed load is undone (mlo_disk_start) */

  /* device residency */
  mlo_residency state;
  void *block;
  mlo_event *load_ev;     /* recorded on the copy queue after the load */
  uint64_t load_begin_ns; /* when the current load was issued (trace, log) */
  bool load_waited;       /* the load is known complete for compute (its head, block by block) */
  bool load_ended;        /* its LOAD_END traced and its line logged (mlo_res_load_ended) */
  uint64_t alloc_bytes;   /* the block as allocated (sharded: whole slices) */
  size_t gather_slice;    /* sharded load: this rank's slice, gathered at the wait; 0: none */
  bool device_gather;     /* sharded load gathered on the device, not waited for yet */
  uint64_t shard_offset, shard_bytes; /* shard_resident: where this rank's slice is */
  mlo_event *compute_ev;              /* recorded after forwards that write (mutable) */
  mlo_event *writeback_ev;            /* pending async write-back into host memory */
  bool writeback_pending;
  /* Recorded on the compute queue at its last release while offload is
   * enabled: after every compute that used this residency (compute on a
   * component happens between its acquire and release), so its eviction
   * frees after that and not after compute queued since (issue 25, item
   * 7).  Valid only for this residency and this enable (use_epoch). */
  mlo_event *use_ev;
  bool use_valid;
  uint64_t use_epoch;
  int users;          /* forwards/acquires in progress */
  pthread_t *holders; /* the thread of each of them (users entries), for EDEADLK */
  size_t hcap;
  /* kept (not streamed) blocks begun and not ended: one entry a begin, with
   * its thread (guard.c), so an end must match a begin on its own thread and
   * a block is ended (a join may take its memory) only at its last end */
  struct mlo_begun *begun;
  size_t nbegun, begun_cap;
  mlo_group *group;  /* delegate exclusion group, if any */
  uint64_t last_use; /* pipe->tick at its last acquire (BUDGET's LRU) */

  mlo_component_stats stats;
};

struct mlo_pipeline {
  mlo_platform *platform; /* devs[0]'s: the host side's (slabs, the disk ring) */
  struct mlo_device devs[MLO_MAX_DEVICES];
  size_t ndevs;
  bool placed;                     /* placement.c chose the devices at an enable */
  uint64_t place_moved, place_one; /* ... its modelled bytes per request, and one device's */
  bool pin_host;
  size_t alignment;
  pthread_mutex_t lock;
  pthread_cond_t idle;
  pthread_mutex_t setup_lock;
  char errmsg[512];

  mlo_component **comps;
  size_t ncomps, ccap;
  bool warned_heuristic;

  /* offload state */
  mlo_strategy strategy;
  bool enabled;
  uint64_t enable_epoch; /* counts enables: a component's use_ev is of one */
  mlo_offload_settings settings;
  /* enable/disable is between its checks and its end with `lock` dropped
   * (materializing, or inside a delegate): acquires wait, except on the
   * thread doing it (a delegate may load inside its enable) */
  bool reconfiguring;
  pthread_t reconfig_thread;
  const mlo_delegate_ops *delegate;
  void *delegate_self;
  mlo_group **groups;
  size_t ngroups, gcap;
  bool audit_each;

  /* the declared schedule and its cursor (sched.c): runs of calls, the
   * run the next call is expected in and how many of it are done */
  struct mlo_sched_run {
    mlo_component *comp;
    uint64_t repeat;
  } * sched;
  size_t nsched;
  size_t cur_run;
  uint64_t cur_done;
  /* learning the schedule from the calls (mlo_pipeline_learn_schedule):
   * the current request's calls so far, as runs */
  bool learning;
  struct mlo_sched_run *rec;
  size_t nrec, reccap;
  uint64_t tick; /* acquires so far, for least-recently-used */

  /* the residency policy in force while generic offload is enabled
   * (policy.h; NULL otherwise), and its own state */
  const struct mlo_policy_ops *policy;
  void *policy_state;

  /* ranks (mlo/mpi.h): NULL without a communicator */
  mlo_comm *comm;
  void *coll_checked;  /* the NCCL communicator last found to be the node's (coll_check) */
  bool sharded;        /* loads copy 1/n and all-gather */
  bool shard_resident; /* ... and keep their slice alone, gathering nothing */
  mlo_dist_stats dist;

  /* the disk tier (disk.c): the reader thread, its queue and staging ring;
   * NULL until the first load from disk */
  struct mlo_disk *disk;
  /* the host's gathers off the forward's thread (gatherer.c): NULL until
   * the first is posted */
  struct mlo_gatherer *gatherer;

  /* accounting */
  uint64_t device_bytes, peak_device_bytes;
  uint64_t host_slab_bytes, pinned_bytes;
  uint64_t disk_bytes; /* slab bytes of components on disk */

  mlo_progress_fn progress;
  void *progress_user;
  mlo_trace_fn trace;
  void *trace_user;
};

/* Taking a pipeline lock.  Both mutexes are error-checking: a thread that
 * already holds one (a trace, log, progress or delegate callback calling
 * back into its own pipeline) gets EDEADLK from pthread_mutex_lock instead
 * of hanging, and the entry point returns MLO_EDEADLK (mlo.h, "Callbacks").
 * Only an entry point's first lock can fail that way; later locks in the
 * same call use pthread_mutex_lock. */
int mlo_reentered(mlo_pipeline *pipe);
#define MLO_LOCK_OR(m, ret)                                                                        \
  do {                                                                                             \
    if (pthread_mutex_lock(m)) {                                                                   \
      mlo_log_reentry(__func__);                                                                   \
      return ret;                                                                                  \
    }                                                                                              \
  } while (0)
#define MLO_LOCK_OR_VOID(m)                                                                        \
  do {                                                                                             \
    if (pthread_mutex_lock(m)) {                                                                   \
      mlo_log_reentry(__func__);                                                                   \
      return;                                                                                      \
    }                                                                                              \
  } while (0)
void mlo_log_reentry(const char *func);
/* setup_lock, then lock (the order of internal.h's rule); MLO_EDEADLK, with
 * neither held, when this thread already holds one of them. */
int mlo_lock_both(mlo_pipeline *pipe);
void mlo_unlock_both(mlo_pipeline *pipe);

/* The threads holding something (a component's acquires and forwards, a
 * streamed block's begins): one entry per hold, in *n of them (guard.c).
 * add: this thread's, MLO_ENOMEM with nothing changed if the list cannot
 * grow; drop: this thread's entry if it has one, else the oldest (a
 * release may come from another thread); has: whether this thread holds. */
int mlo_holders_add(pthread_t **holders, size_t *cap, int *n);
void mlo_holders_drop(pthread_t *holders, int *n);
bool mlo_holders_has(const pthread_t *holders, int n);

/* The kept blocks begun on c (c->begun); lock held.  add: one begin of
 * block by this thread (MLO_ENOMEM with nothing changed); end: drops one
 * of this thread's begins of block, false if it has none; open: whether
 * any thread still has block begun; drop_thread: drops this thread's
 * begins (every thread's with all), returning how many were dropped. */
struct mlo_begun {
  size_t block;
  pthread_t thread;
};
int mlo_begun_add(mlo_component *c, size_t block);
bool mlo_begun_end(mlo_component *c, size_t block);
bool mlo_begun_open(const mlo_component *c, size_t block);
size_t mlo_begun_drop_thread(mlo_component *c, bool all);

/* Whether the calling thread is one of c's holders (its acquires or
 * forwards in progress); lock held.  Both the exclusion rule and the budget
 * use it to refuse a wait that could never end (MLO_EDEADLK). */
static inline bool mlo_held_by_this_thread(const mlo_component *c) {
  return mlo_holders_has(c->holders, c->users);
}

/* Resident or loading; lock held. */
/* The reader still has work of c's: its load, or streamed blocks. */
static inline bool mlo_disk_pending(const mlo_component *c) {
  return c->disk_busy || c->disk_reads;
}

static inline bool mlo_res_is_resident(const mlo_component *c) {
  return c->state == MLO_RES_LOADING || c->state == MLO_RES_DEVICE;
}

/* The platform c's block lives on and its forward runs on. */
static inline mlo_platform *mlo_dev_plat(const mlo_component *c) {
  return c->dev->platform;
}

/* A platform call made for component c, counted against it (counters are
 * exact). */
#define PCALL(c, expr) ((c)->stats.platform_calls++, (expr))

/* Records a failure message on the pipeline and returns status. */
int mlo_fail(mlo_pipeline *pipe, int status, const char *fmt, ...) MLO_PRINTF(3, 4);
/* c's device block's bytes, from its layout before it is materialized
 * (slab.c; lock held). */
uint64_t mlo_comp_bytes(const mlo_component *c);
/* Frees a tensor's declaration (tensor.c; NULL is a no-op). */
void mlo_tensor_free(mlo_tensor *t);
/* loader.c: reads the nfiles file-backed tensors into c->slab (at their
 * dev_offset) with a pool of reader threads, dropping the pages behind the
 * reads from the page cache; progress (may be NULL) is called from the
 * calling thread.  files is reordered.  On failure c->pipe's message says
 * which tensor of which file; the slab's contents are then undefined. */
/* The agreement step of a collective (dist.h) on this pipeline's
 * communicator, named by component: MLO_OK without one.  status and msg
 * are this rank's own part (its failure, told to every rank); check what
 * every rank must agree on at this step besides (0: nothing).  On failure
 * pipe's errmsg holds the message; *together (may be NULL) whether every
 * rank is at this step and may undo it collectively (dist.h). */
int mlo_collective(mlo_pipeline *pipe, const mlo_component *c, unsigned step, uint64_t check,
                   int status, const char *msg, bool *together);
enum {
  COLL_MATERIALIZE = 1,
  COLL_LOADED,
  COLL_LOAD,
  COLL_GATHER,
  COLL_FREE,
  COLL_SAME_FILES,
  COLL_CONTENT
};
/* The agreement's id of c's `step` (c NULL: the pipeline's own): what
 * mlo_collective agrees on, and the gather thread's steps too. */
uint64_t mlo_collective_id(const mlo_component *c, unsigned step);
/* A collective's failure as pipe's: err prefixed with this rank once (the
 * communicator's message may name it already); returns rc. */
int mlo_collective_failed(mlo_pipeline *pipe, int rc, const char *err);
/* Whether the communicator's device-side gather (NCCL) is the node's, in
 * node-rank order, on the platform's device, where a sharded pipeline
 * gathers on the device: MLO_OK, or the reason in why.  Each rank's answer
 * goes to the next agreement as its own part, so every rank refuses. */
int mlo_check_device_gather(mlo_pipeline *pipe, char *why, size_t whylen);
int mlo_load_files(mlo_component *c, mlo_tensor **files, size_t nfiles, uint64_t total, bool share,
                   mlo_progress_fn progress, void *user);
/* The loader's parts the disk tier reads with too (loader.c): files sorted
 * by file then offset; each distinct file opened once and checked to be
 * the one validated (fds[i] is files[i]'s; the message in why); closed,
 * dropping what is left of them in the page cache with drop; the whole
 * pages of a range dropped from it. */
void mlo_sort_by_file(mlo_tensor **files, size_t nfiles);
int mlo_open_checked(const mlo_component *c, mlo_tensor *const *files, size_t nfiles, int *fds,
                     bool share, char *why, size_t whylen);
void mlo_close_files(size_t nfiles, const int *fds, bool drop);
void mlo_drop_pages(int fd, uint64_t off, uint64_t len);

/* transfer.c — what every mover shares; lock held unless said. */
/* c's device bytes change by `bytes` (its device's and the pipeline's
 * figures, and their peaks). */
void mlo_res_count(mlo_component *c, int64_t bytes);
/* Device d's memory for this pipeline (pipeline.c; lock held): its total,
 * and what is free plus what the pipeline holds there, within the total.
 * A failure is said on the pipeline. */
int mlo_device_memory(mlo_pipeline *pipe, size_t d, uint64_t *total, uint64_t *avail);
/* Drains every device of the pipeline (the first failure's status); lock
 * NOT held. */
int mlo_devices_synchronize(mlo_pipeline *pipe);
/* The compute queue waits for ev as the sync mode says (the whole device
 * with MLO_SYNC_DEVICE); lock NOT held.  A wait [t0, t1] for c's copies is
 * then counted in its stats and, with traced, traced (lock held). */
int mlo_res_compute_wait(mlo_platform *p, mlo_event *ev, mlo_sync_mode sync);
void mlo_res_count_wait(mlo_component *c, uint64_t t0, uint64_t t1, bool traced);
void mlo_res_trace(mlo_component *c, mlo_trace_kind kind, uint64_t bytes);
void mlo_res_trace_at(mlo_component *c, mlo_trace_kind kind, uint64_t bytes, uint64_t t_ns);
/* The load's end, once per residency: traced (LOAD_END) and logged at its
 * completion stamp, no later than latest; _at: at t exactly. */
void mlo_res_load_ended(mlo_component *c, uint64_t latest);
void mlo_res_load_ended_at(mlo_component *c, uint64_t t);
/* *ev, created on first use. */
int mlo_res_ensure_event(mlo_component *c, mlo_event **ev);
/* The debug line of a transfer: what, its bytes, its copies. */
void mlo_res_log_transfer(const mlo_component *c, const char *what, uint64_t bytes, size_t copies);
/* Copies c's caller-owned tensors (every tensor with `every`: per-tensor
 * copies) from their own host memory into its block, one copy each, at
 * their place (a streamed plan's, where it has one); adds to *copies and
 * *moved. */
int mlo_res_copy_tensors(mlo_component *c, bool every, size_t *copies, uint64_t *moved);
/* Waits for a pending write-back into host memory. */
int mlo_res_finish_writeback(mlo_component *c);

/* residency.c — every call with pipe->lock held. */
int mlo_res_load(mlo_component *c);  /* no eviction; rolls back on failure */
int mlo_res_evict(mlo_component *c); /* users must be 0 */
/* Releases the block with no write-back, for teardown after a failed
 * evict: nobody is left to report to, and the block must not leak. */
void mlo_res_drop(mlo_component *c);
/* Orders compute after c's load per the sync mode; lock NOT held. */
int mlo_res_wait_loaded(mlo_component *c, mlo_sync_mode sync);
/* The joined switch's residency steps (join.c): b's load began (its
 * copies go into a's block, nothing allocated: traced as such); a hands
 * its block to b at a's last release, b's copies (`copies`, `moved`
 * bytes) issued and its load event recorded after them. */
void mlo_res_join_began(mlo_component *b);
int mlo_res_hand_over(mlo_component *a, mlo_component *b, size_t copies, uint64_t moved,
                      bool placed);
void mlo_res_release_events(mlo_component *c);
/* At a component's last release: records use_ev where the platform can
 * free after it (mlo_plat_has_dev_free_after); lock held. */
int mlo_res_note_last_use(mlo_component *c);

/* blocks.c */
void mlo_block_key_of(const char *name, struct mlo_block_key *k);
/* Sorts c's own slab tensors (not aliases, not external) into c->scratch
 * in layout order, each with its piece (MLO_BLOCK_PROLOGUE, _EPILOGUE, or
 * 0..*nblocks-1); returns how many.  Allocates nothing; lock held. */
size_t mlo_blocks_sort(const mlo_component *c, size_t *nblocks);

/* slab.c */
typedef struct {
  uint64_t block_bytes; /* the device block: the slab, then external tensors */
  uint64_t slab_bytes;  /* the library-owned prefix */
  size_t nblocks;
  struct mlo_span pro, epi;
  struct mlo_span *spans; /* nblocks */
  mlo_tensor **order;     /* the slab's tensors in the order they are laid out */
  size_t norder;
} mlo_layout;
void mlo_layout_free(mlo_layout *lay);
/* The layout of c's device block and slab; with assign, sets each
 * tensor's offset and piece and lists the order; with spans, the pieces'
 * ranges.  Without either it allocates nothing and cannot fail; else
 * MLO_ENOMEM (nothing assigned).  Lock held. */
int mlo_slab_layout(mlo_component *c, bool assign, bool spans, mlo_layout *out);
int mlo_slab_materialize(mlo_component *c); /* setup_lock held */
/* Host memory registered read-only is registered again so a write-back
 * may land in it (copy_back writes every tensor back); setup_lock held. */
void mlo_slab_allow_writeback(mlo_component *c);
void mlo_slab_free(mlo_component *c); /* lock held, not resident */

/* disk.c — the disk tier: slabs kept in their checkpoint files, read by a
 * reader thread through a pinned staging ring at each load. */
/* Chooses, at enable (both locks held), the components whose slabs stay in
 * host memory within s->host_budget_bytes and marks the rest want_disk;
 * device_room[d]: on device d, a component larger streams and must stay in
 * host memory.
 * MLO_ENOMEM (naming them) where what must stay does not fit;
 * MLO_EUNSUPPORTED where the pipeline cannot use the tier. */
int mlo_disk_plan(mlo_pipeline *pipe, const mlo_offload_settings *s, const uint64_t *device_room);
/* Makes c's storage follow its host plan (lock held): a component not
 * resident whose tier changed gives up its storage, once nothing queued
 * uses it, and is materialized again in its tier at its next use.  Enable
 * applies it at once, an eviction to the component it evicts. */
void mlo_disk_change_tier(mlo_component *c);
/* A component on disk that streams (partial) reads the blocks its plan
 * streams into its slab, once each, and page-locks them; lock held, after
 * every stream plan of it.  MLO_OK when it is not partial. */
int mlo_disk_fill_streamed(mlo_component *c);
/* A load of an on-disk c, its block allocated (lock held): the reader reads
 * the slab bytes [lo, hi) of it from its files, copies them to the block
 * (lo at `at`) and records c->load_ev.  A whole load is (0, UINT64_MAX, 0);
 * a sharded one, this rank's slice (gathered at the wait).  A load that
 * fails is undone with `undo` (lock held), the residency's own step,
 * except a sharded one, whose wait tells the other ranks first. */
int mlo_disk_start(mlo_component *c, uint64_t lo, uint64_t hi, uint64_t at,
                   void (*undo)(mlo_component *c));
/* A streamed block b of an on-disk c whose host memory does not hold it
 * (docs/disk.md), lock held: the reader reads its bytes and copies them
 * to `at` in c's block (after whatever the copy queue was told to wait for
 * first: the slot's free event), then records ev; *busy is true until
 * then, and *rc (with err) says how it went.  The simulated device models
 * the read and the copy at once (busy stays false). */
int mlo_disk_read_block(mlo_component *c, size_t b, uint64_t at, mlo_event *ev, bool *busy, int *rc,
                        char *err, size_t errlen);
/* Waits, lock held (dropped while waiting), until c's reads are issued;
 * wait adds the load's failure, said on the pipeline, if they failed.
 * settle waits for its streamed blocks' reads too, wait for its load's. */
void mlo_disk_settle(mlo_component *c);
int mlo_disk_wait(mlo_component *c);
/* Stops the reader (lock NOT held): a load in flight ends early and fails. */
void mlo_disk_stop(mlo_pipeline *pipe);
uint64_t mlo_disk_staging_bytes(const mlo_pipeline *pipe); /* lock held */
/* The host memory the slabs take (lock held): *all of them; *least, what
 * the disk tier cannot leave in the files (the host plan's own rule:
 * caller-owned, mutable, not from files); *keep, that and the blocks that
 * stream in device_room, kept in host memory (0 where nothing streams). */
void mlo_disk_needs(mlo_pipeline *pipe, uint64_t device_room, uint64_t *all, uint64_t *least,
                    uint64_t *keep);

/* disk_store.c — an on-disk component's host storage (its files, a
 * partial slab); below slab.c, which materializes and frees through it. */
/* Materializes c without a slab (setup_lock held): its files are checked
 * and its file-backed tensors listed in layout lay. */
int mlo_disk_prepare(mlo_component *c, const mlo_layout *lay);
/* Frees what a partial component holds besides its files: the blocks
 * read, their registration, the slab (lock held; nothing queued uses it). */
void mlo_disk_free_partial(mlo_component *c);
/* Unregisters a partial slab's page-locked runs. */
void mlo_disk_unpin_runs(mlo_component *c);

/* budget.c — its victim rule, which placement's model follows too: whether
 * a candidate of `bytes`, next used `next` calls from now and last used at
 * tick `last`, goes before the best so far, for short_by bytes of room:
 * one that alone frees enough first, the smallest of those, then the
 * farthest next use, then the least recently used. */
bool mlo_budget_better_victim(uint64_t bytes, uint64_t next, uint64_t last, uint64_t best_bytes,
                              uint64_t best_next, uint64_t best_last, uint64_t short_by);

/* placement.c — where each component of a pipeline of several devices
 * lives (both locks held, before the host plan): places the components
 * not pinned to move the fewest bytes per request under policy pol (NULL:
 * all resident at once, nothing excluded, nothing streamed), each device's
 * room given (room[d]); a component whose device changes is
 * evicted and its events released first.  MLO_OK at once for one device;
 * MLO_ENOMEM_DEVICE naming the sizes where nothing fits. */
struct mlo_policy_ops;
int mlo_place(mlo_pipeline *pipe, const struct mlo_policy_ops *pol, const uint64_t *room);

/* offload.c */
/* True if a and b may never be resident while either executes. */
bool mlo_excludes(const mlo_pipeline *pipe, const mlo_component *a, const mlo_component *b);
/* An enable or disable with the lock dropped: wait it out, unless this
 * thread is the one doing it (lock held). */
static inline bool mlo_must_wait_reconfig(const mlo_pipeline *pipe) {
  return pipe->reconfiguring && !pthread_equal(pipe->reconfig_thread, pthread_self());
}

/* stream_plan.c and stream.c — block streaming; lock held unless said
 * otherwise. */
/* The device bytes c takes while resident: its block, or its streamed
 * footprint. */
uint64_t mlo_res_bytes(const mlo_component *c);
/* Plans c (materialized, not resident) to stream within `room` device
 * bytes through nslots slots: the most blocks resident that fit
 * (MLO_ENOMEM_DEVICE naming the least room it could stream in, where none
 * does).  Drops any earlier plan first. */
int mlo_stream_plan(mlo_component *c, uint64_t room, size_t nslots);
void mlo_stream_drop(mlo_component *c); /* not resident */
/* The slab bytes of the blocks c would stream within room (a plan's
 * choice, made from its layout: c need not be materialized); UINT64_MAX
 * where it cannot stream there. */
uint64_t mlo_stream_streamed_bytes(mlo_component *c, uint64_t room, size_t nslots);
/* The least device room c runs in: its least streamed footprint, or its
 * block where it cannot stream (lock held). */
uint64_t mlo_stream_least(mlo_component *c);
/* Whether c's plan streams block b; the slab bytes of the pieces it keeps
 * resident (the prologue, the blocks kept, the epilogue), as a load copies
 * them. */
bool mlo_stream_block_streams(const mlo_component *c, size_t b);
uint64_t mlo_stream_resident_bytes(const mlo_component *c);
/* Where piece b (MLO_BLOCK_PROLOGUE, _EPILOGUE or a block) of a streamed
 * plan is kept in the footprint; false for a block that streams.  A load
 * copies the kept pieces (progressive.c), then fills the slots (start);
 * the slots are emptied at eviction. */
bool mlo_stream_piece_offset(const mlo_component *c, long b, uint64_t *off);
void mlo_stream_start(mlo_component *c);
/* For a joined switch between two streamed components (join.c): whether
 * a's plan and b's put every piece at the same offset; a's regions, each
 * with the block whose end frees it (-2: its release; a slot's: the last
 * streamed block), allocated (NULL: out of memory). */
struct mlo_stream_region {
  uint64_t lo, hi;
  long dep;
};
bool mlo_stream_same_layout(const mlo_component *a, const mlo_component *b);
/* The device bytes c's plan lays it out in (0: no plan). */
uint64_t mlo_stream_footprint(const mlo_component *c);
struct mlo_stream_region *mlo_stream_regions(const mlo_component *a, size_t *count);
/* How many copies into a's slots have not completed yet. */
size_t mlo_stream_copies_pending(const mlo_component *a);

/* The first block a load block by block issues after the head at the
 * load: c's first streamed block (mlo_stream_start issues the rest), or
 * all of them. */
size_t mlo_stream_load_limit(const mlo_component *c);
void mlo_stream_evicted(mlo_component *c);
/* Its first holder arrived (the first blocks into the slots) / its last
 * left (a block begun and never ended ends here). */
void mlo_stream_acquired(mlo_component *c);
/* A thread released c: the blocks it began and never ended end now (every
 * thread's with last, the component's last release). */
void mlo_stream_released(mlo_component *c, bool last);
/* The budget c's plan was made for (0: none); whether t's block streams. */
uint64_t mlo_stream_room(const mlo_component *c);
bool mlo_stream_streams(const mlo_component *c, const mlo_tensor *t);
int mlo_stream_audit(mlo_component *c);
/* Where a tensor of a streamed, resident component is in its device
 * block; MLO_ESTATE (with the message) for a streamed block not begun. */
int mlo_stream_tensor_offset(const mlo_component *c, const mlo_tensor *t, uint64_t *off);
/* Fills the plan's fields of mlo_component_stream_info (not .progressive). */
void mlo_stream_describe(const mlo_component *c, mlo_stream_info *out);
/* A streamed block's begin and end at the forward's boundaries (forward.c,
 * its checks passed; lock held): begin returns with the lock released. */
int mlo_stream_begin(mlo_component *c, size_t block);
int mlo_stream_end(mlo_component *c, size_t block);

/* shard.c — a sharded load's gathers (mover.h makes the source rows):
 * whether c loads sharded; what a gather of `slice` brought this rank, in
 * the pipeline's dist stats; the host's gather (MPI over the block's
 * memory) of the region at `offset`, the ranks agreeing on `piece` first
 * (0: a whole load; k + 1: piece k of one loaded block by block); lock held. */
bool mlo_shard_applies(const mlo_component *c);
/* Each of `ranks` ranks' slice of `bytes`: whole 4 KiB units of its 1/n. */
uint64_t mlo_shard_slice(uint64_t bytes, uint64_t ranks);
void mlo_shard_count_gathered(mlo_pipeline *pipe, size_t slice);
int mlo_shard_gather(mlo_component *c, size_t offset, size_t slice, uint64_t piece);

/* gatherer.c — the host's gather of one sharded piece, run by a thread of
 * the pipeline's own in the order posted (its header comment).  The
 * poster fills the first part, lock held; the job stays put until done. */
struct mlo_gather_job {
  mlo_platform *plat; /* the device's: its event, its clock, its fabric's pace */
  mlo_event *ev;      /* this rank's slice of the piece landed (NULL: nothing to wait) */
  char *buf;          /* the piece's region in the block, slice bytes per rank */
  size_t slice;
  uint64_t id, check; /* the agreement's step: the component's gather, piece + 1 */
  int status;         /* this rank's load failed before it (the reason in err) */
  uint64_t epoch;     /* its load's (mlo_gather_epoch): after one job fails, the rest do */
  const char *what;   /* the component's name */
  /* the thread's: its verdict, its message, how long it took */
  int rc;
  char err[400];
  uint64_t ns;
  bool done, posted, folded;
  bool stepped; /* an agreement ran for it (a skipped job's did not) */
  bool owned;   /* the thread frees it when done (a failure posted for the others) */
  struct mlo_gather_job *next;
};
/* At each sliced load, before the ranks agree on it: the thread, where
 * the communicator has a gather lane this pipeline could claim; MLO_ENOMEM
 * (why says so) where it cannot start, which the ranks' agreement makes
 * every rank's failure, so no rank gathers on a lane the others do not. */
int mlo_gather_start(mlo_pipeline *pipe, char *why, size_t whylen);
/* Whether the pipeline's host gathers go to the thread (started). */
bool mlo_gather_async(const mlo_pipeline *pipe);
/* A new sliced load's epoch (0 without the thread). */
uint64_t mlo_gather_epoch(mlo_pipeline *pipe);
/* Queues j (the thread started). */
void mlo_gather_post(mlo_pipeline *pipe, struct mlo_gather_job *j);
/* Queues a copy of `like` that the thread frees: a load that failed after
 * the ranks agreed to it, for the other ranks' threads (its status set). */
void mlo_gather_post_failure(mlo_pipeline *pipe, const struct mlo_gather_job *like);
/* Until j (posted) is done: its status, its figures counted in the
 * pipeline's dist stats once. */
int mlo_gather_wait(mlo_pipeline *pipe, struct mlo_gather_job *j);
/* The thread ends once what is queued has run (teardown). */
void mlo_gather_stop(mlo_pipeline *pipe);

/* progressive.c — a load block by block, each behind its own event; lock
 * held unless said otherwise. */
/* Whether c's next load goes block by block (it streams, or its forward
 * was declared to begin every block, and nothing else reads it whole). */
bool mlo_prog_applies(const mlo_component *c);
/* Whether c's current residency was loaded block by block. */
bool mlo_prog_active(const mlo_component *c);
/* A load's copies, c->block allocated: the head (prologue, epilogue,
 * caller-owned tensors, blocks holding mutable tensors) and its event, then
 * (after the caller's own steps) each other kept block before block limit
 * and its event; the rest wait for mlo_prog_issue_upto or their begin. */
int mlo_prog_copy_head(mlo_component *c, size_t *copies, uint64_t *moved);
int mlo_prog_copy_blocks(mlo_component *c, size_t limit, size_t *copies, uint64_t *moved);
/* Issues the copies of this residency's kept blocks before block limit not
 * issued yet, counted in c's stats, the load's event recorded after them. */
int mlo_prog_issue_upto(mlo_component *c, size_t limit);
/* Whether some kept block of this residency has its copy still to issue. */
bool mlo_prog_deferred(const mlo_component *c);
/* Issues the deferred kept blocks of every resident component but except
 * that no thread holds (nothing interleaves with them now: an acquire of
 * another, a disable), and with held those of held ones too (a
 * synchronize, which promises every load complete: a forward may have
 * stopped before reaching them, an exception in the caller's model). */
void mlo_prog_settle(mlo_pipeline *pipe, const mlo_component *except, bool held);
/* The head's event: what an acquire waits for (prog active). */
mlo_event *mlo_prog_head_event(const mlo_component *c);
/* Orders compute after block b's copy, once per residency (C8); drops the
 * lock while it waits (the caller holds c).  MLO_OK where nothing is due. */
int mlo_prog_begin(mlo_component *c, size_t b);
void mlo_prog_evicted(mlo_component *c);
void mlo_prog_free(mlo_component *c);
/* What a load copies of piece b (MLO_BLOCK_PROLOGUE, _EPILOGUE or a
 * block): slab bytes [*src, *src + *len) to *dev in c's device block, the
 * piece running to the next one's start; false for a block that streams. */
bool mlo_prog_extent(const mlo_component *c, long b, uint64_t *src, uint64_t *len, uint64_t *dev);
/* Sharded, block by block (progressive.c's header comment): the device
 * bytes of its padded regions; the plan of this load (its regions, this
 * rank's slices, each tensor's place); whether this residency has one; the
 * host's gathers of the head's pieces still due (after the head's event),
 * and whether any is. */
uint64_t mlo_prog_slice_footprint(mlo_component *c);
int mlo_prog_slice(mlo_component *c);
bool mlo_prog_sliced(const mlo_component *c);
int mlo_prog_gather_head(mlo_component *c);
bool mlo_prog_head_gathers(const mlo_component *c);
/* Where the host's gathers run on the gather thread: after a sliced load
 * failed part-way, its failure for the other ranks' threads (before its
 * block goes); and, before a block goes, every gather still running into
 * it waited for. */
void mlo_prog_post_failure(mlo_component *c, int rc);
void mlo_prog_drain(mlo_component *c);
/* A joined load's events (join.c): the per-block state made ready with
 * nothing pending; then, as its copies are issued, the head's event
 * (piece MLO_BLOCK_PROLOGUE) or block b's recorded after them; at the
 * hand-over the residency goes block by block where a block is pending. */
int mlo_prog_join_prepare(mlo_component *c);
int mlo_prog_join_mark(mlo_component *c, long piece);
void mlo_prog_join_activate(mlo_component *c);
/* A mirror join's hand-over: block from on (kept, not copied by the join)
 * is issued by c's own load, as a deferred kept block. */
void mlo_prog_join_defer(mlo_component *c, size_t from);

/* join.c — the joined switch; lock held. */
/* Starts handing a's memory to b, whose copies go where a's ended blocks
 * were, as a's forward ends them (a: resident, held once, in its last call
 * before b).  False, with nothing changed, where the two cannot join. */
bool mlo_join_start(mlo_component *a, mlo_component *b);
/* Whether b could be a join's target (a slab of its own, nothing mutable). */
bool mlo_join_can_take(const mlo_component *b);
/* Issues b's copies that overwrite nothing of a's now (a has no blocks to
 * end: its join starts at its acquire). */
void mlo_join_kick(mlo_component *a);
/* a's block ended in the forward being joined: the copies it frees issue. */
void mlo_join_block_ended(mlo_component *a, size_t block);
/* a's last release: the rest of b's copies after a's compute, then b is
 * resident in a's block (a failed join: a is evicted, b loads on demand). */
void mlo_join_released(mlo_component *a);
/* Whether a's block may have been overwritten by the join a is the source
 * of (its begin, or a tensor of it, is then refused). */
bool mlo_join_gone(const mlo_component *a, long block);
/* The source (whose memory goes) and the target of c's join. */
mlo_component *mlo_join_source(const mlo_component *c);
mlo_component *mlo_join_target(const mlo_component *c);
/* Ends a join with nothing handed over (teardown): b loads on demand. */
void mlo_join_drop(mlo_component *a);

/* sched.c — the declared schedule and its cursor; lock held. */
/* Calls until c's next use from the cursor (0: the call expected next);
 * UINT64_MAX when the schedule never calls it. */
uint64_t mlo_sched_next_use(const mlo_pipeline *pipe, const mlo_component *c);
/* The cursor follows a call of c (resynchronizing on one off the schedule),
 * and c's least-recently-used tick moves. */
void mlo_sched_advance(mlo_pipeline *pipe, mlo_component *c);
void mlo_sched_free(mlo_pipeline *pipe);

#endif
