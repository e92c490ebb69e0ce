/*
 * plan_activation.c — how much device memory a forward's activations take,
 * for `mlo plan`'s reserve (docs/plan.md, "Activations and the reserve").
 *
 * A DiT's architecture is read from its own tensors (hidden width, FFN
 * width, head width, patching), its tokens from the job (resolution,
 * frames, batch), and the peak is the largest set of tensors alive at once
 * in the forward of diffusers' eager PyTorch code, counted phase by phase
 * from that code: a block's input held by its caller, the block's locals,
 * the attention's projections, the float32 temporaries of its norms and
 * rotary embedding.  Every block has the same shape, so the peak of one is
 * the peak of the forward.  The same count at a small configuration is
 * checked against torch's own allocation counters on CPU at two
 * resolutions (tests/python/test_activation.py), with --kernels cpu: the
 * one kernel whose temporaries differ there is RMSNorm (fused on CUDA,
 * three float32 tensors on CPU).  A VAE's decode is counted the same way
 * from its decoder's levels (checked likewise: Wan's causal VAE and a 2-D
 * one, where CPU convolutions copy their input once more); text encoders
 * have a rougher count, small beside either, said so in the docs.
 */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A float32 element: what upcasts and fp32 rotary tables are made of. */
#define F32 4.0

static const mlo_tensor *tensor_named(const mlo_component *c, const char *name) {
  size_t n = mlo_component_tensor_count(c);
  for (size_t i = 0; i < n; i++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    if (!strcmp(mlo_tensor_name(t), name)) return t;
  }
  return NULL;
}

/* Dimension `dim` of the tensor called name, 0 without one. */
static double dim_of(const mlo_component *c, const char *name, int dim) {
  const mlo_tensor *t = tensor_named(c, name);
  return t && mlo_tensor_ndim(t) > dim ? (double)mlo_tensor_shape(t)[dim] : 0;
}

/* Bytes of one activation element: float32 weights run in float32, every
 * other dtype (bf16, fp16, fp8, GGUF blocks) computes in 16 bits. */
static double element_bytes(const mlo_component *c) {
  uint64_t f32 = 0, all = 0;
  size_t n = mlo_component_tensor_count(c);
  for (size_t i = 0; i < n; i++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    if (mlo_tensor_ndim(t) < 2) continue;
    all += mlo_tensor_nbytes(t);
    if (mlo_tensor_dtype(t) == MLO_DTYPE_F32) f32 += mlo_tensor_nbytes(t);
  }
  return all && f32 * 2 > all ? 4 : 2;
}

/* The DiT layouts the count knows, told apart by their input embedding. */
typedef enum { DIT_NONE, DIT_WAN, DIT_FLUX, DIT_DOUBLE } dit_layout;

typedef struct {
  dit_layout layout;
  double dim, ffn, head_dim;
  double patch_t, patch_h, patch_w; /* latent positions per token */
  double single_ffn;                /* Flux's single-stream MLP width (0: none) */
  double rope_tmp; /* bytes per token and width the rotary embedding adds at its peak */
} dit_arch;

static dit_arch dit_arch_of(const mlo_component *c) {
  dit_arch a = {.layout = DIT_NONE, .patch_t = 1, .patch_h = 2, .patch_w = 2};
  if ((a.dim = dim_of(c, "patch_embedding.weight", 0)) > 0) { /* Wan: a Conv3d */
    a.layout = DIT_WAN;
    a.patch_t = dim_of(c, "patch_embedding.weight", 2);
    a.patch_h = dim_of(c, "patch_embedding.weight", 3);
    a.patch_w = dim_of(c, "patch_embedding.weight", 4);
    a.ffn = dim_of(c, "blocks.0.ffn.net.0.proj.weight", 0);
    a.head_dim = 128; /* the norm is across heads: the head count is the config's (40) */
  } else if ((a.dim = dim_of(c, "x_embedder.weight", 0)) > 0) { /* Flux: packed 2x2 */
    a.layout = DIT_FLUX;
    a.rope_tmp = 3 * F32; /* x * cos, x_rotated * sin, their sum: float32 */
    a.ffn = dim_of(c, "transformer_blocks.0.ff.net.0.proj.weight", 0);
    a.single_ffn = dim_of(c, "single_transformer_blocks.0.proj_mlp.weight", 0);
  } else if ((a.dim = dim_of(c, "img_in.weight", 0)) > 0) { /* Qwen-Image: packed 2x2 */
    a.layout = DIT_DOUBLE;
    a.rope_tmp = 2 * F32; /* complex-valued: x in float32, its product with the frequencies */
    a.ffn = dim_of(c, "transformer_blocks.0.img_mlp.net.0.proj.weight", 0);
  } else if ((a.dim = dim_of(c, "pos_embed.proj.weight", 0)) > 0) { /* SD3: a Conv2d */
    a.layout = DIT_DOUBLE;                                          /* no rotary embedding */
    a.patch_h = dim_of(c, "pos_embed.proj.weight", 2);
    a.patch_w = dim_of(c, "pos_embed.proj.weight", 3);
    a.ffn = dim_of(c, "transformer_blocks.0.ff.net.0.proj.weight", 0);
  }
  if (a.layout != DIT_WAN) a.head_dim = dim_of(c, "transformer_blocks.0.attn.norm_q.weight", 0);
  if (!(a.head_dim > 0)) a.head_dim = 64;
  if (!(a.ffn > 0)) a.ffn = 4 * a.dim;
  if (!(a.patch_t > 0) || !(a.patch_h > 0) || !(a.patch_w > 0)) a.layout = DIT_NONE;
  return a;
}

/* Latent positions: the VAE's 8x8 pixels a position, and for video 4
 * frames a latent frame after the first (Wan's causal VAE). */
static double latent_frames(const plan_job *job) {
  return job->frames > 1 ? (double)((job->frames - 1) / 4 + 1) : 1;
}

static void dit_peak(const mlo_component *c, const plan_job *job, bool cpu_kernels,
                     plan_activation *out) {
  dit_arch a = dit_arch_of(c);
  if (a.layout == DIT_NONE) return;
  double e = element_bytes(c);
  /* a float32 copy of a 16-bit tensor (.float()); free when already float32 */
  double up = e < F32 ? F32 : 0;
  double batch = (job->batch > 0 ? job->batch : 1) * (job->cfg_batched ? job->passes : 1);
  double n = batch * floor(latent_frames(job) / a.patch_t) * floor(job->height / 8.0 / a.patch_h) *
             floor(job->width / 8.0 / a.patch_w);
  double l = batch * job->text_tokens;
  out->tokens = n;
  if (a.layout == DIT_WAN) {
    /* Per token and hidden width, in bytes.  The block's input (its
     * caller's), its locals (norm output, the attention outputs) and: */
    double rope = 6 * e + 3 * (F32 / 2); /* q,k,v normed, out; x1*cos, x2*sin, their sum */
    double qk_norm = 5 * e + (cpu_kernels ? up + 2 * F32 : e); /* RMSNorm on q */
    double ffn = 4 * e + 2 * (a.ffn / a.dim) * e;              /* proj and GELU outputs */
    double gate = 5 * e + up + 2 * F32; /* x.float() + ffn.float() * gate, in float32 */
    const char *phase = "rotary embedding";
    double per = rope;
    if (qk_norm > per) per = qk_norm, phase = "q/k RMSNorm";
    if (ffn > per) per = ffn, phase = "feed-forward";
    if (gate > per) per = gate, phase = "float32 feed-forward residual";
    out->phase = phase;
    out->bytes = n * a.dim * per
                 /* the rotary tables (cos, sin: float32, a head's width) and
                  * the prompt's embeddings, projected, all the forward long */
                 + 2 * n * a.head_dim * F32 + 3 * l * a.dim * e;
    return;
  }
  /* Joint attention over t = image + text tokens; the rotary embedding's
   * temporaries at the peak, with q, k, v concatenated over both streams
   * and the rotated copy. */
  double t = n + l;
  double rope_tmp = a.rope_tmp;
  /* double-stream block: both streams' inputs and norms, the text's own
   * q, k, v (kept by the processor), the joint q, k, v and x_rotated */
  double dbl = t * a.dim * (6 * e + rope_tmp) + 3 * l * a.dim * e;
  const char *phase = "rotary embedding, double-stream block";
  double peak = dbl;
  if (a.layout == DIT_DOUBLE) {
    /* Qwen-Image's image MLP: the block's input (its caller's), its first
     * norm and modulation, the attention's output, the residual, the second
     * norm and modulation, the MLP's projection and GELU; the text stream's
     * five tensors beside */
    double ffn = n * a.dim * (7 + 2 * (a.ffn / a.dim)) * e + 5 * l * a.dim * e;
    if (ffn > peak) peak = ffn, phase = "image feed-forward, double-stream block";
  }
  if (a.layout == DIT_FLUX && a.single_ffn > 0) {
    /* single-stream block: its caller's two streams, the concatenation,
     * the norm, the MLP's GELU output, q, k, v and x_rotated; and later
     * the attention and the MLP concatenated and projected */
    double sfr = a.single_ffn / a.dim;
    double rope_single = (7 + sfr) * e + rope_tmp;
    double out_single = (7 + 2 * sfr) * e;
    double single = t * a.dim * fmax(rope_single, out_single);
    if (single > peak) {
      peak = single;
      phase = rope_single >= out_single ? "rotary embedding, single-stream block"
                                        : "output projection, single-stream block";
    }
  }
  out->phase = phase;
  /* the rotary tables, cos and sin in float32 a head wide, where there are */
  out->bytes = peak + (a.rope_tmp > 0 ? 2 * t * a.head_dim * F32 : 0);
}

/* A text encoder at the prompt's tokens: a block's input, norm, q, k, v,
 * output and its MLP's two hidden tensors, and the attention scores: small
 * beside a DiT's, and an upper count (a small UMT5 encoder measured on CPU
 * 13% under it at 512 tokens, 30% at 128: cli_activation). */
static void encoder_peak(const mlo_component *c, const plan_job *job, plan_activation *out) {
  double e = element_bytes(c), l = (job->batch > 0 ? job->batch : 1) * job->text_tokens;
  double dim = dim_of(c, "encoder.block.0.layer.0.SelfAttention.q.weight", 1);
  double ffn = dim_of(c, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight", 0);
  double heads =
      dim_of(c, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 1);
  size_t n = mlo_component_tensor_count(c);
  for (size_t i = 0; !(dim > 0) && i < n; i++) { /* CLIP, Qwen2.5-VL, ...: the first q projection */
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    const char *name = mlo_tensor_name(t);
    static const char suffix[] = ".q_proj.weight";
    size_t len = strlen(name), slen = sizeof suffix - 1;
    if (len > slen && !strcmp(name + len - slen, suffix) && mlo_tensor_ndim(t) == 2)
      dim = (double)mlo_tensor_shape(t)[1];
  }
  if (!(dim > 0)) return;
  if (!(ffn > 0)) ffn = 4 * dim;
  if (!(heads > 0)) heads = dim / 64;
  out->tokens = l;
  out->phase = "attention scores";
  /* the scores with T5's float32 position bias, their float32 sum and
   * softmax: three float32 tensors and one of e bytes per score */
  out->bytes = l * (6 * dim + 2 * ffn) * e + heads * l * l * (3 * F32 + e);
}

/* ---- VAE decode ------------------------------------------------------------ */

/* The decoder's levels, from its tensors: which up blocks upsample in space
 * (and, a video VAE's, in time), so each level's share of the output's
 * positions and its frames per chunk. */
typedef struct {
  int blocks; /* up blocks */
  bool spatial[16], temporal[16];
  int spatial_total, temporal_total;
} vae_levels;

static bool has_tensor(const mlo_component *c, const char *fmt, int i) {
  char name[160];
  snprintf(name, sizeof name, fmt, i);
  return tensor_named(c, name) != NULL;
}

static vae_levels vae_levels_of(const mlo_component *c) {
  vae_levels v = {0};
  while (v.blocks < 16 && has_tensor(c, "decoder.up_blocks.%d.resnets.0.conv1.weight", v.blocks)) {
    int i = v.blocks++;
    v.spatial[i] = has_tensor(c, "decoder.up_blocks.%d.upsamplers.0.conv.weight", i) ||
                   has_tensor(c, "decoder.up_blocks.%d.upsamplers.0.resample.1.weight", i);
    v.temporal[i] = has_tensor(c, "decoder.up_blocks.%d.upsamplers.0.time_conv.weight", i);
    v.spatial_total += v.spatial[i];
    v.temporal_total += v.temporal[i];
  }
  return v;
}

/* Level i's positions over the output's (i = -1: the latent's, conv_in and
 * the mid block) and its frames per chunk (a steady chunk: one latent
 * frame, four output frames). */
static double level_share(const vae_levels *v, int i) {
  int up = 0;
  for (int j = 0; j < i; j++) up += v->spatial[j];
  return pow(4.0, up - v->spatial_total);
}
static double level_frames(const vae_levels *v, int i, bool video) {
  int up = 0;
  for (int j = 0; j < i && video; j++) up += v->temporal[j];
  return pow(2.0, up);
}

static double chan(const mlo_component *c, const char *fmt, int i, int dim) {
  char name[160];
  snprintf(name, sizeof name, fmt, i);
  return dim_of(c, name, dim);
}

/* A causal video VAE (Wan's, Qwen-Image's): decoded a latent frame at a
 * time, each 3-frame convolution keeping its input's last frames for the
 * next chunk.  The peak is at a convolution of the top level after its
 * first resnet: the decoder's input to the level, the resnet's input, its
 * activation, that padded with the cached frames, and the convolution's
 * output; on top, every cache, the new one of the running convolution
 * and the frames decoded so far. */
static double causal_vae_peak(const mlo_component *c, const vae_levels *v, const plan_job *job,
                              double e, bool cpu_kernels, const char **phase) {
  bool video = job->frames > 1;
  double px = (double)job->width * job->height;
  double pad = (job->width + 2.0) * (job->height + 2.0) / px; /* a 3x3 convolution's border */
  double keep = video ? 2 : 1; /* frames each cache holds (one chunk: what it had) */
  double caches = 0;
  size_t n = mlo_component_tensor_count(c);
  for (size_t i = 0; i < n; i++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, i);
    const char *name = mlo_tensor_name(t);
    if (strncmp(name, "decoder.", 8) || mlo_tensor_ndim(t) != 5 || mlo_tensor_shape(t)[2] != 3)
      continue;
    const char *u = strstr(name, "up_blocks.");
    int level = u ? atoi(u + 10) : strstr(name, "conv_out") ? v->blocks : -1;
    caches += keep * (double)mlo_tensor_shape(t)[1] * level_share(v, level) * px;
  }
  double top = dim_of(c, "decoder.conv_out.weight", 1);
  double frames = level_frames(v, v->blocks, video);
  double level = top * px * frames; /* one tensor of the top level */
  double conv = 4 * level + top * px * (frames + keep) * pad * (cpu_kernels ? 2 : 1);
  double decoded = video ? 3.0 * (job->frames - frames) * px : 0;
  *phase = "top level's causal convolution";
  return (caches + keep * top * px + conv + decoded) * e;
}

/* A 2-D VAE (Flux's, SD3's): the larger of its last upsampler's
 * convolution (the level below held by its caller, that block's output,
 * the upsampled tensor and the convolution's output) and the top level's
 * first resnet (its input, norm and activation at once, then the
 * convolution's output). */
static double image_vae_peak(const mlo_component *c, const vae_levels *v, const plan_job *job,
                             double e, bool cpu_kernels, const char **phase) {
  double px = (double)job->width * job->height;
  int last_up = -1;
  for (int i = 0; i < v->blocks; i++)
    if (v->spatial[i]) last_up = i;
  int top = v->blocks - 1;
  double top_in = chan(c, "decoder.up_blocks.%d.resnets.0.conv1.weight", top, 1);
  double top_out = chan(c, "decoder.up_blocks.%d.resnets.0.conv1.weight", top, 0);
  double cpu = cpu_kernels ? 1 : 0; /* CPU convolutions copy their input once more */
  double resnet = fmax(3 * top_in, (2 + cpu) * top_in + top_out) * px;
  double upsample = 0;
  if (last_up >= 0) {
    double below = chan(c, "decoder.up_blocks.%d.resnets.0.conv1.weight", last_up, 1);
    double width = chan(c, "decoder.up_blocks.%d.resnets.0.conv1.weight", last_up, 0);
    double out = chan(c, "decoder.up_blocks.%d.upsamplers.0.conv.weight", last_up, 0);
    double share = level_share(v, last_up);
    upsample = ((below + width) * share + (1 + cpu) * width + out) * px;
  }
  *phase = upsample > resnet ? "last upsampler's convolution" : "top level's first resnet";
  return fmax(resnet, upsample) * e;
}

static void vae_peak(const mlo_component *c, const plan_job *job, bool cpu_kernels,
                     plan_activation *out) {
  vae_levels v = vae_levels_of(c);
  if (!v.blocks || !(dim_of(c, "decoder.conv_out.weight", 1) > 0)) return;
  double e = element_bytes(c), batch = job->batch > 0 ? job->batch : 1;
  bool causal = mlo_tensor_ndim(tensor_named(c, "decoder.conv_out.weight")) == 5;
  out->tokens = 0;
  out->bytes = batch * (causal ? causal_vae_peak(c, &v, job, e, cpu_kernels, &out->phase)
                               : image_vae_peak(c, &v, job, e, cpu_kernels, &out->phase));
}

void plan_activation_of(const mlo_component *c, const plan_job *job, bool cpu_kernels,
                        plan_activation *out) {
  memset(out, 0, sizeof *out);
  out->phase = "";
  switch (mlo_component_role(c)) {
  case MLO_ROLE_DIT:
    dit_peak(c, job, cpu_kernels, out);
    break;
  case MLO_ROLE_ENCODER:
    encoder_peak(c, job, out);
    break;
  case MLO_ROLE_VAE:
    vae_peak(c, job, cpu_kernels, out);
    break;
  default:
    break;
  }
}
