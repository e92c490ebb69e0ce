/*
 * core_join.c — the joined switch (src/core/join.c, docs/streaming.md):
 * under the budget policy with prefetch and a schedule, the next
 * component's copies go, during the current one's last forward, into the
 * memory its ended blocks free.
 *
 * Two DiTs of the same shape, each an 8 KiB prologue, four 16 KiB blocks
 * and an 8 KiB epilogue (80 KiB), under a budget of 80 KiB: one at a time.
 * By hand, B laid into A's block in the order its load needs it (head:
 * prologue and epilogue; then the blocks) as a ring from A's first block,
 * the wrap at the latest tensor that leaves A's prologue alone (KiB):
 *
 *   A:  [0,8) P   [8,24) b0   [24,40) b1   [40,56) b2   [56,72) b3   [72,80) E
 *   B:  P [16,24) over A's b0       -> copied at A's end of block 0
 *       E [24,32) over b1           -> block 1 (B's head is in)
 *       b0 [32,48) over b1, b2      -> block 2;   b1 [48,64) over b2, b3 -> 3
 *       b2 [64,80) over b3 and A's E, b3 [0,16) over A's P -> at A's release
 *
 *  - on the simulated device, whose clock is virtual, B's acquire waits for
 *    nothing and its forward for the last 48 KiB only (b1, copied at A's
 *    last end just before its release, then b2 and b3), against all 80 KiB
 *    unjoined; the tensors are where the ring puts them; a block of A
 *    ended in that call cannot be begun again nor its tensors addressed;
 *    bytes and accounting are a load's;
 *  - on the host platform with a jittered, throttled copy queue: every
 *    block's bytes right after its begin, prompt after prompt, joining
 *    both ways; a schedule not kept (A called again) reloads A right; the
 *    acquires that cannot be served while the join runs are refused;
 *  - every platform call of a joined prompt failed in turn: a status, a
 *    clean audit, and the next prompts right.
 */
#include "testutil.h"
#include "platform/fault.h"
#include "platform/platform.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KB (1024u)
#define NBLK 4
#define TOTAL (80 * KB)
#define LINK 1000000000ull /* the simulated link, bytes per second */
#define COPY_NS(bytes) tu_copy_ns(bytes, LINK)

typedef struct {
  mlo_platform *plat;
  tu_pipe *tp;
  mlo_component *c[2]; /* A (transformer), B (transformer_2) */
  mlo_tensor *pro[2], *blk[2][NBLK], *epi[2];
  uint64_t compute_ns; /* per block, on the simulated device */
  bool sim;
  int poke;        /* in A's forward after block 1: what else to try (below) */
  bool settle;     /* each block read after every copy issued so far has landed */
  bool undeclared; /* A not declared progressive (forward_again) */
  bool nested;     /* each block begun twice, its bytes read between its ends */
} rig;

static void add_dit(rig *r, int i, const char *name) {
  assert_ok(mlo_component_add(r->tp->pipe, name, MLO_ROLE_DIT, &r->c[i]));
  r->pro[i] = tu_add_tensor(r->tp, r->c[i], "patch_embedding.weight", 8 * KB, 0);
  char t[64];
  for (int b = 0; b < NBLK; b++) {
    snprintf(t, sizeof t, "blocks.%d.weight", b);
    r->blk[i][b] = tu_add_tensor(r->tp, r->c[i], t, 16 * KB, 0);
  }
  r->epi[i] = tu_add_tensor(r->tp, r->c[i], "proj_out.weight", 8 * KB, 0);
  assert_ok(mlo_component_set_progressive(r->c[i], 1));
}

static void rig_build_on(rig *r, mlo_platform *plat, bool sim) {
  memset(r, 0, sizeof *r);
  r->plat = plat;
  r->sim = sim;
  r->tp = tu_pipe_new(plat, !sim);
  add_dit(r, 0, "transformer");
  add_dit(r, 1, "transformer_2");
  mlo_schedule_entry s[] = {{r->c[0], 1}, {r->c[1], 1}};
  assert_ok(mlo_pipeline_set_schedule(r->tp->pipe, s, 2));
}

/* The budget policy on tp's pipeline, keeping to `budget` bytes. */
static int budget_on(tu_pipe *tp, uint64_t budget, bool prefetch) {
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = budget;
  s.prefetch = prefetch;
  return mlo_offload_enable(tp->pipe, &s);
}

static int enable(rig *r, bool prefetch) {
  return budget_on(r->tp, TOTAL, prefetch);
}

static void rig_free(rig *r) {
  tu_pipe_free(r->tp);
  mlo_platform_close(r->plat);
}

static uint64_t dev_off(const mlo_tensor *t) {
  size_t off = 0;
  assert_ok(mlo_tensor_device(t, NULL, &off));
  return off;
}

/* t's bytes on the device are its pattern (a failure noted for the test). */
static bool device_bytes_ok(tu_pipe *tp, const mlo_tensor *t) {
  size_t n = (size_t)mlo_tensor_nbytes(t);
  unsigned char *buf = malloc(n);
  int rc = tu_read_device(tp, t, buf, n);
  bool ok = rc == MLO_OK && tu_pattern_mismatch(buf, n, tu_rec(tp, t)->seed) == n;
  free(buf);
  if (!ok) tu_note_failure(tp, "%s: %s", mlo_tensor_name(t), rc ? mlo_err_name(rc) : "bytes");
  return ok;
}

static bool bytes_ok(rig *r, const mlo_tensor *t) {
  return r->sim || device_bytes_ok(r->tp, t); /* the simulated device stores no bytes */
}

static void *try_acquire_a(void *arg) {
  rig *r = arg;
  intptr_t rc = mlo_component_try_acquire(r->c[0]);
  if (!rc) mlo_component_release(r->c[0]);
  return (void *)rc;
}

/* What may not be done once B's copies go into A's ended blocks (after
 * A's block 1 ended, B's prologue and block 0 are queued over A's blocks
 * 0 and 1). */
static void poke(rig *r) {
  mlo_component *a = r->c[0], *b = r->c[1];
  assert_status(mlo_block_begin(a, 0), MLO_ESTATE); /* its memory may be B's */
  assert_status(mlo_block_begin(a, 1), MLO_ESTATE);
  assert_non_null(strstr(mlo_pipeline_errmsg(r->tp->pipe), "transformer_2"));
  size_t off;
  assert_status(mlo_tensor_device(r->blk[0][0], NULL, &off), MLO_ESTATE);
  assert_ok(mlo_tensor_device(r->blk[0][2], NULL, &off)); /* not ended yet */
  assert_ok(mlo_tensor_device(r->pro[0], NULL, &off));    /* A reads it until its release */
  assert_ok(mlo_tensor_device(r->epi[0], NULL, &off));
  void *whole = NULL;
  uint64_t at = 0, n = 0; /* the whole block: part of it may be B's already */
  assert_status(mlo_component_shard(a, &whole, &at, &n), MLO_ESTATE);
  /* A spent, B not in: this thread cannot wait for either */
  assert_status(mlo_component_acquire(a), MLO_EDEADLK);
  assert_status(mlo_component_acquire(b), MLO_EDEADLK);
  assert_status(mlo_component_try_acquire(b), MLO_EBUSY);
  pthread_t th;
  void *got = NULL;
  assert_int_equal(pthread_create(&th, NULL, try_acquire_a, r), 0);
  assert_int_equal(pthread_join(th, &got), 0);
  assert_int_equal((intptr_t)got, MLO_EBUSY);
  assert_false(mlo_component_is_resident(b));
  assert_ok(mlo_pipeline_audit(r->tp->pipe));
}

/* A forward as compute runs it: each block's bytes once begun.  Where
 * r->nested, each block is begun twice (nested begins are shared) and its
 * bytes are read again between its two ends: the first end must not let
 * the join copy over it (issue 44, F1). */
static int forward(mlo_component *c, void *user) {
  rig *r = user;
  int i = c == r->c[1];
  bool ok = bytes_ok(r, r->pro[i]);
  for (int b = 0; b < NBLK && ok; b++) {
    if (mlo_block_begin(c, (size_t)b)) return 1;
    if (r->nested && mlo_block_begin(c, (size_t)b)) return 1;     /* the release ends the first */
    if (r->settle && mlo_platform_synchronize(r->plat)) return 1; /* a copy too early shows */
    ok = bytes_ok(r, r->blk[i][b]);
    if (r->sim && r->compute_ns && mlo_sim_compute(r->plat, r->compute_ns)) return 1;
    if (r->nested) {
      if (mlo_block_end(c, (size_t)b)) return 1;
      if (mlo_platform_synchronize(r->plat)) return 1; /* what the join let go has landed */
      ok = ok && bytes_ok(r, r->blk[i][b]);
    }
    if (mlo_block_end(c, (size_t)b)) return 1;
    if (!i && b == 1 && r->poke) poke(r);
  }
  return ok && bytes_ok(r, r->epi[i]) ? 0 : 1;
}

static void test_by_hand(void **state) {
  (void)state;
  for (int joined = 1; joined >= 0; joined--) {
    rig r;
    rig_build_on(&r, tu_open_spec("sim:capacity=1M,link=1e9"), true);
    mlo_component *a = r.c[0], *b = r.c[1];
    assert_ok(mlo_pipeline_materialize(r.tp->pipe));
    assert_int_equal(mlo_component_bytes(a), TOTAL);
    assert_ok(enable(&r, joined)); /* with prefetch: A, called first, loads at enable */
    assert_ok(mlo_platform_synchronize(r.plat));
    r.compute_ns = 100000; /* 100 us a block: each copy (16 us) lands within one */
    r.poke = joined;
    assert_ok(mlo_component_forward(a, forward, &r));
    mlo_component_stats sb = tu_cstats(b), sa = tu_cstats(a);
    mlo_pipeline_stats ps = tu_pstats(r.tp);
    assert_true(ps.peak_device_bytes <= TOTAL);
    if (joined) { /* A's block is B's: resident, loading, nothing allocated */
      assert_false(mlo_component_is_resident(a));
      assert_true(mlo_component_is_resident(b));
      assert_int_equal(sb.joined_loads, 1);
      assert_int_equal(sb.loads, 1);
      assert_int_equal(sb.h2d_bytes, TOTAL); /* a load's bytes, in 6 copies (b3 and E apart) */
      assert_int_equal(sb.copy_calls, 6);
      /* what B's acquire waits for, its head, holds the epilogue too */
      assert_int_equal(sa.evictions, 1);
      assert_int_equal(ps.device_bytes, TOTAL);
      assert_int_equal(tu_device_used(r.plat), TOTAL); /* one block all along */
    }
    if (joined) { /* placed as the ring says */
      assert_int_equal(dev_off(r.pro[1]), 16 * KB);
      assert_int_equal(dev_off(r.epi[1]), 24 * KB);
      for (int k = 0; k < NBLK; k++)
        assert_int_equal(dev_off(r.blk[1][k]), k < 3 ? (32 + 16 * k) * KB : 0);
      uint64_t at;
      void *blk = NULL;
      assert_status(mlo_component_shard(b, &blk, &at, NULL), MLO_EUNSUPPORTED);
    }
    assert_ok(mlo_pipeline_audit(r.tp->pipe));
    r.compute_ns = 0; /* B computes nothing: its waits are its copies' */
    assert_ok(mlo_component_forward(b, forward, &r));
    sb = tu_cstats(b);
    if (joined) {
      /* the head and b0 landed during A's forward; b1 was copied from A's
       * last end, just before its release, b2 and b3 after it: each begin
       * from 1 on waits for its own */
      tu_assert_near_ns(sb.wait_ns, COPY_NS(48 * KB));
      assert_int_equal(sb.block_wait_ns, sb.wait_ns); /* the acquire waited for nothing */
      /* and B's own last call joined back into A (the schedule's next) */
      assert_true(mlo_component_is_resident(a));
      assert_int_equal(tu_cstats(a).joined_loads, 1);
    } else {
      /* unjoined: loaded at its acquire, the head (P and E) first */
      assert_int_equal(sb.joined_loads, 0);
      tu_assert_near_ns(sb.wait_ns, COPY_NS(TOTAL));
      tu_assert_near_ns(sb.wait_ns - sb.block_wait_ns, COPY_NS(16 * KB));
      assert_int_equal(dev_off(r.epi[1]), 72 * KB);
    }
    assert_ok(mlo_pipeline_audit(r.tp->pipe));
    rig_free(&r);
  }
}

static void test_bytes_under_jitter(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=5e7"), false);
  mlo_component *a = r.c[0], *b = r.c[1];
  mlo_pipeline_set_audit(r.tp->pipe, true);
  assert_ok(enable(&r, true));
  for (int i = 0; i < 6; i++) {
    r.poke = i == 1;
    r.nested = i % 2 == 0;
    assert_ok(mlo_component_forward(a, forward, &r));
    if (i == 3) /* off the schedule: A again, its memory already B's */
      assert_ok(mlo_component_forward(a, forward, &r));
    assert_ok(mlo_component_forward(b, forward, &r));
  }
  /* every switch joined: A -> B in each A's last call (twice in prompt 3,
   * the first one's spent when A came again), B -> A at each B (the last
   * one's A resident now); A loaded at enable, and again for its call off
   * the schedule */
  assert_int_equal(tu_cstats(b).joined_loads, 7);
  assert_int_equal(tu_cstats(b).loads, 7);
  assert_int_equal(tu_cstats(b).evictions, 7); /* 6 handed to A, 1 for A's call off the schedule */
  assert_int_equal(tu_cstats(a).joined_loads, 6);
  assert_int_equal(tu_cstats(a).loads, 8);
  tu_assert_forwards_clean(r.tp);
  assert_int_equal(tu_device_used(r.plat), tu_pstats(r.tp).device_bytes);
  assert_true(tu_pstats(r.tp).peak_device_bytes <= TOTAL);
  /* a resident B, placed, evicted by hand and loaded again: its own layout */
  assert_ok(mlo_offload_disable(r.tp->pipe));
  assert_ok(mlo_pipeline_audit(r.tp->pipe));
  assert_ok(mlo_component_evict(b));
  assert_ok(mlo_component_load(b));
  assert_int_equal(dev_off(r.epi[1]), 72 * KB);
  assert_ok(mlo_platform_synchronize(r.plat)); /* loaded block by block: no begin here */
  char why[256] = "";
  if (!tu_device_content_ok(r.tp, b, why, sizeof why)) fail_msg("%s", why);
  /* A, placed by the last join (a ring over a ring), holds its own bytes */
  assert_true(mlo_component_is_resident(a));
  if (!tu_device_content_ok(r.tp, a, why, sizeof why)) fail_msg("%s", why);
  rig_free(&r);
}

static int prompt(rig *r) {
  int rc = mlo_component_forward(r->c[0], forward, r);
  if (!rc) rc = mlo_component_forward(r->c[1], forward, r);
  return rc;
}

static tu_pipe *sweep_build(void *self, mlo_platform *plat) {
  rig *r = self;
  rig_build_on(r, plat, false);
  r->nested = true; /* the byte oracle between every block's two ends too */
  assert_ok(mlo_pipeline_materialize(r->tp->pipe));
  return r->tp;
}

static int sweep_run(void *self) {
  rig *r = self;
  int rc = mlo_offload_is_enabled(r->tp->pipe) ? MLO_OK : enable(r, true);
  return rc ? rc : prompt(r);
}

static void sweep_destroy(void *self) {
  rig *r = self;
  tu_pipe_free(r->tp); /* the sweep closes the platform */
}

static void test_fault_sweep(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  rig r;
  tu_fault_case fc = {sweep_build, sweep_run, sweep_destroy};
  assert_true(tu_fault_sweep("host:capacity=1M,jitter=1", &fc, &r) > 20);
}

/* ---- two streamed DiTs ---------------------------------------------------
 * At 64 KiB each DiT streams: its head (16 KiB), block 1 kept, two slots of
 * 16 KiB; blocks 0, 2 and 3 pass through the slots (spread: stream.c).
 * Both plans put every piece at the same offset, so B's pieces go over
 * A's same pieces: its kept block 1 behind A's block 1's end, its head and
 * its slots' first fills (blocks 0 and 2) at A's release. */
#define STREAMED (64 * KB)

/* By hand on the simulated clock, B computing nothing so that its waits
 * are its copies' (C = 16.384 us a 16 KiB copy).  Joined: the head lands
 * C after A's release, slot 0 (block 0) 2C, slot 1 (block 2) 3C; block 3
 * goes into slot 0 at block 0's end, behind slot 1: 4C.  B waits 4C.  Not
 * joined, its load at its acquire adds kept block 1 before slot 1: 5C. */
static void test_streamed_by_hand(void **state) {
  (void)state;
  for (int joined = 1; joined >= 0; joined--) {
    rig r;
    rig_build_on(&r, tu_open_spec("sim:capacity=1M,link=1e9"), true);
    mlo_component *a = r.c[0], *b = r.c[1];
    assert_ok(mlo_pipeline_materialize(r.tp->pipe));
    assert_ok(budget_on(r.tp, STREAMED, joined));
    mlo_stream_info si;
    assert_ok(mlo_component_stream_info(a, &si));
    assert_int_equal(si.resident_blocks, 1);
    assert_int_equal(si.streamed_blocks, 3);
    assert_int_equal(si.device_bytes, STREAMED);
    r.compute_ns = 100000;
    assert_ok(mlo_component_forward(a, forward, &r));
    mlo_component_stats s0 = tu_cstats(b);
    if (joined) { /* A's block is B's: nothing allocated, nothing freed */
      assert_false(mlo_component_is_resident(a));
      assert_true(mlo_component_is_resident(b));
      assert_int_equal(s0.joined_loads, 1);
      assert_int_equal(s0.h2d_bytes, STREAMED); /* head, block 1, blocks 0 and 2 */
      assert_int_equal(s0.block_loads, 2);      /* the slots' fills */
      assert_int_equal(tu_device_used(r.plat), STREAMED);
      assert_int_equal(tu_pstats(r.tp).device_bytes, STREAMED);
    }
    r.compute_ns = 0;
    assert_ok(mlo_component_forward(b, forward, &r));
    mlo_component_stats s1 = tu_cstats(b);
    tu_assert_near_ns(s1.wait_ns - s0.wait_ns, COPY_NS((joined ? 64 : 80) * KB));
    if (joined) assert_int_equal(tu_cstats(a).joined_loads, 1); /* and back into A */
    assert_true(tu_pstats(r.tp).peak_device_bytes <= STREAMED);
    assert_ok(mlo_pipeline_audit(r.tp->pipe));
    rig_free(&r);
  }
}

/* Many prompts of two streamed DiTs through a jittered link: every block's
 * bytes right between its begin and end (the forward reads them, once with
 * the link left to jitter, once after every copy issued so far landed: a
 * copy of B's issued before A's compute ended what it overwrites shows as
 * A's wrong bytes), every switch joined, one device block all along. */
static void test_streamed_bytes_under_jitter(void **state) {
  (void)state;
  for (int settle = 0; settle < 2; settle++) {
    rig r;
    rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=5e7"), false);
    r.settle = settle;
    mlo_component *a = r.c[0], *b = r.c[1];
    r.tp->audit_in_forward = true;
    mlo_pipeline_set_audit(r.tp->pipe, true);
    assert_ok(budget_on(r.tp, STREAMED, true));
    for (int i = 0; i < 6; i++) {
      assert_ok(mlo_component_forward(a, forward, &r));
      assert_ok(mlo_component_forward(b, forward, &r));
    }
    assert_int_equal(tu_cstats(b).joined_loads, 6);
    /* A loaded at enable, then joined from each B (the last one's too) */
    assert_int_equal(tu_cstats(a).joined_loads, 6);
    assert_int_equal(tu_cstats(a).loads, 7);
    tu_assert_forwards_clean(r.tp);
    assert_int_equal(tu_device_used(r.plat), STREAMED);
    assert_true(tu_pstats(r.tp).peak_device_bytes <= STREAMED);
    rig_free(&r);
  }
}

/* A's forward after its four blocks: a streamed block begun again (its
 * slot took nothing of B's: loaded on demand, right bytes), a kept one
 * refused (its memory may hold B's); then kept block 1's bytes at the
 * address its begin gave, read after its end (what a component not
 * declared progressive may do: it is not joined). */
static int forward_again(mlo_component *c, void *user) {
  rig *r = user;
  int rc = forward(c, user);
  if (rc || c != r->c[0]) return rc;
  if (!r->undeclared) {
    if (mlo_block_begin(c, 0) || !bytes_ok(r, r->blk[0][0]) || mlo_block_end(c, 0)) return 1;
    return mlo_block_begin(c, 1) == MLO_ESTATE ? 0 : 1;
  }
  return bytes_ok(r, r->blk[0][1]) ? 0 : 1;
}

/* Two review findings: a streamed block of A's last call may run again
 * (MLO_ESTATE before), and a streamed A not declared progressive is not
 * joined (its kept blocks were overwritten after their ends). */
static void test_streamed_source_rules(void **state) {
  (void)state;
  for (int progressive = 1; progressive >= 0; progressive--) {
    rig r;
    rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=5e7"), false);
    r.settle = true;
    r.undeclared = !progressive;
    assert_ok(mlo_component_set_progressive(r.c[0], progressive));
    assert_ok(budget_on(r.tp, STREAMED, true));
    for (int i = 0; i < 2; i++) {
      assert_ok(mlo_component_forward(r.c[0], forward_again, &r));
      assert_ok(mlo_component_forward(r.c[1], forward, &r));
    }
    assert_int_equal(tu_cstats(r.c[1]).joined_loads, progressive ? 2 : 0);
    tu_assert_forwards_clean(r.tp);
    rig_free(&r);
  }
}

static int sweep_run_streamed(void *self) {
  rig *r = self;
  int rc = mlo_offload_is_enabled(r->tp->pipe) ? MLO_OK : budget_on(r->tp, STREAMED, true);
  return rc ? rc : prompt(r);
}

static void test_streamed_fault_sweep(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  rig r;
  tu_fault_case fc = {sweep_build, sweep_run_streamed, sweep_destroy};
  assert_true(tu_fault_sweep("host:capacity=1M,jitter=1", &fc, &r) > 20);
}

/* ---- the whole prompt's cycle ---------------------------------------------
 * An encoder (8 KiB prologue, two 8 KiB blocks: 24 KiB), the two DiTs and a
 * VAE of one 8 KiB tensor and no blocks, called in that order.  Under a
 * budget of a streamed DiT (64 KiB), each switch joins into the one device
 * block, passed round the prompt (KiB):
 *
 *   B (streamed):  [0,8) P  [8,24) kept b1  [24,32) E  [32,64) two slots
 *   VAE:           a ring from B's first kept block: [8,16), after B's b1 ends
 *   encoder:       right after the VAE's bytes, [16,40): room the VAE does not
 *                  use, copied at the VAE's acquire (it has no block to end)
 *   A (streamed):  its own plan's offsets in that block: P [0,8) and E over
 *                  encoder block 0 [24,32) go after that block ends, its kept
 *                  b1 [8,24) over the encoder's prologue at its release
 *
 * Without the chain, the VAE (which would hold all 64 KiB) is not joined,
 * so that the encoder can load beside it.  Under a budget of a whole DiT
 * (80 KiB, nothing streams) the same cycle joins as rings.  Checked: every
 * switch after the first prompt joined, every block's bytes right at its
 * begin (once after every copy issued so far landed, so that a copy issued
 * before the compute it overwrites ended shows), one device block all
 * along, the bytes moved those of the same prompts unjoined; the VAE's
 * acquire on the simulated clock waits for nothing; a fault sweep. */
typedef struct {
  mlo_platform *plat;
  tu_pipe *tp;
  mlo_component *c[4]; /* encoder, A, B, VAE */
  mlo_tensor *t[4][8];
  int nt[4], nblk[4], npro[4]; /* tensors; of them, blocks and those before them */
  bool sim, settle;
  uint64_t compute_ns;
  uint64_t vae_bytes; /* 8 KiB unless set before cycle_build_on's call */
} cycle;

static void cycle_add(cycle *y, int i, const char *name, mlo_role role, const char *pat, int nblk,
                      uint64_t pro, uint64_t blk, uint64_t epi) {
  assert_ok(mlo_component_add(y->tp->pipe, name, role, &y->c[i]));
  char t[64];
  if (pro) y->t[i][y->nt[i]++] = tu_add_tensor(y->tp, y->c[i], "embed.weight", pro, 0);
  y->npro[i] = y->nt[i];
  for (int b = 0; b < nblk; b++) {
    snprintf(t, sizeof t, pat, b);
    y->t[i][y->nt[i]++] = tu_add_tensor(y->tp, y->c[i], t, blk, 0);
  }
  if (epi) y->t[i][y->nt[i]++] = tu_add_tensor(y->tp, y->c[i], "proj_out.weight", epi, 0);
  y->nblk[i] = nblk;
  if (nblk) assert_ok(mlo_component_set_progressive(y->c[i], 1));
}

static void cycle_build_on(cycle *y, mlo_platform *plat, bool sim) {
  uint64_t vae = y->vae_bytes ? y->vae_bytes : 8 * KB;
  memset(y, 0, sizeof *y);
  y->plat = plat;
  y->sim = sim;
  y->tp = tu_pipe_new(plat, !sim);
  cycle_add(y, 0, "text_encoder", MLO_ROLE_ENCODER, "encoder.block.%d.weight", 2, 8 * KB, 8 * KB,
            0);
  cycle_add(y, 1, "transformer", MLO_ROLE_DIT, "blocks.%d.weight", NBLK, 8 * KB, 16 * KB, 8 * KB);
  cycle_add(y, 2, "transformer_2", MLO_ROLE_DIT, "blocks.%d.weight", NBLK, 8 * KB, 16 * KB, 8 * KB);
  cycle_add(y, 3, "vae", MLO_ROLE_VAE, "", 0, vae, 0, 0);
  mlo_schedule_entry s[] = {{y->c[0], 1}, {y->c[1], 1}, {y->c[2], 1}, {y->c[3], 1}};
  assert_ok(mlo_pipeline_set_schedule(y->tp->pipe, s, 4));
}

static bool cycle_bytes_ok(cycle *y, const mlo_tensor *t) {
  if (y->sim) return true;
  if (y->settle && mlo_platform_synchronize(y->plat)) return false;
  return device_bytes_ok(y->tp, t);
}

/* The prologue, each block between its begin and end, the epilogue. */
static int cycle_forward(mlo_component *c, void *user) {
  cycle *y = user;
  int i = 0;
  while (y->c[i] != c) i++;
  int first = y->npro[i];
  bool ok = true;
  for (int k = 0; k < first && ok; k++) ok = cycle_bytes_ok(y, y->t[i][k]);
  for (int b = 0; b < y->nblk[i] && ok; b++) {
    if (mlo_block_begin(c, (size_t)b)) return 1;
    ok = cycle_bytes_ok(y, y->t[i][first + b]);
    if (y->sim && y->compute_ns && mlo_sim_compute(y->plat, y->compute_ns)) return 1;
    if (mlo_block_end(c, (size_t)b)) return 1;
  }
  for (int k = first + y->nblk[i]; k < y->nt[i] && ok; k++) ok = cycle_bytes_ok(y, y->t[i][k]);
  return ok ? 0 : 1;
}

static int cycle_prompt(cycle *y) {
  int rc = MLO_OK;
  for (int i = 0; i < 4 && !rc; i++) rc = mlo_component_forward(y->c[i], cycle_forward, y);
  return rc;
}

static void test_cycle_joined(void **state) {
  (void)state;
  /* a streamed DiT's budget; a whole DiT's; a streamed DiT's with a VAE of
   * 40 KiB, [8,48), so that the encoder's ring wraps: its block 1 goes
   * over the VAE's last 8 KiB, at the VAE's release */
  const struct {
    uint64_t budget, vae;
  } cases[] = {{STREAMED, 8 * KB}, {TOTAL, 8 * KB}, {STREAMED, 40 * KB}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    uint64_t budget = cases[c].budget, moved[2] = {0, 0};
    for (int joined = 1; joined >= 0; joined--) {
      if (!joined) setenv("MLO_NO_JOIN", "1", 1);
      cycle y = {.vae_bytes = cases[c].vae};
      cycle_build_on(&y, tu_platform_open("capacity=1M,jitter=1,bw=5e7"), false);
      y.tp->audit_in_forward = true;
      mlo_pipeline_set_audit(y.tp->pipe, true);
      assert_ok(budget_on(y.tp, budget, true));
      unsetenv("MLO_NO_JOIN");
      for (int p = 0; p < 4; p++) {
        y.settle = p % 2;
        assert_ok(cycle_prompt(&y));
      }
      for (int i = 0; i < 4; i++) {
        mlo_component_stats st = tu_cstats(y.c[i]);
        moved[joined] += st.h2d_bytes;
        /* every switch joined but the first encoder's to A: that encoder
         * loaded at enable into a block of its own size; the last VAE
         * joined a fifth prompt's encoder */
        assert_int_equal(st.joined_loads, joined ? (i == 1 ? 3 : 4) : 0);
      }
      tu_assert_forwards_clean(y.tp);
      assert_true(tu_pstats(y.tp).peak_device_bytes <= budget);
      if (joined) /* one block, passed round */
        assert_int_equal(tu_device_used(y.plat), budget);
      tu_pipe_free(y.tp);
      mlo_platform_close(y.plat);
    }
    assert_int_equal(moved[1], moved[0]); /* the same bytes, earlier */
  }
}

/* On the simulated clock: B's block 1 computes for 100 us, the VAE's 8 KiB
 * copy (8 us) lands under it, and the VAE's acquire waits for nothing
 * (unjoined, it loads at its acquire: 8 KiB over the link). */
static void test_cycle_vae_waits_for_nothing(void **state) {
  (void)state;
  for (int joined = 1; joined >= 0; joined--) {
    if (!joined) setenv("MLO_NO_JOIN", "1", 1);
    cycle y = {0};
    cycle_build_on(&y, tu_open_spec("sim:capacity=1M,link=1e9"), true);
    assert_ok(mlo_pipeline_materialize(y.tp->pipe));
    assert_ok(budget_on(y.tp, STREAMED, true));
    unsetenv("MLO_NO_JOIN");
    y.compute_ns = 100000;
    for (int p = 0; p < 2; p++) assert_ok(cycle_prompt(&y));
    mlo_component_stats v = tu_cstats(y.c[3]);
    assert_int_equal(v.joined_loads, joined ? 2 : 0);
    if (joined)
      assert_int_equal(v.wait_ns, 0);
    else
      tu_assert_near_ns(v.wait_ns, 2 * COPY_NS(8 * KB));
    assert_ok(mlo_pipeline_audit(y.tp->pipe));
    tu_pipe_free(y.tp);
    mlo_platform_close(y.plat);
  }
}

/* The VAE's call, its join to the encoder running: acquired again by this
 * thread (mlo.torch's hooks nest so) and by another, as any resident
 * component (a review found both refused: MLO_EDEADLK, MLO_EBUSY). */
static void *try_acquire_vae(void *arg) {
  mlo_component *c = arg;
  intptr_t rc = mlo_component_try_acquire(c);
  if (!rc) mlo_component_release(c);
  return (void *)rc;
}

static int vae_shared(mlo_component *c, void *user) {
  cycle *y = user;
  if (c == y->c[3]) {
    if (mlo_component_acquire(c)) return 1;
    mlo_component_release(c);
    pthread_t th;
    void *got = NULL;
    if (pthread_create(&th, NULL, try_acquire_vae, c) || pthread_join(th, &got) || got) return 1;
  }
  return cycle_forward(c, user);
}

static void test_cycle_vae_shared(void **state) {
  (void)state;
  cycle y = {0};
  cycle_build_on(&y, tu_platform_open("capacity=1M,jitter=1,bw=5e7"), false);
  assert_ok(budget_on(y.tp, STREAMED, true));
  for (int p = 0; p < 3; p++)
    for (int i = 0; i < 4; i++) assert_ok(mlo_component_forward(y.c[i], vae_shared, &y));
  assert_int_equal(tu_cstats(y.c[0]).joined_loads, 3); /* the VAE's joins ran all the same */
  tu_assert_forwards_clean(y.tp);
  tu_pipe_free(y.tp);
  mlo_platform_close(y.plat);
}

/* A streamed B joins a plain A's block only if that block is exactly B's
 * footprint: B is counted as its footprint from the hand-over, so a larger
 * block would count less than the platform holds and let a prefetch past
 * the budget (a review's case: a plain 80 KiB DiT, a streamed one of 112
 * KiB, a 56 KiB VAE, a budget of 80 KiB; with a 16 KiB encoder, 96 KiB
 * allocated).  After every forward the platform's bytes are the
 * pipeline's, within the budget. */
static void test_cycle_counts_what_is_held(void **state) {
  (void)state;
  for (int enc_blocks = 2; enc_blocks >= 1; enc_blocks--) {
    cycle y = {0};
    y.plat = tu_platform_open("capacity=1M,jitter=1,bw=5e7");
    y.tp = tu_pipe_new(y.plat, true);
    cycle_add(&y, 0, "text_encoder", MLO_ROLE_ENCODER, "encoder.block.%d.weight", enc_blocks,
              8 * KB, 8 * KB, 0);
    cycle_add(&y, 1, "transformer", MLO_ROLE_DIT, "blocks.%d.weight", NBLK, 8 * KB, 16 * KB,
              8 * KB);
    cycle_add(&y, 2, "transformer_2", MLO_ROLE_DIT, "blocks.%d.weight", NBLK, 8 * KB, 24 * KB,
              8 * KB);
    cycle_add(&y, 3, "vae", MLO_ROLE_VAE, "", 0, 56 * KB, 0, 0);
    mlo_schedule_entry s[] = {{y.c[0], 1}, {y.c[1], 1}, {y.c[2], 1}, {y.c[3], 1}};
    assert_ok(mlo_pipeline_set_schedule(y.tp->pipe, s, 4));
    assert_ok(budget_on(y.tp, TOTAL, true));
    for (int p = 0; p < 3; p++)
      for (int i = 0; i < 4; i++) {
        assert_ok(mlo_component_forward(y.c[i], cycle_forward, &y));
        assert_int_equal(tu_device_used(y.plat), tu_pstats(y.tp).device_bytes);
        assert_true(tu_device_used(y.plat) <= TOTAL);
      }
    tu_assert_forwards_clean(y.tp);
    tu_pipe_free(y.tp);
    mlo_platform_close(y.plat);
  }
}

static tu_pipe *cycle_sweep_build(void *self, mlo_platform *plat) {
  cycle *y = self;
  y->vae_bytes = 0; /* (the last run's is freed) */
  cycle_build_on(y, plat, false);
  assert_ok(mlo_pipeline_materialize(y->tp->pipe));
  return y->tp;
}

static int cycle_sweep_run(void *self) {
  cycle *y = self;
  int rc = mlo_offload_is_enabled(y->tp->pipe) ? MLO_OK : budget_on(y->tp, STREAMED, true);
  for (int p = 0; p < 2 && !rc; p++) rc = cycle_prompt(y);
  return rc;
}

static void cycle_sweep_destroy(void *self) {
  cycle *y = self;
  tu_pipe_free(y->tp);
}

static void test_cycle_fault_sweep(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  cycle y = {0};
  tu_fault_case fc = {cycle_sweep_build, cycle_sweep_run, cycle_sweep_destroy};
  assert_true(tu_fault_sweep("host:capacity=1M,jitter=1", &fc, &y) > 40);
}

/* B's forward reads its epilogue before any block, or skips its last
 * block (block caching, skip-layer guidance): its head, which its acquire
 * waits for, holds the epilogue, so both read landed bytes. */
static int epilogue_first(mlo_component *c, void *user) {
  rig *r = user;
  int i = c == r->c[1];
  bool ok = bytes_ok(r, r->epi[i]) && bytes_ok(r, r->pro[i]);
  for (int b = 0; b < NBLK && ok; b++) {
    if (mlo_block_begin(c, (size_t)b)) return 1;
    ok = bytes_ok(r, r->blk[i][b]);
    if (mlo_block_end(c, (size_t)b)) return 1;
  }
  return ok ? 0 : 1;
}

static int last_block_skipped(mlo_component *c, void *user) {
  rig *r = user;
  int i = c == r->c[1];
  bool ok = bytes_ok(r, r->pro[i]);
  for (int b = 0; b < NBLK - 1 && ok; b++) {
    if (mlo_block_begin(c, (size_t)b)) return 1;
    ok = bytes_ok(r, r->blk[i][b]);
    if (mlo_block_end(c, (size_t)b)) return 1;
  }
  return ok && bytes_ok(r, r->epi[i]) ? 0 : 1;
}

static void test_epilogue_read_anywhere(void **state) {
  (void)state;
  mlo_forward_fn fns[] = {epilogue_first, last_block_skipped};
  for (int f = 0; f < 2; f++)
    for (int round = 0; round < 5; round++) {
      rig r;
      rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=2e7"), false);
      assert_ok(enable(&r, true));
      assert_ok(mlo_component_forward(r.c[0], forward, &r));
      assert_int_equal(tu_cstats(r.c[1]).joined_loads, 1);
      assert_ok(mlo_component_forward(r.c[1], fns[f], &r));
      tu_assert_forwards_clean(r.tp);
      rig_free(&r);
    }
}

/* A block ended in the joined call is refused at once, before any copy
 * goes over it: a second window on it could not hold back the copies its
 * later ends let go.  Here B's head (24 KiB) goes over A's blocks 0 and 1,
 * so nothing is copied at block 0's end. */
static void test_ended_block_not_begun_again(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=1M,bw=1e8");
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *a, *b;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &a));
  assert_ok(mlo_component_add(tp->pipe, "transformer_2", MLO_ROLE_DIT, &b));
  static const size_t ka[] = {8, 4, 28, 32, 8}, kb[] = {16, 32, 24, 8}; /* KiB: P, blocks, E */
  static const char *const na[] = {"patch_embedding.weight", "blocks.0.weight", "blocks.1.weight",
                                   "blocks.2.weight", "proj_out.weight"};
  static const char *const nb[] = {"patch_embedding.weight", "blocks.0.weight", "blocks.1.weight",
                                   "proj_out.weight"};
  mlo_tensor *a0 = NULL;
  for (int i = 0; i < 5; i++) {
    mlo_tensor *t = tu_add_tensor(tp, a, na[i], ka[i] * KB, 0);
    if (i == 1) a0 = t;
  }
  for (int i = 0; i < 4; i++) tu_add_tensor(tp, b, nb[i], kb[i] * KB, 0);
  assert_ok(mlo_component_set_progressive(a, 1));
  assert_ok(mlo_component_set_progressive(b, 1));
  mlo_schedule_entry e[] = {{a, 1}, {b, 1}};
  assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, 2));
  assert_ok(budget_on(tp, TOTAL, true));
  assert_ok(mlo_component_acquire(a));
  assert_ok(mlo_block_begin(a, 0));
  assert_ok(mlo_block_end(a, 0)); /* the join starts; nothing goes yet */
  assert_status(mlo_block_begin(a, 0), MLO_ESTATE);
  size_t off;
  assert_status(mlo_tensor_device(a0, NULL, &off), MLO_ESTATE);
  for (size_t k = 1; k < 3; k++) {
    assert_ok(mlo_block_begin(a, k));
    assert_ok(mlo_block_end(a, k));
  }
  assert_ok(mlo_component_release(a));
  assert_int_equal(tu_cstats(b).joined_loads, 1);
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* F1, F13 (issue 44): a kept block's memory goes to the joined next
 * component only at the last end of its begins.  In A's joined call each
 * block is begun twice on this thread (nested begins are shared); after its
 * first end every copy queued so far is let land (synchronize) and the
 * block's bytes are still A's, its address still given, since the second
 * begin is open; an end with no begin on this thread is refused and gives
 * nothing away.  At the second end the block is B's (begun again: refused),
 * and B, joined, holds its own bytes. */
static void test_nested_and_unbegun_ends(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=5e7"), false);
  mlo_component *a = r.c[0], *b = r.c[1];
  assert_ok(enable(&r, true));
  assert_ok(mlo_component_acquire(a));
  for (size_t k = 0; k < NBLK; k++) {
    assert_status(mlo_block_end(a, k), MLO_ESTATE); /* never begun (F13) */
    assert_true(tu_contains_ci(mlo_pipeline_errmsg(r.tp->pipe), "without a begin"));
    assert_ok(mlo_block_begin(a, k));
    assert_ok(mlo_block_begin(a, k));
    assert_ok(mlo_block_end(a, k));
    assert_ok(mlo_platform_synchronize(r.plat));     /* what the join let go has landed */
    assert_true(device_bytes_ok(r.tp, r.blk[0][k])); /* still A's (F1) */
    assert_ok(mlo_block_end(a, k));
    assert_status(mlo_block_end(a, k), MLO_ESTATE);   /* one end too many */
    assert_status(mlo_block_begin(a, k), MLO_ESTATE); /* its memory may be B's now */
  }
  assert_ok(mlo_component_release(a));
  assert_int_equal(tu_cstats(b).joined_loads, 1);
  assert_ok(mlo_platform_synchronize(r.plat));
  char why[256] = "";
  if (!tu_device_content_ok(r.tp, b, why, sizeof why)) fail_msg("%s", why);
  tu_assert_audit(r.tp);
  tu_assert_forwards_clean(r.tp);
  rig_free(&r);
}

/* A next component smaller than the block it joins into is one range,
 * holding its slab's bytes and nothing else, so a fingerprint of its span
 * (mlo.torch's write check) sums its own bytes: from A's first block where
 * it fits before the block's end, [8, 48) KiB; wrapped round where it does
 * not (A's prologue 48 KiB), its tail right before its start, [40, 80).
 * Each tensor's bytes right. */
static void test_smaller_next_is_one_range(void **state) {
  (void)state;
  static const struct {
    size_t pro, blk, epi, lo; /* KiB: A's pieces, where the VAE starts */
  } cases[] = {{8, 16, 8, 8}, {48, 4, 16, 40}};
  for (int c = 0; c < 2; c++) {
    mlo_platform *plat = tu_platform_open("capacity=1M,jitter=1,bw=5e7");
    tu_pipe *tp = tu_pipe_new(plat, true);
    mlo_component *a, *v;
    assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &a));
    tu_add_tensor(tp, a, "patch_embedding.weight", cases[c].pro * KB, 0);
    char t[64];
    for (int b = 0; b < NBLK; b++) {
      snprintf(t, sizeof t, "blocks.%d.weight", b);
      tu_add_tensor(tp, a, t, cases[c].blk * KB, 0);
    }
    tu_add_tensor(tp, a, "proj_out.weight", cases[c].epi * KB, 0);
    assert_ok(mlo_component_set_progressive(a, 1));
    assert_int_equal(mlo_component_bytes(a), TOTAL);
    assert_ok(mlo_component_add(tp->pipe, "vae", MLO_ROLE_VAE, &v));
    mlo_tensor *vt[4] = {tu_add_tensor(tp, v, "conv_in.weight", 8 * KB, 0),
                         tu_add_tensor(tp, v, "blocks.0.weight", 12 * KB, 0),
                         tu_add_tensor(tp, v, "blocks.1.weight", 12 * KB, 0),
                         tu_add_tensor(tp, v, "conv_out.weight", 8 * KB, 0)};
    mlo_schedule_entry e[] = {{a, 1}, {v, 1}};
    assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, 2));
    assert_ok(budget_on(tp, TOTAL, true));
    assert_ok(mlo_component_acquire(a));
    for (size_t k = 0; k < NBLK; k++) {
      assert_ok(mlo_block_begin(a, k));
      assert_ok(mlo_block_end(a, k));
    }
    assert_ok(mlo_component_release(a));
    assert_int_equal(tu_cstats(v).joined_loads, 1);
    assert_ok(mlo_offload_disable(tp->pipe)); /* read it by hand: its copies have landed */
    assert_ok(mlo_platform_synchronize(plat));
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < 4; i++) {
      uint64_t off = dev_off(vt[i]), n = mlo_tensor_nbytes(vt[i]);
      lo = off < lo ? off : lo;
      hi = off + n > hi ? off + n : hi;
      unsigned char buf[12 * KB];
      assert_ok(tu_read_device(tp, vt[i], buf, (size_t)n));
      assert_int_equal(tu_pattern_mismatch(buf, (size_t)n, tu_rec(tp, vt[i])->seed), n);
    }
    assert_int_equal(lo, cases[c].lo * KB);
    assert_int_equal(hi - lo, 40 * KB);
    tu_assert_audit(tp);
    tu_pipe_free(tp);
    mlo_platform_close(plat);
  }
}

/* Only a component declared progressive is a source: a forward that begins
 * and ends its blocks without the declaration (mlo.torch's, before it has
 * seen every block run) made no promise not to read a block after it. */
static void test_source_declared_progressive(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=2e7"), false);
  assert_ok(mlo_component_set_progressive(r.c[0], 0));
  assert_ok(enable(&r, true));
  assert_ok(mlo_component_forward(r.c[0], forward, &r));
  assert_int_equal(tu_cstats(r.c[1]).joined_loads, 0);
  assert_ok(mlo_component_forward(r.c[1], forward, &r)); /* B joins back into A */
  assert_int_equal(tu_cstats(r.c[0]).joined_loads, 1);
  tu_assert_forwards_clean(r.tp);
  rig_free(&r);
}

/* The pipeline freed while a joined call still holds its component: the
 * join is dropped, nothing leaks or is touched after it is freed (ASan). */
static void test_free_while_joining(void **state) {
  (void)state;
  for (int released = 0; released < 2; released++) {
    rig r;
    rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=2e7"), false);
    assert_ok(enable(&r, true));
    mlo_component *a = r.c[0];
    assert_ok(mlo_component_acquire(a));
    for (int b = 0; b < 2; b++) {
      assert_ok(mlo_block_begin(a, (size_t)b));
      assert_ok(mlo_block_end(a, (size_t)b));
    }
    assert_status(mlo_offload_disable(r.tp->pipe), MLO_EBUSY);
    if (released) {
      assert_ok(mlo_component_release(a));
      assert_true(mlo_component_is_resident(r.c[1]));
    }
    rig_free(&r); /* logs the acquire not released (the first time) */
  }
}

/* Two threads, each in a joined call (a -> b, c -> d), each then acquiring
 * the other's target: a thread that holds anything does not wait for a
 * join (as it does not wait for room): both get MLO_EDEADLK, neither hangs. */
typedef struct {
  mlo_component *hold, *want;
  sem_t step, done;
  int rc;
} crossing;

static void *cross(void *p) {
  crossing *x = p;
  sem_wait(&x->step);
  x->rc = mlo_component_acquire(x->hold);
  if (!x->rc && !(x->rc = mlo_block_begin(x->hold, 0))) x->rc = mlo_block_end(x->hold, 0);
  sem_post(&x->done);
  sem_wait(&x->step);
  int rc = mlo_component_acquire(x->want);
  if (!rc) mlo_component_release(x->want);
  if (!x->rc) x->rc = rc;
  sem_post(&x->done);
  sem_wait(&x->step); /* both have tried before either releases */
  mlo_component_release(x->hold);
  return NULL;
}

static mlo_component *dit(tu_pipe *tp, const char *name) {
  mlo_component *c;
  assert_ok(mlo_component_add(tp->pipe, name, MLO_ROLE_DIT, &c));
  tu_add_tensor(tp, c, "patch_embedding.weight", 8 * KB, 0);
  char t[64];
  for (int b = 0; b < NBLK; b++) {
    snprintf(t, sizeof t, "blocks.%d.weight", b);
    tu_add_tensor(tp, c, t, 16 * KB, 0);
  }
  tu_add_tensor(tp, c, "proj_out.weight", 8 * KB, 0);
  assert_ok(mlo_component_set_progressive(c, 1));
  return c;
}

static void test_holder_does_not_wait_for_a_join(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=1M");
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *a = dit(tp, "a"), *b = dit(tp, "b"), *c = dit(tp, "c"), *d = dit(tp, "d");
  assert_ok(budget_on(tp, 2 * TOTAL, true)); /* two at a time */
  for (int i = 0; i < 2; i++) {              /* a and c resident; no schedule yet */
    assert_ok(mlo_component_acquire(i ? c : a));
    assert_ok(mlo_component_release(i ? c : a));
  }
  mlo_schedule_entry e[] = {{a, 1}, {b, 1}, {c, 1}, {d, 1}};
  assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, 4));
  crossing x[2] = {{.hold = a, .want = d}, {.hold = c, .want = b}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    sem_init(&x[i].step, 0, 0);
    sem_init(&x[i].done, 0, 0);
    assert_int_equal(pthread_create(&th[i], NULL, cross, &x[i]), 0);
  }
  for (int i = 0; i < 2; i++) { /* a's join starts, then c's */
    sem_post(&x[i].step);
    sem_wait(&x[i].done);
    assert_ok(x[i].rc);
  }
  assert_int_equal(tu_cstats(b).loads + tu_cstats(d).loads, 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 30;
  for (int i = 0; i < 2; i++) sem_post(&x[i].step);
  for (int i = 0; i < 2; i++)
    if (sem_timedwait(&x[i].done, &ts)) fail_msg("thread %d still waits: a deadlock", i);
  for (int i = 0; i < 2; i++) sem_post(&x[i].step);
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(x[i].rc, MLO_EDEADLK);
    sem_destroy(&x[i].step);
    sem_destroy(&x[i].done);
  }
  assert_int_equal(tu_cstats(b).joined_loads + tu_cstats(d).joined_loads, 2); /* at the releases */
  tu_assert_audit(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_hand),
      cmocka_unit_test(test_bytes_under_jitter),
      cmocka_unit_test(test_fault_sweep),
      cmocka_unit_test(test_epilogue_read_anywhere),
      cmocka_unit_test(test_ended_block_not_begun_again),
      cmocka_unit_test(test_nested_and_unbegun_ends),
      cmocka_unit_test(test_smaller_next_is_one_range),
      cmocka_unit_test(test_source_declared_progressive),
      cmocka_unit_test(test_free_while_joining),
      cmocka_unit_test(test_holder_does_not_wait_for_a_join),
      cmocka_unit_test(test_streamed_by_hand),
      cmocka_unit_test(test_streamed_bytes_under_jitter),
      cmocka_unit_test(test_streamed_fault_sweep),
      cmocka_unit_test(test_streamed_source_rules),
      cmocka_unit_test(test_cycle_joined),
      cmocka_unit_test(test_cycle_vae_waits_for_nothing),
      cmocka_unit_test(test_cycle_fault_sweep),
      cmocka_unit_test(test_cycle_vae_shared),
      cmocka_unit_test(test_cycle_counts_what_is_held),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
