/*
 * plan.h — `mlo plan`'s parts: the device profiles, the default job of
 * each pipeline family, the compute model (plan_model.c) and the command
 * (cmd_plan.c).  docs/plan.md explains every figure.
 */
#ifndef MLO_TOOL_PLAN_H
#define MLO_TOOL_PLAN_H

#include "tool.h"

/* Where the GPU's memory is (docs/plan.md, "Unified memory"). */
typedef enum {
  PLAN_MEM_DISCRETE, /* its own memory behind a PCIe link */
  PLAN_MEM_SHARED,   /* one pool for CPU and GPU (GB10): a host copy is in it too */
  PLAN_MEM_COHERENT  /* its own HBM, and the CPU's memory read coherently (GH200) */
} plan_memory_kind;

typedef struct {
  const char *name;               /* "h100-sxm", as --device takes it */
  const char *title;              /* "NVIDIA H100 SXM 80GB" */
  uint64_t memory;                /* bytes, as nvidia-smi reports the total */
  double link;                    /* pinned host-to-device bytes per second */
  double bf16_tflops, fp8_tflops; /* dense tensor throughput; fp8 0: none (bf16's is used) */
  const char *bus;
  plan_memory_kind unified;
} plan_device;
extern const plan_device plan_devices[];
extern const size_t plan_ndevices;
/* By name or alias ("h100", "4090"), case-insensitive; NULL if unknown. */
const plan_device *plan_device_find(const char *name);
/* The discrete profile nearest `memory` bytes (in whole GiB), whose compute
 * a card given only by --device-memory is assumed to have. */
const plan_device *plan_device_assumed(uint64_t memory);

/* A node of several cards and its copy paths, for choosing how a switch
 * loads on its ranks (docs/distributed.md, "Topology"; each figure's
 * source in docs/plan.md).  topo.link_bps 0: the card's link. */
typedef struct {
  const char *name;  /* "h100-sxm-8", as --node takes it */
  const char *title; /* "H100 SXM (HGX H100)" */
  const char *card;  /* a plan_devices name */
  unsigned gpus;
  mlo_node_topology topo;
  const char *paths; /* the copy paths in words */
} plan_node;
extern const plan_node plan_nodes[];
extern const size_t plan_nnodes;
/* By name, case-insensitive; NULL if unknown. */
const plan_node *plan_node_find(const char *name);
/* The node's topology: each GPU's link the profile's, else its card's; or
 * `link` where it is > 0 (--link), with the uplinks and the fabric kept at
 * their ratios to the link (mlo run and mlo plan read --link alike). */
mlo_node_topology plan_node_topology(const plan_node *node, double link);

/* What one generation does (diffusers' __call__ defaults per family). */
typedef struct {
  const char *family; /* a preset name: "wan2.2-t2v", "flux", "qwen-image", "sd3" */
  int width, height, frames;
  int passes;       /* DiT and encoder forwards per call: 2 with classifier-free guidance */
  int text_tokens;  /* the prompt's tokens, as the encoders see them */
  bool joint;       /* text tokens join the DiT's attention (Flux, SD3, Qwen-Image) */
  int steps;        /* num_inference_steps */
  int batch;        /* videos or images a forward makes at once */
  bool cfg_batched; /* both guidance passes in one forward, at twice the batch (SD3) */
  /* diffusers' pipeline class: the family's, or model_index.json's where
   * the folder names one (what mlo.torch.from_pretrained is given) */
  char pipeline_class[128];
} plan_job;
bool plan_job_for(const char *family, plan_job *out);
/* The family of a pipeline from its class (model_index.json's _class_name,
 * may be NULL) or, failing that, from words in its component names. */
const char *plan_family_guess(const char *class_name, const char *names);

/* One forward's work under a job (docs/plan.md, "The compute model"). */
typedef struct {
  double linear, attention; /* FLOPs of one pass */
  int passes;
  double flops;            /* passes x (linear + attention) */
  mlo_dtype compute_dtype; /* the dtype holding most weight bytes */
} plan_cost;
void plan_cost_of(const mlo_component *c, const plan_job *job, plan_cost *out);
/* What one forward's activations take at their peak (plan_activation.c;
 * docs/plan.md, "Activations and the reserve"). */
typedef struct {
  double tokens;     /* the tokens a DiT's attention runs over; 0 for a VAE */
  double bytes;      /* the peak, 0 where the component's layout is not known */
  const char *phase; /* where in the forward the peak is */
} plan_activation;
/* cpu_kernels: count torch's CPU kernels' temporaries instead of CUDA's
 * (RMSNorm differs), as the activation test measures them. */
void plan_activation_of(const mlo_component *c, const plan_job *job, bool cpu_kernels,
                        plan_activation *out);
/* The reserve beside the activations: a CUDA context, as PyTorch holds one
 * once its kernels are loaded, and the framework's fixed workspaces
 * (cuBLAS, cuBLASLt); plus a share of the activations for the caching
 * allocator's rounding and fragmentation.  docs/plan.md gives the sources. */
#define PLAN_CUDA_CONTEXT_BYTES (512ull << 20)
#define PLAN_WORKSPACE_BYTES (64ull << 20)
#define PLAN_FRAGMENTATION 0.10

/* Dense TFLOPS for weights of dtype: fp8's where the card has it. */
double plan_tflops_for(const plan_device *dev, mlo_dtype dtype);

/* "fp8", "bf16", "fp16", "fp32" or an mlo dtype name ("F8_E4M3", "Q4_K"). */
int plan_parse_dtype(const char *text, mlo_dtype *out);
/* Declares src's components into the empty dst (no sources: for the
 * simulated platform), DiT and encoder weights converted to `to`. */
int plan_clone(mlo_pipeline *src, mlo_pipeline *dst, mlo_dtype to, char *err, size_t errlen);

int cmd_plan(int argc, char **argv);
/* One line for the demo: preset at full size on a card (dtype may be NULL;
 * host, the host memory for the weights, 0 for all of them): which
 * policies fit and their overhead over all-resident. */
int plan_brief(const char *preset, const char *device, const char *dtype, uint64_t host, FILE *out);

#endif
