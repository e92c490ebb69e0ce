/*
 * test_ranks.c — node-shared slabs and sharded loads across the ranks of
 * an MPI job (run under mpirun with 2 and 4 ranks; every rank runs this).
 * Checks, on every rank:
 *  - one slab per component per node: every rank maps the same pages (its
 *    proportional set size of the mapping is about 1/n of it, and the
 *    node's sum is the mapping once), and each rank read 1/n of the
 *    checkpoint: the node read it exactly once;
 *  - the shared slabs and sharded device blocks hold exactly the bytes a
 *    single-process pipeline holds, and the reference workload's digest
 *    is the single-process digest, replicated and sharded;
 *  - a read that fails on one rank fails materialization on every rank
 *    with that rank's message, leaves no slab, and a retry succeeds;
 *  - a sequence mismatch (one rank loads another component) fails on every
 *    rank naming both, and the communicator goes on working;
 *  - ranks that opened different checkpoints fail together at the first
 *    shared slab, sharing none; the same files at another path agree;
 *  - a rank that does not arrive within the timeout is reported on every
 *    other rank within it, and the late rank is told when it arrives.
 * Plain C with a failure count (no test framework: a rank that gave up on
 * an assertion would leave the others waiting in a collective); the exit
 * code is the node's agreement on success.
 */
#include "mlo/checkpoint.h"
#include "mlo/mpi.h"
#include "workload/workload.h"
#include "ranks_check.h"

#include "base/sysio.h"
#include "dist/dist.h"
#include "platform/fault.h"

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static mlo_platform *host(void) {
  mlo_platform *p = NULL;
  char err[256];
  if (mlo_platform_open("host:capacity=512M,poison=0", &p, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}

static mlo_pipeline *open_with(mlo_platform *p, mlo_comm *comm, bool sharded, int *rc_out) {
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = p;
  po.comm = comm;
  po.sharded_loads = sharded;
  mlo_pipeline *pipe = NULL;
  char err[512] = "";
  int rc = mlo_pipeline_open_path(&po, dir, NULL, &pipe, err, sizeof err);
  if (rc_out) *rc_out = rc;
  CHECK(rc == MLO_OK, "open %s: %s", dir, err);
  return pipe;
}

/* The PSS and RSS (kB) of the mapping that holds addr, from smaps. */
static void mapping_sizes(const void *addr, long *pss, long *rss, long *size) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  bool in = false;
  *pss = *rss = *size = -1;
  uintptr_t a = (uintptr_t)addr;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = a >= lo && a < hi;
      continue;
    }
    if (!in) continue;
    sscanf(line, "Pss: %ld kB", pss);
    sscanf(line, "Rss: %ld kB", rss);
    sscanf(line, "Size: %ld kB", size);
  }
  if (f) fclose(f);
}

static void test_shared_and_sharded(mlo_comm *comm, uint64_t reference_digest) {
  mlo_platform *p = host(), *q = host();
  mlo_pipeline *single = open_with(q, NULL, false, NULL);
  CHECK(mlo_pipeline_materialize(single) == MLO_OK, "single materialize");
  for (int sharded = 0; sharded < 2; sharded++) {
    mlo_pipeline *pipe = open_with(p, comm, sharded, NULL);
    int rc = mlo_pipeline_materialize(pipe);
    CHECK(rc == MLO_OK, "materialize: %s", mlo_pipeline_errmsg(pipe));
    mlo_dist_stats ds = MLO_DIST_STATS_INIT;
    mlo_pipeline_get_dist_stats(pipe, &ds);
    mlo_pipeline_stats st;
    mlo_pipeline_get_stats(pipe, &st);
    CHECK(ds.ranks == nranks && ds.node_ranks == nranks, "ranks %d/%d", ds.ranks, ds.node_ranks);
    CHECK(ds.shared_bytes == st.host_slab_bytes, "shared %llu of %llu",
          (unsigned long long)ds.shared_bytes, (unsigned long long)st.host_slab_bytes);
    /* the node read the checkpoint once: the ranks' reads sum to its bytes */
    unsigned long long mine = ds.read_bytes, sum = 0, total = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < mlo_pipeline_component_count(single); i++)
      total += mlo_component_tensor_bytes(mlo_pipeline_component_at(single, i));
    CHECK(sum == total, "ranks read %llu bytes of %llu", sum, total);
    if (nranks > 1) CHECK(mine < total, "rank read %llu of %llu alone", mine, total);
    /* the bytes are the single process's, on the host and on the device */
    for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
      mlo_component *a = mlo_pipeline_component_at(pipe, i);
      mlo_component *b = mlo_pipeline_component_at(single, i);
      rc = mlo_component_load(a);
      CHECK(rc == MLO_OK, "load %s: %s", mlo_component_name(a), mlo_pipeline_errmsg(pipe));
      if (rc) continue;
      rc = mlo_component_acquire(a); /* waits for the load (and its gather) */
      CHECK(rc == MLO_OK, "acquire %s: %s", mlo_component_name(a), mlo_pipeline_errmsg(pipe));
      for (size_t k = 0; !rc && k < mlo_component_tensor_count(a); k++) {
        const mlo_tensor *ta = mlo_component_tensor_at(a, k);
        const mlo_tensor *tb = mlo_component_find_tensor(b, mlo_tensor_name(ta));
        size_t nb = (size_t)mlo_tensor_nbytes(ta);
        CHECK(!memcmp(mlo_tensor_host_data(ta), mlo_tensor_host_data(tb), nb), "host %s",
              mlo_tensor_name(ta));
        CHECK(!memcmp(mlo_tensor_device_ptr(ta), mlo_tensor_host_data(tb), nb), "device %s",
              mlo_tensor_name(ta));
      }
      if (!rc) mlo_component_release(a);
      CHECK(mlo_component_evict(a) == MLO_OK, "evict");
    }
    /* Every rank has now read every byte of every slab: one mapping per
     * component, shared, so each rank's PSS of it is about 1/n of its RSS
     * and the node's PSS sum is the slab once (private copies: n times). */
    mlo_component *big = mlo_pipeline_component_at(pipe, 1);
    const void *at = mlo_tensor_host_data(mlo_component_tensor_at(big, 0));
    long pss, rss, size, node_pss = 0;
    MPI_Barrier(MPI_COMM_WORLD); /* every rank has touched every page */
    mapping_sizes(at, &pss, &rss, &size);
    long slab_kb = (long)(mlo_component_bytes(big) / 1024);
    CHECK(rss >= slab_kb && size >= slab_kb, "mapping rss %ld size %ld of a %ld kB slab", rss, size,
          slab_kb);
    MPI_Allreduce(&pss, &node_pss, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(node_pss <= size + size / 10 + 64, "node PSS %ld kB for a %ld kB mapping", node_pss,
          size);
    CHECK(pss <= rss / nranks + rss / 20 + 16, "PSS %ld kB of RSS %ld kB over %d ranks: not shared",
          pss, rss, nranks);
    mlo_pipeline_get_dist_stats(pipe, &ds);
    mlo_pipeline_get_stats(pipe, &st);
    if (sharded && nranks > 1) {
      CHECK(ds.gather_bytes > 0, "no gather");
      CHECK(st.total.h2d_bytes * (uint64_t)nranks < st.host_slab_bytes + 4096ull * nranks * 8,
            "sharded: moved %llu of %llu", (unsigned long long)st.total.h2d_bytes,
            (unsigned long long)st.host_slab_bytes);
    } else {
      CHECK(ds.gather_bytes == 0, "replicated gathered");
      CHECK(st.total.h2d_bytes == st.host_slab_bytes, "replicated moved %llu",
            (unsigned long long)st.total.h2d_bytes);
    }
    uint64_t d = digest_of(p, pipe);
    CHECK(d == reference_digest, "%s digest %016llx, single %016llx",
          sharded ? "sharded" : "replicated", (unsigned long long)d,
          (unsigned long long)reference_digest);
    mlo_pipeline_free(pipe);
  }
  mlo_pipeline_free(single);
  mlo_platform_close(p);
  mlo_platform_close(q);
}

/* HSDP: each rank keeps only its slice resident and gathers nothing; the
 * caller's own all-gather of the slices is the component, the device holds
 * 1/n of it, and tensors outside the slice are refused, not wrong. */
static void test_shard_resident(mlo_comm *comm) {
  mlo_platform *p = host();
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = p;
  po.comm = comm;
  po.sharded_loads = true;
  po.shard_resident = true;
  mlo_pipeline *pipe = NULL;
  char err[512] = "";
  CHECK(mlo_pipeline_open_path(&po, dir, NULL, &pipe, err, sizeof err) == MLO_OK, "%s", err);
  mlo_component *c = mlo_pipeline_component_at(pipe, 1);
  mlo_platform_memory m0, m1;
  mlo_platform_get_memory(p, &m0);
  int rc = mlo_component_load(c);
  CHECK(rc == MLO_OK, "load: %s", mlo_pipeline_errmsg(pipe));
  CHECK(mlo_component_acquire(c) == MLO_OK, "acquire: %s", mlo_pipeline_errmsg(pipe));
  mlo_platform_get_memory(p, &m1);
  void *block = NULL;
  uint64_t off = 0, len = 0, total = mlo_component_bytes(c);
  CHECK(mlo_component_shard(c, &block, &off, &len) == MLO_OK, "shard");
  CHECK((m1.used_bytes - m0.used_bytes) * (uint64_t)nranks < total + 4096ull * nranks * 2,
        "the device holds %llu bytes of a %llu-byte component",
        (unsigned long long)(m1.used_bytes - m0.used_bytes), (unsigned long long)total);
  /* the caller's gather: every rank's slice, in node rank order */
  unsigned long long mine[2] = {off, len}, all[2 * 8] = {0};
  MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
  unsigned long long covered = 0;
  for (int r = 0; r < nranks && r < 8; r++) {
    CHECK(all[2 * r] == covered || all[2 * r + 1] == 0, "slice %d starts at %llu, not %llu", r,
          all[2 * r], covered);
    covered += all[2 * r + 1];
  }
  const char *slab = mlo_tensor_host_data(mlo_component_tensor_at(c, 0));
  CHECK(covered >= total - 4096 && covered <= total, "the slices cover %llu of %llu bytes", covered,
        (unsigned long long)total);
  CHECK(!len || !memcmp(block, slab + off, (size_t)len), "this rank's slice differs");
  /* a tensor inside the slice has its address; one outside is refused */
  size_t inside = 0, outside = 0;
  for (size_t k = 0; k < mlo_component_tensor_count(c); k++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, k);
    const char *h = mlo_tensor_host_data(t);
    uint64_t at = (uint64_t)(h - slab), nb = mlo_tensor_nbytes(t);
    void *dp = mlo_tensor_device_ptr(t);
    if (at >= off && at + nb <= off + len) {
      inside++;
      CHECK(dp == (char *)block + (at - off), "%s: address", mlo_tensor_name(t));
    } else {
      outside++;
      CHECK(dp == NULL, "%s: outside the shard yet given an address", mlo_tensor_name(t));
    }
  }
  CHECK(inside > 0 && (nranks == 1 || outside > 0), "inside %zu outside %zu", inside, outside);
  mlo_component_release(c);
  CHECK(mlo_component_evict(c) == MLO_OK, "evict");
  CHECK(mlo_component_shard(c, NULL, NULL, NULL) == MLO_ESTATE, "shard of an evicted component");
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

/* The reference workload under strict offload on pipe, every component
 * loaded block by block: its status, the digest in *d. */
static int run_blocks(mlo_platform *p, mlo_pipeline *pipe, uint64_t *d) {
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++)
    mlo_component_set_progressive(mlo_pipeline_component_at(pipe, i), 1);
  mlo_workload *w = NULL;
  mlo_workload_call *calls = NULL;
  size_t n = 0;
  int rc = mlo_workload_open(p, &w, NULL, 0);
  if (!rc) rc = mlo_workload_schedule(pipe, 4, 3, &calls, &n);
  mlo_offload_settings set = MLO_OFFLOAD_SETTINGS_INIT;
  if (!rc) rc = mlo_offload_enable(pipe, &set);
  if (!rc) rc = mlo_workload_run(w, calls, n, d, NULL, NULL, NULL);
  mlo_offload_disable(pipe);
  free(calls);
  mlo_workload_close(w);
  return rc;
}

/* Sharded loads block by block (each piece sliced, then gathered by the
 * host over MPI): the single process's digest.  Where the job gives
 * MPI_THREAD_MULTIPLE (`lane`), every gather ran on the pipeline's gather
 * thread, under the compute; otherwise on the forward's thread. */
static void test_sharded_blocks(mlo_comm *comm, uint64_t reference, bool lane) {
  mlo_platform *p = host();
  mlo_pipeline *pipe = open_with(p, comm, true, NULL);
  uint64_t d = 0;
  int rc = run_blocks(p, pipe, &d);
  CHECK(rc == MLO_OK, "block by block: %s", mlo_pipeline_errmsg(pipe));
  CHECK(d == reference, "block by block: digest %016llx, single %016llx", (unsigned long long)d,
        (unsigned long long)reference);
  mlo_dist_stats ds = MLO_DIST_STATS_INIT;
  mlo_pipeline_get_dist_stats(pipe, &ds);
  if (nranks > 1) {
    CHECK(ds.gather_bytes > 0, "nothing gathered");
    if (lane)
      CHECK(ds.lane_gathers > 0, "no gather ran on the gather thread");
    else
      CHECK(ds.lane_gathers == 0, "%llu gathers on a thread MPI does not allow",
            (unsigned long long)ds.lane_gathers);
  }
  /* a caller built before lane_gathers: the fields it knows */
  struct {
    mlo_dist_stats s;
  } old = {.s = MLO_DIST_STATS_INIT};
  old.s.size = offsetof(mlo_dist_stats, lane_gathers);
  old.s.lane_gathers = 12345;
  CHECK(mlo_pipeline_get_dist_stats(pipe, &old.s) == MLO_OK &&
            old.s.gather_bytes == ds.gather_bytes && old.s.lane_gathers == 12345,
        "an older caller's stats");
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

/* Two sharded pipelines on one communicator: the lane serves the one that
 * gathered first until it is freed; the other gathers on its forward's
 * thread meanwhile (two threads on one lane would mix their steps), and a
 * pipeline opened after the first is freed takes the lane. */
static void test_two_pipelines_one_lane(mlo_comm *comm, uint64_t reference, bool lane) {
  if (nranks < 2) return;
  mlo_platform *p = host(), *q = host();
  mlo_pipeline *first = open_with(p, comm, true, NULL), *second = open_with(q, comm, true, NULL);
  uint64_t d1 = 0, d2 = 0;
  CHECK(run_blocks(p, first, &d1) == MLO_OK, "first: %s", mlo_pipeline_errmsg(first));
  CHECK(run_blocks(q, second, &d2) == MLO_OK, "second: %s", mlo_pipeline_errmsg(second));
  CHECK(d1 == reference && d2 == reference, "digests %016llx %016llx", (unsigned long long)d1,
        (unsigned long long)d2);
  mlo_dist_stats s1 = MLO_DIST_STATS_INIT, s2 = MLO_DIST_STATS_INIT;
  mlo_pipeline_get_dist_stats(first, &s1);
  mlo_pipeline_get_dist_stats(second, &s2);
  CHECK(s2.gather_bytes > 0 && s2.lane_gathers == 0, "second: %llu on the lane",
        (unsigned long long)s2.lane_gathers);
  CHECK(lane ? s1.lane_gathers > 0 : s1.lane_gathers == 0, "first: %llu on the lane",
        (unsigned long long)s1.lane_gathers);
  mlo_pipeline_free(first);
  mlo_pipeline *third = open_with(p, comm, true, NULL);
  CHECK(run_blocks(p, third, &d1) == MLO_OK && d1 == reference, "third: %s",
        mlo_pipeline_errmsg(third));
  mlo_pipeline_get_dist_stats(third, &s1);
  CHECK(lane ? s1.lane_gathers > 0 : s1.lane_gathers == 0, "third: %llu on the lane",
        (unsigned long long)s1.lane_gathers);
  mlo_pipeline_free(third);
  mlo_pipeline_free(second);
  mlo_platform_close(p);
  mlo_platform_close(q);
}

/* With the gather thread: a copy that fails part-way through one rank's
 * sharded load fails the run on every rank, naming that rank, within the
 * timeout (the others' threads do not wait for pieces it never posts),
 * and the communicator goes on working. */
static void test_lane_failure(mlo_comm *comm, uint64_t reference) {
  if (nranks < 2) return;
  int last = nranks - 1;
  mlo_platform *p = NULL;
  char err[256];
  const char *spec = rank == last ? "fault:kind=copy,nth=6,inner=host:capacity=512M,poison=0"
                                  : "host:capacity=512M,poison=0";
  if (mlo_platform_open(spec, &p, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  mlo_pipeline *pipe = open_with(p, comm, true, NULL);
  uint64_t d = 0;
  int rc = run_blocks(p, pipe, &d);
  CHECK(rc != MLO_OK, "a copy failed on rank %d, yet the run succeeded", last);
  if (rank != last) {
    char want[64];
    snprintf(want, sizeof want, "node rank %d failed", last);
    CHECK(strstr(mlo_pipeline_errmsg(pipe), want), "message '%s'", mlo_pipeline_errmsg(pipe));
  }
  /* the same pipeline again, nothing failing: it loads and verifies (a
   * failure is its load's alone, not remembered against the next) */
  if (rank == last) mlo_fault_arm(p, MLO_FAULT_COPY, 0); /* counts only */
  rc = run_blocks(p, pipe, &d);
  CHECK(rc == MLO_OK, "the run after a failed one: %s", mlo_pipeline_errmsg(pipe));
  CHECK(d == reference, "the run after a failed one: digest %016llx", (unsigned long long)d);
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
  CHECK(!mlo_comm_broken(comm), "the communicator broke");
  CHECK(mlo_dist_agree(comm, MLO_DIST_PROGRAM_STEP | 7, 0, MLO_OK, NULL, NULL, NULL, NULL, err,
                       sizeof err) == MLO_OK,
        "an agreement after the failure: %s", err);
}

static void test_fault_on_one_rank(mlo_comm *comm) {
  mlo_platform *p = host();
  mlo_pipeline *pipe = open_with(p, comm, false, NULL);
  int last = nranks - 1;
  if (rank == last) mlo_sysfault_arm(MLO_SYSFAULT_READ, 1);
  int rc = mlo_pipeline_materialize(pipe);
  if (rank == last) mlo_sysfault_disarm();
  CHECK(rc != MLO_OK, "a read failed on rank %d, yet materialize succeeded", last);
  if (nranks > 1 && rank != last) {
    char want[64];
    snprintf(want, sizeof want, "node rank %d failed", last);
    CHECK(strstr(mlo_pipeline_errmsg(pipe), want), "message '%s'", mlo_pipeline_errmsg(pipe));
  }
  mlo_pipeline_stats st;
  mlo_pipeline_get_stats(pipe, &st);
  mlo_dist_stats ds = MLO_DIST_STATS_INIT;
  mlo_pipeline_get_dist_stats(pipe, &ds);
  /* the component that failed keeps nothing (the ones before it are loaded) */
  uint64_t kept = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++)
    if (mlo_component_residency(mlo_pipeline_component_at(pipe, i)) != MLO_RES_UNMATERIALIZED)
      kept += mlo_component_bytes(mlo_pipeline_component_at(pipe, i));
  CHECK(ds.shared_bytes <= kept + 4096 * 64, "shared %llu bytes, materialized %llu",
        (unsigned long long)ds.shared_bytes, (unsigned long long)kept);
  rc = mlo_pipeline_materialize(pipe); /* the retry */
  CHECK(rc == MLO_OK, "retry: %s", mlo_pipeline_errmsg(pipe));
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

static void test_mismatch(mlo_comm *comm) {
  if (nranks < 2) return;
  mlo_platform *p = host();
  mlo_pipeline *pipe = open_with(p, comm, true, NULL);
  CHECK(mlo_pipeline_materialize(pipe) == MLO_OK, "materialize");
  /* rank 0 loads the encoder, the others the first DiT */
  mlo_component *want = mlo_pipeline_component_at(pipe, rank == 0 ? 0 : 1);
  double t0 = MPI_Wtime();
  int rc = mlo_component_load(want);
  double took = MPI_Wtime() - t0;
  CHECK(rc == MLO_ESTATE, "mismatch gave %s", mlo_err_name(rc));
  const char *msg = mlo_pipeline_errmsg(pipe);
  CHECK(strstr(msg, "mismatch") && strstr(msg, "text_encoder") && strstr(msg, "transformer"),
        "message '%s'", msg);
  CHECK(took < 2.0, "the mismatch took %.2f s to report", took);
  CHECK(!mlo_component_is_resident(want), "a refused load is resident");
  /* the communicator still works: the same load everywhere succeeds */
  rc = mlo_component_load(mlo_pipeline_component_at(pipe, 1));
  CHECK(rc == MLO_OK, "consistent load after a mismatch: %s", mlo_pipeline_errmsg(pipe));
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

/* Ranks that opened different checkpoints (another scale: every size
 * differs) fail together at the first shared slab, naming the component,
 * at once and on every rank: no slab is shared between them (shared mode
 * once computed on the other rank's bytes), and nobody waits in
 * MPI_Win_free for a window of another size (it hung).  The same
 * checkpoint at another path is the same checkpoint. */
static void open_at_dir(const char *path, mlo_platform *p, mlo_comm *comm, mlo_pipeline **pipe) {
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = p;
  po.comm = comm;
  char err[512] = "";
  int rc = mlo_pipeline_open_path(&po, path, NULL, pipe, err, sizeof err);
  CHECK(rc == MLO_OK, "open %s: %s", path, err);
}

static void test_different_checkpoints(mlo_comm *comm, const char *other, const char *copy) {
  if (nranks < 2) return;
  int odd = nranks - 1;
  mlo_platform *p = host();
  mlo_pipeline *pipe = NULL;
  open_at_dir(rank == odd ? other : dir, p, comm, &pipe);
  double t0 = MPI_Wtime();
  int rc = pipe ? mlo_pipeline_materialize(pipe) : MLO_EINVAL;
  double took = MPI_Wtime() - t0;
  CHECK(rc == MLO_ESTATE, "different checkpoints gave %s", mlo_err_name(rc));
  const char *msg = pipe ? mlo_pipeline_errmsg(pipe) : "";
  CHECK(strstr(msg, "do not hold the same checkpoint") && strstr(msg, "text_encoder"),
        "message '%s'", msg);
  CHECK(took < 5.0, "reported after %.2f s", took);
  mlo_pipeline_stats st;
  CHECK(pipe && mlo_pipeline_get_stats(pipe, &st) == MLO_OK && st.host_slab_bytes == 0,
        "a slab was shared between different checkpoints");
  mlo_pipeline_free(pipe);
  /* the same files under another path: one checkpoint, one slab each */
  open_at_dir(rank == odd ? copy : dir, p, comm, &pipe);
  rc = pipe ? mlo_pipeline_materialize(pipe) : MLO_EINVAL;
  CHECK(rc == MLO_OK, "the same checkpoint at another path: %s", mlo_pipeline_errmsg(pipe));
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

/* A rank that failed and went on to its program's own step (the tool's
 * report) while the others load: they hear its failure at once, named at
 * its step, not a bare "sequence mismatch" (issue 26.8). */
static void test_peer_failed_elsewhere(mlo_comm *comm) {
  if (nranks < 2) return;
  int odd = nranks - 1;
  char err[512] = "";
  if (rank == odd) {
    int rc = mlo_dist_agree(comm, MLO_DIST_PROGRAM_STEP | 1, 0, MLO_ECALLBACK, "exit code 4", NULL,
                            NULL, NULL, err, sizeof err);
    CHECK(rc != MLO_OK && strstr(err, "exit code 4"), "the failing rank heard '%s'", err);
    return;
  }
  mlo_platform *p = host();
  mlo_pipeline *pipe = open_with(p, comm, false, NULL);
  double t0 = MPI_Wtime();
  int rc = mlo_pipeline_materialize(pipe);
  double took = MPI_Wtime() - t0;
  const char *msg = mlo_pipeline_errmsg(pipe);
  char want[96];
  snprintf(want, sizeof want, "node rank %d failed at 'the program's own step 1", odd);
  CHECK(rc != MLO_OK && strstr(msg, want) && strstr(msg, "exit code 4"), "message '%s'", msg);
  CHECK(!strstr(msg, "mismatch"), "a bare mismatch: '%s'", msg);
  CHECK(took < 5.0, "heard after %.2f s", took);
  mlo_pipeline_free(pipe);
  mlo_platform_close(p);
}

/* A communicator of timeout_ms and a pipeline on it, materialized. */
static mlo_pipeline *on_new_comm(unsigned timeout_ms, mlo_comm **comm, mlo_platform **p) {
  mlo_comm_options co = MLO_COMM_OPTIONS_INIT;
  co.timeout_ms = timeout_ms;
  char err[256];
  *comm = NULL;
  CHECK(mlo_comm_create_mpi(MPI_COMM_WORLD, &co, comm, err, sizeof err) == MLO_OK, "%s", err);
  *p = host();
  mlo_pipeline *pipe = open_with(*p, *comm, true, NULL);
  CHECK(mlo_pipeline_materialize(pipe) == MLO_OK, "materialize");
  return pipe;
}

/* Frees what on_new_comm made, after a collective left the communicator
 * broken on some rank. */
static void free_broken(mlo_pipeline *pipe, mlo_comm *comm, mlo_platform *p) {
  mlo_set_log(NULL, NULL, MLO_LOG_OFF); /* freeing says the slabs are left mapped */
  mlo_pipeline_free(pipe);
  mlo_set_log(NULL, NULL, MLO_LOG_ERROR);
  mlo_platform_close(p);
  MPI_Barrier(MPI_COMM_WORLD);
  mlo_comm_free(comm);
}

static void test_missing_rank(void) {
  if (nranks < 2) return;
  mlo_comm *comm;
  mlo_platform *p;
  mlo_pipeline *pipe = on_new_comm(1000, &comm, &p);
  int late = nranks - 1;
  if (rank == late) usleep(2500 * 1000);
  double t0 = MPI_Wtime();
  int rc = mlo_component_load(mlo_pipeline_component_at(pipe, 1));
  double took = MPI_Wtime() - t0;
  CHECK(rc == MLO_ESTATE, "a missing rank gave %s", mlo_err_name(rc));
  const char *msg = mlo_pipeline_errmsg(pipe);
  if (rank != late) {
    char want[64];
    snprintf(want, sizeof want, "rank(s) %d did not arrive", late);
    CHECK(strstr(msg, want), "message '%s'", msg);
    CHECK(took < 2.0, "reported after %.2f s (timeout 1 s)", took);
  } else {
    CHECK(strstr(msg, "did not arrive"), "the late rank was told '%s'", msg);
    CHECK(took < 0.5, "the late rank waited %.2f s", took);
  }
  CHECK(mlo_comm_broken(comm), "rank %d: the communicator is not said to be broken", rank);
  /* broken: every later collective fails at once */
  t0 = MPI_Wtime();
  rc = mlo_component_load(mlo_pipeline_component_at(pipe, 2));
  CHECK(rc == MLO_ESTATE && MPI_Wtime() - t0 < 0.1, "after a timeout: %s", mlo_err_name(rc));
  free_broken(pipe, comm, p);
}

/* The coordinator (node rank 0) late past the timeout and its second of
 * grace: the others fail naming it, their own rank once (issue 44, F17:
 * "rank 1: rank 1: node rank 0 (the coordinator) did not answer"). */
static void test_missing_coordinator(void) {
  if (nranks < 2) return;
  mlo_comm *comm;
  mlo_platform *p;
  mlo_pipeline *pipe = on_new_comm(500, &comm, &p);
  if (rank == 0) usleep(2500 * 1000);
  int rc = mlo_component_load(mlo_pipeline_component_at(pipe, 1));
  if (rank != 0) {
    const char *msg = mlo_pipeline_errmsg(pipe);
    char mine[32];
    snprintf(mine, sizeof mine, "rank %d: ", rank);
    const char *first = strstr(msg, mine);
    CHECK(rc == MLO_ESTATE && strstr(msg, "coordinator"), "rank %d: %s: '%s'", rank,
          mlo_err_name(rc), msg);
    CHECK(first && !strstr(first + 1, mine), "rank %d named more than once: '%s'", rank, msg);
  }
  free_broken(pipe, comm, p);
}

int main(int argc, char **argv) {
  /* --lane: two threads may call MPI, so the host's gathers run on the
   * pipeline's gather thread (dist_ranks_2_lane) */
  bool lane = argc > 1 && !strcmp(argv[1], "--lane");
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, lane ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
  lane = lane && provided == MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  mlo_set_log(NULL, NULL, MLO_LOG_ERROR);
  /* rank 0 writes a small Wan2.2-shaped checkpoint into a folder of its own */
  if (rank == 0) {
    snprintf(dir, sizeof dir, "%s/mlo_ranks_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    char err[512];
    if (!mkdtemp(dir) ||
        mlo_synth_write("wan2.2-t2v", strcat(dir, "/wan"), 0.0005, NULL, NULL, err, sizeof err)) {
      fprintf(stderr, "synth: %s\n", err);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  /* beside it: the same preset at another scale, and a copy of the first */
  char other[300], copy[300];
  snprintf(other, sizeof other, "%s_b", dir);
  snprintf(copy, sizeof copy, "%s_copy", dir);
  if (rank == 0) {
    char err[512], cmd[700];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", dir, copy);
    if (mlo_synth_write("wan2.2-t2v", other, 0.0006, NULL, NULL, err, sizeof err) || system(cmd)) {
      fprintf(stderr, "second checkpoint: %s\n", err);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  snprintf(other, sizeof other, "%s_b", dir);
  snprintf(copy, sizeof copy, "%s_copy", dir);
  /* the single-process digest, on rank 0's own pipeline */
  uint64_t reference = 0;
  {
    mlo_platform *p = host();
    mlo_pipeline *pipe = open_with(p, NULL, false, NULL);
    reference = digest_of(p, pipe);
    mlo_pipeline_free(pipe);
    mlo_platform_close(p);
  }
  mlo_comm *comm = NULL;
  mlo_comm_options co = MLO_COMM_OPTIONS_INIT;
  co.timeout_ms = 20000;
  char err[256];
  if (mlo_comm_create_mpi(MPI_COMM_WORLD, &co, &comm, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  CHECK(mlo_comm_size(comm) == nranks && mlo_comm_rank(comm) == rank, "comm ranks");
  test_shared_and_sharded(comm, reference);
  test_shard_resident(comm);
  test_fault_on_one_rank(comm);
  test_mismatch(comm);
  test_different_checkpoints(comm, other, copy);
  test_peer_failed_elsewhere(comm);
  test_sharded_blocks(comm, reference, lane);
  if (lane) test_lane_failure(comm, reference);
  test_two_pipelines_one_lane(comm, reference, lane);
  mlo_comm_free(comm);
  test_missing_rank();
  test_missing_coordinator();
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    *strrchr(cmd, '/') = '\0'; /* the folder above wan */
    strcat(cmd, "'");
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    printf("%d ranks: %s (%d failed checks)\n", nranks, all ? "FAILED" : "ok", all);
  }
  MPI_Finalize();
  return all ? 1 : 0;
}
