/*
 * tool.h — what the `mlo` command's files share: exit codes, flag parsing,
 * the progress bar, the trace recorder and its two writers (Chrome trace
 * JSON, SVG timeline), and the session that opens a checkpoint on a
 * platform and runs the reference workload on it.  Internal to tools/mlo.
 */
#ifndef MLO_TOOL_H
#define MLO_TOOL_H

#include "mlo/checkpoint.h"
#include "mlo/mlo.h"
#include "workload/workload.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__)
#define TOOL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TOOL_PRINTF(a, b)
#endif

/* Exit codes (docs/cli.md). */
enum {
  TOOL_EXIT_OK = 0,
  TOOL_EXIT_VERIFY = 1, /* the digests differ, or the audit failed */
  TOOL_EXIT_USAGE = 2,  /* bad flag, bad value, bad path, malformed checkpoint */
  TOOL_EXIT_NOMEM = 3,  /* out of device memory */
  TOOL_EXIT_FAIL = 4,   /* anything else: host memory, a platform error */
};
/* The exit code for a library status. */
int tool_exit_for(int status);

/* The declared roles of the generated wan2.2-t2v preset (cmd_demo.c). */
extern const mlo_role_override tool_wan_roles[];
extern const size_t tool_wan_nroles;

/* Commands: argv[0] is the command name. */
int cmd_demo(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* ---- args.c: flag parsing with one error style for every command ---- */
typedef struct {
  const char *cmd; /* "run", for messages */
  int argc;
  char **argv;
  int i;       /* index of the current argument */
  bool failed; /* a message was printed; exit TOOL_EXIT_USAGE */
} targs;
void targs_init(targs *a, const char *cmd, int argc, char **argv);
/* Advances to the next argument; false at the end. */
bool targs_next(targs *a);
const char *targs_cur(const targs *a);
bool targs_is_help(const targs *a);
/* A boolean flag "--name". */
bool targs_flag(targs *a, const char *name);
/* "--name VALUE" or "--name=VALUE": true if the current argument is this
 * flag; *val is NULL (and a message printed) when the value is missing. */
bool targs_value(targs *a, const char *name, const char **val);
/* An argument starting with '-' that no branch took. */
void targs_unknown(targs *a);
/* Prints "mlo CMD: MESSAGE" and the --help hint; sets failed. */
void targs_error(targs *a, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* Typed values; each prints a message naming the flag on junk and returns
 * false. */
bool targs_int(targs *a, const char *flag, const char *val, long lo, long hi, long *out);
bool targs_double(targs *a, const char *flag, const char *val, double lo, double hi, double *out);
bool targs_size(targs *a, const char *flag, const char *val, uint64_t *out);
/* A platform spec whose name the library knows (mlo_platform_info: the
 * tools keep no list of their own); the message lists them. */
bool targs_platform(targs *a, const char *flag, const char *val);
/* Whether spec names a platform the library knows; *indexed (may be NULL)
 * whether its specs take a device index ("cuda[:N]"). */
bool tool_platform_known(const char *spec, bool *indexed);
/* A residency policy by the library's name for it (mlo_policy_name's
 * table); *out is its mlo_policy value, the message lists the names. */
bool targs_policy(targs *a, const char *flag, const char *val, int *out);
/* One of a NULL-terminated list of words; *out is its index. */
bool targs_choice(targs *a, const char *flag, const char *val, const char *const *words, int *out);

/* "--role NAME=ROLE": appends to list (names are malloc'd copies, freed
 * by targs_free_roles). */
bool targs_role(targs *a, const char *val, mlo_role_override *list, size_t *count, size_t cap);
void targs_free_roles(mlo_role_override *list, size_t count);
#define TOOL_MAX_ROLES 32

/* ---- source.c: the pipeline a command works on, and the expert split ---- */
#define TOOL_MAX_FILES 16
typedef struct {
  const char *path;                         /* PATH, or NULL when component files are given */
  const char *label;                        /* for messages: path, or the first file */
  const char *variant;                      /* --variant */
  bool allow_stray;                         /* --allow-stray */
  mlo_component_file files[TOOL_MAX_FILES]; /* --diffusion-model, --component, ... */
  bool high_noise[TOOL_MAX_FILES];
  size_t nfiles;
  mlo_role_override roles[TOOL_MAX_ROLES]; /* --role */
  size_t nroles;
  /* A pipeline declared without files (mlo plan's presets): its schedule,
   * used by split_resolve instead of reading PATH's. */
  const mlo_denoise_schedule *sched;
  mlo_comm *comm; /* --ranks: the pipeline's communicator (NULL: one process) */
  bool sharded;   /* --ranks sharded */
} tool_source;
/* Takes the current argument when it is one of the source flags. */
bool source_flag(targs *a, tool_source *src);
/* After parsing: a PATH or files (not both), names settled; false with a
 * message on a problem. */
bool source_finish(targs *a, tool_source *src);
void source_free(tool_source *src);
/* A source that is just a PATH (the demo's and the bench's generated
 * pipelines). */
void source_init_path(tool_source *src, const char *path);
/* Opens the pipeline (headers only).  roles replace src->roles when given
 * (the reference run passes the roles the run resolved). */
int source_open(const tool_source *src, mlo_platform *const *devs, size_t ndevs,
                const mlo_role_override *roles, size_t nroles, mlo_pipeline **out, char *err,
                size_t errlen);
/* The help text of the source flags, shared by run and inspect. */
#define TOOL_SOURCE_HELP                                                                           \
  "  --variant V           weights variant (fp16, bf16): *.V.safetensors and their\n"              \
  "                        weight maps; without it the plain files are used\n"                     \
  "  --role NAME=ROLE      override a component's role (dit, encoder, vae, other)\n"               \
  "  --allow-stray         a stray file beside a weight map warns instead of failing\n"            \
  "components as separate files (ComfyUI / stable-diffusion.cpp), instead of PATH:\n"              \
  "  --diffusion-model F   the DiT (Wan2.2: the low-noise expert)\n"                               \
  "  --high-noise-diffusion-model F   Wan2.2's high-noise expert (runs first)\n"                   \
  "  --t5xxl F, --umt5 F, --clip_l F, --clip_g F, --llm F   text encoders\n"                       \
  "  --vae F               the VAE\n"                                                              \
  "  --component NAME[:ROLE]=F   any other component (ROLE guessed from F's name)\n"               \
  "  each F is a .safetensors or .gguf file, or a component folder\n"

typedef struct {
  bool have_ratio, have_shift, have_steps;
  double ratio, shift;
  long steps;
} tool_split_args;
typedef struct {
  int first_steps;            /* steps on the first of two DiTs */
  mlo_denoise_schedule sched; /* where they came from */
  char source[48];            /* "scheduler config", "default", "--boundary-steps", "one DiT" */
} tool_split;
/* The DiTs of a pipeline: how many, and the names of the first two (either
 * pointer may be NULL). */
size_t tool_dits(mlo_pipeline *pipe, const char **first, const char **second);
/* The files a pipeline's tensors (or only's, when given) come from, each
 * once, in first-use order; *out is malloc'd (free it). */
size_t tool_files(mlo_pipeline *pipe, const mlo_component *only, const char ***out);
/* Takes --boundary, --flow-shift, --boundary-steps. */
bool split_flag(targs *a, tool_split_args *sa);
/* The expert split of a steps-step run: --boundary-steps, else the
 * pipeline's scheduler config (with --boundary / --flow-shift over its
 * values), else the default flow-match schedule with Wan2.2's boundary
 * 0.875.  Only a pipeline with two DiTs needs one. */
int split_resolve(const tool_source *src, const tool_split_args *sa, mlo_pipeline *pipe, int steps,
                  tool_split *out, char *err, size_t errlen);
#define TOOL_SPLIT_HELP                                                                            \
  "  --boundary R          Wan2.2's boundary_ratio: steps whose timestep is at least\n"            \
  "                        R x num_train_timesteps run on the first DiT (default:\n"               \
  "                        model_index.json's; 0.875 for files)\n"                                 \
  "  --flow-shift F        the scheduler's flow shift (default: its config; 5 for files)\n"        \
  "  --boundary-steps N    put exactly the first N steps on the first DiT\n"

/* Prints an error line "mlo: ..." to stderr. */
void tool_err(const char *fmt, ...) TOOL_PRINTF(1, 2);
/* Prints "mlo CMD: ..." to stderr; like tool_err and targs_error it keeps
 * the message for the JSON error object. */
void tool_failf(const char *cmd, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* "cannot open PATH: why", or the library's message alone when it starts
 * with PATH already (a path is said once); returns out. */
const char *tool_open_message(const char *path, const char *msg, int rc, char *out, size_t outlen);
/* The last error message, and whether a command printed its JSON already:
 * with --json, a failure that printed none prints {"error", "code",
 * "message"} on stdout instead (main.c). */
extern char tool_last_error[1024];
extern bool tool_json_printed;
/* Prints a cJSON_Print result (freeing it) as the command's JSON output;
 * TOOL_EXIT_FAIL for NULL (out of memory). */
int tool_print_json_text(char *text);
void tool_print_json_error(int code);
/* A size as "1.50 GiB" in a static rotating buffer (for printf). */
const char *tool_size(uint64_t bytes);
/* A name read from a file (tensor, metadata, component, path) as a terminal
 * may be shown it: control characters and bytes that are not UTF-8 escaped
 * (mlo_escape).  Eight rotating buffers, as tool_size: the printing thread's. */
const char *tool_esc(const char *s);

/* Whether a platform spec names the host platform ("host", "host:..."; NULL:
 * no). */
bool tool_is_host(const char *spec);

/* ---- ranks.c: mlo run --ranks under mpirun ---- */
typedef struct {
  mlo_comm *comm;
  bool sharded;
  int rank, ranks, node_rank, node_ranks;
  bool chosen;          /* --ranks auto: sharded is mlo's choice, not the user's */
  const char *reason;   /* why it chose what it did (with chosen) */
  uint64_t agreed;      /* what every node rank must hold alike: the loads and the model */
  const char *platform; /* the spec this rank opened (cuda: its own device) */
  bool modelled;        /* the node's topology is known: plan holds its figures */
  char topology[160];   /* where it came from, in words */
  mlo_load_plan plan;   /* with modelled: a GiB's load each way on this node */
} tool_ranks;
/* The node's loads: the topology the platform `spec` models (the host
 * platform with group=, uplink=, fabric=: a --node profile becomes those)
 * or else `node` (a --node profile, may be NULL), planned for r's
 * node_ranks GPUs into r->plan; and r->sharded: mode 1 sharded, 0
 * replicated, -1 (--ranks auto) the faster as planned, replicated where no
 * topology is known (a host budget does not decide: either mode reads a
 * component on disk once per node); planned for the shape the loads take
 * (`blocks`: block by block, each piece's gather under the next pieces'
 * slices, the model's pipelined figure; else whole).  MLO_OK, or a failure to open the
 * platform (err says). */
int ranks_plan_loads(tool_ranks *r, const char *spec, const mlo_node_topology *node,
                     const char *node_name, int mode, bool blocks, char *err, size_t errlen);
/* What one rank measured (plain data: gathered to rank 0 as bytes). */
typedef struct {
  uint64_t pss;       /* proportional set size: shared pages count 1/n */
  uint64_t slab_pss;  /* of it, the host slabs' mappings */
  uint64_t read;      /* checkpoint bytes this rank was given to read */
  uint64_t io_read;   /* bytes the kernel read from storage for this process while it
                         materialized (/proc/self/io read_bytes): what it really read,
                         read-ahead included, pages others had cached excluded */
  uint64_t shared;    /* host slabs in node-shared memory */
  uint64_t tier_read; /* read from files by loads from disk (--host-memory) */
  uint64_t h2d, gather;
  uint64_t lane_gathers; /* of the gathers, those on the gather thread (MPI_THREAD_MULTIPLE) */
  double gather_s, stall_s, steady_stall_s, wall_s, steady_wall_s;
  uint64_t digest;
  int verified; /* -1: no --verify */
} rank_figures;
/* MPI_Init (unless the caller did) and the communicator over every rank;
 * timeout_s bounds how long a collective waits for a missing rank. */
int ranks_start(tool_ranks *r, double timeout_s, char *err, size_t errlen);
/* Sharded loads on a platform that gathers on the device (cuda): the
 * node's NCCL communicator, made by mlo over comm (collective over the
 * node: node rank 0's id, each rank's communicator on its own device) and
 * freed by ranks_device_comm_free before the platform closes.  *made says
 * whether there is one to free.  MLO_OK with nothing made elsewhere. */
int ranks_device_comm(mlo_comm *comm, mlo_platform *p, bool *made, char *err, size_t errlen);
void ranks_device_comm_free(mlo_comm *comm);
/* Frees the communicator and finalizes MPI if ranks_start initialized it;
 * a broken communicator ends the job with MPI_Abort(code) instead. */
void ranks_stop(tool_ranks *r, int code);
/* Every rank at `step` with its exit code so far: code if every rank got
 * here with 0 and the same check, else non-zero on every rank (err says
 * which failed or differ), within the communicator's timeout, never a
 * hang.  code itself without ranks. */
enum {
  RANKS_STEP_MEASURE = 1, /* a page's PSS counts every rank that touched it */
  RANKS_STEP_REPORT = 2,  /* the report's collectives need every rank */
  RANKS_STEP_LOADS = 3,   /* check: the loads chosen, the same on every rank */
  RANKS_STEP_SETTINGS = 4 /* check: the offload settings, the same on every rank */
};
int ranks_agree(const tool_ranks *r, int step, int code, uint64_t check, char *err, size_t errlen);
/* The demo's line on several ranks: this binary under `mpirun -np 2 ...
 * --ranks auto --node h100-sxm-8` on the demo's checkpoint, device and link,
 * then the mode auto did not choose, the same way: host slabs and reads
 * against the weights, and the two stalls measured; a line saying why when
 * MPI or mpirun is missing. */
void ranks_demo(const char *dir, uint64_t capacity, double bw, int steps, uint64_t weights,
                FILE *out);
/* This process's proportional set size (smaps_rollup), 0 if unknown, and
 * that of the mappings holding any of addrs (each counted once). */
uint64_t ranks_pss_bytes(void);
/* This process's resident high-water mark (VmHWM; 0 if unknown), and its
 * reset to the RSS now (where the kernel allows: else it stays the
 * process's peak so far). */
uint64_t ranks_peak_rss_bytes(void);
void ranks_reset_peak_rss(void);
/* /proc/self/io read_bytes (0 where the kernel does not account it). */
uint64_t ranks_io_read_bytes(void);
uint64_t ranks_pss_of(const void *const *addrs, size_t n);
/* --json: one line per rank, in rank order; else rank 0 prints every
 * rank's figures and the node's totals against `weights`.  Collective. */
int ranks_report(const tool_ranks *r, const rank_figures *mine, uint64_t weights, bool json,
                 FILE *out);

/* ---- progress.c: a bar on stderr when it is a terminal, else nothing ---- */
typedef struct {
  bool enabled;
  const char *label;
  uint64_t last_ns;
  int last_permille;
  /* materialization: bytes of finished components + the current one's */
  const void *cur_comp;
  uint64_t base, cur, total;
  uint64_t t0_ns; /* runs: when the first forward started, for s/it and time left */
} tool_progress;
void progress_init(tool_progress *p, const char *label, uint64_t total);
void progress_update(tool_progress *p, uint64_t done, uint64_t total);
void progress_finish(tool_progress *p);
/* Adapters for mlo_pipeline_set_progress, mlo_synth_write and
 * mlo_workload_run. */
void progress_load_cb(const mlo_component *comp, uint64_t done, uint64_t total, void *user);
void progress_synth_cb(const char *file, uint64_t done, uint64_t total, void *user);
/* Runs: "  offloaded   9/11  transformer_2   23.5 it/s, 0.09 s left", as
 * stable-diffusion.cpp users know it (s/it when a forward takes over 1 s). */
void progress_step_cb(size_t done, size_t total, const mlo_component *comp, void *user);

/* ---- trace_json.c: the recorder behind --trace and --timeline ---- */
typedef struct {
  mlo_trace_event *events;
  size_t count, cap;
  bool overflow; /* allocation failed: the trace is incomplete */
  void *lock;    /* pthread_mutex_t* */
} tool_trace;
int tool_trace_init(tool_trace *t);
void tool_trace_destroy(tool_trace *t);
/* The mlo_trace_fn to install with mlo_pipeline_set_trace. */
void tool_trace_hook(const mlo_trace_event *ev, void *user);
/* Writes Chrome trace-event JSON (tracks: copies, forwards, evictions,
 * waits, and a device-memory counter).  Component names are read from the
 * events, so the pipeline must still be alive.  Atomic (temp + rename). */
int tool_trace_write_json(const tool_trace *t, const char *path, char *err, size_t errlen);
/* ---- timeline_svg.c ---- */
/* The run a timeline draws, beside its trace: times on the trace's clock
 * (the platform's), so the axis covers the whole run, not only its events. */
typedef struct {
  uint64_t capacity;         /* device bytes (a stand-in's may dwarf the run) */
  uint64_t budget;           /* the budget policy's, 0 for none */
  uint64_t start_ns, end_ns; /* the run */
  const uint64_t *prompt_ns; /* when each prompt started (nprompts) */
  int nprompts;
} tool_timeline_run;
int tool_timeline_write_svg(const tool_trace *t, mlo_pipeline *pipe, const tool_timeline_run *run,
                            const char *title, const char *subtitle, const char *path, char *err,
                            size_t errlen);
/* Writes an output file: a regular file is replaced atomically, a symlink
 * followed, a device, FIFO or socket refused (base/outfile.c). */
int tool_write_file(const char *path, const char *data, size_t len, char *err, size_t errlen);
/* Checks before any work that an output path can be written (NULL: none);
 * prints "mlo CMD: FLAG: why" and returns an exit code, 0 if it can. */
int tool_check_output(const char *cmd, const char *flag, const char *path);

/* ---- session.c: a checkpoint opened on a platform, and runs of it ---- */
#define TOOL_MAX_DEVICES 16
typedef struct {
  mlo_platform *platform; /* devices[0] */
  mlo_platform *devices[TOOL_MAX_DEVICES];
  size_t ndevices;
  mlo_pipeline *pipe;
  mlo_workload *workload;
  uint64_t capacity;     /* device total (several devices: the largest's) */
  double load_s;         /* reading the checkpoint into host slabs */
  uint64_t load_io_read; /* what the kernel read from storage meanwhile (/proc/self/io) */
  uint64_t load_bytes;   /* bytes read into slabs */
  double read_s;         /* --read-check: the plain cold read of the same files */
  uint64_t read_bytes;   /* their size */
  int refused;           /* the exit code before_load returned */
  mlo_comm *nccl_comm;   /* --ranks sharded on cuda: the communicator we gave an NCCL one */
} tool_session;

/* --place NAME=DEVICE: a component pinned to one of the run's devices. */
typedef struct {
  const char *name;
  int device;
} tool_place;

typedef struct {
  const tool_source *source;
  const char *platform_spec; /* "host:capacity=1G", "cuda:0" */
  /* more devices for the one pipeline (--platform repeated): specs of the
   * second and later, and the components pinned to one */
  const char *const *more_specs;
  size_t nmore;
  const tool_place *place;
  size_t nplace;
  const mlo_role_override *overrides; /* NULL: the source's --role flags */
  size_t override_count;
  bool progress;   /* a load bar while materializing */
  bool read_check; /* time a plain cold read of the files, then load cold */
  /* leave materializing to the run's enable (a host budget decides which
   * slabs it reads) */
  bool defer_materialize;
  int tokens[4]; /* per role (0: the default) */
  /* Called with the pipeline open and nothing loaded; a nonzero return
   * (an exit code, err set) ends session_open with that code, negated. */
  int (*before_load)(tool_session *s, void *user, char *err, size_t errlen);
  void *before_load_user;
} session_config;

/* Opens and materializes.  On failure err holds the message and the
 * returned status maps to an exit code through tool_exit_for; a refusal by
 * before_load returns TOOL_SESSION_REFUSED and puts its exit code in
 * s->refused. */
#define TOOL_SESSION_REFUSED 1
int session_open(tool_session *s, const session_config *cfg, char *err, size_t errlen);
/* Opens one more device of the session, a platform of its own (--platform
 * repeated; mlo plan's simulated devices); the first is s->platform too.
 * The capacity is the largest device's; session_close closes them all. */
int session_add_device(tool_session *s, const char *spec, char *err, size_t errlen);
/* The reference workload on every device of the session (s->workload). */
int session_open_workload(tool_session *s, char *err, size_t errlen);
void session_close(tool_session *s);

typedef struct {
  bool offload;                  /* model-level offload; false = all resident */
  mlo_offload_settings settings; /* policy, budget and prefetch included */
  bool learn_schedule;           /* learn it from the calls; false: declare it */
  bool whole_loads;              /* no progressive loads (mlo_component_set_progressive) */
  int prompts;                   /* generations in one process (0 counts as 1) */
  int steps;
  int first_steps; /* of two DiTs, steps on the first (tool_split) */
  bool audit;
  bool progress;
  const char *progress_label; /* NULL: "offloaded" or "resident" */
  tool_trace *trace;          /* NULL: no trace */
} run_options;

/* One generation (prompt) of a run: the first includes enable (cold), the
 * rest show the steady state. */
typedef struct {
  double wall_s, stall_s;
  uint64_t h2d_bytes, loads, evictions, prefetches;
  uint64_t disk_read_bytes; /* read from checkpoint files by loads (the disk tier) */
  double disk_stall_s;      /* of stall_s, waiting for them */
  uint64_t digest;
} gen_result;

typedef struct {
  uint64_t digest;    /* the first generation's */
  bool digests_agree; /* every generation's digest equals the first's */
  gen_result *gens;   /* ngens of them (malloc'd; run_result_free) */
  int ngens;
  double wall_s;
  uint64_t start_ns; /* when the run started, on the platform's clock (the trace's) */
  mlo_pipeline_stats stats;
  uint64_t platform_peak;   /* the platform's own high-water mark */
  uint64_t reserved_peak;   /* its allocator's reserve high-water mark (CUDA pool) */
  uint64_t peak_rss;        /* the process's resident high-water mark (VmHWM) */
  size_t calls;             /* forwards in the schedule */
  double dit_step_s;        /* mean seconds of one DiT forward (0 without DiTs) */
  mlo_component *failed;    /* the component a failure happened in */
  mlo_stream_info *streams; /* per component, as the policy planned it at enable
                               (malloc'd; run_result_free) */
  size_t nstreams;
} run_result;

/* Runs the reference schedule for o->prompts generations, starting cold:
 * every component starts on the host (evicted first), stats are reset, the
 * schedule is declared to the library (the budget policy plans from it),
 * and the time covers enable (or load-all) through the last forward and a
 * synchronize; each generation is also measured on its own.  Offload is
 * disabled again afterwards.  Free r with run_result_free. */
int session_run(tool_session *s, const run_options *o, run_result *r, char *err, size_t errlen);
void run_result_free(run_result *r);
/* One figure of a run's steady state: its median over generations 2..
 * (the warm prompts), the first's when there is only one. */
typedef enum { GEN_WALL, GEN_STALL, GEN_H2D, GEN_LOADS, GEN_DISK, GEN_DISK_STALL } gen_figure;
double run_steady(const run_result *r, gen_figure what);
/* a / b, 0 when b is not positive (a ratio to a missing baseline). */
double tool_ratio(double a, double b);

/* The all-resident reference of --verify and the demo: the same checkpoint
 * in a fresh session (on host, with a capacity that holds everything),
 * closed again before returning.  o->offload/audit/trace are ignored. */
int session_reference_run(const session_config *cfg, const run_options *o, uint64_t all_resident,
                          run_result *r, char *err, size_t errlen);
/* Writes the trace JSON and/or the SVG timeline (either path may be NULL);
 * the timeline's second line names the platform, the run's mode, steps and
 * wall time. */
int session_write_pictures(const tool_trace *t, tool_session *s, const char *title,
                           const run_options *o, const run_result *r, const char *trace_path,
                           const char *svg_path, char *err, size_t errlen);

/* The device bytes the run mode needs and the component that sets it, for
 * the "needs at least ..." message; false if it does not fit. */
bool session_fits(tool_session *s, bool offload, uint64_t *need, const char **what);

/* ---- report.c: what a run printed, as text or JSON ---- */
typedef struct {
  char *name;
  size_t device; /* the device it ran on (several: placement's or --place's) */
  mlo_role role;
  mlo_role_source source;
  uint64_t bytes;        /* on the device, alignment padding included */
  uint64_t tensor_bytes; /* the tensors alone */
  mlo_component_stats stats;
  mlo_stream_info stream; /* slots 0: it moved whole */
} comp_report;

typedef struct {
  char *platform;      /* mlo_platform_description */
  const char *offload; /* "model" or "none" */
  const char *sync;
  const char *policy; /* "strict" or "budget" */
  bool prefetch;
  bool learned; /* the schedule learned from the calls, not declared */
  int prompts;
  int steps;
  tool_split split;
  uint64_t capacity, all_resident, model_need, max_comp;
  uint64_t tensor_bytes;        /* the weights without alignment padding */
  char *dit_first, *dit_second; /* the two DiTs of a split (NULL otherwise) */
  double load_s;                /* checkpoint -> host slabs */
  uint64_t load_bytes;
  double read_s; /* --read-check: a plain read of the same files, cold */
  uint64_t read_bytes;
  run_result run;
  bool verify;    /* a reference run was made */
  bool identical; /* its digest equals run.digest */
  run_result ref;
  size_t ncomp;
  comp_report *comps;
  const char *trace_path, *timeline_path;
  rank_figures rank; /* --ranks: this rank's, taken while the pipeline was alive */
  size_t ndevices;   /* one pipeline over several devices: each one's */
  char *device_desc[TOOL_MAX_DEVICES];
  uint64_t device_peak[TOOL_MAX_DEVICES];
  mlo_placement placement;
} tool_report;
/* Copies what the report needs out of a session (so it can be closed). */
int report_snapshot(tool_report *rep, tool_session *s, const run_result *r);
void report_free(tool_report *rep);
void report_print_text(const tool_report *rep, FILE *out);
int report_print_json(const tool_report *rep, FILE *out);

/* ---- bench_micro.c: the measurements behind `mlo bench` ---- */
typedef struct {
  uint64_t bytes;
  double load_s, raw_s; /* medians */
  double ratio;         /* load throughput / raw copy throughput */
} bench_load;
typedef struct {
  uint64_t bytes;   /* bytes loaded per switch */
  double switch_s;  /* median time of one switch (evict + load) */
  double ideal_s;   /* bytes / raw copy bandwidth */
  double literal_s; /* the same in the specification-literal mode */
} bench_switch;
typedef struct {
  int copies; /* back to back, each of bytes */
  uint64_t bytes;
  double rate;      /* the link set, bytes per second */
  double delivered; /* median over reps: bytes moved / elapsed, over rate */
} bench_link;
/* Median of n doubles (sorts v). */
double bench_median(double *v, size_t n);
/* Loads of one `bytes` component vs a raw copy of the same size. */
int bench_load_throughput(const char *spec, uint64_t bytes, int reps, bench_load *out, char *err,
                          size_t errlen);
/* Median ns of a hooked forward of an already-resident component, and the
 * platform calls it made (0 means: no synchronize, no copy). */
int bench_hot_forward(const char *spec, int batches, double *ns, double *platform_calls, char *err,
                      size_t errlen);
/* DiT <-> encoder switches of `bytes` components (64 tensors each). */
int bench_switch_cost(const char *spec, uint64_t bytes, int reps, bench_switch *out, char *err,
                      size_t errlen);

/* The host link model's fidelity: copies queued back to back (a streamed
 * forward's) against the rate set (bw=), on a host platform of its own. */
int bench_link_model(int reps, bench_link *out, char *err, size_t errlen);

/* The platform spec with the host capacity replaced (or added). */
void spec_with_capacity(const char *spec, uint64_t capacity, char *out, size_t outlen);

#endif
