/*
 * stream.c — block streaming: a component larger than its room on the
 * device runs with part of its blocks resident and the rest passed through
 * a few device buffers ("slots"), each block's copy issued on the copy
 * queue while the blocks before it compute (docs/streaming.md).
 *
 * A streamed component's device block (its footprint) is laid out as
 *
 *   [prologue][resident blocks...][epilogue][external tensors][slot 0]...[slot n-1]
 *
 * and a load copies the resident part block by block (progressive.c, at
 * the offsets mlo_stream_piece_offset gives) and then fills the slots with
 * the first streamed blocks.  The caller's forward says where it is with
 * mlo_block_begin/mlo_block_end; the rules are the component's (C8, C9):
 *
 *  - begin waits, on the compute queue, for the event recorded after the
 *    block's copy into its slot (C8);
 *  - end records an event on the compute queue; the copy that next reuses
 *    the slot waits for it on the copy queue first, so a slot is never
 *    overwritten while compute still reads it (C9);
 *  - eviction frees the whole footprint stream-ordered, as for any
 *    component, so nothing is freed under a running copy.
 *
 * At each end the slot just freed takes the next streamed block in the
 * order the forward runs them; after the last one it takes the first of
 * the next forward when the declared schedule calls this component again
 * next (or no schedule is declared), so a DiT step's first blocks land
 * while the previous step's last blocks compute.  A begin for a block not
 * in a slot (blocks run out of order) loads it on demand into the slot
 * needed last.
 *
 * Every function runs with the pipeline lock held, except where begin
 * waits, which drops it (the slot is marked in use first, so nothing
 * reuses it meanwhile).
 */
#include "base/sysio.h"
#include "core/stream.h"
#include "core/policy.h"

#include <stdio.h>
#include <stdlib.h>
/* ---- loads ------------------------------------------------------------- */

/* Copies block b into slot s on the copy queue, after the compute that
 * last read the slot (C9), and records the slot's load event (C8). */
/* Whether block b's bytes are only in c's files: on disk, and not one of
 * the streamed blocks a partial slab keeps (docs/disk.md). */
static bool from_disk(const mlo_component *c, size_t b) {
  return c->on_disk && !(c->partial && c->filled && c->filled[b]);
}

static int issue(mlo_component *c, struct stream_slot *s, size_t b) {
  mlo_platform *p = mlo_dev_plat(c);
  int rc = MLO_OK;
  s->blk = -1;
  s->read_rc = MLO_OK;
  if (!s->load_ev) rc = PCALL(c, mlo_plat_event_create(p, &s->load_ev));
  if (!rc && s->has_free_ev) rc = PCALL(c, mlo_plat_copy_wait(p, s->free_ev));
  if (!rc) s->has_free_ev = false;
  uint64_t len = c->spans[b].bytes;
  if (!rc && len && from_disk(c, b)) { /* the reader reads it into the slot, then the event */
    rc = mlo_disk_read_block(c, b, s->dev_off, s->load_ev, &s->reading, &s->read_rc, s->read_err,
                             sizeof s->read_err);
  } else {
    if (!rc && len) {
      rc = PCALL(c, mlo_plat_copy_h2d(p, c->block, (size_t)s->dev_off,
                                      (char *)c->slab + c->spans[b].off, (size_t)len));
      if (!rc) { /* counted once queued: it crosses the link even if its event fails */
        c->stats.h2d_bytes += len;
        c->stats.copy_calls++;
      }
    }
    if (!rc) rc = PCALL(c, mlo_plat_event_record_copy(p, s->load_ev));
  }
  if (rc) return rc;
  s->blk = (long)b;
  s->waited = false;
  c->stats.block_loads++;
  mlo_res_trace(c, MLO_TRACE_BLOCK_LOAD, len);
  return MLO_OK;
}

static struct stream_slot *slot_of(struct mlo_stream *st, size_t b) {
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].blk == (long)b) return &st->slots[i];
  return NULL;
}

/* Issues the next streamed block into slot s if it is due: not in a slot
 * already, and (past the last block) only when this component is what the
 * schedule calls next.  A failure leaves the slot empty: the block's begin
 * loads it on demand and reports the error there. */
static void refill(mlo_component *c, struct stream_slot *s, size_t after_pos) {
  struct mlo_stream *st = c->stream;
  mlo_pipeline *pipe = c->pipe;
  size_t q = st->order[st->next];
  /* the kept blocks the forward runs before q (the rest of this forward's
   * where q is the next one's) go first; a failure is their begin's */
  if (mlo_prog_issue_upto(c, st->next <= after_pos ? c->nblocks : q))
    mlo_logf(MLO_LOG_DEBUG, "%s: kept blocks before %zu not issued: %s", c->name, q, pipe->errmsg);
  if (slot_of(st, q)) return;
  if (st->next <= after_pos && pipe->nsched && mlo_sched_next_use(pipe, c) != 0) return;
  if (issue(c, s, q) != MLO_OK) {
    mlo_logf(MLO_LOG_DEBUG, "%s: block %zu not issued ahead: %s", c->name, q, pipe->errmsg);
    s->blk = -1;
    return;
  }
  st->next = (st->next + 1) % st->nstreamed;
}

/* Empty slots: after a load allocated them, or an eviction freed them. */
static void reset_slots(struct mlo_stream *st) {
  for (size_t i = 0; i < st->nslots; i++) {
    struct stream_slot *s = &st->slots[i];
    s->blk = -1;
    s->users = 0;
    s->waited = s->has_free_ev = s->reading = false;
    s->read_rc = MLO_OK;
  }
  st->next = 0;
}

size_t mlo_stream_load_limit(const mlo_component *c) {
  return c->stream && c->stream->nstreamed ? c->stream->order[0] : c->nblocks;
}

/* The slots' first fills, each after the kept blocks the forward runs
 * before it; then the kept blocks up to the first streamed block no slot
 * holds (a load block by block; a whole load has issued them all). */
void mlo_stream_start(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  size_t i = 0;
  reset_slots(st);
  for (; i < st->nslots && i < st->nstreamed; i++) {
    mlo_prog_issue_upto(c, st->order[i]); /* a failure is the block's begin's */
    if (issue(c, &st->slots[i], st->order[i]) != MLO_OK) break; /* on demand, then */
    st->next = (i + 1) % st->nstreamed;
  }
  mlo_prog_issue_upto(c, i < st->nstreamed ? st->order[i] : c->nblocks);
}

void mlo_stream_acquired(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  if (!st || c->users != 1 || !mlo_res_is_resident(c)) return;
  /* a forward starts at the first streamed blocks: those are what the
   * slots should hold now (they do where the last forward ran on into
   * this one, or the load just filled them) */
  size_t want = st->nslots < st->nstreamed ? st->nslots : st->nstreamed;
  for (size_t k = 0; k < want; k++) {
    size_t b = st->order[k];
    if (slot_of(st, b)) continue;
    struct stream_slot *s = NULL;
    for (size_t i = 0; i < st->nslots && !s; i++)
      if (!st->slots[i].users && !st->slots[i].reading && /* the reader's, until it is done */
          (st->slots[i].blk < 0 || st->pos[st->slots[i].blk] >= want))
        s = &st->slots[i];
    if (!s || issue(c, s, b) != MLO_OK) break; /* on demand, then */
  }
  st->next = want % st->nstreamed;
}

void mlo_stream_evicted(mlo_component *c) {
  if (c->stream) reset_slots(c->stream);
}

/* Records the end of the compute that read slot s (C9): the next copy
 * into it waits for this event. */
static int record_free(mlo_component *c, struct stream_slot *s) {
  mlo_platform *p = mlo_dev_plat(c);
  int rc = s->free_ev ? MLO_OK : PCALL(c, mlo_plat_event_create(p, &s->free_ev));
  if (!rc) rc = PCALL(c, mlo_plat_event_record_compute(p, s->free_ev));
  if (!rc) s->has_free_ev = true;
  return rc;
}

/* Ends slot s's begins by this thread (all of them with all_threads):
 * the compute that read it ends here. */
static void end_left(mlo_component *c, struct stream_slot *s, bool all_threads) {
  pthread_t self = pthread_self();
  int left = s->users;
  for (int k = s->users - 1; k >= 0; k--)
    if (all_threads || pthread_equal(s->holders[k], self)) s->holders[k] = s->holders[--s->users];
  if (s->users == left) return;
  mlo_logf(MLO_LOG_WARN, "%s: block %ld was begun and never ended; ended at the release", c->name,
           s->blk);
  if (!s->users && record_free(c, s) != MLO_OK) { /* no event: order it the blunt way */
    c->stats.platform_calls++;
    mlo_plat_synchronize(mlo_dev_plat(c));
  }
}

void mlo_stream_released(mlo_component *c, bool last) {
  struct mlo_stream *st = c->stream;
  if (!st || !mlo_res_is_resident(c)) return;
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].users) end_left(c, &st->slots[i], last);
  pthread_cond_broadcast(&c->pipe->idle); /* a thread may wait for a slot */
}

int mlo_stream_audit(mlo_component *c) {
  struct mlo_stream *st = c->stream;
  if (!st || c->users) return MLO_OK;
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].users)
      return mlo_fail(c->pipe, MLO_ESTATE, "audit: block %ld of '%s' is begun with no holder",
                      st->slots[i].blk, c->name);
  return MLO_OK;
}

/* ---- the forward's side ------------------------------------------------ */

/* The slots' holders are lists as a component's are (guard.c). */
static bool holds_a_slot(const struct mlo_stream *st) {
  for (size_t i = 0; i < st->nslots; i++)
    if (mlo_holders_has(st->slots[i].holders, st->slots[i].users)) return true;
  return false;
}

/* Whether the reader is filling any slot: a wait for one ends without
 * any thread of the forward. */
static bool reads_pending(const struct mlo_stream *st) {
  for (size_t i = 0; i < st->nslots; i++)
    if (st->slots[i].reading) return true;
  return false;
}

/* A slot the reader fills: wait, lock held (dropped while waiting), for
 * its copies to be queued (counted as a wait for the disk); its read's
 * failure, said.  The caller holds the slot, so nothing reuses it. */
static int wait_read(mlo_component *c, struct stream_slot *s, size_t block) {
  mlo_pipeline *pipe = c->pipe;
  if (!s->reading && !s->read_rc) return MLO_OK;
  uint64_t t0 = mlo_plat_now(mlo_dev_plat(c));
  while (s->reading) pthread_cond_wait(&pipe->idle, &pipe->lock);
  uint64_t waited = mlo_plat_now(mlo_dev_plat(c)) - t0;
  c->stats.disk_wait_ns += waited;
  c->stats.block_wait_ns += waited; /* a wait at the block's begin, as for its copy */
  c->stats.wait_ns += waited;
  if (!s->read_rc) return MLO_OK;
  /* the slot stays failed (every thread that began the block is told)
   * until it is filled again or the component leaves the device */
  return mlo_fail(pipe, s->read_rc, "%s: reading block %zu from disk failed: %s", c->name, block,
                  s->read_err);
}

/* The slot to load block b into on demand: a free one, else the one whose
 * block is needed last from b on. */
static struct stream_slot *victim(struct mlo_stream *st, size_t b) {
  struct stream_slot *best = NULL;
  size_t best_d = 0;
  for (size_t i = 0; i < st->nslots; i++) {
    struct stream_slot *s = &st->slots[i];
    if (s->users || s->reading) continue; /* a slot the reader fills is not free */
    size_t d =
        s->blk < 0 ? SIZE_MAX : (st->pos[s->blk] + st->nstreamed - st->pos[b]) % st->nstreamed;
    if (!best || d > best_d) {
      best = s;
      best_d = d;
    }
  }
  return best;
}

/* A streamed block's begin, from mlo_block_begin (forward.c) once its
 * checks passed, lock held; returns with the lock released.  The block's
 * slot (shared with other threads running it), or one loaded with it on
 * demand, is held by this thread; compute then waits for its copy (C8). */
int mlo_stream_begin(mlo_component *c, size_t block) {
  mlo_pipeline *pipe = c->pipe;
  struct mlo_stream *st = c->stream;
  struct stream_slot *s;
  int rc = MLO_OK;
  for (;;) { /* the block's slot (shared with other threads running it), or one to load it in */
    if ((s = slot_of(st, block))) break;
    if ((s = victim(st, block))) { /* out of the order the slots were filled in: on demand */
      if ((rc = issue(c, s, block)))
        rc = mlo_fail(pipe, rc, "%s: loading block %zu failed (%s)", c->name, block,
                      mlo_strerror(rc));
      else
        st->next = (st->pos[block] + 1) % st->nstreamed; /* the forward's order from here */
      break;
    }
    /* Every slot holds a block begun elsewhere.  A thread that holds one
     * must not wait (two such threads would wait for each other); one that
     * holds none waits for an end, which every holder can reach. */
    if (holds_a_slot(st) && !reads_pending(st)) {
      rc = mlo_fail(pipe, MLO_EBUSY,
                    "block %zu of '%s': all %zu slots hold blocks begun and not ended, one of "
                    "them by this thread",
                    block, c->name, st->nslots);
      break;
    }
    pthread_cond_wait(&pipe->idle, &pipe->lock); /* c stays resident: this thread holds it */
  }
  if (!rc && (rc = mlo_holders_add(&s->holders, &s->hcap, &s->users)))
    rc = mlo_fail(pipe, rc, "out of host memory beginning block %zu of '%s'", block, c->name);
  else if (!rc && (rc = wait_read(c, s, block))) { /* not begun: its read failed */
    mlo_holders_drop(s->holders, &s->users);
    pthread_cond_broadcast(&pipe->idle);
  }
  if (rc) {
    pthread_mutex_unlock(&pipe->lock);
    return rc;
  }
  bool pending = !s->waited;
  mlo_event *ev = s->load_ev;
  mlo_sync_mode sync = pipe->enabled ? pipe->settings.sync : MLO_SYNC_EVENT;
  pthread_mutex_unlock(&pipe->lock);
  if (sync == MLO_SYNC_UNSAFE_NONE || (!pending && sync == MLO_SYNC_EVENT)) return MLO_OK;
  mlo_platform *p = mlo_dev_plat(c);
  uint64_t t0 = mlo_plat_now(p);
  rc = mlo_res_compute_wait(p, ev, sync);
  uint64_t t1 = mlo_plat_now(p);
  pthread_mutex_lock(&pipe->lock);
  mlo_res_count_wait(c, t0, t1, true);
  c->stats.block_wait_ns += t1 - t0;
  if (!rc) s->waited = true;
  if (rc) { /* not begun after all: nothing of this thread's compute read the slot */
    mlo_holders_drop(s->holders, &s->users);
    if (!s->users) pthread_cond_broadcast(&pipe->idle);
    rc = mlo_fail(pipe, rc, "%s: waiting for block %zu failed", c->name, block);
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

/* A streamed block's end, from mlo_block_end (forward.c), lock held: its
 * slot is freed after the compute that read it (C9) and refilled with the
 * next block the forward runs. */
int mlo_stream_end(mlo_component *c, size_t block) {
  mlo_pipeline *pipe = c->pipe;
  int rc = MLO_OK;
  struct mlo_stream *st = c->stream;
  struct stream_slot *s = slot_of(st, block);
  if (!s || !s->users) {
    rc = mlo_fail(pipe, MLO_ESTATE, "block %zu of '%s' ended without a begin", block, c->name);
  } else if (!mlo_holders_has(s->holders, s->users)) { /* its slot is another thread's */
    rc = mlo_fail(pipe, MLO_ESTATE,
                  "block %zu of '%s' ended on a thread that did not begin it (the thread that "
                  "began it still reads its slot)",
                  block, c->name);
  } else if (s->users > 1) {
    mlo_holders_drop(s->holders, &s->users); /* others still run it */
  } else if ((rc = record_free(c, s))) {     /* it stays begun: the release ends it */
    rc = mlo_fail(pipe, rc, "%s: recording the end of block %zu failed", c->name, block);
  } else {
    mlo_holders_drop(s->holders, &s->users);
    refill(c, s, st->pos[block]);
    pthread_cond_broadcast(&pipe->idle); /* a thread may wait for a slot */
    if (pipe->policy && pipe->policy->block_ended)
      pipe->policy->block_ended(pipe, c, block); /* the next component may join (join.c) */
  }
  return rc;
}
