/*
 * plan_cmd.h — what the three files of `mlo plan` share: the parsed flags
 * (cmd_plan.c), one card's projection (plan_project.c) and its output
 * (plan_output.c).  plan.h is the command's outside: profiles, jobs, the
 * compute model.
 */
#ifndef MLO_TOOL_PLAN_CMD_H
#define MLO_TOOL_PLAN_CMD_H

#include "plan.h"

#include <cjson/cJSON.h>

/* The rows of the table, cheapest to describe first. */
enum { POL_RESIDENT, POL_STRICT, POL_BUDGET, POL_PREFETCH, POL_COUNT };
extern const char *const pol_names[POL_COUNT];

typedef struct {
  tool_source src;
  tool_split_args split;
  const char *preset;
  double scale;
  const char *device;
  const char *node; /* --node: a plan_nodes name */
  long gpus;        /* --gpus: the node's GPUs (0: the profile's) */
  long devices;     /* --devices: one pipeline over N of the card (1: one card) */
  bool have_capacity, have_link, have_tflops;
  uint64_t capacity, link;
  double tflops, mfu;
  long steps, prompts;
  int policy, offload; /* -1: not given; policy an mlo_policy */
  bool no_prefetch;
  bool whole_loads; /* --whole-loads: no progressive loads */
  bool have_budget, have_reserve;
  uint64_t budget, reserve;
  bool have_host, have_disk;
  uint64_t host, disk; /* --host-memory, --disk-bw */
  bool have_dtype;
  mlo_dtype dtype;
  const char *job, *timeline;
  struct step_time {
    char key[128]; /* a role or a component name */
    double s;
  } times[32]; /* --step-time, parsed */
  size_t ntimes;
  long width, height, frames, cfg, text_tokens, batch;
  bool cpu_kernels; /* --kernels cpu: the activation model counts torch's CPU kernels */
  bool json;
} plan_args;

typedef struct {
  bool run, fits;
  char why[512]; /* what is short, or why the run failed */
  double wall_s, stall_s, first_wall_s;
  double total_wall_s, total_stall_s; /* every prompt, the cold one included */
  uint64_t total_h2d;
  uint64_t h2d_bytes, loads, peak_device, pinned_host, budget;
  uint64_t disk_bytes; /* read from disk per steady prompt (--host-memory) */
  uint64_t total_disk; /* ... over every prompt */
  uint64_t host_slab;  /* slabs kept in host memory */
  double disk_cost_s;  /* wall_s less the same policy's with every slab in host memory */
  /* several devices (--devices): what the enable placed, and each device's peak */
  mlo_placement placement;
  uint64_t dev_peak[TOOL_MAX_DEVICES];
} pol_result;

typedef struct {
  plan_device dev;       /* the profile with --device-memory / --link applied; with
                            --node, link is the node's effective rate per GPU */
  const plan_node *node; /* --node, else NULL */
  unsigned gpus;
  double gpu_link;            /* with node: each GPU's own link */
  mlo_node_topology topo;     /* with node: as planned (--link applied) */
  mlo_load_plan loads;        /* with node: a GiB's load each way */
  bool custom;                /* no profile: --device-memory, --link, --tflops */
  const plan_device *assumed; /* custom, given only its memory: whose compute it has */
  size_t ncomp;
  struct comp_plan {
    char name[128];
    mlo_role role;
    uint64_t bytes;
    double forward_s, flops;
    mlo_dtype dtype;
    const char *source; /* "model", "--step-time" */
    plan_activation act;
    unsigned char device[POL_COUNT]; /* --devices: where each row's run kept it */
  } * comps;
  uint64_t all_bytes, strict_need, largest;
  uint64_t budget_least; /* the budget policy's least budget, streaming what it must */
  double compute_s;      /* one prompt's forwards: a warm all-resident prompt */
  tool_split split;
  int steps; /* the job's */
  size_t calls;
  pol_result pol[POL_COUNT];
  int advice; /* -1: nothing fits */
  /* Room every row leaves free (docs/plan.md, "Activations and the
   * reserve"): --reserve where given, else the model's. */
  double act_peak;          /* the largest component's activations */
  int act_comp;             /* its index in comps, -1: none known */
  uint64_t model_reserve;   /* context + workspaces + activations and their share */
  uint64_t reserve_but_vae; /* the same without the VAEs' decode (0: a VAE is not the largest) */
  uint64_t reserve;         /* what the rows keep free */
  const char *reserve_from; /* "model", "--reserve" */
  /* --devices N: the projection on N simulated devices of the card, each
   * with `held` (the one-card projection's reserve) taken from its memory */
  size_t ndevices;
  uint64_t held;
} plan_result;

/* The longest projected run mlo plan accepts, in seconds (about 32 years):
 * the simulated clock counts nanoseconds in 64 bits (584 years), so a run
 * within this bound, every load included, can never wrap it. */
#define PLAN_MAX_RUN_S 1e9

/* One card: the pipeline opened on its simulated device, every policy run
 * (plan_project.c).  *pr is the caller's to free (plan_free_result). */
int plan_device_run(const plan_args *pa, const plan_device *dev, plan_result *pr, plan_job *job,
                    bool want_timeline);
/* The same card's projection on ndev of them, one pipeline placed over
 * them (docs/placement.md), each simulated device's memory less `held` (the
 * one-card projection's reserve: what each device keeps free), one clock
 * for all (the calling thread's), each its own link.  No timeline. */
int plan_devices_run(const plan_args *pa, const plan_device *dev, size_t ndev, uint64_t held,
                     plan_result *pr, plan_job *job);
void plan_free_result(plan_result *pr);
/* Whether the flags ask for this row (--offload none, --policy ...). */
bool plan_wanted(const plan_args *pa, int pol);

/* Output (plan_output.c). */
double plan_overhead(const plan_result *pr, const pol_result *q);
const char *plan_pct(double x);
void plan_print_text(const plan_args *pa, const plan_result *pr, const plan_job *job, FILE *out);
cJSON *plan_result_json(const plan_args *pa, const plan_result *pr, const plan_job *job);
void plan_print_summary_line(const plan_result *pr, FILE *out);
/* --devices: the N-device projection beside the one-card one. */
void plan_print_devices(const plan_args *pa, const plan_result *one, const plan_result *many,
                        FILE *out);
cJSON *plan_devices_json(const plan_args *pa, const plan_result *one, const plan_result *many);

#endif
