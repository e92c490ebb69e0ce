/*
 * ranks.c — `mlo run --ranks shared|sharded` under mpirun: starting MPI and
 * mlo's communicator, what each rank measures about itself (its
 * proportional set size, so pages the node shares count once; the bytes it
 * read; what it moved and gathered), and the report: one JSON line per
 * rank, or rank 0's table of every rank with the node's totals against the
 * weights.  Built with MPI (MLO_HAVE_MPI); without it --ranks says so.
 */
#include "tool.h"

#include "base/hash.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef MLO_HAVE_MPI
#include "dist/dist.h"
#include "mlo/mpi.h"

#include <cjson/cJSON.h>
#include <mpi.h>

static bool we_started_mpi;

/* MPI_Init waits for every rank of the job, and one that exited before
 * calling it (another command, --help, a bad flag) is never waited out:
 * the others stayed in MPI_Init for ever, where --rank-timeout cannot
 * reach (issue 44, F8).  A watch started before it ends this rank once the
 * rank timeout passes with MPI_Init still waiting. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool returned;
  double timeout_s;
} init_watch = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0};

static void *watch_init(void *arg) {
  (void)arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  double whole = (double)(long)init_watch.timeout_s;
  until.tv_sec += (time_t)whole;
  until.tv_nsec += (long)((init_watch.timeout_s - whole) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&init_watch.lock);
  while (!init_watch.returned)
    if (pthread_cond_timedwait(&init_watch.cond, &init_watch.lock, &until) == ETIMEDOUT) break;
  bool late = !init_watch.returned;
  pthread_mutex_unlock(&init_watch.lock);
  if (late) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    fprintf(stderr,
            "mlo run: rank %s: MPI_Init did not return within %.1f s (--rank-timeout): a rank of "
            "this job may have exited before starting MPI (another command, --help, a bad "
            "flag); ending this rank\n",
            rank ? rank : "?", init_watch.timeout_s);
    fflush(NULL);
    _exit(TOOL_EXIT_FAIL);
  }
  return NULL;
}

static int init_watched(double timeout_s) {
  init_watch.timeout_s = timeout_s;
  pthread_t th;
  bool watching = pthread_create(&th, NULL, watch_init, NULL) == 0;
  /* two threads may call MPI: the host's gathers of sharded pieces then run
   * off the forward's thread (docs/distributed.md); a library that gives
   * less leaves them on it */
  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  pthread_mutex_lock(&init_watch.lock);
  init_watch.returned = true;
  pthread_cond_signal(&init_watch.cond);
  pthread_mutex_unlock(&init_watch.lock);
  if (watching) pthread_join(th, NULL);
  return rc;
}

int ranks_start(tool_ranks *r, double timeout_s, char *err, size_t errlen) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    if (init_watched(timeout_s) != MPI_SUCCESS) {
      snprintf(err, errlen, "--ranks: MPI_Init failed (run under mpirun)");
      return MLO_EPLATFORM;
    }
    we_started_mpi = true;
  }
  mlo_comm_options co = MLO_COMM_OPTIONS_INIT;
  co.timeout_ms = (unsigned)(timeout_s * 1000);
  int rc = mlo_comm_create_mpi(MPI_COMM_WORLD, &co, &r->comm, err, errlen);
  if (rc) return rc;
  r->rank = mlo_comm_rank(r->comm);
  r->ranks = mlo_comm_size(r->comm);
  r->node_rank = mlo_comm_node_rank(r->comm);
  r->node_ranks = mlo_comm_node_size(r->comm);
  return MLO_OK;
}

int ranks_device_comm(mlo_comm *comm, mlo_platform *p, bool *made, char *err, size_t errlen) {
  *made = false;
  if (!comm || strcmp(mlo_platform_name(p), "cuda")) return MLO_OK; /* the host gathers by MPI */
  int rc = mlo_comm_create_nccl(comm, p, err, errlen);
  *made = rc == MLO_OK;
  return rc;
}

void ranks_device_comm_free(mlo_comm *comm) {
  mlo_comm_destroy_nccl(comm);
}

void ranks_stop(tool_ranks *r, int code) {
  /* A rank that never arrived would keep MPI_Finalize waiting, perhaps
   * forever (stopped, not dead): end the job, so the scheduler sees the
   * failure within the timeout. */
  if (r->comm && mlo_comm_broken(r->comm)) {
    fprintf(stderr, "mlo run: rank %d: the communicator is broken; ending the job (MPI_Abort)\n",
            r->rank);
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, code ? code : TOOL_EXIT_FAIL);
  }
  if (r->comm) mlo_comm_free(r->comm);
  r->comm = NULL;
  if (we_started_mpi) MPI_Finalize();
  we_started_mpi = false;
}

static const char *step_name(uint64_t id, void *user) {
  (void)user;
  if (!(id & MLO_DIST_PROGRAM_STEP)) /* the other rank is still at its pipeline */
    return "a step of its pipeline (loading or freeing it)";
  switch (id & ~MLO_DIST_PROGRAM_STEP) {
  case RANKS_STEP_MEASURE:
    return "measuring the ranks";
  case RANKS_STEP_LOADS:
    return "choosing sharded or replicated loads";
  case RANKS_STEP_SETTINGS:
    return "comparing the offload settings";
  default:
    return "reporting the ranks";
  }
}

int ranks_agree(const tool_ranks *r, int step, int code, uint64_t check, char *err, size_t errlen) {
  if (!r->comm) return code;
  char mine[64];
  snprintf(mine, sizeof mine, "exit code %d", code);
  int rc = mlo_dist_agree(r->comm, MLO_DIST_PROGRAM_STEP | (uint64_t)step, check,
                          code ? MLO_ECALLBACK : MLO_OK, code ? mine : NULL, step_name, NULL, NULL,
                          err, errlen);
  return rc ? (code ? code : TOOL_EXIT_FAIL) : code;
}

/* Every rank's figures at rank 0 (in rank order); all has one per rank
 * there, and is only written on rank 0. */
static int gather_figures(const rank_figures *mine, rank_figures *all) {
  int rc = MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0,
                      MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? MLO_OK : MLO_EPLATFORM;
}

/* This rank's figures as one JSON line. */
static char *json_line(const tool_ranks *r, const rank_figures *mine, uint64_t weights) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "rank", r->rank);
  cJSON_AddNumberToObject(o, "ranks", r->ranks);
  cJSON_AddNumberToObject(o, "node_rank", r->node_rank);
  cJSON_AddNumberToObject(o, "node_ranks", r->node_ranks);
  cJSON_AddStringToObject(o, "mode", r->sharded ? "sharded" : "shared");
  cJSON_AddStringToObject(o, "platform", r->platform ? r->platform : "");
  cJSON_AddBoolToObject(o, "mode_chosen", r->chosen); /* --ranks auto */
  if (r->reason)
    cJSON_AddStringToObject(o, "mode_reason", r->reason);
  else
    cJSON_AddNullToObject(o, "mode_reason");
  cJSON_AddStringToObject(o, "topology", r->topology);
  if (r->modelled) { /* a GiB's load on every rank of the node, each way, as modelled */
    cJSON_AddNumberToObject(o, "modelled_replicated_s_per_gib", r->plan.replicated_s);
    cJSON_AddNumberToObject(o, "modelled_sharded_s_per_gib", r->plan.sharded_s);
  } else {
    cJSON_AddNullToObject(o, "modelled_replicated_s_per_gib");
    cJSON_AddNullToObject(o, "modelled_sharded_s_per_gib");
  }
  cJSON_AddNumberToObject(o, "host_pss_bytes", (double)mine->pss);
  cJSON_AddNumberToObject(o, "slab_pss_bytes", (double)mine->slab_pss);
  cJSON_AddNumberToObject(o, "disk_read_bytes", (double)mine->read);
  cJSON_AddNumberToObject(o, "measured_read_bytes", (double)mine->io_read);
  cJSON_AddNumberToObject(o, "shared_slab_bytes", (double)mine->shared);
  cJSON_AddNumberToObject(o, "disk_tier_read_bytes", (double)mine->tier_read);
  cJSON_AddNumberToObject(o, "h2d_bytes", (double)mine->h2d);
  cJSON_AddNumberToObject(o, "gather_bytes", (double)mine->gather);
  cJSON_AddNumberToObject(o, "gather_s", mine->gather_s);
  cJSON_AddNumberToObject(o, "lane_gathers", (double)mine->lane_gathers);
  cJSON_AddNumberToObject(o, "stall_s", mine->stall_s);
  cJSON_AddNumberToObject(o, "steady_stall_s", mine->steady_stall_s);
  cJSON_AddNumberToObject(o, "wall_s", mine->wall_s);
  cJSON_AddNumberToObject(o, "steady_wall_s", mine->steady_wall_s);
  cJSON_AddNumberToObject(o, "weights_bytes", (double)weights);
  char hex[32];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)mine->digest);
  cJSON_AddStringToObject(o, "digest", hex);
  if (mine->verified < 0)
    cJSON_AddNullToObject(o, "verified");
  else
    cJSON_AddBoolToObject(o, "verified", mine->verified == 1);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}

/* Every rank makes the same collective calls whatever its own flags say
 * (a rank given --json and one not must not wait in different
 * collectives: issue 26.7): the JSON lines in rank order (each rank prints
 * its own if it was asked for JSON), then the figures gathered at rank 0,
 * which prints the table if it was asked for text. */
int ranks_report(const tool_ranks *r, const rank_figures *mine, uint64_t weights, bool json,
                 FILE *out) {
  int mixed[2] = {json, !json}, any[2] = {0, 0};
  if (MPI_Allreduce(mixed, any, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
    return MLO_EPLATFORM;
  if (any[0] && any[1] && r->rank == 0)
    fprintf(stderr, "mlo run: --json was given to some ranks only: each rank reports as it was "
                    "asked\n");
  char *text = json ? json_line(r, mine, weights) : NULL;
  for (int i = 0; i < r->ranks; i++) { /* one line per rank, in rank order: never interleaved */
    if (i == r->rank && text) {
      fprintf(out, "%s\n", text);
      fflush(out);
    }
    if (any[0]) MPI_Barrier(MPI_COMM_WORLD); /* every rank knows whether anyone prints */
  }
  if (json) tool_json_printed = true;
  bool lost = json && !text; /* out of memory for the line: still at every collective below */
  cJSON_free(text);
  if (json && !any[1]) return lost ? MLO_ENOMEM : MLO_OK; /* nobody wants the table */
  rank_figures *all = r->rank == 0 ? calloc((size_t)r->ranks, sizeof *all) : NULL;
  if (r->rank == 0 && !all) { /* the others are in the gather already: end the job */
    fprintf(stderr, "mlo run: rank 0: out of host memory gathering the ranks' figures\n");
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, TOOL_EXIT_FAIL);
  }
  int rc = gather_figures(mine, all);
  if (rc || r->rank || json) { /* rank 0 asked for JSON: it has printed its line */
    free(all);
    return rc ? rc : lost ? MLO_ENOMEM : MLO_OK;
  }
  fprintf(out, "\nranks (%d, %d on this node, %s%s%s):\n", r->ranks, r->node_ranks,
          r->sharded ? "sharded loads" : "replicated loads from the shared slab",
          r->chosen ? ", chosen by --ranks auto: " : "", r->chosen ? r->reason : "");
  fprintf(out, "  the node's topology: %s\n", r->topology);
  if (r->modelled)
    fprintf(out, "  modelled: a GiB reaches every rank in %.3f s replicated, %.3f s sharded\n",
            r->plan.replicated_s, r->plan.sharded_s);
  fprintf(out, "  %4s %10s %10s %10s %10s %10s %8s %9s  %-16s %s\n", "rank", "slabs PSS", "all PSS",
          "read", "moved in", "gathered", "gather", "stall", "digest", "verified");
  uint64_t pss = 0, slab = 0, read = 0, tier = 0, io = 0;
  for (int i = 0; i < r->ranks; i++) {
    const rank_figures *f = &all[i];
    pss += f->pss;
    slab += f->slab_pss;
    read += f->read;
    tier += f->tier_read;
    io += f->io_read;
    fprintf(out, "  %4d %10s %10s %10s %10s %10s %7.3fs %8.3fs  %016llx %s\n", i,
            tool_size(f->slab_pss), tool_size(f->pss), tool_size(f->read + f->tier_read),
            tool_size(f->h2d), tool_size(f->gather), f->gather_s, f->stall_s,
            (unsigned long long)f->digest,
            f->verified < 0 ? "-"
            : f->verified   ? "yes"
                            : "NO");
  }
  double w = weights ? (double)weights : 1;
  fprintf(out, "  node: host slabs %s (%.2fx the weights), read from disk %s (%.2fx)",
          tool_size(slab), (double)slab / w, tool_size(read + tier), (double)(read + tier) / w);
  if (tier) /* the disk tier reads at every load: say which reads were which (issue 44, F18) */
    fprintf(out, ":\n  %s into the slabs, %s by loads through the disk tier (--host-memory)",
            tool_size(read), tool_size(tier));
  fprintf(out,
          "; processes in\n"
          "  all %s (on the host platform that includes the device memory it stands in for)\n",
          tool_size(pss));
  /* what the kernel read from storage for the ranks (/proc/self/io): read-ahead included,
   * pages another process had cached excluded */
  fprintf(out, "  the kernel read %s from storage for them (%.2fx the weights; /proc/PID/io)\n",
          tool_size(io), (double)io / w);
  free(all);
  return MLO_OK;
}

#else

int ranks_start(tool_ranks *r, double timeout_s, char *err, size_t errlen) {
  (void)r, (void)timeout_s;
  snprintf(err, errlen, "--ranks: this mlo was built without MPI (Debian: libopenmpi-dev)");
  return MLO_EUNSUPPORTED;
}
void ranks_stop(tool_ranks *r, int code) {
  (void)r, (void)code;
}
int ranks_device_comm(mlo_comm *comm, mlo_platform *p, bool *made, char *err, size_t errlen) {
  (void)comm, (void)p, (void)err, (void)errlen;
  *made = false;
  return MLO_OK;
}
void ranks_device_comm_free(mlo_comm *comm) {
  (void)comm;
}
int ranks_agree(const tool_ranks *r, int step, int code, uint64_t check, char *err, size_t errlen) {
  (void)r, (void)step, (void)check, (void)err, (void)errlen;
  return code;
}
int ranks_report(const tool_ranks *r, const rank_figures *mine, uint64_t weights, bool json,
                 FILE *out) {
  (void)r, (void)mine, (void)weights, (void)json, (void)out;
  return MLO_EUNSUPPORTED;
}
#endif

/* The PSS of the mappings holding any of addrs (each mapping once). */
uint64_t ranks_pss_of(const void *const *addrs, size_t n) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  bool in = false;
  unsigned long long kb = 0, v;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char *dash = strchr(line, '-'), *space = strchr(line, ' ');
    if (dash && space && dash < space && sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
      in = false;
      for (size_t i = 0; i < n && !in; i++)
        in = (uintptr_t)addrs[i] >= lo && (uintptr_t)addrs[i] < hi;
      continue;
    }
    if (in && sscanf(line, "Pss: %llu kB", &v) == 1) kb += v;
  }
  if (f) fclose(f);
  return (uint64_t)kb * 1024;
}

/* ---- the demo's line: two ranks of this very binary under mpirun ---- */

#ifdef MLO_HAVE_MPI
/* One two-rank run of the demo's pipeline as on an h100-sxm-8 node, with
 * --ranks `mode`: the slowest rank's steady stall, the node's slab PSS and
 * disk reads, the mode it ran and the model's sharded/replicated ratio.
 * false where it did not run. */
typedef struct {
  double stall, slab, read, modelled;
  int ranks, sharded, lane; /* lane: ranks whose gathers ran on the gather thread */
} demo_ranks;

static bool demo_ranks_run(const char *self, const char *dir, uint64_t capacity, double bw,
                           int steps, const char *mode, demo_ranks *r) {
  char cmd[10000];
  snprintf(cmd, sizeof cmd,
           "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
           "OMPI_MCA_rmaps_base_oversubscribe=1 MLO_LOG=error MPIEXEC_TIMEOUT=300 "
           "mpirun -np 2 '%s' run '%s' "
           "--ranks %s --node h100-sxm-8 --json --steps %d --prompts 3 --device-memory %llu "
           "--platform host:prefault=1,poison=0 --link %.0f 2>/dev/null",
           self, dir, mode, steps, (unsigned long long)capacity, bw);
  fflush(NULL);
  FILE *p = popen(cmd, "r");
  char line[8192];
  memset(r, 0, sizeof *r);
  while (p && fgets(line, sizeof line, p)) {
    cJSON *o = cJSON_Parse(line);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "steady_stall_s");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(o, "slab_pss_bytes");
    const cJSON *rd = cJSON_GetObjectItemCaseSensitive(o, "disk_read_bytes");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "modelled_sharded_s_per_gib");
    const cJSON *mr = cJSON_GetObjectItemCaseSensitive(o, "modelled_replicated_s_per_gib");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "mode");
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(o, "lane_gathers");
    if (cJSON_IsNumber(st) && cJSON_IsNumber(sp) && cJSON_IsNumber(rd) && cJSON_IsNumber(ms) &&
        cJSON_IsNumber(mr) && cJSON_IsString(m)) {
      r->ranks++;
      r->sharded += !strcmp(m->valuestring, "sharded");
      r->lane += cJSON_IsNumber(lg) && lg->valuedouble > 0;
      r->modelled = ms->valuedouble / mr->valuedouble;
      r->stall = st->valuedouble > r->stall ? st->valuedouble : r->stall;
      r->slab += sp->valuedouble;
      r->read += rd->valuedouble;
    }
    cJSON_Delete(o);
  }
  int rc = p ? pclose(p) : -1;
  return rc == 0 && r->ranks == 2;
}
#endif

void ranks_demo(const char *dir, uint64_t capacity, double bw, int steps, uint64_t weights,
                FILE *out) {
#ifndef MLO_HAVE_MPI
  (void)dir, (void)capacity, (void)bw, (void)steps, (void)weights;
  fprintf(out, "\nseveral ranks: not shown (this mlo was built without MPI)\n");
#else
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || strchr(dir, '\'') || system("command -v mpirun >/dev/null 2>&1") != 0) {
    fprintf(out, "\nseveral ranks: not shown (mpirun not found; Debian: openmpi-bin)\n");
    return;
  }
  self[n] = '\0';
  /* what --ranks auto chose, and the other mode forced, measured the same
   * way: both block by block, the same policy, link and node (issue 40) */
  demo_ranks chose, other;
  if (!demo_ranks_run(self, dir, capacity, bw, steps, "auto", &chose) || !weights) {
    fprintf(out, "\nseveral ranks: not shown (mpirun -np 2 did not run here)\n");
    return;
  }
  bool sharded = chose.sharded == 2;
  if (!demo_ranks_run(self, dir, capacity, bw, steps, sharded ? "shared" : "sharded", &other)) {
    fprintf(out, "\nseveral ranks: not shown (mpirun -np 2 did not run here)\n");
    return;
  }
  double w = (double)weights;
  fprintf(out,
          "\ntwo ranks as on an 8x H100 SXM node (this pipeline under mpirun -np 2, --ranks auto\n"
          "--node h100-sxm-8: NVSwitch at 7.2x each GPU's host link, modelled), strict, loads\n"
          "block by block: host slabs %.2fx the weights (two processes with slabs of their\n"
          "own: 2.00x), read from disk %.2fx; --ranks auto chose %s loads (the model:\n"
          "sharded %.2fx replicated): stall %.3f s per prompt against %.3f s %s, measured\n"
          "here: %.2fx\n",
          chose.slab / w, chose.read / w, sharded ? "sharded" : "replicated", chose.modelled,
          chose.stall, other.stall,
          sharded ? "replicated (--ranks shared)" : "sharded (--ranks sharded)",
          other.stall > 0 ? chose.stall / other.stall : 0);
  if (sharded && chose.lane == 2)
    fprintf(out,
            "  (each block's gather ran on a thread of its own while the blocks before it\n"
            "  computed, as NCCL's run on a GPU's copy queue; where the compute hides both\n"
            "  modes' copies, what is left is each switch's first block: docs/distributed.md)\n");
  else if (sharded)
    fprintf(out, "  (each block's gather ran on the forward's thread: this MPI does not give\n"
                 "  MPI_THREAD_MULTIPLE, so no thread of its own gathers under the compute)\n");
#endif
}

/* The value of the line of a /proc file that fmt (one %llu) reads; 0 when
 * there is none. */
static unsigned long long proc_value(const char *path, const char *fmt) {
  FILE *f = fopen(path, "r");
  char line[256];
  unsigned long long value = 0, v;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, fmt, &v) == 1) value = v;
  if (f) fclose(f);
  return value;
}

uint64_t ranks_io_read_bytes(void) {
  return (uint64_t)proc_value("/proc/self/io", "read_bytes: %llu");
}

void ranks_reset_peak_rss(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w"); /* "5": VmHWM to the RSS now (Linux 4.0) */
  if (!f) return;
  fputs("5", f);
  fclose(f);
}

uint64_t ranks_peak_rss_bytes(void) {
  return (uint64_t)proc_value("/proc/self/status", "VmHWM: %llu kB") * 1024;
}

uint64_t ranks_pss_bytes(void) {
  return (uint64_t)proc_value("/proc/self/smaps_rollup", "Pss: %llu kB") * 1024;
}

/* ---- --ranks auto: replicated or sharded, from the node's topology ---- */

int ranks_plan_loads(tool_ranks *r, const char *spec, const mlo_node_topology *node,
                     const char *node_name, int mode, bool blocks, char *err, size_t errlen) {
  mlo_node_topology t = MLO_NODE_TOPOLOGY_INIT;
  r->chosen = mode < 0;
  r->modelled = false;
  r->plan = (mlo_load_plan)MLO_LOAD_PLAN_INIT;
  static const char *const keys[] = {"group", "uplink", "fabric", "pcie_p2p"};
  bool node_options = false;
  for (size_t i = 0; i < sizeof keys / sizeof *keys && !node_options; i++) {
    char v[64];
    node_options = mlo_platform_spec_get(spec, keys[i], v, sizeof v) != MLO_ENOTFOUND;
  }
  if (tool_is_host(spec) && node_options) {
    /* the host platform says what it models (a --node profile became its
     * options, or the user gave them in --platform); opened for that alone
     * only when it has them (prefault=1 would touch its memory twice) */
    mlo_platform *p = NULL;
    int rc = mlo_platform_open(spec, &p, err, errlen);
    if (rc) return rc;
    r->modelled = mlo_platform_get_topology(p, &t) == MLO_OK;
    mlo_platform_close(p);
    if (r->modelled && t.group > (unsigned)r->node_ranks) {
      /* its copies would be held to a share of ranks that are not there */
      snprintf(err, errlen,
               "--platform: group=%u ranks behind one uplink, but %d run%s on this node", t.group,
               r->node_ranks, r->node_ranks == 1 ? "s" : "");
      return MLO_EINVAL;
    }
    if (r->modelled)
      snprintf(r->topology, sizeof r->topology, "%s, as the host platform models it",
               node_name ? node_name : "the node given in --platform");
  }
  if (!r->modelled && node) {
    t = *node;
    r->modelled = true;
    snprintf(r->topology, sizeof r->topology, "%s (mlo plan --help)", node_name);
  }
  if (r->modelled && mlo_node_plan_loads(&t, (unsigned)r->node_ranks, 1ull << 30, &r->plan))
    r->modelled = false;
  if (blocks) { /* the shape the loads take: block by block, the gathers pipelined */
    r->plan.sharded_s = r->plan.pipelined_s;
    r->plan.sharded = r->plan.pipelined;
  }
  if (!r->modelled)
    snprintf(r->topology, sizeof r->topology,
             "not known: give --node (mlo plan --help lists them) to let it decide");
  /* (with --host-memory either mode reads the disk once per node: each
   * rank reads its slice of a component on disk, docs/disk.md) */
  r->sharded = mode >= 0 ? mode == 1 : r->modelled && r->plan.sharded;
  r->reason = mode >= 0      ? NULL
              : !r->modelled ? "the node's topology is not known"
              : r->sharded   ? "the topology makes sharded loads faster"
                             : "the topology makes sharded loads no faster";
  /* what the node's ranks must hold alike: how they load, and the model
   * they are paced to (other --node flags model other nodes) */
  struct {
    uint64_t sharded, modelled, group, via;
    double link, uplink, fabric;
  } agreed = {r->sharded, r->modelled,  t.group,     t.fabric_via_uplinks,
              t.link_bps, t.uplink_bps, t.fabric_bps};
  if (!r->modelled) agreed.group = agreed.via = 0, agreed.link = agreed.uplink = agreed.fabric = 0;
  r->agreed = mlo_fnv1a(MLO_FNV_BASIS, &agreed, sizeof agreed) | 1; /* never 0: "nothing" */
  return MLO_OK;
}
