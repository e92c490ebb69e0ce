/*
 * synth_presets.c — the pipelines the generator can write, as data: each
 * architecture's hyper-parameters at full size (from the public configs of
 * Wan2.2-T2V-A14B, FLUX.1, Qwen-Image and SD3.5-Large) and the tensor
 * names and shapes diffusers / transformers give those modules.  Names and
 * layer structure follow the real checkpoints so that tools see familiar
 * files; fidelity ends there (interface sizes stay fixed while widths
 * shrink, and a few buffers are left out).
 */
#include "synth/synth.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>

#define BF MLO_DTYPE_BF16
#define F32 MLO_DTYPE_F32
#define COUNT(a) (sizeof(a) / sizeof *(a))

/* ---- WanTransformer3DModel --------------------------------------------- */

enum { WAN_HEADS, WAN_HEAD_DIM, WAN_FFN, WAN_LAYERS, WAN_IN, WAN_TEXT, WAN_FREQ };
static const mlo_syn_param wan_dit_params[] = {
    {"num_attention_heads", 40, SYN_HEADS}, {"attention_head_dim", 128, SYN_HEAD_DIM},
    {"ffn_dim", 13824, SYN_WIDTH},          {"num_layers", 40, SYN_DEPTH},
    {"in_channels", 16, SYN_FIXED},         {"text_dim", 4096, SYN_FIXED},
    {"freq_dim", 256, SYN_FIXED},
};

static void wan_attn(mlo_syn_emitter *e, int64_t h, int i, const char *which) {
  mlo_dtype dt = mlo_syn_dtype(e);
  mlo_syn_lin(e, dt, h, h, true, "blocks.%d.%s.to_q", i, which);
  mlo_syn_lin(e, dt, h, h, true, "blocks.%d.%s.to_k", i, which);
  mlo_syn_lin(e, dt, h, h, true, "blocks.%d.%s.to_v", i, which);
  mlo_syn_lin(e, dt, h, h, true, "blocks.%d.%s.to_out.0", i, which);
  T1(e, dt, h, "blocks.%d.%s.norm_q.weight", i, which);
  T1(e, dt, h, "blocks.%d.%s.norm_k.weight", i, which);
}

/* Modules diffusers keeps in fp32 for Wan (time_embedder, norm2,
 * scale_shift_table) are F32 here too. */
static void wan_dit_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t h = (int64_t)p[WAN_HEADS] * p[WAN_HEAD_DIM], ffn = p[WAN_FFN];
  T5(e, dt, h, p[WAN_IN], 1, 2, 2, "patch_embedding.weight");
  T1(e, dt, h, "patch_embedding.bias");
  mlo_syn_lin(e, F32, h, p[WAN_FREQ], true, "condition_embedder.time_embedder.linear_1");
  mlo_syn_lin(e, F32, h, h, true, "condition_embedder.time_embedder.linear_2");
  mlo_syn_lin(e, dt, 6 * h, h, true, "condition_embedder.time_proj");
  mlo_syn_lin(e, dt, h, p[WAN_TEXT], true, "condition_embedder.text_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "condition_embedder.text_embedder.linear_2");
  for (int i = 0; i < p[WAN_LAYERS]; i++) {
    wan_attn(e, h, i, "attn1");
    wan_attn(e, h, i, "attn2");
    T1(e, F32, h, "blocks.%d.norm2.weight", i);
    T1(e, F32, h, "blocks.%d.norm2.bias", i);
    mlo_syn_lin(e, dt, ffn, h, true, "blocks.%d.ffn.net.0.proj", i);
    mlo_syn_lin(e, dt, h, ffn, true, "blocks.%d.ffn.net.2", i);
    T3(e, F32, 1, 6, h, "blocks.%d.scale_shift_table", i);
  }
  mlo_syn_lin(e, dt, (int64_t)p[WAN_IN] * 4, h, true, "proj_out");
  T3(e, F32, 1, 2, h, "scale_shift_table");
}

static const mlo_syn_arch wan_dit = {
    wan_dit_params, COUNT(wan_dit_params),
    "{\"patch_size\":[1,2,2],\"out_channels\":16,\"qk_norm\":\"rms_norm_across_heads\","
    "\"cross_attn_norm\":true,\"eps\":1e-06,\"image_dim\":null,\"added_kv_proj_dim\":null,"
    "\"rope_max_seq_len\":1024}",
    wan_dit_emit, NULL};

/* ---- T5 / UMT5 encoders (T5EncoderModel, UMT5EncoderModel) --------------- */

enum { T5_D, T5_HEADS, T5_DKV, T5_FF, T5_LAYERS, T5_VOCAB, T5_BUCKETS };
#define T5_PARAMS(vocab)                                                                           \
  {"d_model", 4096, SYN_WIDTH}, {"num_heads", 64, SYN_HEADS}, {"d_kv", 64, SYN_HEAD_DIM},          \
      {"d_ff", 10240, SYN_WIDTH}, {"num_layers", 24, SYN_DEPTH}, {"vocab_size", vocab, SYN_VOCAB}, \
  {                                                                                                \
    "relative_attention_num_buckets", 32, SYN_FIXED                                                \
  }
static const mlo_syn_param t5_params[] = {T5_PARAMS(32128)};
static const mlo_syn_param umt5_params[] = {T5_PARAMS(256384)};

/* UMT5 gives every block its own relative-position bias; T5 only block 0. */
static void t5_emit_common(mlo_syn_emitter *e, const int *p, bool bias_every_block) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t d = p[T5_D], inner = (int64_t)p[T5_HEADS] * p[T5_DKV], ff = p[T5_FF];
  T2(e, dt, p[T5_VOCAB], d, "shared.weight");
  for (int i = 0; i < p[T5_LAYERS]; i++) {
    const char *sa = "encoder.block.%d.layer.0.SelfAttention";
    char pre[128];
    snprintf(pre, sizeof pre, sa, i);
    mlo_syn_lin(e, dt, inner, d, false, "%s.q", pre);
    mlo_syn_lin(e, dt, inner, d, false, "%s.k", pre);
    mlo_syn_lin(e, dt, inner, d, false, "%s.v", pre);
    mlo_syn_lin(e, dt, d, inner, false, "%s.o", pre);
    if (i == 0 || bias_every_block)
      T2(e, dt, p[T5_BUCKETS], p[T5_HEADS], "%s.relative_attention_bias.weight", pre);
    T1(e, dt, d, "encoder.block.%d.layer.0.layer_norm.weight", i);
    mlo_syn_lin(e, dt, ff, d, false, "encoder.block.%d.layer.1.DenseReluDense.wi_0", i);
    mlo_syn_lin(e, dt, ff, d, false, "encoder.block.%d.layer.1.DenseReluDense.wi_1", i);
    mlo_syn_lin(e, dt, d, ff, false, "encoder.block.%d.layer.1.DenseReluDense.wo", i);
    T1(e, dt, d, "encoder.block.%d.layer.1.layer_norm.weight", i);
  }
  T1(e, dt, d, "encoder.final_layer_norm.weight");
}
static void t5_emit(mlo_syn_emitter *e, const int *p) {
  t5_emit_common(e, p, false);
}
static void umt5_emit(mlo_syn_emitter *e, const int *p) {
  t5_emit_common(e, p, true);
}

static const mlo_syn_arch t5_xxl = {t5_params, COUNT(t5_params),
                                    "{\"model_type\":\"t5\",\"feed_forward_proj\":\"gated-gelu\","
                                    "\"is_gated_act\":true,\"layer_norm_epsilon\":1e-06}",
                                    t5_emit, NULL};
static const mlo_syn_arch umt5_xxl = {
    umt5_params, COUNT(umt5_params),
    "{\"model_type\":\"umt5\",\"feed_forward_proj\":\"gated-gelu\","
    "\"is_gated_act\":true,\"layer_norm_epsilon\":1e-06}",
    umt5_emit, NULL};

/* ---- CLIP text encoders (CLIPTextModel[WithProjection]) ------------------ */

enum { CLIP_HEADS, CLIP_HEAD_DIM, CLIP_FFN, CLIP_LAYERS, CLIP_VOCAB, CLIP_POS, CLIP_PROJ };
#define CLIP_PARAMS(heads, ffn, layers, proj)                                                      \
  {"num_attention_heads", heads, SYN_HEADS}, {NULL, 64, SYN_HEAD_DIM},                             \
      {"intermediate_size", ffn, SYN_WIDTH}, {"num_hidden_layers", layers, SYN_DEPTH},             \
      {"vocab_size", 49408, SYN_VOCAB}, {"max_position_embeddings", 77, SYN_FIXED}, {              \
    NULL, proj, SYN_FIXED                                                                          \
  }
static const mlo_syn_param clip_l_params[] = {CLIP_PARAMS(12, 3072, 12, 0)};
static const mlo_syn_param clip_l_proj_params[] = {CLIP_PARAMS(12, 3072, 12, 1)};
static const mlo_syn_param clip_g_params[] = {CLIP_PARAMS(20, 5120, 32, 1)};

static void clip_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t h = (int64_t)p[CLIP_HEADS] * p[CLIP_HEAD_DIM], ffn = p[CLIP_FFN];
  T2(e, dt, p[CLIP_VOCAB], h, "text_model.embeddings.token_embedding.weight");
  T2(e, dt, p[CLIP_POS], h, "text_model.embeddings.position_embedding.weight");
  for (int i = 0; i < p[CLIP_LAYERS]; i++) {
    static const char *const proj[] = {"k_proj", "v_proj", "q_proj", "out_proj"};
    for (int k = 0; k < 4; k++)
      mlo_syn_lin(e, dt, h, h, true, "text_model.encoder.layers.%d.self_attn.%s", i, proj[k]);
    T1(e, dt, h, "text_model.encoder.layers.%d.layer_norm1.weight", i);
    T1(e, dt, h, "text_model.encoder.layers.%d.layer_norm1.bias", i);
    mlo_syn_lin(e, dt, ffn, h, true, "text_model.encoder.layers.%d.mlp.fc1", i);
    mlo_syn_lin(e, dt, h, ffn, true, "text_model.encoder.layers.%d.mlp.fc2", i);
    T1(e, dt, h, "text_model.encoder.layers.%d.layer_norm2.weight", i);
    T1(e, dt, h, "text_model.encoder.layers.%d.layer_norm2.bias", i);
  }
  T1(e, dt, h, "text_model.final_layer_norm.weight");
  T1(e, dt, h, "text_model.final_layer_norm.bias");
  if (p[CLIP_PROJ]) T2(e, dt, h, h, "text_projection.weight");
}

static void clip_config(cJSON *cfg, const int *p) {
  int h = p[CLIP_HEADS] * p[CLIP_HEAD_DIM];
  cJSON_AddNumberToObject(cfg, "hidden_size", h);
  cJSON_AddNumberToObject(cfg, "projection_dim", h);
}

#define CLIP_EXTRA "{\"model_type\":\"clip_text_model\",\"hidden_act\":\"quick_gelu\"}"
static const mlo_syn_arch clip_l = {clip_l_params, COUNT(clip_l_params), CLIP_EXTRA, clip_emit,
                                    clip_config};
static const mlo_syn_arch clip_l_proj = {clip_l_proj_params, COUNT(clip_l_proj_params), CLIP_EXTRA,
                                         clip_emit, clip_config};
static const mlo_syn_arch clip_g = {clip_g_params, COUNT(clip_g_params),
                                    "{\"model_type\":\"clip_text_model\",\"hidden_act\":\"gelu\"}",
                                    clip_emit, clip_config};

/* ---- FluxTransformer2DModel ---------------------------------------------- */

enum { FLUX_HEADS, FLUX_HEAD_DIM, FLUX_LAYERS, FLUX_SINGLE, FLUX_IN, FLUX_JOINT, FLUX_POOLED };
static const mlo_syn_param flux_params[] = {
    {"num_attention_heads", 24, SYN_HEADS},
    {"attention_head_dim", 128, SYN_HEAD_DIM},
    {"num_layers", 19, SYN_DEPTH},
    {"num_single_layers", 38, SYN_DEPTH},
    {"in_channels", 64, SYN_FIXED},
    {"joint_attention_dim", 4096, SYN_FIXED},
    {"pooled_projection_dim", 768, SYN_FIXED},
};

/* The dual-stream attention of Flux, Qwen-Image and SD3 (image and text
 * projections side by side, per-head RMS norms). */
static void dual_attn(mlo_syn_emitter *e, const char *pre, int64_t h, int64_t hd, bool add_out) {
  mlo_dtype dt = mlo_syn_dtype(e);
  static const char *const proj[] = {"to_q",       "to_k",       "to_v",    "add_q_proj",
                                     "add_k_proj", "add_v_proj", "to_out.0"};
  for (int k = 0; k < 7; k++) mlo_syn_lin(e, dt, h, h, true, "%s.attn.%s", pre, proj[k]);
  if (add_out) mlo_syn_lin(e, dt, h, h, true, "%s.attn.to_add_out", pre);
  static const char *const norms[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
  for (int k = 0; k < 4; k++) T1(e, dt, hd, "%s.attn.%s.weight", pre, norms[k]);
}

static void flux_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t hd = p[FLUX_HEAD_DIM], h = (int64_t)p[FLUX_HEADS] * hd, mlp = 4 * h;
  mlo_syn_lin(e, dt, h, p[FLUX_IN], true, "x_embedder");
  mlo_syn_lin(e, dt, h, p[FLUX_JOINT], true, "context_embedder");
  mlo_syn_lin(e, dt, h, 256, true, "time_text_embed.timestep_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "time_text_embed.timestep_embedder.linear_2");
  mlo_syn_lin(e, dt, h, 256, true, "time_text_embed.guidance_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "time_text_embed.guidance_embedder.linear_2");
  mlo_syn_lin(e, dt, h, p[FLUX_POOLED], true, "time_text_embed.text_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "time_text_embed.text_embedder.linear_2");
  for (int i = 0; i < p[FLUX_LAYERS]; i++) {
    char pre[64];
    snprintf(pre, sizeof pre, "transformer_blocks.%d", i);
    mlo_syn_lin(e, dt, 6 * h, h, true, "%s.norm1.linear", pre);
    mlo_syn_lin(e, dt, 6 * h, h, true, "%s.norm1_context.linear", pre);
    dual_attn(e, pre, h, hd, true);
    mlo_syn_lin(e, dt, mlp, h, true, "%s.ff.net.0.proj", pre);
    mlo_syn_lin(e, dt, h, mlp, true, "%s.ff.net.2", pre);
    mlo_syn_lin(e, dt, mlp, h, true, "%s.ff_context.net.0.proj", pre);
    mlo_syn_lin(e, dt, h, mlp, true, "%s.ff_context.net.2", pre);
  }
  for (int i = 0; i < p[FLUX_SINGLE]; i++) {
    char pre[64];
    snprintf(pre, sizeof pre, "single_transformer_blocks.%d", i);
    mlo_syn_lin(e, dt, 3 * h, h, true, "%s.norm.linear", pre);
    mlo_syn_lin(e, dt, mlp, h, true, "%s.proj_mlp", pre);
    mlo_syn_lin(e, dt, h, h + mlp, true, "%s.proj_out", pre);
    mlo_syn_lin(e, dt, h, h, true, "%s.attn.to_q", pre);
    mlo_syn_lin(e, dt, h, h, true, "%s.attn.to_k", pre);
    mlo_syn_lin(e, dt, h, h, true, "%s.attn.to_v", pre);
    T1(e, dt, hd, "%s.attn.norm_q.weight", pre);
    T1(e, dt, hd, "%s.attn.norm_k.weight", pre);
  }
  mlo_syn_lin(e, dt, 2 * h, h, true, "norm_out.linear");
  mlo_syn_lin(e, dt, p[FLUX_IN], h, true, "proj_out");
}

static const mlo_syn_arch flux_dit = {flux_params, COUNT(flux_params),
                                      "{\"patch_size\":1,\"guidance_embeds\":true,"
                                      "\"axes_dims_rope\":[16,56,56]}",
                                      flux_emit, NULL};

/* ---- QwenImageTransformer2DModel ------------------------------------------ */

enum { QI_HEADS, QI_HEAD_DIM, QI_LAYERS, QI_IN, QI_OUT, QI_JOINT };
static const mlo_syn_param qwen_dit_params[] = {
    {"num_attention_heads", 24, SYN_HEADS}, {"attention_head_dim", 128, SYN_HEAD_DIM},
    {"num_layers", 60, SYN_DEPTH},          {"in_channels", 64, SYN_FIXED},
    {"out_channels", 16, SYN_FIXED},        {"joint_attention_dim", 3584, SYN_FIXED},
};

static void qwen_dit_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t hd = p[QI_HEAD_DIM], h = (int64_t)p[QI_HEADS] * hd, mlp = 4 * h;
  mlo_syn_lin(e, dt, h, p[QI_IN], true, "img_in");
  T1(e, dt, p[QI_JOINT], "txt_norm.weight");
  mlo_syn_lin(e, dt, h, p[QI_JOINT], true, "txt_in");
  mlo_syn_lin(e, dt, h, 256, true, "time_text_embed.timestep_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "time_text_embed.timestep_embedder.linear_2");
  for (int i = 0; i < p[QI_LAYERS]; i++) {
    char pre[64];
    snprintf(pre, sizeof pre, "transformer_blocks.%d", i);
    mlo_syn_lin(e, dt, 6 * h, h, true, "%s.img_mod.1", pre);
    mlo_syn_lin(e, dt, 6 * h, h, true, "%s.txt_mod.1", pre);
    dual_attn(e, pre, h, hd, true);
    mlo_syn_lin(e, dt, mlp, h, true, "%s.img_mlp.net.0.proj", pre);
    mlo_syn_lin(e, dt, h, mlp, true, "%s.img_mlp.net.2", pre);
    mlo_syn_lin(e, dt, mlp, h, true, "%s.txt_mlp.net.0.proj", pre);
    mlo_syn_lin(e, dt, h, mlp, true, "%s.txt_mlp.net.2", pre);
  }
  mlo_syn_lin(e, dt, 2 * h, h, true, "norm_out.linear");
  mlo_syn_lin(e, dt, 4 * (int64_t)p[QI_OUT], h, true, "proj_out");
}

static const mlo_syn_arch qwen_dit = {qwen_dit_params, COUNT(qwen_dit_params),
                                      "{\"patch_size\":2,\"guidance_embeds\":false,"
                                      "\"axes_dims_rope\":[16,56,56]}",
                                      qwen_dit_emit, NULL};

/* ---- Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration) as text encoder ------- */

enum {
  QV_HEADS,
  QV_HEAD_DIM,
  QV_INTER,
  QV_LAYERS,
  QV_VOCAB,
  QV_VHEADS,
  QV_VHEAD_DIM,
  QV_VINTER,
  QV_VDEPTH
};
static const mlo_syn_param qwen_vl_params[] = {
    {"num_attention_heads", 28, SYN_HEADS},
    {NULL, 128, SYN_HEAD_DIM},
    {"intermediate_size", 18944, SYN_WIDTH},
    {"num_hidden_layers", 28, SYN_DEPTH},
    {"vocab_size", 152064, SYN_VOCAB},
    {NULL, 16, SYN_HEADS},
    {NULL, 80, SYN_HEAD_DIM},
    {NULL, 3420, SYN_WIDTH},
    {NULL, 32, SYN_DEPTH},
};

static void qwen_vl_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t hd = p[QV_HEAD_DIM], h = (int64_t)p[QV_HEADS] * hd, inter = p[QV_INTER];
  int64_t kv = (p[QV_HEADS] >= 7 ? p[QV_HEADS] / 7 : 1) * hd; /* 28 heads : 4 kv heads */
  int64_t vh = (int64_t)p[QV_VHEADS] * p[QV_VHEAD_DIM], vi = p[QV_VINTER];
  T2(e, dt, p[QV_VOCAB], h, "model.embed_tokens.weight");
  for (int i = 0; i < p[QV_LAYERS]; i++) {
    mlo_syn_lin(e, dt, h, h, true, "model.layers.%d.self_attn.q_proj", i);
    mlo_syn_lin(e, dt, kv, h, true, "model.layers.%d.self_attn.k_proj", i);
    mlo_syn_lin(e, dt, kv, h, true, "model.layers.%d.self_attn.v_proj", i);
    mlo_syn_lin(e, dt, h, h, false, "model.layers.%d.self_attn.o_proj", i);
    mlo_syn_lin(e, dt, inter, h, false, "model.layers.%d.mlp.gate_proj", i);
    mlo_syn_lin(e, dt, inter, h, false, "model.layers.%d.mlp.up_proj", i);
    mlo_syn_lin(e, dt, h, inter, false, "model.layers.%d.mlp.down_proj", i);
    T1(e, dt, h, "model.layers.%d.input_layernorm.weight", i);
    T1(e, dt, h, "model.layers.%d.post_attention_layernorm.weight", i);
  }
  T1(e, dt, h, "model.norm.weight");
  T2(e, dt, p[QV_VOCAB], h, "lm_head.weight");
  T5(e, dt, vh, 3, 2, 14, 14, "visual.patch_embed.proj.weight");
  for (int i = 0; i < p[QV_VDEPTH]; i++) {
    T1(e, dt, vh, "visual.blocks.%d.norm1.weight", i);
    T1(e, dt, vh, "visual.blocks.%d.norm2.weight", i);
    mlo_syn_lin(e, dt, 3 * vh, vh, true, "visual.blocks.%d.attn.qkv", i);
    mlo_syn_lin(e, dt, vh, vh, true, "visual.blocks.%d.attn.proj", i);
    mlo_syn_lin(e, dt, vi, vh, true, "visual.blocks.%d.mlp.gate_proj", i);
    mlo_syn_lin(e, dt, vi, vh, true, "visual.blocks.%d.mlp.up_proj", i);
    mlo_syn_lin(e, dt, vh, vi, true, "visual.blocks.%d.mlp.down_proj", i);
  }
  T1(e, dt, vh, "visual.merger.ln_q.weight");
  mlo_syn_lin(e, dt, 4 * vh, 4 * vh, true, "visual.merger.mlp.0");
  mlo_syn_lin(e, dt, h, 4 * vh, true, "visual.merger.mlp.2");
}

static void qwen_vl_config(cJSON *cfg, const int *p) {
  cJSON_AddNumberToObject(cfg, "hidden_size", p[QV_HEADS] * p[QV_HEAD_DIM]);
  cJSON_AddNumberToObject(cfg, "num_key_value_heads", p[QV_HEADS] >= 7 ? p[QV_HEADS] / 7 : 1);
  cJSON *vision = cJSON_AddObjectToObject(cfg, "vision_config");
  cJSON_AddNumberToObject(vision, "depth", p[QV_VDEPTH]);
  cJSON_AddNumberToObject(vision, "hidden_size", p[QV_VHEADS] * p[QV_VHEAD_DIM]);
  cJSON_AddNumberToObject(vision, "num_heads", p[QV_VHEADS]);
  cJSON_AddNumberToObject(vision, "intermediate_size", p[QV_VINTER]);
  cJSON_AddNumberToObject(vision, "out_hidden_size", p[QV_HEADS] * p[QV_HEAD_DIM]);
  cJSON_AddNumberToObject(vision, "patch_size", 14);
  cJSON_AddNumberToObject(vision, "spatial_merge_size", 2);
  cJSON_AddNumberToObject(vision, "temporal_patch_size", 2);
}

static const mlo_syn_arch qwen_vl = {qwen_vl_params, COUNT(qwen_vl_params),
                                     "{\"model_type\":\"qwen2_5_vl\",\"hidden_act\":\"silu\","
                                     "\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":false}",
                                     qwen_vl_emit, qwen_vl_config};

/* ---- SD3Transformer2DModel (SD3.5 Large) ---------------------------------- */

enum { SD3_HEADS, SD3_HEAD_DIM, SD3_LAYERS, SD3_IN, SD3_JOINT, SD3_POOLED };
static const mlo_syn_param sd3_params[] = {
    {"num_attention_heads", 38, SYN_HEADS},
    {"attention_head_dim", 64, SYN_HEAD_DIM},
    {"num_layers", 38, SYN_DEPTH},
    {"in_channels", 16, SYN_FIXED},
    {"joint_attention_dim", 4096, SYN_FIXED},
    {"pooled_projection_dim", 2048, SYN_FIXED},
};

/* The last block is context_pre_only: no text output projection or MLP. */
static void sd3_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  int64_t hd = p[SD3_HEAD_DIM], h = (int64_t)p[SD3_HEADS] * hd, mlp = 4 * h;
  T4(e, dt, h, p[SD3_IN], 2, 2, "pos_embed.proj.weight");
  T1(e, dt, h, "pos_embed.proj.bias");
  mlo_syn_lin(e, dt, h, p[SD3_JOINT], true, "context_embedder");
  mlo_syn_lin(e, dt, h, 256, true, "time_text_embed.timestep_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "time_text_embed.timestep_embedder.linear_2");
  mlo_syn_lin(e, dt, h, p[SD3_POOLED], true, "time_text_embed.text_embedder.linear_1");
  mlo_syn_lin(e, dt, h, h, true, "time_text_embed.text_embedder.linear_2");
  for (int i = 0; i < p[SD3_LAYERS]; i++) {
    bool last = i == p[SD3_LAYERS] - 1;
    char pre[64];
    snprintf(pre, sizeof pre, "transformer_blocks.%d", i);
    mlo_syn_lin(e, dt, 6 * h, h, true, "%s.norm1.linear", pre);
    mlo_syn_lin(e, dt, (last ? 2 : 6) * h, h, true, "%s.norm1_context.linear", pre);
    dual_attn(e, pre, h, hd, !last);
    mlo_syn_lin(e, dt, mlp, h, true, "%s.ff.net.0.proj", pre);
    mlo_syn_lin(e, dt, h, mlp, true, "%s.ff.net.2", pre);
    if (last) continue;
    mlo_syn_lin(e, dt, mlp, h, true, "%s.ff_context.net.0.proj", pre);
    mlo_syn_lin(e, dt, h, mlp, true, "%s.ff_context.net.2", pre);
  }
  mlo_syn_lin(e, dt, 2 * h, h, true, "norm_out.linear");
  mlo_syn_lin(e, dt, 4 * (int64_t)p[SD3_IN], h, true, "proj_out");
}

static const mlo_syn_arch sd3_dit = {
    sd3_params, COUNT(sd3_params),
    "{\"patch_size\":2,\"out_channels\":16,\"qk_norm\":\"rms_norm\","
    "\"pos_embed_max_size\":192,\"sample_size\":128}",
    sd3_emit, NULL};

/* ---- the presets ------------------------------------------------------------ */

#define SCHED(cls)                                                                                 \
  {                                                                                                \
    "scheduler", "diffusers", cls, "scheduler_config.json",                                        \
        "{\"_class_name\":\"" cls "\",\"num_train_timesteps\":1000}"                               \
  }
#define TOK(folder, cls)                                                                           \
  {                                                                                                \
    folder, "transformers", cls, "tokenizer_config.json",                                          \
        "{\"tokenizer_class\":\"" cls "\",\"model_max_length\":512}"                               \
  }

static const mlo_syn_component wan_components[] = {
    {"text_encoder", "transformers", "UMT5EncoderModel", &umt5_xxl, BF, true},
    {"transformer", "diffusers", "WanTransformer3DModel", &wan_dit, BF, true},
    {"transformer_2", "diffusers", "WanTransformer3DModel", &wan_dit, BF, true},
    {"vae", "diffusers", "AutoencoderKLWan", &mlo_syn_wan_vae, F32, false},
};
/* Wan2.2 T2V A14B's scheduler as its diffusers directory ships it: UniPC
 * with flow sigmas and shift 12, so with boundary_ratio 0.875 the
 * high-noise expert runs the first 6 of 8 steps, 26 of 40. */
static const mlo_syn_aux wan_aux[] = {
    {"scheduler", "diffusers", "UniPCMultistepScheduler", "scheduler_config.json",
     "{\"_class_name\":\"UniPCMultistepScheduler\",\"num_train_timesteps\":1000,"
     "\"prediction_type\":\"flow_prediction\",\"use_flow_sigmas\":true,\"flow_shift\":12.0,"
     "\"solver_order\":2,\"final_sigmas_type\":\"zero\"}"},
    TOK("tokenizer", "T5TokenizerFast")};

static const mlo_syn_component flux_components[] = {
    {"text_encoder", "transformers", "CLIPTextModel", &clip_l, BF, false},
    {"text_encoder_2", "transformers", "T5EncoderModel", &t5_xxl, BF, true},
    {"transformer", "diffusers", "FluxTransformer2DModel", &flux_dit, BF, true},
    {"vae", "diffusers", "AutoencoderKL", &mlo_syn_vae2d, BF, false},
};
static const mlo_syn_aux flux_aux[] = {SCHED("FlowMatchEulerDiscreteScheduler"),
                                       TOK("tokenizer", "CLIPTokenizer"),
                                       TOK("tokenizer_2", "T5TokenizerFast")};
static const char *const flux_absent[] = {"feature_extractor", "image_encoder", NULL};

static const mlo_syn_component qwen_components[] = {
    {"text_encoder", "transformers", "Qwen2_5_VLForConditionalGeneration", &qwen_vl, BF, true},
    {"transformer", "diffusers", "QwenImageTransformer2DModel", &qwen_dit, BF, true},
    {"vae", "diffusers", "AutoencoderKLQwenImage", &mlo_syn_wan_vae, BF, false},
};
static const mlo_syn_aux qwen_aux[] = {SCHED("FlowMatchEulerDiscreteScheduler"),
                                       TOK("tokenizer", "Qwen2Tokenizer")};

static const mlo_syn_component sd3_components[] = {
    {"text_encoder", "transformers", "CLIPTextModelWithProjection", &clip_l_proj, BF, false},
    {"text_encoder_2", "transformers", "CLIPTextModelWithProjection", &clip_g, BF, false},
    {"text_encoder_3", "transformers", "T5EncoderModel", &t5_xxl, BF, true},
    {"transformer", "diffusers", "SD3Transformer2DModel", &sd3_dit, BF, true},
    {"vae", "diffusers", "AutoencoderKL", &mlo_syn_vae2d, BF, false},
};
static const mlo_syn_aux sd3_aux[] = {
    SCHED("FlowMatchEulerDiscreteScheduler"), TOK("tokenizer", "CLIPTokenizer"),
    TOK("tokenizer_2", "CLIPTokenizer"), TOK("tokenizer_3", "T5TokenizerFast")};

const mlo_syn_preset mlo_syn_presets[] = {
    {"wan2.2-t2v", "Wan2.2 T2V A14B: UMT5 encoder, two 14B video DiTs, 3-D VAE (~69 GB)",
     "WanPipeline", "{\"boundary_ratio\":0.875,\"expand_timesteps\":false}", wan_components,
     COUNT(wan_components), wan_aux, COUNT(wan_aux), NULL},
    {"flux", "FLUX.1: CLIP-L and T5-XXL encoders, 12B DiT, VAE (~34 GB)", "FluxPipeline", NULL,
     flux_components, COUNT(flux_components), flux_aux, COUNT(flux_aux), flux_absent},
    {"qwen-image", "Qwen-Image: Qwen2.5-VL 7B encoder, 20B DiT, VAE (~58 GB)", "QwenImagePipeline",
     NULL, qwen_components, COUNT(qwen_components), qwen_aux, COUNT(qwen_aux), NULL},
    {"sd3", "SD3.5 Large: CLIP-L, CLIP-G and T5-XXL encoders, 8B DiT, VAE (~27 GB)",
     "StableDiffusion3Pipeline", NULL, sd3_components, COUNT(sd3_components), sd3_aux,
     COUNT(sd3_aux), flux_absent},
};
const size_t mlo_syn_preset_count = COUNT(mlo_syn_presets);
