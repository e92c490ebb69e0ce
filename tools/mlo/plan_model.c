/*
 * plan_model.c — what `mlo plan` assumes about the world: the cards our
 * users have (memory, host link, dense tensor throughput, each with its
 * public source in docs/plan.md), the job each pipeline family runs by
 * default (diffusers' __call__ defaults), and the compute model that turns
 * a component's tensors and the job into seconds per forward.  The residency
 * side of a projection is not modelled here: it is the library's own code
 * running on the simulated platform (src/platform/sim.c).
 */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MIB (1024ull * 1024ull)
#define GEN4_LINK 25e9          /* ~80% of PCIe 4.0 x16's 31.5 GB/s: pinned copies in practice */
#define GEN5_LINK 50e9          /* ~80% of PCIe 5.0 x16's 63 GB/s */
#define GEN4_X8 (GEN4_LINK / 2) /* an x8 card: half the lanes, half the rate */
#define C2C_LINK 360e9          /* ~80% of NVLink-C2C's 450 GB/s each way */
/* GB10: "host" and "device" are the same LPDDR5x (273 GB/s), so a copy reads
 * and writes it: ~80% of half its bandwidth */
#define GB10_COPY 109e9

/* Memory as nvidia-smi reports the card's total (GB10: as CUDA reports the
 * pool); TFLOPS dense (without structured sparsity) with FP32 accumulation,
 * from NVIDIA's datasheets and architecture whitepapers (docs/plan.md lists
 * each, and how the figures of a spec page that quotes only "AI TOPS" are
 * derived). */
const plan_device plan_devices[] = {
    {"h200", "NVIDIA H200 SXM 141GB", 143771 * MIB, GEN5_LINK, 989, 1979, "PCIe 5.0",
     PLAN_MEM_DISCRETE},
    {"h100-sxm", "NVIDIA H100 SXM 80GB", 81559 * MIB, GEN5_LINK, 989, 1979, "PCIe 5.0",
     PLAN_MEM_DISCRETE},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB", 81559 * MIB, GEN5_LINK, 756, 1513, "PCIe 5.0",
     PLAN_MEM_DISCRETE},
    {"a100-80g", "NVIDIA A100 80GB", 81920 * MIB, GEN4_LINK, 312, 0, "PCIe 4.0", PLAN_MEM_DISCRETE},
    {"a100-40g", "NVIDIA A100 40GB", 40960 * MIB, GEN4_LINK, 312, 0, "PCIe 4.0", PLAN_MEM_DISCRETE},
    {"l40s", "NVIDIA L40S 48GB", 46068 * MIB, GEN4_LINK, 362, 733, "PCIe 4.0", PLAN_MEM_DISCRETE},
    {"rtx5090", "NVIDIA GeForce RTX 5090 32GB", 32607 * MIB, GEN5_LINK, 209.5, 419, "PCIe 5.0",
     PLAN_MEM_DISCRETE},
    {"rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24564 * MIB, GEN4_LINK, 165.2, 330.3, "PCIe 4.0",
     PLAN_MEM_DISCRETE},
    {"rtx3090", "NVIDIA GeForce RTX 3090 24GB", 24576 * MIB, GEN4_LINK, 71, 0, "PCIe 4.0",
     PLAN_MEM_DISCRETE},
    {"rtx4080", "NVIDIA GeForce RTX 4080 16GB", 16376 * MIB, GEN4_LINK, 97.5, 194.9, "PCIe 4.0",
     PLAN_MEM_DISCRETE},
    {"rtx4060ti-16g", "NVIDIA GeForce RTX 4060 Ti 16GB", 16380 * MIB, GEN4_X8, 44.1, 88.3,
     "PCIe 4.0 x8", PLAN_MEM_DISCRETE},
    {"rtx4070", "NVIDIA GeForce RTX 4070 12GB", 12282 * MIB, GEN4_LINK, 58.3, 116.6, "PCIe 4.0",
     PLAN_MEM_DISCRETE},
    {"rtx3060", "NVIDIA GeForce RTX 3060 12GB", 12288 * MIB, GEN4_LINK, 25.5, 0, "PCIe 4.0",
     PLAN_MEM_DISCRETE},
    {"rtx4060", "NVIDIA GeForce RTX 4060 8GB", 8188 * MIB, GEN4_X8, 30.2, 60.5, "PCIe 4.0 x8",
     PLAN_MEM_DISCRETE},
    {"gh200", "NVIDIA GH200 96GB (Grace Hopper)", 97871 * MIB, C2C_LINK, 989, 1979, "NVLink-C2C",
     PLAN_MEM_COHERENT},
    {"gh200-144g", "NVIDIA GH200 144GB HBM3e (Grace Hopper)", 145920 * MIB, C2C_LINK, 989, 1979,
     "NVLink-C2C", PLAN_MEM_COHERENT},
    {"gb10", "NVIDIA DGX Spark (GB10)", 124549 * MIB, GB10_COPY, 62.5, 125, "unified LPDDR5x",
     PLAN_MEM_SHARED},
};
const size_t plan_ndevices = sizeof plan_devices / sizeof plan_devices[0];

static const struct {
  const char *alias, *name;
} device_aliases[] = {
    {"h100", "h100-sxm"},  {"a100", "a100-80g"},        {"4090", "rtx4090"},
    {"5090", "rtx5090"},   {"3090", "rtx3090"},         {"h200-sxm", "h200"},
    {"4080", "rtx4080"},   {"4070", "rtx4070"},         {"3060", "rtx3060"},
    {"4060", "rtx4060"},   {"4060ti", "rtx4060ti-16g"}, {"rtx4060ti", "rtx4060ti-16g"},
    {"dgx-spark", "gb10"}, {"gh200-96g", "gh200"}};

const plan_device *plan_device_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof device_aliases / sizeof *device_aliases; i++)
    if (!strcasecmp(name, device_aliases[i].alias)) name = device_aliases[i].name;
  for (size_t i = 0; i < plan_ndevices; i++)
    if (!strcasecmp(name, plan_devices[i].name)) return &plan_devices[i];
  return NULL;
}

/* The profile whose compute a card described by its memory alone is given:
 * the discrete card whose memory, in whole GiB, is nearest; of cards as
 * near, the one listed first (the newer generation). */
const plan_device *plan_device_assumed(uint64_t memory) {
  const plan_device *best = NULL;
  double want = (double)memory / (double)(1ull << 30), dist = 0;
  for (size_t i = 0; i < plan_ndevices; i++) {
    if (plan_devices[i].unified != PLAN_MEM_DISCRETE) continue;
    double d = fabs(round((double)plan_devices[i].memory / (double)(1ull << 30)) - want);
    if (!best || d < dist) best = &plan_devices[i], dist = d;
  }
  return best;
}

/* Nodes our users run on.  A GPU's host link as the card's (80% of the bus,
 * what pinned copies reach); a fabric at 80% of its per-direction peak,
 * likewise (docs/plan.md lists the sources and what each layout assumes). */
const plan_node plan_nodes[] = {
    {"h100-sxm-8",
     "H100 SXM (HGX H100)",
     "h100-sxm",
     8,
     {.size = sizeof(mlo_node_topology), .group = 1, .fabric_bps = 360e9},
     "a PCIe 5.0 x16 host path per GPU; NVLink 4 through NVSwitch, 450 GB/s each way"},
    {"l40s-4",
     "L40S PCIe server",
     "l40s",
     4,
     {.size = sizeof(mlo_node_topology),
      .group = 2,
      .uplink_bps = GEN4_LINK,
      .fabric_bps = 20e9,
      .fabric_via_uplinks = true},
     "two GPUs per PCIe 4.0 switch, one x16 uplink each to the CPU; peer-to-peer over PCIe"},
    {"rtx4090-2",
     "RTX 4090 desktop",
     "rtx4090",
     2,
     {.size = sizeof(mlo_node_topology), .link_bps = GEN4_LINK / 2, .group = 1},
     "the CPU's 16 lanes split x8/x8; no peer-to-peer (GeForce): gathers go through host "
     "memory"},
};
const size_t plan_nnodes = sizeof plan_nodes / sizeof plan_nodes[0];

const plan_node *plan_node_find(const char *name) {
  for (size_t i = 0; name && i < plan_nnodes; i++)
    if (!strcasecmp(name, plan_nodes[i].name)) return &plan_nodes[i];
  return NULL;
}

mlo_node_topology plan_node_topology(const plan_node *node, double link) {
  mlo_node_topology t = node->topo;
  if (!(t.link_bps > 0)) t.link_bps = plan_device_find(node->card)->link;
  if (link > 0) { /* the node's other paths keep their ratios to the link */
    double k = link / t.link_bps;
    t.link_bps = link;
    t.uplink_bps *= k;
    t.fabric_bps *= k;
  }
  return t;
}

/* diffusers' defaults for each pipeline's __call__: WanPipeline 832x480,
 * 81 frames, 50 steps, guidance 5 (two passes per step); FluxPipeline
 * 1024^2, 28 steps, distilled guidance (one pass), T5 at 512 tokens;
 * QwenImagePipeline 1024^2, 50 steps, true CFG only with a negative prompt
 * (one pass); StableDiffusion3Pipeline 1024^2, 28 steps, guidance 7 (two
 * passes, batched into one forward), 77 CLIP + 256 T5 tokens.  Wan runs
 * its two passes as two forwards.  One video or image a call. */
static const plan_job jobs[] = {
    {"wan2.2-t2v", 832, 480, 81, 2, 512, false, 50, 1, false, "WanPipeline"},
    {"flux", 1024, 1024, 1, 1, 512, true, 28, 1, false, "FluxPipeline"},
    {"qwen-image", 1024, 1024, 1, 1, 256, true, 50, 1, false, "QwenImagePipeline"},
    {"sd3", 1024, 1024, 1, 2, 333, true, 28, 1, true, "StableDiffusion3Pipeline"},
};

bool plan_job_for(const char *family, plan_job *out) {
  for (size_t i = 0; family && i < sizeof jobs / sizeof *jobs; i++)
    if (!strcmp(family, jobs[i].family)) {
      *out = jobs[i];
      return true;
    }
  return false;
}

const char *plan_family_guess(const char *class_name, const char *names) {
  static const struct {
    const char *word, *family;
  } hints[] = {{"wan", "wan2.2-t2v"},
               {"flux", "flux"},
               {"qwen", "qwen-image"},
               {"sd3", "sd3"},
               {"stablediffusion3", "sd3"}};
  char low[512];
  for (int pass = 0; pass < 2; pass++) {
    const char *text = pass ? names : class_name;
    size_t n = 0;
    for (; text && text[n] && n + 1 < sizeof low; n++)
      low[n] = (char)(text[n] >= 'A' && text[n] <= 'Z' ? text[n] + 32 : text[n]);
    low[n] = '\0';
    for (size_t i = 0; n && i < sizeof hints / sizeof *hints; i++)
      if (strstr(low, hints[i].word)) return hints[i].family;
  }
  return "flux"; /* an image DiT at 1024^2: the most common job */
}

/* ---- the compute model --------------------------------------------------- */

static bool has(const char *name, const char *part) {
  return strstr(name, part) != NULL;
}

static uint64_t numel_of(const mlo_tensor *t) {
  uint64_t n = 1;
  for (int i = 0; i < mlo_tensor_ndim(t); i++) n *= (uint64_t)mlo_tensor_shape(t)[i];
  return n;
}

/* An attention's query projection: its output width summed over layers is
 * what the attention's FLOPs scale with (diffusers: to_q, transformers:
 * q_proj, T5: SelfAttention.q). */
static bool is_query(const char *name) {
  size_t n = strlen(name);
  static const char *const ends[] = {".to_q.weight", ".q_proj.weight", "SelfAttention.q.weight",
                                     "EncDecAttention.q.weight"};
  for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
    size_t m = strlen(ends[i]);
    if (n >= m && !strcmp(name + n - m, ends[i])) return true;
  }
  return false;
}

/* Weights a forward never multiplies by every token: embedding tables
 * (looked up), an encoder's language-model head and vision tower (a text
 * prompt uses neither). */
static bool skipped(const char *name, mlo_role role) {
  if (has(name, "embed_tokens") || has(name, "token_embedding") || has(name, "shared.weight") ||
      has(name, "position_embedding") || has(name, "wte.") || has(name, "wpe."))
    return true;
  return role == MLO_ROLE_ENCODER && (has(name, "lm_head") || has(name, "visual."));
}

/* The decoder level of a VAE tensor (0 at the latent's resolution, one
 * more per up block), -1 for a tensor decoding does not use. */
static int vae_level(const char *name, int *up_blocks) {
  if (!strncmp(name, "post_quant_conv", 15)) return 0;
  if (strncmp(name, "decoder.", 8)) return -1; /* encoder.*, quant_conv: not in text-to-X */
  const char *u = strstr(name, "up_blocks.");
  if (!u) return has(name, "conv_out") || has(name, "norm_out") ? 1000 : 0;
  int level = atoi(u + 10);
  if (level + 1 > *up_blocks) *up_blocks = level + 1;
  return level + (has(name, "upsamplers") || has(name, "upsampler") ? 1 : 0);
}

void plan_cost_of(const mlo_component *c, const plan_job *job, plan_cost *out) {
  memset(out, 0, sizeof *out);
  mlo_role role = mlo_component_role(c);
  int lat_frames = job->frames > 1 ? (job->frames - 1) / 4 + 1 : 1;
  double dit_tokens = (double)lat_frames * (job->width / 16) * (job->height / 16);
  double text = job->text_tokens;
  double all = dit_tokens + (job->joint ? text : 0);
  double lat_pos = (double)lat_frames * (job->width / 8) * (job->height / 8);
  double out_pos = (double)job->frames * job->width * job->height;
  uint64_t dtype_bytes[MLO_DTYPE_COUNT] = {0};
  int up_blocks = 0;
  size_t n = mlo_component_tensor_count(c);
  /* VAE levels need the number of up blocks first */
  for (size_t i = 0; role == MLO_ROLE_VAE && i < n; i++)
    vae_level(mlo_tensor_name(mlo_component_tensor_at(c, i)), &up_blocks);
  for (size_t i = 0; i < n; i++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    if (mlo_tensor_owner(t) != c || mlo_tensor_ndim(t) < 2) continue;
    const char *name = mlo_tensor_name(t);
    double w = (double)numel_of(t);
    dtype_bytes[mlo_tensor_dtype(t)] += mlo_tensor_nbytes(t);
    if (role == MLO_ROLE_VAE) {
      int level = vae_level(name, &up_blocks);
      if (level < 0) continue;
      double pos = lat_pos * pow(4.0, level);
      double tf = lat_frames > 1 ? fmin(pow(2.0, level), (double)job->frames / lat_frames) : 1;
      pos = fmin(pos * tf, out_pos);
      if (level == 1000) pos = out_pos;
      out->linear += 2 * w * pos;
      continue;
    }
    if (role != MLO_ROLE_DIT && role != MLO_ROLE_ENCODER) continue;
    if (skipped(name, role)) continue;
    double tokens = role == MLO_ROLE_ENCODER ? text : all;
    /* Wan's cross-attention keys and values project the text, not the latent */
    if (role == MLO_ROLE_DIT && (has(name, "attn2.to_k") || has(name, "attn2.to_v") ||
                                 has(name, "add_k_proj") || has(name, "add_v_proj")))
      tokens = text;
    out->linear += 2 * w * tokens;
    if (is_query(name)) {
      double width = (double)mlo_tensor_shape(t)[0];
      bool cross = has(name, "attn2.") || has(name, "EncDecAttention");
      double keys = cross ? text : tokens;
      out->attention += 4 * tokens * keys * width; /* QK^T and AV, 2 FLOPs each */
    }
  }
  out->passes = role == MLO_ROLE_VAE ? 1 : job->passes;
  /* every term is per sample: a batch multiplies it */
  out->flops = out->passes * (out->linear + out->attention) * (job->batch > 0 ? job->batch : 1);
  uint64_t best = 0;
  out->compute_dtype = MLO_DTYPE_BF16;
  for (int d = 0; d < MLO_DTYPE_COUNT; d++)
    if (dtype_bytes[d] > best) best = dtype_bytes[d], out->compute_dtype = (mlo_dtype)d;
}

double plan_tflops_for(const plan_device *dev, mlo_dtype dtype) {
  bool fp8 = dtype == MLO_DTYPE_F8_E4M3 || dtype == MLO_DTYPE_F8_E5M2;
  return fp8 && dev->fp8_tflops > 0 ? dev->fp8_tflops : dev->bf16_tflops;
}

int plan_parse_dtype(const char *text, mlo_dtype *out) {
  static const struct {
    const char *word;
    mlo_dtype dtype;
  } words[] = {{"fp8", MLO_DTYPE_F8_E4M3},      {"fp8_e4m3fn", MLO_DTYPE_F8_E4M3},
               {"fp8_e5m2", MLO_DTYPE_F8_E5M2}, {"bf16", MLO_DTYPE_BF16},
               {"fp16", MLO_DTYPE_F16},         {"fp32", MLO_DTYPE_F32}};
  for (size_t i = 0; i < sizeof words / sizeof *words; i++)
    if (!strcasecmp(text, words[i].word)) {
      *out = words[i].dtype;
      return MLO_OK;
    }
  char upper[32];
  size_t n = 0;
  for (; text[n] && n + 1 < sizeof upper; n++)
    upper[n] = (char)(text[n] >= 'a' && text[n] <= 'z' ? text[n] - 32 : text[n]);
  upper[n] = '\0';
  return mlo_dtype_from_name(upper, out);
}

/* Which tensors a --dtype converts: the weights of DiTs and encoders (two
 * or more dimensions, floating point), as fp8 and GGUF checkpoints are
 * made; norms, biases and the VAE keep theirs.  A block type needs whole
 * blocks per row. */
static bool converts(const mlo_component *c, const mlo_tensor *t, mlo_dtype to) {
  mlo_role role = mlo_component_role(c);
  if (role != MLO_ROLE_DIT && role != MLO_ROLE_ENCODER) return false;
  mlo_dtype from = mlo_tensor_dtype(t);
  bool floating = from == MLO_DTYPE_F32 || from == MLO_DTYPE_F16 || from == MLO_DTYPE_BF16 ||
                  from == MLO_DTYPE_F8_E4M3 || from == MLO_DTYPE_F8_E5M2;
  if (!floating || mlo_tensor_ndim(t) < 2) return false;
  uint32_t elems = 0;
  int nd = mlo_tensor_ndim(t);
  if (mlo_dtype_block(to, &elems, NULL) && mlo_tensor_shape(t)[nd - 1] % elems) return false;
  return true;
}

int plan_clone(mlo_pipeline *src, mlo_pipeline *dst, mlo_dtype to, char *err, size_t errlen) {
  size_t n = mlo_pipeline_component_count(src);
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(src, i), *d = NULL;
    int rc = mlo_component_add(dst, mlo_component_name(c), MLO_ROLE_AUTO, &d);
    if (!rc) rc = mlo_component_set_role(d, mlo_component_role(c), mlo_component_role_source(c));
    size_t nt = mlo_component_tensor_count(c);
    for (size_t k = 0; !rc && k < nt; k++) {
      const mlo_tensor *t = mlo_component_tensor_at(c, k);
      if (mlo_tensor_owner(t) != c) continue; /* references are not moved */
      mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
      desc.name = mlo_tensor_name(t);
      desc.dtype = converts(c, t, to) ? to : mlo_tensor_dtype(t);
      desc.ndim = mlo_tensor_ndim(t);
      memcpy(desc.shape, mlo_tensor_shape(t), (size_t)desc.ndim * sizeof desc.shape[0]);
      desc.flags = mlo_tensor_flags(t) & (MLO_TENSOR_BUFFER | MLO_TENSOR_MUTABLE);
      rc = mlo_tensor_add(d, &desc, NULL);
    }
    if (rc) {
      snprintf(err, errlen, "--dtype %s: cannot declare %s: %s", mlo_dtype_name(to),
               mlo_component_name(c), mlo_pipeline_errmsg(dst));
      return rc;
    }
  }
  return MLO_OK;
}
