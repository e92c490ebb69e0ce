/*
 * core_progressive.c — progressive loads (src/core/progressive.c,
 * docs/streaming.md): a component whose forward begins and ends its blocks
 * loads block by block, each block behind its own event.
 *
 *  - on the simulated device, whose clock is virtual, the waits are the
 *    figures computed by hand from the pieces' bytes and the link: the
 *    acquire waits for the head (prologue and epilogue) alone, a block's
 *    begin for what of its copy has not landed, and a forward whose blocks
 *    compute at least as long as the next one copies waits for nothing
 *    after the first block; the same component loaded whole waits for all
 *    of it, and the bytes moved are the same;
 *  - on the host platform with a jittered, throttled copy queue: every
 *    block's bytes are right after its begin, the head (mutable and
 *    caller-owned tensors included) right after the acquire, the copies are
 *    the ones counted by hand, an eviction before any forward leaves the
 *    audit clean, and a mutable tensor written on the device reaches the
 *    host at eviction;
 *  - every platform call of a progressive prompt failed in turn: a status,
 *    a clean audit, and the next prompt right.
 */
#include "testutil.h"
#include "mlo/checkpoint.h"
#include "platform/fault.h"
#include "platform/platform.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB (1024u)
#define LINK 1000000000ull /* the simulated link, bytes per second */
#define COPY_NS(bytes) tu_copy_ns(bytes, LINK)

/* The LOAD_END stamps traced for one component (the last one kept). */
typedef struct {
  const mlo_component *c;
  uint64_t begin_ns, end_ns;
  int ends;
} load_seen;

static void on_trace(const mlo_trace_event *ev, void *user) {
  load_seen *ls = user;
  if (ev->comp != ls->c) return;
  if (ev->kind == MLO_TRACE_LOAD_BEGIN) ls->begin_ns = ev->t_ns;
  if (ev->kind == MLO_TRACE_LOAD_END) {
    ls->end_ns = ev->t_ns;
    ls->ends++;
  }
}

static void test_waits_by_hand(void **state) {
  (void)state;
  mlo_platform *p = tu_open_spec("sim:capacity=1G,link=1e9");
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = p;
  mlo_pipeline *pipe = NULL;
  char err[512] = "";
  assert_ok(mlo_synth_open(&po, "wan2.2-t2v", 0.002, &pipe, NULL, err, sizeof err));
  assert_ok(mlo_pipeline_materialize(pipe));
  mlo_component *dit = mlo_pipeline_find(pipe, "transformer");
  mlo_component *whole = mlo_pipeline_find(pipe, "transformer_2"); /* the same shape */
  assert_ok(mlo_component_set_progressive(dit, 1));
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(dit, &si));
  assert_int_equal(si.progressive, 1);
  assert_ok(mlo_component_stream_info(whole, &si));
  assert_int_equal(si.progressive, 0);
  size_t n = 0;
  mlo_block_info info[16];
  assert_ok(mlo_component_blocks(dit, info, 16, &n));
  size_t nb = mlo_component_block_count(dit);
  assert_int_equal(n, nb + 2);
  assert_true(nb >= 3);
  /* the pieces tile the slab: each piece's copy runs to the next one's
   * start (alignment included), the last to the end of the block */
  uint64_t total = mlo_component_bytes(dit), ext[16];
  for (size_t i = 0; i < n; i++) ext[i] = (i + 1 < n ? info[i + 1].offset : total) - info[i].offset;
  uint64_t head = ext[0] + ext[n - 1];
  assert_ok(mlo_offload_enable(pipe, NULL));
  assert_ok(mlo_platform_synchronize(p)); /* the encoder and VAE strict loaded at enable */

  /* whole: the acquire waits for every byte */
  assert_ok(mlo_component_acquire(whole));
  mlo_component_stats ws;
  assert_ok(mlo_component_get_stats(whole, &ws));
  tu_assert_near_ns(ws.wait_ns, COPY_NS(total));
  assert_int_equal(ws.h2d_bytes, total);
  assert_int_equal(ws.copy_calls, 1);
  for (size_t b = 0; b < nb; b++) assert_ok(mlo_block_begin(whole, b)); /* nothing to wait */
  for (size_t b = 0; b < nb; b++) assert_ok(mlo_block_end(whole, b));
  assert_ok(mlo_component_get_stats(whole, &ws));
  assert_int_equal(ws.block_wait_ns, 0);
  assert_ok(mlo_component_release(whole));

  /* progressive: the acquire waits for the head alone; block 0's begin
   * for its own copy (nothing computed yet); then each block computes for
   * twice its copy, so every later block has landed by its begin */
  assert_ok(mlo_platform_synchronize(p));
  load_seen ls = {.c = dit};
  mlo_pipeline_set_trace(pipe, on_trace, &ls);
  assert_ok(mlo_component_acquire(dit)); /* strict: evicts transformer_2 (C4) */
  mlo_component_stats s0, s1;
  assert_ok(mlo_component_get_stats(dit, &s0));
  tu_assert_near_ns(s0.wait_ns, COPY_NS(head));
  assert_int_equal(s0.h2d_bytes, total); /* the same bytes, in 2 + nb copies */
  assert_int_equal(s0.copy_calls, 2 + nb);
  assert_false(mlo_component_load_done(dit)); /* the blocks are still on their way */
  for (size_t b = 0; b < nb; b++) {
    assert_ok(mlo_block_begin(dit, b));
    assert_ok(mlo_component_get_stats(dit, &s1));
    tu_assert_near_ns(s1.block_wait_ns, COPY_NS(ext[1]));
    assert_ok(mlo_sim_compute(p, 2 * COPY_NS(ext[1 + b])));
    assert_ok(mlo_block_end(dit, b));
  }
  assert_true(mlo_component_load_done(dit));
  assert_ok(mlo_component_get_stats(dit, &s1));
  tu_assert_near_ns(s1.wait_ns, COPY_NS(head) + COPY_NS(ext[1]));
  assert_ok(mlo_component_release(dit));
  /* the load ended when its last block landed, not when the acquire's wait
   * for the head did (traced once, at the last block's begin) */
  assert_int_equal(ls.ends, 1);
  tu_assert_near_ns(ls.end_ns - ls.begin_ns, COPY_NS(total));
  mlo_pipeline_set_trace(pipe, NULL, NULL);

  /* its next forward, resident, waits for nothing; loaded again, with no
   * compute between the blocks, it waits for every byte in all, as whole */
  assert_ok(mlo_component_acquire(dit));
  for (size_t b = 0; b < nb; b++) assert_ok(mlo_block_begin(dit, b));
  for (size_t b = 0; b < nb; b++) assert_ok(mlo_block_end(dit, b));
  assert_ok(mlo_component_release(dit));
  assert_ok(mlo_component_get_stats(dit, &s0));
  assert_int_equal(s0.wait_ns, s1.wait_ns);
  assert_ok(mlo_offload_disable(pipe)); /* by hand: evicted, then enabled again */
  assert_ok(mlo_component_evict(dit));
  assert_ok(mlo_offload_enable(pipe, NULL));
  assert_ok(mlo_platform_synchronize(p));
  assert_ok(mlo_component_acquire(dit));
  for (size_t b = 0; b < nb; b++) {
    assert_ok(mlo_block_begin(dit, b));
    assert_ok(mlo_block_end(dit, b));
  }
  assert_ok(mlo_component_release(dit));
  assert_ok(mlo_component_get_stats(dit, &s1));
  tu_assert_near_ns(s1.wait_ns - s0.wait_ns, COPY_NS(total));
  /* declared off: its next load is whole again */
  assert_ok(mlo_component_set_progressive(dit, 0));
  assert_ok(mlo_offload_disable(pipe));
  assert_ok(mlo_component_evict(dit));
  assert_ok(mlo_offload_enable(pipe, NULL));
  assert_ok(mlo_component_acquire(dit));
  assert_ok(mlo_component_get_stats(dit, &s0));
  assert_int_equal(s0.copy_calls - s1.copy_calls, 1);
  assert_ok(mlo_component_release(dit));
  assert_ok(mlo_pipeline_audit(pipe));
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

/* A DiT of a 4 KiB prologue, 6 blocks of 16 KiB (block 3 holds a mutable
 * buffer), a 4 KiB epilogue and a caller-owned 4 KiB tensor; an encoder
 * beside it. */
#define NBLK 6
typedef struct {
  mlo_platform *plat;
  tu_pipe *tp;
  mlo_component *dit, *enc;
  mlo_tensor *blk[NBLK], *mut, *own;
  void *own_data;
} rig;

static void rig_build_on(rig *r, mlo_platform *plat) {
  memset(r, 0, sizeof *r);
  r->plat = plat;
  r->tp = tu_pipe_new(plat, true);
  assert_ok(mlo_component_add(r->tp->pipe, "transformer", MLO_ROLE_DIT, &r->dit));
  tu_add_tensor(r->tp, r->dit, "patch_embedding.weight", 4 * KB, 0);
  char name[64];
  for (int b = 0; b < NBLK; b++) {
    snprintf(name, sizeof name, "blocks.%d.weight", b);
    r->blk[b] = tu_add_tensor(r->tp, r->dit, name, (b == 3 ? 12 : 16) * KB, 0);
  }
  r->mut = tu_add_tensor(r->tp, r->dit, "blocks.3.cache", 4 * KB,
                         MLO_TENSOR_BUFFER | MLO_TENSOR_MUTABLE);
  tu_add_tensor(r->tp, r->dit, "proj_out.weight", 4 * KB, 0);
  r->own_data = malloc(4 * KB);
  tu_fill_pattern(r->own_data, 4 * KB, tu_seed("transformer", "blocks.1.lora"));
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = "blocks.1.lora";
  d.dtype = MLO_DTYPE_U8;
  d.ndim = 1;
  d.shape[0] = 4 * KB;
  d.data = r->own_data;
  d.flags = MLO_TENSOR_EXTERNAL;
  assert_ok(mlo_tensor_add(r->dit, &d, &r->own));
  assert_ok(mlo_component_add(r->tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &r->enc));
  tu_add_tensor(r->tp, r->enc, "w", 8 * KB, 0);
  assert_ok(mlo_component_set_progressive(r->dit, 1));
}

static void rig_free(rig *r) {
  tu_pipe_free(r->tp);
  mlo_platform_close(r->plat);
  free(r->own_data);
}

static bool bytes_ok(rig *r, const mlo_tensor *t, uint32_t seed) {
  size_t n = (size_t)mlo_tensor_nbytes(t);
  unsigned char *buf = malloc(n);
  int rc = tu_read_device(r->tp, t, buf, n);
  bool ok = rc == MLO_OK && tu_pattern_mismatch(buf, n, seed) == n;
  free(buf);
  if (!ok) tu_note_failure(r->tp, "%s: %s", mlo_tensor_name(t), rc ? mlo_err_name(rc) : "bytes");
  return ok;
}

static uint32_t seed_of(const mlo_tensor *t) {
  return tu_seed("transformer", mlo_tensor_name(t));
}

/* A forward as compute runs it: the head is there at the acquire, each
 * block once begun. */
static int forward(mlo_component *c, void *user) {
  rig *r = user;
  bool ok =
      bytes_ok(r, r->mut, tu_rec(r->tp, r->mut)->seed) && bytes_ok(r, r->own, seed_of(r->own));
  for (int b = 0; b < NBLK && ok; b++) {
    if (mlo_block_begin(c, (size_t)b)) return 1;
    ok = bytes_ok(r, r->blk[b], seed_of(r->blk[b]));
    if (mlo_block_end(c, (size_t)b)) return 1;
  }
  return ok ? 0 : 1;
}

static void test_bytes_under_jitter(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=5e7"));
  mlo_pipeline_set_audit(r.tp->pipe, true);
  assert_ok(mlo_offload_enable(r.tp->pipe, NULL));
  for (int i = 0; i < 6; i++) {
    mlo_component_stats a, b;
    assert_ok(mlo_component_get_stats(r.dit, &a));
    assert_ok(mlo_component_forward(r.dit, forward, &r));
    assert_ok(mlo_component_get_stats(r.dit, &b));
    /* the head: prologue, epilogue, block 3 (its mutable buffer) and the
     * caller's tensor; then blocks 0, 1, 2, 4, 5 */
    assert_int_equal(b.copy_calls - a.copy_calls, 4 + 5);
    assert_ok(tu_forward(r.tp, r.enc)); /* C4: the DiT goes */
    assert_false(mlo_component_is_resident(r.dit));
    if (i == 2) { /* a mutable buffer written on the device reaches the host */
      assert_ok(mlo_component_acquire(r.dit));
      tu_mutate(r.tp, r.mut, 77);
      assert_ok(mlo_component_release(r.dit));
      assert_ok(tu_forward(r.tp, r.enc)); /* written back at this eviction */
    }
    if (i == 4) { /* loaded by hand and evicted before any forward, its copies in flight */
      assert_ok(mlo_offload_disable(r.tp->pipe));
      assert_ok(mlo_component_load(r.dit));
      assert_ok(mlo_component_evict(r.dit));
      assert_ok(mlo_pipeline_audit(r.tp->pipe));
      assert_ok(mlo_offload_enable(r.tp->pipe, NULL));
    }
  }
  char why[256];
  assert_true(tu_host_content_ok(r.tp, r.dit, why, sizeof why));
  tu_assert_forwards_clean(r.tp);
  assert_int_equal(tu_device_used(r.plat), tu_pstats(r.tp).device_bytes);
  rig_free(&r);
}

static int prompt(rig *r) {
  int rc = tu_forward(r->tp, r->enc);
  for (int s = 0; s < 3 && !rc; s++) rc = mlo_component_forward(r->dit, forward, r);
  return rc;
}

static tu_pipe *sweep_build(void *self, mlo_platform *plat) {
  rig *r = self;
  rig_build_on(r, plat);
  assert_ok(mlo_pipeline_materialize(r->tp->pipe));
  return r->tp;
}

static int sweep_run(void *self) {
  rig *r = self;
  int rc = mlo_offload_is_enabled(r->tp->pipe) ? MLO_OK : mlo_offload_enable(r->tp->pipe, NULL);
  return rc ? rc : prompt(r);
}

static void sweep_destroy(void *self) {
  rig *r = self;
  tu_pipe_free(r->tp); /* the sweep closes the platform */
  free(r->own_data);
}

static void test_fault_sweep(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  rig r;
  tu_fault_case fc = {sweep_build, sweep_run, sweep_destroy};
  assert_true(tu_fault_sweep("host:capacity=1M,jitter=1", &fc, &r) > 20);
}

/* A load whose own last event fails is rolled back with its per-block
 * state: the next load, whole since the declaration was withdrawn, is
 * waited for whole (a stale head event would let the acquire return while
 * it copies). */
static void test_failed_load_leaves_no_block_state(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  mlo_platform *plat = NULL;
  char err[256] = "";
  assert_ok(mlo_platform_open("fault:kind=any,nth=0,inner=host:capacity=4M,bw=2e7", &plat, err,
                              sizeof err));
  rig r;
  rig_build_on(&r, plat);
  assert_ok(mlo_pipeline_materialize(r.tp->pipe));
  /* a load that creates the events, then one counted: the last event call
   * of a load is its own event's record */
  for (int i = 0; i < 2; i++) {
    uint64_t c0[MLO_FAULT_KINDS], c1[MLO_FAULT_KINDS];
    mlo_fault_counts(plat, c0);
    assert_ok(mlo_component_load(r.dit));
    mlo_fault_counts(plat, c1);
    assert_ok(mlo_component_evict(r.dit));
    assert_ok(mlo_platform_synchronize(plat));
    if (i) mlo_fault_arm(plat, MLO_FAULT_EVENT, c1[MLO_FAULT_EVENT] - c0[MLO_FAULT_EVENT]);
  }
  assert_status(mlo_component_load(r.dit), MLO_EPLATFORM);
  assert_true(mlo_fault_fired(plat));
  assert_false(mlo_component_is_resident(r.dit));
  assert_ok(mlo_component_set_progressive(r.dit, 0));
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.progressive, 0);
  mlo_component_stats a = tu_cstats(r.dit);
  assert_ok(mlo_component_acquire(r.dit));
  assert_true(mlo_component_load_done(r.dit));                     /* waited for whole */
  assert_int_equal(tu_cstats(r.dit).copy_calls - a.copy_calls, 2); /* its slab, its lora */
  char why[256];
  assert_true(tu_device_content_ok(r.tp, r.dit, why, sizeof why));
  assert_ok(mlo_component_release(r.dit));
  assert_int_equal(tu_device_used(plat), tu_pstats(r.tp).device_bytes);
  rig_free(&r);
}

/* A residency loaded block by block stays so when the declaration goes (or
 * settings that load whole come in): stream_info says the forward must
 * still begin its blocks until it is evicted. */
static void test_residency_keeps_its_way(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_platform_open("capacity=1M,bw=2e7"));
  assert_ok(mlo_pipeline_materialize(r.tp->pipe));
  assert_ok(mlo_component_load(r.dit));
  assert_ok(mlo_component_set_progressive(r.dit, 0));
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.copy_back = true;
  assert_ok(mlo_offload_enable(r.tp->pipe, &s)); /* moves nothing (C14) */
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.progressive, 1);
  assert_ok(mlo_component_forward(r.dit, forward, &r));
  assert_ok(tu_forward(r.tp, r.enc)); /* evicted, written back whole (copy_back) */
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.progressive, 0);
  char why[256];
  assert_true(tu_host_content_ok(r.tp, r.dit, why, sizeof why));
  tu_assert_forwards_clean(r.tp);
  rig_free(&r);
}

/* Two threads run the DiT's forward at once, one of them switching to the
 * encoder between its forwards (each switch reloads the DiT block by block
 * while the other thread may be waiting to begin its blocks): every block's
 * bytes are right after its begin. */
static void *dit_forwards(void *arg) {
  rig *r = arg;
  for (int i = 0; i < 20; i++)
    if (mlo_component_forward(r->dit, forward, r)) tu_note_failure(r->tp, "dit forward %d", i);
  return NULL;
}

static void *dit_and_enc_forwards(void *arg) {
  rig *r = arg;
  for (int i = 0; i < 20; i++) {
    if (mlo_component_forward(r->dit, forward, r)) tu_note_failure(r->tp, "dit forward %d", i);
    if (tu_forward(r->tp, r->enc)) tu_note_failure(r->tp, "encoder forward %d", i);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_platform_open("capacity=1M,jitter=1,bw=5e7"));
  assert_ok(mlo_offload_enable(r.tp->pipe, NULL));
  pthread_t t[2];
  assert_int_equal(pthread_create(&t[0], NULL, dit_forwards, &r), 0);
  assert_int_equal(pthread_create(&t[1], NULL, dit_and_enc_forwards, &r), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  tu_assert_forwards_clean(r.tp);
  assert_true(tu_cstats(r.dit).loads >= 20); /* after each of the encoder's forwards */
  assert_ok(mlo_pipeline_audit(r.tp->pipe));
  rig_free(&r);
}

/* Every load's end is traced once, paired with its begin, whatever the
 * forward began: under MLO_SYNC_DEVICE at the acquire (it synchronized);
 * with every block in the head (each holds a mutable buffer) at the
 * acquire; evicted while later blocks still copy, at the eviction. */
typedef struct {
  const mlo_component *c;
  int begins, ends, unpaired;
} ends_seen;

static void count_ends(const mlo_trace_event *ev, void *user) {
  ends_seen *e = user;
  if (ev->comp != e->c) return;
  if (ev->kind == MLO_TRACE_LOAD_BEGIN) e->unpaired += e->begins++ != e->ends;
  if (ev->kind == MLO_TRACE_LOAD_END) e->unpaired += ++e->ends != e->begins;
}

static mlo_component *small_dit(tu_pipe *tp, bool all_mutable) {
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &c));
  tu_add_tensor(tp, c, "patch_embedding.weight", 4 * KB, 0);
  char name[64];
  for (int b = 0; b < 4; b++) {
    snprintf(name, sizeof name, "blocks.%d.weight", b);
    tu_add_tensor(tp, c, name, 64 * KB, 0);
    snprintf(name, sizeof name, "blocks.%d.cache", b);
    if (all_mutable) tu_add_tensor(tp, c, name, 4 * KB, MLO_TENSOR_BUFFER | MLO_TENSOR_MUTABLE);
  }
  assert_ok(mlo_component_set_progressive(c, 1));
  return c;
}

static void test_load_end_traced_once(void **state) {
  (void)state;
  for (int k = 0; k < 3; k++) { /* sync device; all in the head; evicted in flight */
    mlo_platform *plat = tu_platform_open(k == 2 ? "capacity=4M,bw=2e6" : "capacity=4M");
    tu_pipe *tp = tu_pipe_new(plat, true);
    mlo_component *dit = small_dit(tp, k == 1), *enc = NULL;
    assert_ok(mlo_component_add(tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &enc));
    tu_add_tensor(tp, enc, "w", 8 * KB, 0);
    ends_seen e = {.c = dit};
    mlo_pipeline_set_trace(tp->pipe, count_ends, &e);
    mlo_offload_settings st = MLO_OFFLOAD_SETTINGS_INIT;
    if (k == 0) st.sync = MLO_SYNC_DEVICE;
    assert_ok(mlo_offload_enable(tp->pipe, &st));
    assert_ok(mlo_component_acquire(dit));
    for (size_t b = 0; b < (k == 2 ? 1 : 4); b++) { /* k == 2: block 0 alone */
      assert_ok(mlo_block_begin(dit, b));
      assert_ok(mlo_block_end(dit, b));
    }
    assert_ok(mlo_component_release(dit));
    if (k < 2) assert_int_equal(e.ends, 1); /* resident, its load known complete */
    assert_ok(tu_forward(tp, enc));         /* evicts it (C4) */
    assert_ok(mlo_component_acquire(dit));  /* and a second residency */
    for (size_t b = 0; b < 4; b++) {
      assert_ok(mlo_block_begin(dit, b));
      assert_ok(mlo_block_end(dit, b));
    }
    assert_ok(mlo_component_release(dit));
    assert_int_equal(e.begins, 2);
    assert_int_equal(e.ends, 2);
    assert_int_equal(e.unpaired, 0);
    mlo_pipeline_set_trace(tp->pipe, NULL, NULL);
    tu_pipe_free(tp);
    mlo_platform_close(plat);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_waits_by_hand),
      cmocka_unit_test(test_bytes_under_jitter),
      cmocka_unit_test(test_fault_sweep),
      cmocka_unit_test(test_failed_load_leaves_no_block_state),
      cmocka_unit_test(test_residency_keeps_its_way),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_load_end_traced_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
