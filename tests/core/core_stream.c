/*
 * core_stream.c — blocks and block streaming (docs/streaming.md), against
 * layouts and plans computed by hand:
 *
 *  - blocks found from the names of every layout mlo reads (Wan, Flux's
 *    two groups in the order they run, T5, GGUF, a single file's prefix),
 *    numbers compared as numbers, prologue and epilogue; declared blocks;
 *  - the slab lays each block out as one contiguous range;
 *  - the budget policy's plan for a DiT larger than the budget: which
 *    blocks stay, how many slots, the footprint, and the refusals;
 *  - a streamed forward: every block's device bytes are the checkpoint's
 *    between its begin and end, under a jittered, throttled copy queue, for
 *    many forwards (a slot overwritten while compute reads it, or read
 *    before its copy landed, shows as wrong bytes); device bytes within the
 *    budget at every audit; the steady state moves exactly the streamed
 *    blocks' bytes per forward; blocks run out of order are loaded on
 *    demand; the API's misuse is refused with the reason;
 *  - the reference workload's digest is the same streamed and resident;
 *  - every platform call of a streamed prompt failed in turn: the failure
 *    comes back as a status, the audit stays clean (device bytes the
 *    platform handed out = the pipeline's), and the next prompt's blocks
 *    are right.
 */
#include "testutil.h"
#include "platform/fault.h"
#include "workload/workload.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KB (1024u)

static mlo_component *add_named(tu_pipe *tp, const char *comp, mlo_role role,
                                const char *const *names, const size_t *bytes, size_t n) {
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, comp, role, &c));
  for (size_t i = 0; i < n; i++) tu_add_tensor(tp, c, names[i], bytes[i], 0);
  return c;
}

static int block_of(mlo_component *c, const char *name) {
  mlo_tensor *t = mlo_component_find_tensor(c, name);
  assert_non_null(t);
  return mlo_tensor_block(t);
}

static void test_blocks_from_names(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  static const char *const wan[] = {"patch_embedding.weight",
                                    "blocks.10.ffn.0.weight",
                                    "blocks.2.self_attn.q.weight",
                                    "blocks.0.self_attn.q.weight",
                                    "blocks.0.ffn.0.weight",
                                    "norm_out.weight",
                                    "condition_embedder.time_proj.weight",
                                    "scale_shift_table",
                                    "blocks.2.norm3.weight",
                                    "head.head.weight"};
  size_t b4[10];
  for (size_t i = 0; i < 10; i++) b4[i] = 64 * (i + 1);
  mlo_component *w = add_named(tp, "transformer", MLO_ROLE_DIT, wan, b4, 10);
  assert_int_equal(mlo_component_block_count(w), 3);
  assert_int_equal(block_of(w, "blocks.0.ffn.0.weight"), 0);
  assert_int_equal(block_of(w, "blocks.2.norm3.weight"), 1);
  assert_int_equal(block_of(w, "blocks.10.ffn.0.weight"), 2); /* 10 after 2: numbers */
  assert_int_equal(block_of(w, "patch_embedding.weight"), MLO_BLOCK_PROLOGUE);
  assert_int_equal(block_of(w, "condition_embedder.time_proj.weight"), MLO_BLOCK_PROLOGUE);
  assert_int_equal(block_of(w, "norm_out.weight"), MLO_BLOCK_EPILOGUE);
  assert_int_equal(block_of(w, "head.head.weight"), MLO_BLOCK_EPILOGUE);
  assert_int_equal(block_of(w, "scale_shift_table"), MLO_BLOCK_EPILOGUE);

  /* Flux: the double-stream blocks run before the single-stream ones,
   * whichever sorts first by name */
  static const char *const flux[] = {"single_transformer_blocks.0.proj_out.weight",
                                     "transformer_blocks.1.attn.to_q.weight",
                                     "x_embedder.weight",
                                     "transformer_blocks.0.attn.to_q.weight",
                                     "single_transformer_blocks.1.norm.linear.weight",
                                     "proj_out.weight"};
  size_t b6[6] = {64, 64, 64, 64, 64, 64};
  mlo_component *f = add_named(tp, "flux", MLO_ROLE_DIT, flux, b6, 6);
  assert_int_equal(mlo_component_block_count(f), 4);
  assert_int_equal(block_of(f, "transformer_blocks.0.attn.to_q.weight"), 0);
  assert_int_equal(block_of(f, "transformer_blocks.1.attn.to_q.weight"), 1);
  assert_int_equal(block_of(f, "single_transformer_blocks.0.proj_out.weight"), 2);
  assert_int_equal(block_of(f, "single_transformer_blocks.1.norm.linear.weight"), 3);
  assert_int_equal(block_of(f, "proj_out.weight"), MLO_BLOCK_EPILOGUE);
  assert_int_equal(block_of(f, "x_embedder.weight"), MLO_BLOCK_PROLOGUE);

  /* T5, GGUF, a single file's prefix, and names that only look alike */
  static const char *const misc[] = {"encoder.block.3.layer.0.SelfAttention.q.weight",
                                     "encoder.block.1.layer.1.DenseReluDense.wi.weight",
                                     "encoder.final_layer_norm.weight",
                                     "shared.weight",
                                     "blocks.x.weight",
                                     "blocks.7"};
  mlo_component *t5 = add_named(tp, "text_encoder", MLO_ROLE_ENCODER, misc, b6, 6);
  assert_int_equal(mlo_component_block_count(t5), 2);
  assert_int_equal(block_of(t5, "encoder.block.1.layer.1.DenseReluDense.wi.weight"), 0);
  assert_int_equal(block_of(t5, "encoder.block.3.layer.0.SelfAttention.q.weight"), 1);
  assert_int_equal(block_of(t5, "encoder.final_layer_norm.weight"), MLO_BLOCK_EPILOGUE);
  assert_int_equal(block_of(t5, "blocks.x.weight"), MLO_BLOCK_PROLOGUE);
  assert_int_equal(block_of(t5, "blocks.7"), MLO_BLOCK_PROLOGUE);
  static const char *const gguf[] = {"blk.0.attn_q.weight", "token_embd.weight",
                                     "blk.1.attn_q.weight", "output_norm.weight",
                                     "model.diffusion_model.double_blocks.0.img_attn.qkv.weight"};
  mlo_component *g = add_named(tp, "gguf", MLO_ROLE_ENCODER, gguf, b6, 5);
  assert_int_equal(mlo_component_block_count(g), 3);
  assert_int_equal(block_of(g, "blk.1.attn_q.weight"), 1); /* "blk." sorts before "model." */
  assert_int_equal(block_of(g, "model.diffusion_model.double_blocks.0.img_attn.qkv.weight"), 2);
  assert_int_equal(block_of(g, "output_norm.weight"), MLO_BLOCK_EPILOGUE);
  assert_int_equal(block_of(g, "token_embd.weight"), MLO_BLOCK_PROLOGUE);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* After materialization each piece is one range of the slab holding
 * exactly its tensors, and the pieces follow each other in order. */
static void test_blocks_contiguous(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  static const char *const names[] = {"blocks.1.b", "head.w",     "blocks.0.a", "embed.w",
                                      "blocks.1.a", "blocks.0.b", "blocks.2.a"};
  size_t bytes[] = {1000, 300, 2000, 100, 700, 52, 4096};
  mlo_component *c = add_named(tp, "transformer", MLO_ROLE_DIT, names, bytes, 7);
  assert_ok(mlo_component_materialize(c));
  size_t n = 0;
  mlo_block_info info[8];
  assert_ok(mlo_component_blocks(c, info, 8, &n));
  assert_int_equal(n, 5);
  assert_int_equal(info[0].block, MLO_BLOCK_PROLOGUE);
  assert_int_equal(info[4].block, MLO_BLOCK_EPILOGUE);
  const char *base = NULL;
  for (size_t i = 0; i < 7; i++) {
    const char *h = mlo_tensor_host_data(mlo_component_find_tensor(c, names[i]));
    if (!base || h < base) base = h;
  }
  for (size_t i = 0; i < 7; i++) {
    const mlo_tensor *t = mlo_component_find_tensor(c, names[i]);
    uint64_t off = (uint64_t)((const char *)mlo_tensor_host_data(t) - base);
    int b = mlo_tensor_block(t);
    const mlo_block_info *in = &info[b == MLO_BLOCK_PROLOGUE   ? 0
                                     : b == MLO_BLOCK_EPILOGUE ? 4
                                                               : b + 1];
    assert_true(off >= in->offset && off + bytes[i] <= in->offset + in->bytes);
  }
  for (size_t i = 1; i < 5; i++)
    assert_true(info[i].offset >= info[i - 1].offset + info[i - 1].bytes);
  assert_int_equal(info[1].tensors, 2);
  assert_int_equal(info[3].tensors, 1);
  char why[256];
  assert_true(tu_host_content_ok(tp, c, why, sizeof why));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_declared_blocks(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *c = NULL;
  assert_ok(mlo_component_add(tp->pipe, "engine", MLO_ROLE_DIT, &c));
  mlo_tensor *a = tu_add_tensor(tp, c, "blocks.0.w", 256, 0); /* names are not read once declared */
  mlo_tensor *b = tu_add_tensor(tp, c, "w_last", 256, 0);
  mlo_tensor *d = tu_add_tensor(tp, c, "w_first", 256, 0);
  mlo_tensor *e = tu_add_tensor(tp, c, "final", 256, 0);
  assert_status(mlo_tensor_set_block(b, -3), MLO_EINVAL);
  assert_status(mlo_tensor_set_block(b, MLO_BLOCK_MAX + 1), MLO_EINVAL);
  assert_ok(mlo_tensor_set_block(b, 70));
  assert_ok(mlo_tensor_set_block(d, 5));
  assert_ok(mlo_tensor_set_block(e, MLO_BLOCK_EPILOGUE));
  assert_int_equal(mlo_component_block_count(c), 2); /* 5 and 70: the gap closes */
  assert_int_equal(mlo_tensor_block(d), 0);
  assert_int_equal(mlo_tensor_block(b), 1);
  assert_int_equal(mlo_tensor_block(a), MLO_BLOCK_PROLOGUE);
  assert_int_equal(mlo_tensor_block(e), MLO_BLOCK_EPILOGUE);
  assert_ok(mlo_component_materialize(c));
  assert_status(mlo_tensor_set_block(a, 1), MLO_ESTATE);
  assert_int_equal(mlo_tensor_block(b), 1);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* ---- streaming ---------------------------------------------------------- */

/* A DiT of a 4 KiB prologue, 8 blocks of 16 KiB (two tensors each) and a
 * 4 KiB epilogue (136 KiB), with a 8 KiB encoder and a 8 KiB VAE. */
#define NBLK 8
typedef struct {
  mlo_platform *plat;
  tu_pipe *tp;
  mlo_component *dit, *enc, *vae;
  mlo_tensor *blk[NBLK][2];
} rig;

static void rig_build_on(rig *r, mlo_platform *plat, bool pin) {
  memset(r, 0, sizeof *r);
  r->plat = plat;
  r->tp = tu_pipe_new(r->plat, pin);
  assert_ok(mlo_component_add(r->tp->pipe, "transformer", MLO_ROLE_DIT, &r->dit));
  tu_add_tensor(r->tp, r->dit, "patch_embedding.weight", 4 * KB, 0);
  char name[64];
  for (int b = 0; b < NBLK; b++) {
    snprintf(name, sizeof name, "blocks.%d.attn.weight", b);
    r->blk[b][0] = tu_add_tensor(r->tp, r->dit, name, 6 * KB, 0);
    snprintf(name, sizeof name, "blocks.%d.ffn.weight", b);
    r->blk[b][1] = tu_add_tensor(r->tp, r->dit, name, 10 * KB, 0);
  }
  tu_add_tensor(r->tp, r->dit, "proj_out.weight", 4 * KB, 0);
  assert_ok(mlo_component_add(r->tp->pipe, "text_encoder", MLO_ROLE_ENCODER, &r->enc));
  tu_add_tensor(r->tp, r->enc, "w", 8 * KB, 0);
  assert_ok(mlo_component_add(r->tp->pipe, "vae", MLO_ROLE_VAE, &r->vae));
  tu_add_tensor(r->tp, r->vae, "w", 8 * KB, 0);
}

static void rig_build(rig *r, const char *host_opts) {
  rig_build_on(r, tu_platform_open(host_opts), true);
}

static void rig_free(rig *r) {
  tu_pipe_free(r->tp);
  mlo_platform_close(r->plat);
}

static int enable_budget(rig *r, uint64_t budget) {
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = budget;
  return mlo_offload_enable(r->tp->pipe, &s);
}

/* The budget policy with prefetch, on the schedule of a prompt: the
 * encoder, four DiT steps, the VAE. */
static int enable_prefetching(rig *r, uint64_t budget) {
  mlo_schedule_entry sched[] = {{r->enc, 1}, {r->dit, 4}, {r->vae, 1}};
  int rc = mlo_pipeline_set_schedule(r->tp->pipe, sched, 3);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = budget;
  s.prefetch = true;
  return rc ? rc : mlo_offload_enable(r->tp->pipe, &s);
}

/* Reads block b's tensors through their device copies and compares them
 * with the checkpoint's bytes; false (with a note) if any differs. */
static bool block_ok(rig *r, int b) {
  for (int k = 0; k < 2; k++) {
    const mlo_tensor *t = r->blk[b][k];
    size_t n = (size_t)mlo_tensor_nbytes(t);
    unsigned char *buf = malloc(n);
    int rc = tu_read_device(r->tp, t, buf, n);
    bool same = rc == MLO_OK && !memcmp(buf, mlo_tensor_host_data(t), n);
    free(buf);
    if (!same) {
      tu_note_failure(r->tp, "block %d tensor %d: %s", b, k, rc ? mlo_err_name(rc) : "wrong bytes");
      return false;
    }
  }
  return true;
}

/* A forward that runs the blocks in order, each read between its begin
 * and end, as compute would. */
static int streamed_forward(mlo_component *c, void *user) {
  rig *r = user;
  for (int b = 0; b < NBLK; b++) {
    int rc = mlo_block_begin(c, (size_t)b);
    if (rc) {
      tu_note_failure(r->tp, "begin %d: %s", b, mlo_err_name(rc));
      return 1;
    }
    bool ok = block_ok(r, b);
    if ((rc = mlo_block_end(c, (size_t)b)) || !ok) return 1;
  }
  return 0;
}

/* The plan, by hand: fixed 8 KiB; each kept block saves 16 KiB and the
 * slots are 2 x 16 KiB.  A 72 KiB budget keeps 8 + 32 + 32: two blocks
 * resident, six through the slots, spread over the forward: the k-th of 6
 * at (2k + 1) 8 / 12, blocks 0, 2, 3, 4, 6 and 7, so 1 and 5 stay. */
static void test_plan_by_hand(void **state) {
  (void)state;
  rig r;
  rig_build(&r, "capacity=1M");
  /* the least budget it streams in, known before anything is read: the
   * fixed 8 KiB and two slots of 16 KiB */
  assert_int_equal(mlo_component_stream_least(r.dit), 40 * KB);
  assert_int_equal(mlo_component_stream_least(r.enc), 8 * KB); /* no blocks: whole */
  assert_ok(enable_budget(&r, 72 * KB));
  assert_int_equal(mlo_component_stream_least(r.dit), 40 * KB);
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.blocks, NBLK);
  assert_int_equal(si.resident_blocks, 2);
  assert_int_equal(si.streamed_blocks, 6);
  assert_int_equal(si.slots, MLO_STREAM_SLOTS);
  assert_int_equal(si.slot_bytes, 16 * KB);
  assert_int_equal(si.device_bytes, 72 * KB);
  assert_int_equal(si.streamed_bytes, 6 * 16 * KB);
  assert_ok(mlo_component_acquire(r.dit));
  for (int b = 0; b < NBLK; b++) { /* a kept block has a device copy outside its begin */
    size_t off;
    int rc = mlo_tensor_device(r.blk[b][1], NULL, &off);
    if (rc != (b == 1 || b == 5 ? MLO_OK : MLO_ESTATE))
      fail_msg("block %d: %s", b, mlo_err_name(rc));
  }
  mlo_component_release(r.dit);
  assert_ok(mlo_component_stream_info(r.enc, &si)); /* fits: moves whole */
  assert_int_equal(si.slots, 0);
  assert_int_equal(si.device_bytes, 8 * KB);
  assert_ok(mlo_offload_disable(r.tp->pipe));
  /* 40 KiB is the least it streams in (nothing kept); below, refused with
   * the figure */
  assert_ok(enable_budget(&r, 40 * KB));
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.resident_blocks, 0);
  assert_int_equal(si.device_bytes, 40 * KB);
  assert_ok(mlo_offload_disable(r.tp->pipe));
  assert_status(enable_budget(&r, 39 * KB), MLO_ENOMEM_DEVICE);
  assert_true(tu_contains_ci(mlo_pipeline_errmsg(r.tp->pipe), "needs at least 40.0 KiB"));
  assert_false(mlo_offload_is_enabled(r.tp->pipe));
  /* the strict policy moves components whole, as the specification says */
  assert_ok(mlo_offload_enable(r.tp->pipe, NULL));
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.slots, 0);
  assert_ok(mlo_offload_disable(r.tp->pipe));
  /* a DiT left resident and streamed by the budget stays so (C14: disable
   * moves nothing); once evicted under strict it moves whole again */
  assert_ok(enable_budget(&r, 72 * KB));
  assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
  assert_ok(mlo_offload_disable(r.tp->pipe));
  assert_true(mlo_component_is_resident(r.dit));
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.slots, MLO_STREAM_SLOTS);
  mlo_offload_settings strict = MLO_OFFLOAD_SETTINGS_INIT;
  assert_ok(mlo_offload_enable(r.tp->pipe, &strict));
  assert_ok(tu_forward(r.tp, r.enc)); /* C4: the encoder evicts the DiT */
  assert_false(mlo_component_is_resident(r.dit));
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.slots, 0);
  assert_int_equal(si.device_bytes, 136 * KB);
  tu_assert_forwards_clean(r.tp);
  rig_free(&r);
}

/* A forward on the simulated device (a virtual clock, sim.c): each block
 * computes compute_ns between its begin and end. */
typedef struct {
  rig *r;
  uint64_t compute_ns;
} timed;

static int timed_forward(mlo_component *c, void *user) {
  timed *t = user;
  for (size_t b = 0; b < NBLK; b++) {
    int rc = mlo_block_begin(c, b);
    if (!rc) rc = mlo_sim_compute(t->r->plat, t->compute_ns);
    if (!rc) rc = mlo_block_end(c, b);
    if (rc) return rc;
  }
  return 0;
}

/* Which blocks of one size stream, and when their copies go, by hand.
 * A 104 KiB budget keeps four of the eight 16 KiB blocks (8 + 64 + 32);
 * spread over the forward, blocks 1, 3, 5 and 7 stream (the k-th of s in
 * the middle of the k-th of s equal parts of n: (2k + 1) n / 2s).  On a
 * 1 GB/s simulated link a block's copy takes L = 16.384 us; u = L / 2.
 *
 * First forward, a block's compute = L, loaded at its acquire: the head
 * (8 KiB) [0,1]u, block 0 [1,3], slot <- 1 [3,5], block 2 [5,7], slot <-
 * 3 [7,9], block 4 [9,11]: kept blocks go between the slots' copies in the
 * forward's order.  The acquire waits 1u, block 0 2u; from then each copy
 * lands as the block before it ends (block 5's copy, issued at 1's end
 * at 7u, queues behind 4's and lands at 13u, when 4 ends; 6 goes before 7
 * at 3's end).  Waited: 3u.  Issued the old way, every kept block before
 * any slot, block 1 would wait until 11u: 9u in all.
 *
 * Then forwards whose block computes L / 2 (the link half as fast as
 * compute; the copies per forward, 4L, equal its compute, 8 x L/2): each
 * streamed copy lands as the kept block before it ends, so no block waits
 * at all, and a forward is max(compute, bytes / link) to the nanosecond.
 * With blocks 4-7 streaming (the first four kept), the kept blocks'
 * compute would leave the link idle and blocks 6 and 7 would wait 1u
 * each, every forward. */
static void test_spread_by_hand(void **state) {
  (void)state;
  rig r;
  rig_build_on(&r, tu_open_spec("sim:capacity=1M,link=1e9"), false);
  assert_ok(mlo_pipeline_materialize(r.tp->pipe));
  assert_ok(enable_budget(&r, 104 * KB));
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.resident_blocks, 4);
  assert_int_equal(si.streamed_blocks, 4);
  const uint64_t L = tu_copy_ns(16 * KB, 1000000000ull), u = L / 2;
  timed t = {&r, L};
  assert_ok(mlo_component_forward(r.dit, timed_forward, &t));
  mlo_component_stats s0 = tu_cstats(r.dit);
  tu_assert_near_ns(s0.wait_ns, 3 * u);
  tu_assert_near_ns(s0.block_wait_ns, 2 * u);
  assert_int_equal(s0.h2d_bytes, 8 * KB + 8 * 16 * KB + 2 * 16 * KB); /* and the next two */
  t.compute_ns = u;
  for (int f = 0; f < 3; f++) {
    mlo_component_stats a = tu_cstats(r.dit);
    assert_ok(mlo_component_forward(r.dit, timed_forward, &t));
    mlo_component_stats b = tu_cstats(r.dit);
    tu_assert_near_ns(b.wait_ns - a.wait_ns, 0);
    assert_int_equal(b.h2d_bytes - a.h2d_bytes, 4 * 16 * KB);
  }
  /* kept blocks have a device copy outside their begin; streamed ones not */
  assert_ok(mlo_component_acquire(r.dit));
  for (int b = 0; b < NBLK; b++) {
    size_t off;
    int rc = mlo_tensor_device(r.blk[b][0], NULL, &off);
    if (rc != (b % 2 ? MLO_ESTATE : MLO_OK)) fail_msg("block %d: %s", b, mlo_err_name(rc));
  }
  mlo_component_release(r.dit);
  tu_assert_audit(r.tp);
  rig_free(&r);
}

/* A streamed plan's kept blocks wait for the refills of its own forward
 * only when that forward is next; ahead of another's forward they go at its
 * acquire.  Kept blocks 1 and 5 (test_plan_by_hand).  A load issues the
 * head (8 KiB), slot <- 0, block 1, slot <- 2: 56 KiB, block 5 left for
 * the refill before block 6.
 *  - 72 KiB budget: the DiT cannot sit beside the encoder; the encoder's
 *    release prefetches it, and with nothing else to run it stays at
 *    56 KiB until its own forward.
 *  - 80 KiB: enable prefetches the encoder and the DiT (8 + 72); the
 *    encoder's acquire issues block 5 under its forward: 72 KiB. */
static void test_kept_blocks_and_prefetch(void **state) {
  (void)state;
  for (int wide = 0; wide < 2; wide++) {
    rig r;
    rig_build(&r, "capacity=1M,jitter=1");
    assert_ok(enable_prefetching(&r, wide ? 80 * KB : 72 * KB));
    assert_int_equal(tu_cstats(r.dit).h2d_bytes, wide ? 56 * KB : 0);
    assert_ok(mlo_component_acquire(r.enc));
    assert_int_equal(tu_cstats(r.dit).h2d_bytes, wide ? 72 * KB : 0);
    assert_ok(mlo_component_release(r.enc));
    assert_true(mlo_component_is_resident(r.dit));
    assert_int_equal(tu_cstats(r.dit).h2d_bytes, wide ? 72 * KB : 56 * KB);
    assert_ok(mlo_component_forward(r.dit, streamed_forward, &r)); /* bytes right */
    /* the forward moved block 5, the other four streamed and the next two */
    assert_int_equal(tu_cstats(r.dit).h2d_bytes, 72 * KB + 6 * 16 * KB);
    tu_assert_forwards_clean(r.tp);
    tu_assert_audit(r.tp);
    rig_free(&r);
  }
}

/* Block b's device bytes read straight (the host device is host memory),
 * as compute would: no copy, no synchronize in between. */
static bool block_landed(rig *r, int b) {
  for (int k = 0; k < 2; k++) {
    const mlo_tensor *t = r->blk[b][k];
    const void *p = mlo_tensor_device_ptr(t);
    if (!p || memcmp(p, mlo_tensor_host_data(t), (size_t)mlo_tensor_nbytes(t))) return false;
  }
  return true;
}

/* Kept blocks whose copies a streamed load deferred are issued wherever
 * their bytes are promised (a review found each of these broken):
 *  - under MLO_SYNC_DEVICE, whose begin waits for nothing (the acquire
 *    synchronized): a DiT loaded under EVENT keeps block 5 deferred across
 *    disable and an enable with DEVICE (C14), and its begin reads it;
 *  - mlo_pipeline_synchronize ("every load this pipeline issued"), and
 *    disable: a DiT prefetched at the encoder's release, never run. */
static void test_deferred_blocks_land(void **state) {
  (void)state;
  for (int trial = 0; trial < 3; trial++) {
    rig r;
    rig_build(&r, "capacity=1M,bw=5e7"); /* a copy of a block: 0.3 ms */
    assert_ok(enable_budget(&r, 72 * KB));
    assert_ok(mlo_component_acquire(r.dit));
    assert_ok(mlo_component_release(r.dit));
    assert_int_equal(tu_cstats(r.dit).h2d_bytes, 56 * KB); /* block 5 deferred */
    assert_ok(mlo_offload_disable(r.tp->pipe));            /* ... and now issued: C14 keeps it */
    assert_int_equal(tu_cstats(r.dit).h2d_bytes, 72 * KB);
    mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
    s.policy = MLO_POLICY_BUDGET;
    s.budget_bytes = 72 * KB;
    s.sync = MLO_SYNC_DEVICE;
    assert_ok(mlo_offload_enable(r.tp->pipe, &s));
    assert_ok(mlo_component_acquire(r.dit));
    assert_ok(mlo_block_begin(r.dit, 5)); /* out of order: allowed */
    assert_true(block_landed(&r, 5));
    assert_ok(mlo_block_end(r.dit, 5));
    assert_ok(mlo_component_release(r.dit));
    rig_free(&r);
  }
  for (int how = 0; how < 2; how++) {
    rig r;
    rig_build(&r, "capacity=1M,bw=5e7");
    assert_ok(enable_prefetching(&r, 72 * KB));
    assert_ok(tu_forward(r.tp, r.enc)); /* its release prefetches the DiT */
    assert_true(mlo_component_is_resident(r.dit));
    assert_false(mlo_component_load_done(r.dit)); /* block 5 not even issued */
    if (how) assert_ok(mlo_offload_disable(r.tp->pipe));
    assert_ok(mlo_pipeline_synchronize(r.tp->pipe));
    assert_true(mlo_component_load_done(r.dit));
    for (int b = 1; b < NBLK; b += 4) assert_true(block_landed(&r, b)); /* kept: 1 and 5 */
    rig_free(&r);
  }
}

/* The first tensor of c whose device copy the API gives (a streamed
 * block outside its begin has none) and does not hold its host bytes
 * there; NULL if there is none. */
static const char *not_landed(mlo_component *c) {
  for (size_t i = 0; i < mlo_component_tensor_count(c); i++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    const void *p = mlo_tensor_device_ptr(t);
    if (p && memcmp(p, mlo_tensor_host_data(t), (size_t)mlo_tensor_nbytes(t)))
      return mlo_tensor_name(t);
  }
  return NULL;
}

/* A forward aborted after block 1 (an exception in the caller's model:
 * blocks 0 and 1 begun and ended, then the release), kept blocks 1 and 5
 * (test_plan_by_hand): block 5's copy was deferred to the refill before
 * block 6, which never came, yet mlo_tensor_device answers for it.
 * mlo_pipeline_synchronize promises every load complete, so after it the
 * component's load is done and every device copy the API gives holds its
 * bytes: whether it comes after the release, or before it, while the
 * thread still holds the component (mlo.torch's release hook checks the
 * weights for writes there, and read block 5's never-copied bytes as a
 * write and copied them over the slab).  The next forward reads right
 * bytes in every block, and so does one after an eviction and a reload. */
static void test_aborted_forward_lands(void **state) {
  (void)state;
  for (int held = 0; held < 2; held++) {
    rig r;
    rig_build(&r, "capacity=1M,bw=5e7"); /* a copy of a block: 0.3 ms */
    assert_ok(enable_budget(&r, 72 * KB));
    assert_ok(mlo_component_acquire(r.dit));
    for (size_t b = 0; b < 2; b++) {
      assert_ok(mlo_block_begin(r.dit, b));
      assert_true(block_ok(&r, (int)b));
      assert_ok(mlo_block_end(r.dit, b));
    }
    if (!held) assert_ok(mlo_component_release(r.dit));
    assert_false(mlo_component_load_done(r.dit)); /* block 5 not issued */
    assert_ok(mlo_pipeline_synchronize(r.tp->pipe));
    assert_true(mlo_component_load_done(r.dit));
    assert_non_null(mlo_tensor_device_ptr(r.blk[5][0]));
    const char *bad = not_landed(r.dit);
    if (bad) fail_msg("held %d: %s's device bytes were never copied", held, bad);
    if (held) assert_ok(mlo_component_release(r.dit));
    assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
    assert_ok(tu_forward(r.tp, r.enc)); /* 72 KiB: the encoder evicts the DiT */
    assert_false(mlo_component_is_resident(r.dit));
    assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
    tu_assert_forwards_clean(r.tp);
    tu_assert_audit(r.tp);
    rig_free(&r);
  }
}

/* Which blocks stream, predicted (mlo_component_streamed_bytes: the disk
 * tier and mlo inspect) and planned, where blocks of one aligned size
 * differ in bytes: block b's ffn tensor 8 b bytes short. */
static void test_streamed_bytes_predicted(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open("capacity=1M");
  tu_pipe *tp = tu_pipe_new(plat, true);
  mlo_component *dit = NULL;
  assert_ok(mlo_component_add(tp->pipe, "transformer", MLO_ROLE_DIT, &dit));
  tu_add_tensor(tp, dit, "patch_embedding.weight", 4 * KB, 0);
  uint64_t kept = 0;
  for (int b = 0; b < NBLK; b++) {
    char name[64];
    snprintf(name, sizeof name, "blocks.%d.attn.weight", b);
    tu_add_tensor(tp, dit, name, 6 * KB, 0);
    snprintf(name, sizeof name, "blocks.%d.ffn.weight", b);
    tu_add_tensor(tp, dit, name, 10 * KB - 8 * (size_t)b, 0);
    if (b == 1 || b == 5) kept += 16 * KB - 8 * (uint64_t)b; /* spread: 1 and 5 stay */
  }
  tu_add_tensor(tp, dit, "proj_out.weight", 4 * KB, 0);
  assert_ok(mlo_pipeline_materialize(tp->pipe));
  uint64_t predicted = mlo_component_streamed_bytes(dit, 72 * KB);
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = MLO_POLICY_BUDGET;
  s.budget_bytes = 72 * KB;
  assert_ok(mlo_offload_enable(tp->pipe, &s));
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(dit, &si));
  assert_int_equal(si.streamed_bytes, 8 * 16 * KB - 8 * 28 - kept);
  assert_int_equal(predicted, si.streamed_bytes);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

/* Many forwards through a throttled, jittered link: every block's bytes are
 * right between its begin and end, the device stays within the budget at
 * every audit, and the steady state moves the streamed blocks' bytes and
 * no more. */
static void test_streamed_forwards(void **state) {
  (void)state;
  rig r;
  rig_build(&r, "capacity=1M,jitter=1,bw=2e8");
  r.tp->audit_in_forward = true;
  mlo_pipeline_set_audit(r.tp->pipe, true);
  assert_ok(enable_budget(&r, 72 * KB));
  mlo_schedule_entry sched[] = {{r.enc, 1}, {r.dit, 4}, {r.vae, 1}};
  assert_ok(mlo_pipeline_set_schedule(r.tp->pipe, sched, 3));
  for (int prompt = 0; prompt < 3; prompt++) {
    mlo_component_stats p0, p1, before, after;
    assert_ok(mlo_component_get_stats(r.dit, &p0));
    /* Prompt 0: the encoder's release prefetches the DiT (its resident
     * part, and its first two streamed blocks into the slots).  From prompt
     * 1 the VAE, prefetched beside the encoder and needed right after the
     * DiT's run, may not be displaced by a prefetch (budget.c), so the DiT
     * loads at its first step, the two slots with it. */
    assert_ok(tu_forward(r.tp, r.enc));
    for (int step = 0; step < 4; step++) {
      assert_ok(mlo_component_get_stats(r.dit, &before));
      assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
      assert_ok(mlo_component_get_stats(r.dit, &after));
      /* each forward issues the blocks after the first two, and the next
       * step's first two while its last ones run; the last step does not
       * (the VAE is next) */
      uint64_t want = step == 3 ? 4 : step == 0 && prompt > 0 ? 8 : 6;
      assert_int_equal(after.block_loads - before.block_loads, want);
      tu_assert_audit(r.tp);
    }
    assert_ok(tu_forward(r.tp, r.vae));
    assert_ok(mlo_component_get_stats(r.dit, &p1));
    /* a prompt moves the resident part once (4 + 32 + 4 KiB) and each
     * streamed block once per step: not a byte wasted */
    assert_int_equal(p1.loads - p0.loads, 1);
    assert_int_equal(p1.block_loads - p0.block_loads, 4 * 6);
    assert_int_equal(p1.h2d_bytes - p0.h2d_bytes, 40 * KB + 4 * 6 * 16 * KB);
  }
  tu_assert_forwards_clean(r.tp);
  mlo_pipeline_stats ps;
  assert_ok(mlo_pipeline_get_stats(r.tp->pipe, &ps));
  assert_true(ps.peak_device_bytes <= 72 * KB);
  mlo_component_stats ds;
  assert_ok(mlo_component_get_stats(r.dit, &ds));
  assert_int_equal(ps.total.block_loads, ds.block_loads); /* only the DiT streams */
  assert_int_equal(ps.total.block_wait_ns, ds.block_wait_ns);
  rig_free(&r);
}

static void test_block_rules(void **state) {
  (void)state;
  rig r;
  rig_build(&r, "capacity=1M,jitter=1");
  assert_ok(enable_budget(&r, 72 * KB));
  /* outside an acquire */
  assert_status(mlo_block_begin(r.dit, 0), MLO_ESTATE);
  assert_ok(mlo_component_acquire(r.dit));
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(r.dit, &si));
  /* the largest blocks stay; with equal sizes, spread: 1 and 5 */
  void *blk = NULL;
  size_t off = 0;
  assert_ok(mlo_tensor_device(r.blk[1][0], &blk, &off));
  assert_status(mlo_block_end(r.dit, 1), MLO_ESTATE); /* a kept block never begun */
  assert_status(mlo_tensor_device(r.blk[7][0], &blk, &off), MLO_ESTATE);
  assert_true(tu_contains_ci(mlo_pipeline_errmsg(r.tp->pipe), "mlo_block_begin"));
  assert_status(mlo_block_begin(r.dit, NBLK), MLO_EINVAL);
  assert_status(mlo_block_end(r.dit, 7), MLO_ESTATE); /* a streamed block never begun */
  /* out of order: on demand, right bytes */
  assert_ok(mlo_block_begin(r.dit, 6));
  assert_true(block_ok(&r, 6));
  assert_ok(mlo_block_begin(r.dit, 6)); /* again: counted, as a second thread's would be */
  assert_ok(mlo_block_end(r.dit, 6));
  assert_true(block_ok(&r, 6)); /* still begun once */
  assert_ok(mlo_block_begin(r.dit, 2));
  assert_true(block_ok(&r, 2));
  /* both slots are in use, by this thread: it may not wait for them */
  assert_status(mlo_block_begin(r.dit, 4), MLO_EBUSY);
  assert_true(tu_contains_ci(mlo_pipeline_errmsg(r.tp->pipe), "by this thread"));
  assert_ok(mlo_block_end(r.dit, 6));
  assert_ok(mlo_block_begin(r.dit, 4));
  assert_true(block_ok(&r, 4));
  assert_ok(mlo_block_end(r.dit, 4));
  /* a kept block's begin orders compute after its own copy (the load is
   * progressive), then nothing more to do */
  assert_ok(mlo_block_begin(r.dit, 1));
  assert_true(block_ok(&r, 1));
  assert_ok(mlo_block_end(r.dit, 1));
  assert_status(mlo_component_shard(r.dit, NULL, NULL, NULL), MLO_EUNSUPPORTED);
  /* block 2 left begun: the release ends it (the audit stays clean) */
  assert_ok(mlo_component_release(r.dit));
  tu_assert_audit(r.tp);
  /* a component that moves whole takes begin/end as no-ops in an acquire */
  assert_ok(mlo_component_acquire(r.enc));
  assert_status(mlo_block_begin(r.enc, 0), MLO_EINVAL); /* it has no blocks */
  assert_ok(mlo_component_release(r.enc));
  /* the next forward is right whatever state the last one left */
  assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
  tu_assert_forwards_clean(r.tp);
  rig_free(&r);
}

/* The reference workload's digest: all-resident, strict (whole loads and
 * progressive ones), and streamed through a budget well below the DiT,
 * under jitter. */
static uint64_t workload_digest(const char *mode) {
  mlo_platform *plat = tu_platform_open("capacity=16M,jitter=1");
  mlo_pipeline_options o = MLO_PIPELINE_OPTIONS_INIT;
  o.platform = plat;
  mlo_pipeline *pipe = NULL;
  assert_ok(mlo_pipeline_create(&o, &pipe));
  static const char *const comps[] = {"text_encoder", "transformer", "vae"};
  static const mlo_role roles[] = {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE};
  static float data[3][12][64 * 32];
  for (int ci = 0; ci < 3; ci++) {
    mlo_component *c = NULL;
    assert_ok(mlo_component_add(pipe, comps[ci], roles[ci], &c));
    for (int k = 0; k < 12; k++) {
      for (int e = 0; e < 64 * 32; e++) data[ci][k][e] = (float)((ci * 7 + k * 3 + e) % 17) / 8.f;
      char name[64];
      if (k == 0)
        snprintf(name, sizeof name, "embed.weight");
      else if (k == 11)
        snprintf(name, sizeof name, "norm_out.weight");
      else
        snprintf(name, sizeof name, "blocks.%d.%s.weight", (k - 1) / 2, k % 2 ? "attn" : "ffn");
      mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
      d.name = name;
      d.dtype = MLO_DTYPE_F32;
      d.ndim = 2;
      d.shape[0] = 64;
      d.shape[1] = 32;
      d.data = data[ci][k];
      assert_ok(mlo_tensor_add(c, &d, NULL));
    }
  }
  if (!strcmp(mode, "resident")) {
    assert_ok(mlo_pipeline_load_all(pipe));
  } else if (!strcmp(mode, "strict")) {
    assert_ok(mlo_offload_enable(pipe, NULL));
  } else if (!strcmp(mode, "progressive")) { /* strict, each load block by block */
    for (size_t i = 0; i < 3; i++)
      assert_ok(mlo_component_set_progressive(mlo_pipeline_component_at(pipe, i), 1));
    assert_ok(mlo_offload_enable(pipe, NULL));
  } else if (!strcmp(mode, "joined")) { /* one component's room: every switch joined */
    for (size_t i = 0; i < 3; i++)
      assert_ok(mlo_component_set_progressive(mlo_pipeline_component_at(pipe, i), 1));
    assert_ok(mlo_pipeline_learn_schedule(pipe, true));
    mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
    s.policy = MLO_POLICY_BUDGET;
    s.budget_bytes = mlo_component_bytes(mlo_pipeline_find(pipe, "transformer"));
    s.prefetch = true;
    assert_ok(mlo_offload_enable(pipe, &s));
    mlo_pipeline_set_audit(pipe, true);
  } else {
    mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
    s.policy = MLO_POLICY_BUDGET;
    s.budget_bytes = 60 * KB; /* each component is 96 KiB */
    assert_ok(mlo_offload_enable(pipe, &s));
    mlo_stream_info si;
    assert_ok(mlo_component_stream_info(mlo_pipeline_find(pipe, "transformer"), &si));
    assert_true(si.streamed_blocks > 0);
    mlo_pipeline_set_audit(pipe, true);
  }
  char err[256] = "";
  mlo_workload *w = NULL;
  assert_ok(mlo_workload_open(plat, &w, err, sizeof err));
  mlo_workload_call *calls = NULL;
  size_t n = 0;
  assert_ok(mlo_workload_schedule(pipe, 4, 4, &calls, &n));
  uint64_t digest = 0;
  for (int prompt = 0; prompt < 3; prompt++)
    assert_ok(mlo_workload_run(w, calls, n, &digest, NULL, NULL, NULL));
  if (strcmp(mode, "resident")) assert_ok(mlo_pipeline_audit(pipe));
  if (!strcmp(mode, "joined")) { /* learned from the first prompt, joined from the second */
    mlo_pipeline_stats ps;
    assert_ok(mlo_pipeline_get_stats(pipe, &ps));
    assert_true(ps.total.joined_loads >= 3);
    assert_true(ps.peak_device_bytes <= ps.budget_bytes);
  }
  free(calls);
  mlo_workload_close(w);
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  return digest;
}

static void test_workload_digest(void **state) {
  (void)state;
  uint64_t resident = workload_digest("resident");
  assert_int_equal(workload_digest("strict"), resident);
  assert_int_equal(workload_digest("progressive"), resident);
  assert_int_equal(workload_digest("stream"), resident);
  assert_int_equal(workload_digest("joined"), resident);
}

/* Zero-byte tensors of a streamed component's pieces: laid out at 0 as in
 * a whole block, never an offset wrapped below a piece's start. */
static void test_zero_byte_tensors(void **state) {
  (void)state;
  rig r;
  rig_build(&r, "capacity=1M");
  static const char *const empty[] = {"blocks.5.empty", "blocks.7.empty", "proj_out.empty"};
  mlo_tensor *e[3];
  for (int i = 0; i < 3; i++) e[i] = tu_add_tensor(r.tp, r.dit, empty[i], 0, 0);
  assert_ok(enable_budget(&r, 72 * KB));
  assert_ok(mlo_component_acquire(r.dit));
  for (int i = 0; i < 3; i++) {
    int b = mlo_tensor_block(e[i]);
    if (b >= 0) assert_ok(mlo_block_begin(r.dit, (size_t)b));
    void *blk = NULL;
    size_t off = 1;
    assert_ok(mlo_tensor_device(e[i], &blk, &off));
    assert_int_equal(off, 0);
    if (b >= 0) assert_ok(mlo_block_end(r.dit, (size_t)b));
  }
  assert_ok(mlo_component_release(r.dit));
  rig_free(&r);
}

/* A thread that releases with blocks begun ends them then, so another
 * holder waiting for a slot goes on (it waited for ever before). */
typedef struct {
  rig *r;
  atomic_int done;
  int rc;
} waiter;

static void *begin_block_4(void *arg) {
  waiter *w = arg;
  if (mlo_component_acquire(w->r->dit) == MLO_OK) {
    w->rc = mlo_block_begin(w->r->dit, 4); /* both slots are begun by the main thread: waits */
    if (!w->rc) w->rc = block_ok(w->r, 4) ? mlo_block_end(w->r->dit, 4) : -1;
    mlo_component_release(w->r->dit);
  }
  atomic_store(&w->done, 1);
  return NULL;
}

static void test_release_ends_this_threads_blocks(void **state) {
  (void)state;
  rig r;
  rig_build(&r, "capacity=1M,jitter=1");
  assert_ok(enable_budget(&r, 40 * KB)); /* nothing kept: all 8 blocks stream */
  assert_ok(mlo_component_acquire(r.dit));
  assert_ok(mlo_block_begin(r.dit, 0));
  assert_ok(mlo_block_begin(r.dit, 1));
  waiter w = {&r, 0, -99};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, begin_block_4, &w), 0);
  for (int i = 0; i < 20 && !atomic_load(&w.done); i++) usleep(10000);
  assert_false(atomic_load(&w.done));      /* it waits for a slot */
  assert_ok(mlo_component_release(r.dit)); /* not the last release: the other thread holds it */
  for (int i = 0; i < 500 && !atomic_load(&w.done); i++) usleep(10000);
  assert_true(atomic_load(&w.done));
  pthread_join(th, NULL);
  assert_ok(w.rc);
  tu_assert_forwards_clean(r.tp);
  tu_assert_audit(r.tp);
  /* a thread that does not hold the component may not begin its blocks */
  assert_status(mlo_block_begin(r.dit, 0), MLO_ESTATE);
  assert_true(tu_contains_ci(mlo_pipeline_errmsg(r.tp->pipe), "on this thread"));
  rig_free(&r);
}

/* Another thread's end of a block the main thread began, streamed (block
 * 0) or kept (under 72 KiB, block 1): refused, and the slot the main
 * thread reads is not refilled under it. */
typedef struct {
  rig *r;
  size_t block;
  int rc;
  char msg[512];
} ender;

static void *end_foreign(void *arg) {
  ender *e = arg;
  if ((e->rc = mlo_component_acquire(e->r->dit)) != MLO_OK) return NULL;
  e->rc = mlo_block_end(e->r->dit, e->block);
  snprintf(e->msg, sizeof e->msg, "%s", mlo_pipeline_errmsg(e->r->tp->pipe));
  mlo_component_release(e->r->dit);
  return NULL;
}

static void test_end_on_another_thread(void **state) {
  (void)state;
  static const struct {
    uint64_t budget;
    size_t block;
    const char *words;
  } cases[] = {{40 * KB, 0, "did not begin it"}, {72 * KB, 1, "on this thread"}};
  for (int i = 0; i < 2; i++) {
    rig r;
    rig_build(&r, "capacity=1M,jitter=1");
    assert_ok(enable_budget(&r, cases[i].budget));
    size_t b = cases[i].block;
    assert_ok(mlo_component_acquire(r.dit));
    assert_ok(mlo_block_begin(r.dit, b));
    ender e = {.r = &r, .block = b};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, end_foreign, &e), 0);
    pthread_join(th, NULL);
    assert_status(e.rc, MLO_ESTATE);
    assert_true(tu_contains_ci(e.msg, cases[i].words));
    assert_ok(mlo_platform_synchronize(r.plat)); /* a refill would have landed */
    assert_true(block_ok(&r, (int)b));
    assert_ok(mlo_block_end(r.dit, b)); /* still this thread's to end */
    assert_ok(mlo_component_release(r.dit));
    assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
    tu_assert_forwards_clean(r.tp);
    tu_assert_audit(r.tp);
    rig_free(&r);
  }
}

/* A plan is the budget's it was made for: a DiT left streamed by a 72 KiB
 * budget and evicted under a 140 KiB one loads whole again; under strict
 * with copy_back its eviction writes back what is on the device, not the
 * streamed blocks that are not. */
static void test_plans_follow_the_budget(void **state) {
  (void)state;
  rig r;
  rig_build(&r, "capacity=1M,jitter=1");
  mlo_component *big = NULL;
  assert_ok(mlo_component_add(r.tp->pipe, "big", MLO_ROLE_OTHER, &big));
  tu_add_tensor(r.tp, big, "w", 70 * KB, 0);
  assert_ok(enable_budget(&r, 72 * KB));
  assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
  assert_ok(mlo_offload_disable(r.tp->pipe));
  assert_ok(enable_budget(&r, 140 * KB)); /* the 136 KiB DiT fits whole now */
  mlo_stream_info si;
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.slots, MLO_STREAM_SLOTS); /* resident: it keeps its plan (C14) */
  assert_ok(tu_forward(r.tp, big));             /* 400 KiB: the DiT is evicted */
  assert_false(mlo_component_is_resident(r.dit));
  assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
  assert_ok(mlo_component_stream_info(r.dit, &si));
  assert_int_equal(si.slots, 0); /* planned again for 140 KiB: whole */
  assert_int_equal(si.device_bytes, 136 * KB);
  assert_ok(mlo_offload_disable(r.tp->pipe));
  assert_ok(mlo_component_evict(r.dit));
  assert_ok(enable_budget(&r, 72 * KB));
  assert_ok(mlo_component_forward(r.dit, streamed_forward, &r));
  assert_ok(mlo_offload_disable(r.tp->pipe));
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.copy_back = true;
  assert_ok(mlo_offload_enable(r.tp->pipe, &s));
  assert_ok(
      tu_forward(r.tp, r.enc)); /* C4 evicts the streamed DiT, writing back its resident part */
  assert_false(mlo_component_is_resident(r.dit));
  char why[256];
  assert_true(tu_host_content_ok(r.tp, r.dit, why, sizeof why));
  tu_assert_forwards_clean(r.tp);
  rig_free(&r);
}

/* One prompt: encoder, four DiT steps, VAE; the first failure's status. */
static int prompt(rig *r) {
  int rc = tu_forward(r->tp, r->enc);
  for (int s = 0; s < 4 && !rc; s++) rc = mlo_component_forward(r->dit, streamed_forward, r);
  if (!rc) rc = tu_forward(r->tp, r->vae);
  return rc;
}

static tu_pipe *sweep_build(void *self, mlo_platform *plat) {
  rig *r = self;
  rig_build_on(r, plat, true);
  mlo_schedule_entry sched[] = {{r->enc, 1}, {r->dit, 4}, {r->vae, 1}};
  assert_ok(mlo_pipeline_set_schedule(r->tp->pipe, sched, 3));
  assert_ok(mlo_pipeline_materialize(r->tp->pipe));
  return r->tp;
}

static int sweep_run(void *self) {
  rig *r = self;
  int rc = mlo_offload_is_enabled(r->tp->pipe) ? MLO_OK : enable_budget(r, 72 * KB);
  return rc ? rc : prompt(r);
}

static void sweep_destroy(void *self) {
  tu_pipe_free(((rig *)self)->tp); /* the sweep closes the platform */
}

static void test_fault_sweep(void **state) {
  (void)state;
  if (!tu_platform_is_host()) skip();
  rig r;
  tu_fault_case fc = {sweep_build, sweep_run, sweep_destroy};
  assert_true(tu_fault_sweep("host:capacity=1M,jitter=1", &fc, &r) > 20); /* streamed calls */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocks_from_names),
      cmocka_unit_test(test_blocks_contiguous),
      cmocka_unit_test(test_declared_blocks),
      cmocka_unit_test(test_plan_by_hand),
      cmocka_unit_test(test_streamed_forwards),
      cmocka_unit_test(test_spread_by_hand),
      cmocka_unit_test(test_kept_blocks_and_prefetch),
      cmocka_unit_test(test_deferred_blocks_land),
      cmocka_unit_test(test_aborted_forward_lands),
      cmocka_unit_test(test_streamed_bytes_predicted),
      cmocka_unit_test(test_block_rules),
      cmocka_unit_test(test_workload_digest),
      cmocka_unit_test(test_zero_byte_tensors),
      cmocka_unit_test(test_release_ends_this_threads_blocks),
      cmocka_unit_test(test_end_on_another_thread),
      cmocka_unit_test(test_plans_follow_the_budget),
      cmocka_unit_test(test_fault_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
