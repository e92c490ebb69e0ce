/*
 * disk.c — the disk tier: weights larger than host memory (docs/disk.md).
 *
 * With a host budget (mlo_offload_settings.host_budget_bytes) the slabs
 * that do not fit are never allocated: such a component is materialized
 * as its layout and the list of its file-backed tensors, and every load
 * reads them from the checkpoint.  The choice is made once, at enable,
 * from the declared schedule: the components used most per prompt keep
 * their slabs (a DiT called in several runs); one used once, an encoder,
 * is the natural one to leave on disk.
 *
 * A load from disk is asynchronous like any other: mlo_res_load allocates
 * the device block and hands the component to the pipeline's reader
 * thread, which reads the files in chunks into a small ring of pinned
 * staging buffers and queues each chunk's copies to the device from there;
 * a buffer is reused once the copies out of it are done (its event).  The
 * reader records the load's event after the last copy, so compute is
 * ordered after it exactly as after a load from a slab (C8); a forward
 * first waits for the reader to have issued them (mlo_disk_wait, counted
 * as disk_wait_ns).  A prefetch issued by the budget policy therefore
 * reads the next component from disk while the current one computes.
 *
 * Host memory stays within the budget plus the ring: the pages read are
 * dropped from the page cache behind every chunk (the loader does the
 * same), and each file is checked, when opened for a load, to be the one
 * its tensors were validated from.  The reader makes platform calls off
 * the pipeline lock (the platforms' queues take their own locks) and
 * touches the component only under the lock, at a job's end.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DISK_SLOTS 4                                    /* buffers in the ring */
#define DISK_CHUNK (MLO_STAGING_MAX_BYTES / DISK_SLOTS) /* one staging buffer, at most */
#define DISK_GAP ((uint64_t)64 << 10) /* file gaps read through rather than split */

struct disk_slot {
  void *buf;
  mlo_event *ev;         /* recorded after the copies out of buf */
  mlo_platform *ev_plat; /* the device ev is of: the last load's through it */
  bool used;             /* ev was recorded */
  bool pinned;           /* buf is page-locked (freed as such) */
};

/* A streamed block of a component on disk, to be read into its slot
 * (mlo_disk_read_block): its end is said through the slot's fields. */
struct disk_block {
  mlo_component *c;
  uint64_t lo, hi, at; /* the block's slab bytes, and its slot's offset in the block */
  mlo_event *ev;       /* recorded after its last copy */
  bool *busy;
  int *rc;
  char *err;
  size_t errlen;
  struct disk_block *next;
};

struct mlo_disk {
  pthread_t thread;
  bool started, stopping;
  pthread_cond_t work; /* signalled (under pipe->lock) when a job is queued or at stop */
  mlo_component *head, *tail;
  struct disk_block *bhead, *btail; /* streamed blocks to read into their slots, first */
  struct disk_slot slots[DISK_SLOTS];
  uint64_t chunk; /* bytes of each buffer (0: the ring is not allocated) */
  uint64_t bytes; /* the ring's bytes, for the stats (chunk is the reader's; this, the lock's) */
  bool want_pin;  /* the pipeline's pin_host, read under its lock */
};

/* ---- the host plan ------------------------------------------------------ */

/* Why c cannot live on disk (NULL: it can), given the device room it must
 * fit whole in. */
static const char *why_in_host(const mlo_component *c) {
  for (size_t i = 0; i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    if (t->target || !t->nbytes) continue;
    if (t->flags & MLO_TENSOR_EXTERNAL) return "caller-owned tensors";
    if (t->flags & MLO_TENSOR_MUTABLE) return "mutable tensors";
    /* a projection's tensors stand for a checkpoint's (the simulated device
     * reads no file: its disk is a rate) */
    if (!t->src_file && !c->pipe->platform->caps.simulated) return "tensors not from files";
  }
  return NULL;
}

/* The host plan's rule for c in a device room, for the plan and for the
 * needs alike: its layout (sizes only: allocates nothing); why it must stay
 * in host memory (NULL: it may live on disk); and, where it may and
 * exceeds the room, the bytes its blocks stream (UINT64_MAX: it cannot
 * stream there), else 0. */
static const char *host_rule(mlo_component *c, uint64_t room, mlo_layout *lay, uint64_t *streamed) {
  mlo_slab_layout(c, false, false, lay);
  const char *why = why_in_host(c);
  *streamed =
      !why && lay->block_bytes > room ? mlo_stream_streamed_bytes(c, room, MLO_STREAM_SLOTS) : 0;
  return why;
}

void mlo_disk_needs(mlo_pipeline *pipe, uint64_t device_room, uint64_t *all, uint64_t *least,
                    uint64_t *keep) {
  *all = *least = *keep = 0;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    mlo_layout lay;
    uint64_t streamed;
    bool stays = host_rule(c, device_room, &lay, &streamed) != NULL;
    uint64_t bytes = lay.block_bytes;
    *all += bytes;
    *least += stays ? bytes : 0;
    /* one that cannot stream in the room stays whole, as the host plan keeps it */
    *keep += stays || streamed == UINT64_MAX ? bytes : streamed;
  }
  if (*keep == *least) *keep = 0; /* nothing streams */
}

typedef struct {
  mlo_component *c;
  uint64_t bytes;    /* its slab (a streamed one's: besides the blocks that stream) */
  uint64_t streamed; /* the blocks it streams (0: it does not) */
  uint64_t runs, calls;
  bool streams; /* it streams in the device budget */
  bool kept;    /* its streamed blocks have host memory (on disk: want_partial) */
} candidate;

/* Uses per cycle of the schedule: runs (each a load where the component is
 * evicted between them) and calls. */
static void uses_of(const mlo_pipeline *pipe, const mlo_component *c, uint64_t *runs,
                    uint64_t *calls) {
  *runs = *calls = 0;
  for (size_t i = 0; i < pipe->nsched; i++)
    if (pipe->sched[i].comp == c) {
      ++*runs;
      *calls += pipe->sched[i].repeat;
    }
}

static int role_rank(mlo_role r) {
  return r == MLO_ROLE_DIT ? 0 : r == MLO_ROLE_VAE ? 1 : r == MLO_ROLE_ENCODER ? 3 : 2;
}

/* The component kept in host memory first: loaded more often per prompt,
 * then called more, then by role (a DiT before a VAE before an encoder). */
static int keep_first(const void *pa, const void *pb) {
  const candidate *a = pa, *b = pb;
  if (a->runs != b->runs) return a->runs > b->runs ? -1 : 1;
  if (a->calls != b->calls) return a->calls > b->calls ? -1 : 1;
  int ra = role_rank(a->c->role), rb = role_rank(b->c->role);
  if (ra != rb) return ra - rb;
  return a->c->index < b->c->index ? -1 : a->c->index > b->c->index;
}

static void log_plan(const mlo_pipeline *pipe, uint64_t budget, uint64_t kept) {
  if (!mlo_log_enabled(MLO_LOG_INFO)) return;
  char a[32], b[32], line[400];
  size_t at = 0;
  line[0] = 0;
  for (size_t i = 0; i < pipe->ncomps && at + 1 < sizeof line; i++) {
    const mlo_component *c = pipe->comps[i];
    if (!c->want_disk) continue;
    int n = snprintf(line + at, sizeof line - at, "%s%s%s", at ? ", " : "", c->name,
                     c->want_partial ? " (the blocks it streams in host memory)" : "");
    if (n > 0) at += (size_t)n;
  }
  mlo_logf(MLO_LOG_INFO, "host budget %s: %s of slabs in host memory; on disk: %s",
           mlo_format_size(budget, a, sizeof a), mlo_format_size(kept, b, sizeof b),
           at ? line : "nothing");
}

/* MLO_DISK_BW (bytes per second): the reader paces its reads to that rate,
 * a slower disk's stand-in for benchmarks and the projection's validation,
 * as the host platform's bw= is a slower link's; 0 or unset: as fast as the
 * disk reads. */
static int paced_rate(double *rate, char *why, size_t whylen) {
  const char *env = getenv("MLO_DISK_BW");
  uint64_t v = 0;
  *rate = 0;
  if (!env || !*env) return MLO_OK;
  if (mlo_parse_size(env, true, &v) != MLO_OK) {
    snprintf(why, whylen,
             "MLO_DISK_BW='%.40s' is not a rate: bytes per second (1e8, 500M, 2G), or 0 for the "
             "disk's own",
             env);
    return MLO_EINVAL;
  }
  *rate = (double)v;
  return MLO_OK;
}

int mlo_disk_plan(mlo_pipeline *pipe, const mlo_offload_settings *s, const uint64_t *rooms) {
  uint64_t budget = s->host_budget_bytes;
  for (size_t i = 0; i < pipe->ncomps; i++)
    pipe->comps[i]->want_disk = pipe->comps[i]->want_partial = false;
  if (!budget) return MLO_OK;
  double pace;
  char bad[160]; /* a pacing that cannot be read: refused before anything changes */
  if (paced_rate(&pace, bad, sizeof bad)) return mlo_fail(pipe, MLO_EINVAL, "%s", bad);
  if (s->copy_back)
    return mlo_fail(pipe, MLO_EINVAL,
                    "host_budget_bytes with copy_back: every tensor is written back to host "
                    "memory, so none may live on disk");
  /* ranks: the budget is the node's (its slabs are shared); a component on
   * disk is read by each rank in its slice and the node's ranks gather the
   * rest (shard.c), replicated loads too (no node-shared copy of it exists
   * to load whole from), so the node reads it once. */
  if (pipe->comm && !pipe->shard_resident && !pipe->platform->caps.host_addressable)
    return mlo_fail(pipe, MLO_EUNSUPPORTED,
                    "host_budget_bytes with ranks on this device: the all-gathers of the "
                    "components on disk would be issued from the reader and the caller in no "
                    "agreed order (NCCL); built for the host platform and for sharded "
                    "residency so far");
  candidate *cand = mlo_calloc(pipe->ncomps ? pipe->ncomps : 1, sizeof *cand);
  if (!cand) return mlo_fail(pipe, MLO_ENOMEM, "out of host memory");
  size_t n = 0;
  uint64_t must = 0;
  char who[300] = "";
  size_t at = 0;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    mlo_layout lay;
    uint64_t streamed;
    const char *why = host_rule(c, rooms[c->dev->index], &lay, &streamed);
    if (!lay.slab_bytes) continue; /* nothing to keep anywhere */
    /* one that streams reads its streamed blocks at every forward: from
     * host memory where they fit (want_partial), else from its files */
    bool streams = !why && lay.block_bytes > rooms[c->dev->index];
    if (streams && streamed == UINT64_MAX)
      why = "it cannot stream in the device budget", streams = false, streamed = 0;
    if (why) {
      must += lay.slab_bytes;
      if (at + 1 < sizeof who) {
        char sz[32];
        int k = snprintf(who + at, sizeof who - at, "%s'%s' (%s: %s)", at ? ", " : "", c->name,
                         mlo_format_size(lay.slab_bytes, sz, sizeof sz), why);
        if (k > 0) at += (size_t)k;
      }
      continue;
    }
    cand[n].c = c;
    cand[n].streams = streams;
    cand[n].streamed = streamed;
    cand[n].bytes = lay.slab_bytes - streamed;
    uses_of(pipe, c, &cand[n].runs, &cand[n].calls);
    n++;
  }
  char a[32], b[32];
  if (must > budget) {
    free(cand);
    return mlo_fail(pipe, MLO_ENOMEM,
                    "host budget %s is below the %s that must stay in host memory: %s",
                    mlo_format_size(budget, a, sizeof a), mlo_format_size(must, b, sizeof b),
                    at ? who : "resident components loaded from host slabs");
  }
  qsort(cand, n, sizeof *cand, keep_first);
  uint64_t left = budget - must;
  /* the blocks streamed at every forward first, in the same order (the
   * bytes read most often); what does not fit reads them from disk */
  for (size_t i = 0; i < n; i++) {
    cand[i].kept = cand[i].streamed <= left;
    if (cand[i].kept) left -= cand[i].streamed;
  }
  for (size_t i = 0; i < n; i++) {
    if (cand[i].kept && cand[i].bytes <= left) {
      left -= cand[i].bytes;
    } else {
      cand[i].c->want_disk = true;
      cand[i].c->want_partial = cand[i].streams && cand[i].kept;
    }
  }
  free(cand);
  log_plan(pipe, budget, budget - left);
  return MLO_OK;
}

void mlo_disk_change_tier(mlo_component *c) {
  if (!c->materialized || mlo_res_is_resident(c) ||
      (c->on_disk == c->want_disk && c->partial == c->want_partial))
    return;
  /* nothing queued may still read or write the host memory freed here: a
   * load never waited for, a streamed block's refill, a write-back */
  mlo_res_finish_writeback(c);
  if (c->slab) {
    c->stats.platform_calls++;
    mlo_plat_synchronize(mlo_dev_plat(c));
  }
  mlo_stream_drop(c); /* planned on the layout it gives up */
  mlo_slab_free(c);
  c->disk_rc = MLO_OK;
}

/* ---- a component on disk that streams ------------------------------------ */

/* Page-locks the filled blocks, each run of adjacent ones once (its pages
 * rounded out: runs are apart by a kept block, larger than a page).  A run
 * that cannot be registered stays pageable (copied below link speed). */
static void pin_runs(mlo_component *c) {
  mlo_disk_unpin_runs(c);
  mlo_platform *p = c->pipe->platform;
  if (!p->caps.host_register || !c->pipe->pin_host || mlo_env_flag("MLO_NO_PINNED")) return;
  if (!(c->pinned_runs = mlo_calloc(c->nblocks ? c->nblocks : 1, sizeof *c->pinned_runs))) return;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), lo = 0, hi = 0;
  bool open_run = false;
  /* runs of filled blocks, their pages rounded out; runs whose pages meet
   * (a kept block under a page between them) are one: registrations must
   * not overlap */
  for (size_t b = 0; b <= c->nblocks; b++) {
    bool in = b < c->nblocks && c->filled[b];
    uint64_t a = in ? c->spans[b].off / page * page : 0;
    if (open_run && (!in || a > hi)) {
      char *at = (char *)c->slab + lo;
      c->stats.platform_calls++;
      if (mlo_plat_host_register(p, at, (size_t)(hi - lo), true) == MLO_OK)
        c->pinned_runs[c->npinned_runs++] = at;
      open_run = false;
    }
    if (!in) continue;
    if (!open_run) lo = a;
    hi = (c->spans[b].off + c->spans[b].bytes + page - 1) / page * page;
    open_run = true;
  }
}

/* Gives back the blocks a new plan no longer streams: their pages (whole
 * ones inside the block), their host pointers, their bytes to disk_bytes. */
static void trim_unstreamed(mlo_component *c) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), back = 0;
  for (size_t b = 0; b < c->nblocks; b++) {
    if (!c->filled[b] || mlo_stream_block_streams(c, b)) continue;
    c->filled[b] = false;
    back += c->spans[b].bytes;
    uint64_t lo = (c->spans[b].off + page - 1) / page * page;
    uint64_t hi = (c->spans[b].off + c->spans[b].bytes) / page * page;
    if (hi > lo && !c->pipe->platform->caps.simulated)
      madvise((char *)c->slab + lo, (size_t)(hi - lo), MADV_DONTNEED);
    for (size_t i = 0; i < c->ntensors; i++)
      if (c->tensors[i]->block == (int)b && !c->tensors[i]->target) c->tensors[i]->host = NULL;
  }
  c->pipe->host_slab_bytes -= back;
  c->pipe->disk_bytes += back;
}

int mlo_disk_fill_streamed(mlo_component *c) {
  if (!c->partial || !c->stream) return MLO_OK;
  mlo_pipeline *pipe = c->pipe;
  mlo_disk_unpin_runs(c); /* nothing is resident: no copy reads the slab now */
  trim_unstreamed(c);
  mlo_tensor **list = mlo_malloc((c->ntensors ? c->ntensors : 1) * sizeof *list);
  if (!list) return mlo_fail(pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
  size_t n = 0;
  uint64_t bytes = 0, blocks = 0;
  for (size_t i = 0; i < c->ntensors; i++) {
    mlo_tensor *t = c->tensors[i];
    if (t->target || !t->nbytes || t->block < 0 || c->filled[t->block]) continue;
    if (!mlo_stream_streams(c, t)) continue;
    list[n++] = t;
    bytes += t->nbytes;
  }
  /* on the simulated device there is nothing to read: its slab is
   * address space, a projection's blocks are their sizes */
  int rc = n && !pipe->platform->caps.simulated
               ? mlo_load_files(c, list, n, bytes, false, NULL, NULL)
               : MLO_OK;
  if (rc) {
    free(list);
    return rc;
  }
  for (size_t i = 0; i < n; i++) list[i]->host = (char *)c->slab + list[i]->dev_offset;
  for (size_t b = 0; b < c->nblocks; b++)
    if (!c->filled[b] && mlo_stream_block_streams(c, b)) {
      c->filled[b] = true;
      blocks += c->spans[b].bytes;
    }
  pipe->host_slab_bytes += blocks;
  pipe->disk_bytes -= blocks;
  free(list);
  pin_runs(c);
  return MLO_OK;
}

/* ---- the reader --------------------------------------------------------- */

typedef struct {
  mlo_component *c;
  uint64_t lo, hi, at; /* the slab bytes read, and where lo goes in the block */
  mlo_event *ev;       /* recorded after the last copy: the load's, or a slot's */
  bool block;          /* a streamed block into its slot (placed by lo and at alone) */
  uint64_t calls, copies, read;
  char *err;
  size_t errlen;
} job;

typedef struct {
  const mlo_tensor *t;
  uint64_t toff, boff, len; /* bytes [toff, toff+len) of t at boff in the buffer */
} piece;

static int plat(job *j, int rc) {
  j->calls++;
  return rc;
}

/* The ring's buffers, each freed once the copies out of it are done; the
 * pinned bytes freed.  Lock NOT held (a partial ring too). */
static uint64_t free_ring(mlo_pipeline *pipe, struct mlo_disk *d) {
  uint64_t pinned = 0;
  for (int i = 0; i < DISK_SLOTS; i++) {
    struct disk_slot *s = &d->slots[i];
    if (s->used) mlo_plat_event_sync(s->ev_plat, s->ev);
    if (s->ev) mlo_plat_event_destroy(s->ev_plat, s->ev);
    if (s->buf) mlo_plat_host_free(pipe->platform, s->buf, (size_t)d->chunk, s->pinned);
    if (s->buf && s->pinned) pinned += d->chunk;
    *s = (struct disk_slot){0};
  }
  d->chunk = 0;
  return pinned;
}

/* A ring whose buffers are chunk bytes (page-rounded): *pinned gets the
 * bytes pinned.  On failure nothing is left allocated.  Lock NOT held. */
static int alloc_ring(mlo_pipeline *pipe, struct mlo_disk *d, uint64_t chunk, bool want_pin,
                      uint64_t *pinned, char *err, size_t errlen) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  d->chunk = (chunk + page - 1) / page * page;
  *pinned = 0;
  for (int i = 0; i < DISK_SLOTS; i++) {
    struct disk_slot *s = &d->slots[i];
    int rc = mlo_plat_host_alloc(pipe->platform, (size_t)d->chunk, want_pin, &s->buf, &s->pinned);
    if (rc) s->buf = NULL;
    if (!rc) rc = mlo_plat_event_create(pipe->platform, &s->ev);
    s->ev_plat = pipe->platform;
    if (rc) {
      snprintf(err, errlen, "allocating the disk tier's staging ring (%d x %llu bytes) failed (%s)",
               DISK_SLOTS, (unsigned long long)d->chunk, mlo_strerror(rc));
      free_ring(pipe, d);
      return rc;
    }
    if (s->pinned) *pinned += d->chunk;
  }
  return MLO_OK;
}

/* Waits until deadline (monotonic ns), or less once stopping is set: a
 * paced read must not hold up the pipeline's free (docs/disk.md). */
static void pace_until(uint64_t deadline, const bool *stopping) {
  for (;;) {
    uint64_t now = mlo_now_ns();
    if (now >= deadline || __atomic_load_n(stopping, __ATOMIC_ACQUIRE)) return;
    uint64_t step = deadline - now < 10000000u ? deadline - now : 10000000u; /* 10 ms */
    mlo_sleep_until_ns(now + step);
  }
}

/* The piece of a chunk that holds its byte boff (a gap's: the next one). */
static const mlo_tensor *tensor_at(const piece *pcs, size_t np, uint64_t boff) {
  for (size_t q = 0; q < np; q++)
    if (boff < pcs[q].boff + pcs[q].len) return pcs[q].t;
  return pcs[np - 1].t;
}

/* Reads len bytes at `at` into buf, whatever the short reads; a failure
 * names the tensor of the chunk's pieces it hit. */
static int read_range(int fd, char *buf, uint64_t len, uint64_t at, const piece *pcs, size_t np,
                      job *j) {
  uint64_t got = 0;
  while (got < len) {
    ssize_t r = mlo_pread(fd, buf + got, (size_t)(len - got), at + got);
    const mlo_tensor *t = r <= 0 ? tensor_at(pcs, np, got) : NULL;
    if (r < 0) {
      snprintf(j->err, j->errlen, "%s: reading tensor '%s' from '%s': %s", j->c->name, t->name,
               t->src_file, strerror(errno));
      return MLO_EIO;
    }
    if (r == 0) {
      snprintf(j->err, j->errlen,
               "%s: tensor '%s': '%s' ended early (it shrank since it was opened)", j->c->name,
               t->name, t->src_file);
      return MLO_EFORMAT;
    }
    got += (uint64_t)r;
  }
  /* the bytes read are the file's as declared only if it is unchanged now */
  const mlo_tensor *t = pcs[0].t;
  char why[384];
  if (mlo_fd_id_recheck(fd, t->src_file, &t->src_id, why, sizeof why)) {
    snprintf(j->err, j->errlen, "%s: tensor '%s': %s", j->c->name, t->name, why);
    return MLO_EIO;
  }
  j->read += len;
  if (!j->block) /* a whole load's progress, read by mlo_component_disk_progress */
    __atomic_store_n(&j->c->disk_done, j->read, __ATOMIC_RELAXED);
  return MLO_OK;
}

/* What one load reads: every file-backed tensor, or, streaming, those of
 * the pieces it keeps resident (the slots fill from the slab); of a
 * sharded load, the bytes in this rank's slice [lo, hi) of the slab, each
 * tensor from byte from[f] to to[f] of it. */
typedef struct {
  mlo_tensor **files;
  int *fds;
  uint64_t *from, *to;
  size_t n;
} reads;

static void reads_free(reads *r) {
  free(r->files);
  free(r->fds);
  free(r->from);
  free(r->to);
}

static int reads_of(const job *j, reads *r) {
  mlo_component *c = j->c;
  size_t cap = c->ndisk_files ? c->ndisk_files : 1;
  *r = (reads){mlo_malloc(cap * sizeof *r->files), mlo_malloc(cap * sizeof *r->fds),
               mlo_malloc(cap * sizeof *r->from), mlo_malloc(cap * sizeof *r->to), 0};
  if (!r->files || !r->fds || !r->from || !r->to) {
    reads_free(r);
    snprintf(j->err, j->errlen, "%s: out of host memory", c->name);
    return MLO_ENOMEM;
  }
  for (size_t f = 0; f < c->ndisk_files; f++) {
    mlo_tensor *t = c->disk_files[f];
    uint64_t a = t->dev_offset > j->lo ? t->dev_offset : j->lo;
    uint64_t b = t->dev_offset + t->nbytes < j->hi ? t->dev_offset + t->nbytes : j->hi;
    if ((!j->block && c->stream && mlo_stream_streams(c, t)) || a >= b) continue;
    r->from[r->n] = a - t->dev_offset;
    r->to[r->n] = b - t->dev_offset;
    r->files[r->n++] = t;
  }
  return MLO_OK;
}

/* Slot s's event made again on device p (a pipeline of several devices:
 * the copies out of it now go to another one's queue); its copies are done. */
static int slot_to(job *j, struct disk_slot *s, mlo_platform *p) {
  mlo_event *ev = NULL;
  int rc = plat(j, mlo_plat_event_create(p, &ev));
  if (rc) {
    snprintf(j->err, j->errlen, "%s: creating a staging buffer's event failed (%s)", j->c->name,
             mlo_strerror(rc));
    return rc;
  }
  mlo_plat_event_destroy(s->ev_plat, s->ev);
  s->ev = ev;
  s->ev_plat = p;
  return MLO_OK;
}

/* Queues the copies of a chunk's np pieces out of buffer s into c->block,
 * then s's event.  The buffer's event follows every copy queued out of
 * it, a failed chunk's first pieces too: the next chunk read into it waits
 * for them (review D14).  A record that fails leaves nothing to wait on
 * but the device itself. */
static int queue_chunk(job *j, struct disk_slot *s, const piece *pcs, size_t np) {
  mlo_component *c = j->c;
  mlo_platform *p = mlo_dev_plat(c);
  size_t queued = 0;
  int rc = MLO_OK;
  for (size_t q = 0; q < np && !rc; q++) {
    uint64_t at = pcs[q].t->dev_offset; /* streaming: where the plan keeps its piece */
    if (c->stream && !j->block) mlo_stream_tensor_offset(c, pcs[q].t, &at);
    at = at - j->lo + j->at; /* a slice: where it goes in this rank's block */
    rc = plat(j, mlo_plat_copy_h2d(p, c->block, (size_t)(at + pcs[q].toff),
                                   (char *)s->buf + pcs[q].boff, (size_t)pcs[q].len));
    j->copies++;
    if (!rc) queued++;
  }
  if (queued) {
    int rr = plat(j, mlo_plat_event_record_copy(p, s->ev));
    if (!rr)
      s->used = true;
    else
      mlo_plat_synchronize(p);
    if (!rc) rc = rr;
  }
  return rc;
}

/* Reads c's files chunk by chunk into the ring and queues each chunk's
 * copies into c->block; the load's event after the last.  Lock NOT held:
 * c's files, layout and block do not change while it is disk_busy. */
static int read_component(struct mlo_disk *d, job *j, piece *pcs, const bool *stopping) {
  mlo_component *c = j->c;
  mlo_platform *p = mlo_dev_plat(c);
  reads r;
  int rc = reads_of(j, &r);
  if (rc) return rc;
  rc = mlo_open_checked(c, r.files, r.n, r.fds, false, j->err, j->errlen);
  bool drop = !mlo_env_flag("MLO_KEEP_PAGE_CACHE");
  double pace = 0;
  if (!rc) rc = paced_rate(&pace, j->err, j->errlen);
  uint64_t t0 = mlo_now_ns(), paced = 0;
  size_t i = 0, k = 0;
  uint64_t toff = r.n ? r.from[0] : 0;
  while (!rc && i < r.n) {
    if (__atomic_load_n(stopping, __ATOMIC_ACQUIRE)) {
      snprintf(j->err, j->errlen, "%s: the load from disk was stopped (the pipeline is freed)",
               c->name);
      rc = MLO_ESTATE;
      break;
    }
    struct disk_slot *s = &d->slots[k++ % DISK_SLOTS];
    if (s->used && (rc = plat(j, mlo_plat_event_sync(s->ev_plat, s->ev)))) {
      snprintf(j->err, j->errlen, "%s: waiting for a staging buffer's copy failed (%s)", c->name,
               mlo_strerror(rc));
      break;
    }
    s->used = false; /* its copies are done: used again only once new ones are queued */
    if (s->ev_plat != p && (rc = slot_to(j, s, p))) break;
    /* the chunk: a run of tensors adjacent in one file (gaps under DISK_GAP
     * read through), at most one buffer */
    int fd = r.fds[i];
    uint64_t start = r.files[i]->src_offset + toff, fill = 0;
    size_t np = 0;
    while (i < r.n && r.fds[i] == fd && fill < d->chunk) {
      const mlo_tensor *t = r.files[i];
      uint64_t here = t->src_offset + toff;
      if (here < start + fill || here - (start + fill) > DISK_GAP || here - start >= d->chunk)
        break;
      uint64_t boff = here - start, take = r.to[i] - toff;
      if (take > d->chunk - boff) take = d->chunk - boff;
      pcs[np++] = (piece){t, toff, boff, take};
      fill = boff + take;
      toff += take;
      if (toff == r.to[i] && ++i < r.n) toff = r.from[i];
    }
    rc = read_range(fd, s->buf, fill, start, pcs, np, j);
    if (!rc && drop) mlo_drop_pages(fd, start, fill);
    if (!rc && pace > 0) { /* a slower disk's stand-in: this chunk ends no sooner than it would */
      paced += fill;
      pace_until(t0 + (uint64_t)((double)paced * 1e9 / pace), stopping);
    }
    if (!rc) rc = queue_chunk(j, s, pcs, np);
    if (rc && !j->err[0])
      snprintf(j->err, j->errlen, "%s: copying to the device failed (%s)", c->name,
               mlo_strerror(rc));
  }
  if (!rc && (rc = plat(j, mlo_plat_event_record_copy(p, j->ev))))
    snprintf(j->err, j->errlen, "%s: recording the load's event failed (%s)", c->name,
             mlo_strerror(rc));
  mlo_close_files(r.n, r.fds, drop && !rc);
  reads_free(&r);
  return rc;
}

/* Takes c's streamed blocks still queued off the queue, each said failed
 * (the load they belong to is undone: nothing may copy into its block). */
static void purge_blocks(struct mlo_disk *d, mlo_component *c) {
  struct disk_block **at = &d->bhead, *last = NULL;
  while (*at) {
    struct disk_block *bj = *at;
    if (bj->c != c) {
      last = bj;
      at = &bj->next;
      continue;
    }
    *at = bj->next;
    snprintf(bj->err, bj->errlen, "%s: the load its block belonged to failed", c->name);
    *bj->rc = MLO_ESTATE;
    *bj->busy = false;
    c->disk_reads--;
    free(bj);
  }
  d->btail = last;
}

/* A job's end, lock held: the counts, and on failure the load undone (the
 * block freed stream-ordered after the copies already queued). */
static void finish(struct mlo_disk *d, job *j, int rc) {
  mlo_component *c = j->c;
  mlo_pipeline *pipe = c->pipe;
  c->stats.platform_calls += j->calls;
  c->stats.copy_calls += j->copies;
  c->stats.disk_read_bytes += j->read;
  c->disk_rc = rc;
  c->disk_busy = false;
  if (rc && mlo_res_is_resident(c)) {
    mlo_logf(MLO_LOG_DEBUG, "load of %s from disk failed: %s", c->name, c->disk_err);
    purge_blocks(d, c);
    /* a sharded load stays loading, failed: the other ranks will wait at its
     * gather, so its wait tells them there (a rank that dropped it here
     * would load it again, out of step with them); any other is undone now,
     * the trace closing the load it began */
    c->disk_tell = c->gather_slice != 0;
    if (!c->disk_tell) c->disk_undo(c); /* (which traces the eviction) */
  }
  pthread_cond_broadcast(&pipe->idle);
}

/* A streamed block's end, lock held: the counts, and its slot told. */
static void finish_block(struct disk_block *bj, job *j, int rc) {
  mlo_component *c = j->c;
  c->stats.platform_calls += j->calls;
  c->stats.copy_calls += j->copies;
  c->stats.disk_read_bytes += j->read;
  if (!rc) c->stats.h2d_bytes += j->read; /* each byte read crosses the link once */
  *bj->rc = rc;
  *bj->busy = false;
  c->disk_reads--;
  free(bj);
  pthread_cond_broadcast(&c->pipe->idle);
}

static uint64_t largest_on_disk(const mlo_pipeline *pipe) {
  uint64_t m = 0;
  for (size_t i = 0; i < pipe->ncomps; i++)
    if (pipe->comps[i]->on_disk && pipe->comps[i]->slab_bytes > m) m = pipe->comps[i]->slab_bytes;
  return m;
}

/* The next job, lock held: a streamed block first (the forward running
 * now waits for it), else a component's load; *c NULL: none. */
static struct disk_block *next_job(struct mlo_disk *d, mlo_component **c) {
  struct disk_block *bj = d->bhead;
  if (bj) {
    d->bhead = bj->next;
    if (!d->bhead) d->btail = NULL;
    *c = bj->c;
    return bj;
  }
  *c = d->head;
  if (*c) {
    d->head = (*c)->disk_next;
    if (!d->head) d->tail = NULL;
    (*c)->disk_next = NULL;
  }
  return NULL;
}

static void *reader(void *arg) {
  mlo_pipeline *pipe = arg;
  struct mlo_disk *d = pipe->disk;
  piece *pcs = NULL;
  size_t pcap = 0;
  pthread_mutex_lock(&pipe->lock);
  for (;;) {
    while (!d->head && !d->bhead && !d->stopping) pthread_cond_wait(&d->work, &pipe->lock);
    mlo_component *c;
    struct disk_block *bj = next_job(d, &c);
    if (!c) break; /* stopping, and nothing queued */
    /* buffers as large as the largest slab on disk, up to DISK_CHUNK: a
     * ring made for smaller slabs is made again */
    uint64_t chunk = largest_on_disk(pipe);
    if (chunk > DISK_CHUNK) chunk = DISK_CHUNK;
    bool regrow = d->chunk < chunk, want_pin = d->want_pin;
    size_t want = c->ndisk_files + 1;
    pthread_mutex_unlock(&pipe->lock);
    job j = bj ? (job){.c = c,
                       .lo = bj->lo,
                       .hi = bj->hi,
                       .at = bj->at,
                       .ev = bj->ev,
                       .block = true,
                       .err = bj->err,
                       .errlen = bj->errlen}
               : (job){.c = c,
                       .lo = c->disk_lo,
                       .hi = c->disk_hi,
                       .at = c->disk_at,
                       .ev = c->load_ev,
                       .err = c->disk_err,
                       .errlen = sizeof c->disk_err};
    j.err[0] = 0;
    int rc = MLO_OK;
    if (regrow) {
      uint64_t freed = free_ring(pipe, d), pinned = 0;
      rc = alloc_ring(pipe, d, chunk, want_pin, &pinned, j.err, j.errlen);
      pthread_mutex_lock(&pipe->lock);
      pipe->pinned_bytes = pipe->pinned_bytes - freed + pinned;
      d->bytes = d->chunk * DISK_SLOTS;
      pthread_mutex_unlock(&pipe->lock);
    }
    if (!rc && want > pcap) { /* a chunk holds at most every tensor of the component */
      piece *grown = realloc(pcs, want * sizeof *pcs);
      if (!grown) {
        snprintf(j.err, j.errlen, "%s: out of host memory", c->name);
        rc = MLO_ENOMEM;
      } else {
        pcs = grown;
        pcap = want;
      }
    }
    if (!rc) rc = read_component(d, &j, pcs, &d->stopping);
    pthread_mutex_lock(&pipe->lock);
    if (bj)
      finish_block(bj, &j, rc);
    else
      finish(d, &j, rc);
  }
  pthread_mutex_unlock(&pipe->lock);
  free(pcs);
  return NULL;
}

/* A load from the simulated device's disk (mlo plan): chunk by chunk, a
 * modelled read, then its copy, all issued now on the virtual clock, so a
 * projection is exact and the same every time; no reader thread. */
/* What the reader reads of c's slab bytes [lo, hi): its own tensors'
 * bytes there, not the slab's padding between them; those of a streamed
 * plan's streamed blocks only for a block's own read (`block`). */
static uint64_t file_bytes(const mlo_component *c, uint64_t lo, uint64_t hi, bool block) {
  uint64_t file = 0;
  for (size_t i = 0; i < c->ntensors; i++) {
    const mlo_tensor *t = c->tensors[i];
    if (t->target || (t->flags & MLO_TENSOR_EXTERNAL) ||
        (!block && c->stream && mlo_stream_streams(c, t)))
      continue;
    uint64_t a = t->dev_offset > lo ? t->dev_offset : lo;
    uint64_t b = t->dev_offset + t->nbytes < hi ? t->dev_offset + t->nbytes : hi;
    file += b > a ? b - a : 0;
  }
  return file;
}

static int sim_load(mlo_component *c, uint64_t lo, uint64_t hi) {
  mlo_platform *p = mlo_dev_plat(c);
  int rc = MLO_OK;
  c->stats.disk_loads++;
  if (hi > c->slab_bytes) hi = c->slab_bytes; /* a slice's, or the whole */
  uint64_t total = c->stream ? mlo_stream_resident_bytes(c) : hi > lo ? hi - lo : 0;
  uint64_t file = file_bytes(c, lo, hi, false), done = 0;
  for (uint64_t off = 0; off < total && !rc; off += DISK_CHUNK) {
    uint64_t len = total - off < DISK_CHUNK ? total - off : DISK_CHUNK;
    uint64_t rd = off + len >= total ? file - done : (uint64_t)((double)file * len / total);
    c->stats.platform_calls += 2;
    rc = mlo_sim_disk_read(p, rd);
    if (!rc) rc = mlo_plat_copy_h2d(p, c->block, (size_t)off, NULL, (size_t)len);
    if (!rc) c->stats.disk_read_bytes += rd;
    done += rd;
  }
  c->stats.platform_calls++;
  if (!rc) rc = mlo_plat_event_record_copy(p, c->load_ev);
  if (rc) return mlo_fail(c->pipe, rc, "%s: the simulated load from disk failed", c->name);
  return MLO_OK;
}

/* The pipeline's reader, started on first use; lock held. */
static int reader_of(mlo_component *c, struct mlo_disk **out) {
  mlo_pipeline *pipe = c->pipe;
  struct mlo_disk *d = pipe->disk;
  if (!d) {
    if (!(d = mlo_calloc(1, sizeof *d)))
      return mlo_fail(pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
    pthread_cond_init(&d->work, NULL);
    pipe->disk = d;
  }
  d->want_pin = pipe->pin_host && !mlo_env_flag("MLO_NO_PINNED");
  if (!d->started) {
    if (pthread_create(&d->thread, NULL, reader, pipe) != 0)
      return mlo_fail(pipe, MLO_ENOMEM, "%s: cannot start the disk tier's reader thread", c->name);
    d->started = true;
  }
  *out = d;
  return MLO_OK;
}

int mlo_component_disk_progress(mlo_component *c, uint64_t *done, uint64_t *total) {
  if (!c || !done || !total) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  bool busy = c->disk_busy;
  uint64_t all = busy ? c->disk_total : 0;
  uint64_t read = busy ? __atomic_load_n(&c->disk_done, __ATOMIC_RELAXED) : 0;
  pthread_mutex_unlock(&c->pipe->lock);
  *done = read < all ? read : all; /* gaps read through count once */
  *total = all;
  return MLO_OK;
}

int mlo_disk_start(mlo_component *c, uint64_t lo, uint64_t hi, uint64_t at,
                   void (*undo)(mlo_component *c)) {
  mlo_pipeline *pipe = c->pipe;
  if (pipe->platform->caps.simulated) return sim_load(c, lo, hi);
  struct mlo_disk *d;
  int rc = reader_of(c, &d);
  if (rc) return rc;
  c->disk_busy = true;
  c->disk_rc = MLO_OK;
  c->disk_lo = lo;
  c->disk_hi = hi;
  c->disk_at = at;
  __atomic_store_n(&c->disk_done, 0, __ATOMIC_RELAXED);
  c->disk_total = file_bytes(c, lo, hi, false);
  c->disk_undo = undo;
  c->stats.disk_loads++; /* counted when issued, as loads are */
  c->disk_next = NULL;
  if (d->tail)
    d->tail->disk_next = c;
  else
    d->head = c;
  d->tail = c;
  pthread_cond_signal(&d->work);
  return MLO_OK;
}

/* The simulated device's disk (mlo plan): the block's read, then its copy,
 * issued now on the virtual clock, as sim_load does. */
static int sim_block(mlo_component *c, size_t b, uint64_t at, mlo_event *ev) {
  mlo_platform *p = mlo_dev_plat(c);
  const struct mlo_span *sp = &c->spans[b]; /* its tensors, read and copied */
  uint64_t len = file_bytes(c, sp->off, sp->off + sp->bytes, true);
  c->stats.platform_calls += 3;
  int rc = mlo_sim_disk_read(p, len);
  if (!rc) rc = mlo_plat_copy_h2d(p, c->block, (size_t)at, NULL, (size_t)len);
  if (!rc) rc = mlo_plat_event_record_copy(p, ev);
  if (rc) return mlo_fail(c->pipe, rc, "%s: the simulated read of a block failed", c->name);
  c->stats.disk_read_bytes += len;
  c->stats.h2d_bytes += len;
  c->stats.copy_calls++;
  return MLO_OK;
}

int mlo_disk_read_block(mlo_component *c, size_t b, uint64_t at, mlo_event *ev, bool *busy, int *rc,
                        char *err, size_t errlen) {
  mlo_pipeline *pipe = c->pipe;
  const struct mlo_span *sp = &c->spans[b];
  *rc = MLO_OK;
  if (pipe->platform->caps.simulated) return sim_block(c, b, at, ev);
  struct mlo_disk *d;
  int e = reader_of(c, &d);
  if (e) return e;
  struct disk_block *bj = mlo_calloc(1, sizeof *bj);
  if (!bj) return mlo_fail(pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
  *bj = (struct disk_block){c, sp->off, sp->off + sp->bytes, at, ev, busy, rc, err, errlen, NULL};
  *busy = true;
  c->disk_reads++;
  if (d->btail)
    d->btail->next = bj;
  else
    d->bhead = bj;
  d->btail = bj;
  pthread_cond_signal(&d->work);
  return MLO_OK;
}

void mlo_disk_settle(mlo_component *c) {
  while (c->disk_busy || c->disk_reads) pthread_cond_wait(&c->pipe->idle, &c->pipe->lock);
}

int mlo_disk_wait(mlo_component *c) {
  while (c->disk_busy) pthread_cond_wait(&c->pipe->idle, &c->pipe->lock);
  if (c->disk_rc) return mlo_fail(c->pipe, c->disk_rc, "%s", c->disk_err); /* this load's */
  return MLO_OK;
}

void mlo_disk_stop(mlo_pipeline *pipe) {
  pthread_mutex_lock(&pipe->lock);
  struct mlo_disk *d = pipe->disk;
  if (!d) {
    pthread_mutex_unlock(&pipe->lock);
    return;
  }
  __atomic_store_n(&d->stopping, true, __ATOMIC_RELEASE);
  pthread_cond_signal(&d->work);
  bool started = d->started;
  pthread_mutex_unlock(&pipe->lock);
  if (started) pthread_join(d->thread, NULL);
  pthread_mutex_lock(&pipe->lock);
  pipe->pinned_bytes -= free_ring(pipe, d); /* each after the copies out of it */
  pthread_cond_destroy(&d->work);
  pipe->disk = NULL;
  free(d);
  pthread_mutex_unlock(&pipe->lock);
}

uint64_t mlo_disk_staging_bytes(const mlo_pipeline *pipe) {
  return pipe->disk ? pipe->disk->bytes : 0;
}
