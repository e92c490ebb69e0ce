/*
 * synth_vae.c — the generator's VAEs: diffusers' AutoencoderKL (the 2-D VAE
 * of Flux and SD3) and AutoencoderKLWan (the 3-D causal VAE of Wan, which
 * Qwen-Image reuses as AutoencoderKLQwenImage), with their real tensor
 * names.  Kept apart from synth_presets.c because convolution stacks are
 * long to spell out and share nothing with the transformers.
 */
#include "synth/synth.h"

#include <stdio.h>

#define COUNT(a) (sizeof(a) / sizeof *(a))
#define F32 MLO_DTYPE_F32

/* ---- AutoencoderKL (2-D, Flux / SD3) --------------------------------------- */

enum { VAE_CH, VAE_BLOCKS, VAE_LATENT };
static const mlo_syn_param vae2d_params[] = {
    {NULL, 128, SYN_WIDTH}, {"layers_per_block", 2, SYN_DEPTH}, {"latent_channels", 16, SYN_FIXED}};

static void vae2d_resnet(mlo_syn_emitter *e, const char *pre, int64_t cin, int64_t cout) {
  mlo_dtype dt = mlo_syn_dtype(e);
  T1(e, dt, cin, "%s.norm1.weight", pre);
  T1(e, dt, cin, "%s.norm1.bias", pre);
  T4(e, dt, cout, cin, 3, 3, "%s.conv1.weight", pre);
  T1(e, dt, cout, "%s.conv1.bias", pre);
  T1(e, dt, cout, "%s.norm2.weight", pre);
  T1(e, dt, cout, "%s.norm2.bias", pre);
  T4(e, dt, cout, cout, 3, 3, "%s.conv2.weight", pre);
  T1(e, dt, cout, "%s.conv2.bias", pre);
  if (cin == cout) return;
  T4(e, dt, cout, cin, 1, 1, "%s.conv_shortcut.weight", pre);
  T1(e, dt, cout, "%s.conv_shortcut.bias", pre);
}

static void vae2d_mid(mlo_syn_emitter *e, const char *side, int64_t c) {
  mlo_dtype dt = mlo_syn_dtype(e);
  char pre[96];
  snprintf(pre, sizeof pre, "%s.mid_block.resnets.0", side);
  vae2d_resnet(e, pre, c, c);
  T1(e, dt, c, "%s.mid_block.attentions.0.group_norm.weight", side);
  T1(e, dt, c, "%s.mid_block.attentions.0.group_norm.bias", side);
  static const char *const proj[] = {"to_q", "to_k", "to_v", "to_out.0"};
  for (int k = 0; k < 4; k++)
    mlo_syn_lin(e, dt, c, c, true, "%s.mid_block.attentions.0.%s", side, proj[k]);
  snprintf(pre, sizeof pre, "%s.mid_block.resnets.1", side);
  vae2d_resnet(e, pre, c, c);
}

static void vae2d_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  static const int mult[4] = {1, 2, 4, 4};
  int64_t ch = p[VAE_CH], lat = p[VAE_LATENT], top = ch * mult[3], c = ch;
  char pre[96];
  T4(e, dt, ch, 3, 3, 3, "encoder.conv_in.weight");
  T1(e, dt, ch, "encoder.conv_in.bias");
  for (int i = 0; i < 4; i++) {
    int64_t out = ch * mult[i];
    for (int j = 0; j < p[VAE_BLOCKS]; j++, c = out) {
      snprintf(pre, sizeof pre, "encoder.down_blocks.%d.resnets.%d", i, j);
      vae2d_resnet(e, pre, c, out);
    }
    if (i < 3) {
      T4(e, dt, out, out, 3, 3, "encoder.down_blocks.%d.downsamplers.0.conv.weight", i);
      T1(e, dt, out, "encoder.down_blocks.%d.downsamplers.0.conv.bias", i);
    }
  }
  vae2d_mid(e, "encoder", top);
  T1(e, dt, top, "encoder.conv_norm_out.weight");
  T1(e, dt, top, "encoder.conv_norm_out.bias");
  T4(e, dt, 2 * lat, top, 3, 3, "encoder.conv_out.weight");
  T1(e, dt, 2 * lat, "encoder.conv_out.bias");
  T4(e, dt, top, lat, 3, 3, "decoder.conv_in.weight");
  T1(e, dt, top, "decoder.conv_in.bias");
  vae2d_mid(e, "decoder", top);
  c = top;
  for (int i = 0; i < 4; i++) {
    int64_t out = ch * mult[3 - i];
    for (int j = 0; j <= p[VAE_BLOCKS]; j++, c = out) {
      snprintf(pre, sizeof pre, "decoder.up_blocks.%d.resnets.%d", i, j);
      vae2d_resnet(e, pre, c, out);
    }
    if (i < 3) {
      T4(e, dt, out, out, 3, 3, "decoder.up_blocks.%d.upsamplers.0.conv.weight", i);
      T1(e, dt, out, "decoder.up_blocks.%d.upsamplers.0.conv.bias", i);
    }
  }
  T1(e, dt, ch, "decoder.conv_norm_out.weight");
  T1(e, dt, ch, "decoder.conv_norm_out.bias");
  T4(e, dt, 3, ch, 3, 3, "decoder.conv_out.weight");
  T1(e, dt, 3, "decoder.conv_out.bias");
}

static void vae2d_config(cJSON *cfg, const int *p) {
  const int ch[4] = {p[VAE_CH], 2 * p[VAE_CH], 4 * p[VAE_CH], 4 * p[VAE_CH]};
  cJSON_AddItemToObject(cfg, "block_out_channels", cJSON_CreateIntArray(ch, 4));
}

const mlo_syn_arch mlo_syn_vae2d = {vae2d_params, COUNT(vae2d_params),
                                    "{\"in_channels\":3,"
                                    "\"out_channels\":3,\"use_quant_conv\":false,"
                                    "\"use_post_quant_conv\":false,\"scaling_factor\":1.5035}",
                                    vae2d_emit, vae2d_config};

/* ---- AutoencoderKLWan (3-D causal VAE; also AutoencoderKLQwenImage) ------- */

enum { WV_BASE, WV_RES, WV_Z };
static const mlo_syn_param wan_vae_params[] = {
    {"base_dim", 96, SYN_WIDTH}, {"num_res_blocks", 2, SYN_DEPTH}, {"z_dim", 16, SYN_FIXED}};

static void wv_gamma(mlo_syn_emitter *e, int64_t c, const char *fmt, const char *pre) {
  T4(e, F32, c, 1, 1, 1, fmt, pre);
}

static void wv_resnet(mlo_syn_emitter *e, const char *pre, int64_t cin, int64_t cout) {
  mlo_dtype dt = mlo_syn_dtype(e);
  wv_gamma(e, cin, "%s.norm1.gamma", pre);
  T5(e, dt, cout, cin, 3, 3, 3, "%s.conv1.weight", pre);
  T1(e, dt, cout, "%s.conv1.bias", pre);
  wv_gamma(e, cout, "%s.norm2.gamma", pre);
  T5(e, dt, cout, cout, 3, 3, 3, "%s.conv2.weight", pre);
  T1(e, dt, cout, "%s.conv2.bias", pre);
  if (cin == cout) return;
  T5(e, dt, cout, cin, 1, 1, 1, "%s.conv_shortcut.weight", pre);
  T1(e, dt, cout, "%s.conv_shortcut.bias", pre);
}

static void wv_mid(mlo_syn_emitter *e, const char *side, int64_t c) {
  mlo_dtype dt = mlo_syn_dtype(e);
  char pre[96];
  snprintf(pre, sizeof pre, "%s.mid_block.resnets.0", side);
  wv_resnet(e, pre, c, c);
  T3(e, F32, c, 1, 1, "%s.mid_block.attentions.0.norm.gamma", side);
  T4(e, dt, 3 * c, c, 1, 1, "%s.mid_block.attentions.0.to_qkv.weight", side);
  T1(e, dt, 3 * c, "%s.mid_block.attentions.0.to_qkv.bias", side);
  T4(e, dt, c, c, 1, 1, "%s.mid_block.attentions.0.proj.weight", side);
  T1(e, dt, c, "%s.mid_block.attentions.0.proj.bias", side);
  snprintf(pre, sizeof pre, "%s.mid_block.resnets.1", side);
  wv_resnet(e, pre, c, c);
}

/* Spatial resampling "resample.1" and, where the stride is temporal too,
 * "time_conv".  Upsampling halves the channels, as in the real decoder. */
static void wv_resample(mlo_syn_emitter *e, const char *pre, int64_t cout, int64_t cin,
                        bool temporal, int64_t time_out) {
  mlo_dtype dt = mlo_syn_dtype(e);
  T4(e, dt, cout, cin, 3, 3, "%s.resample.1.weight", pre);
  T1(e, dt, cout, "%s.resample.1.bias", pre);
  if (!temporal) return;
  T5(e, dt, time_out, cin, 3, 1, 1, "%s.time_conv.weight", pre);
  T1(e, dt, time_out, "%s.time_conv.bias", pre);
}

static void wan_vae_emit(mlo_syn_emitter *e, const int *p) {
  mlo_dtype dt = mlo_syn_dtype(e);
  static const int mult[4] = {1, 2, 4, 4};
  int64_t b = p[WV_BASE], z = p[WV_Z], top = 4 * b, c = b;
  char pre[96];
  int k = 0; /* the encoder's down_blocks are one flat list */
  T5(e, dt, b, 3, 3, 3, 3, "encoder.conv_in.weight");
  T1(e, dt, b, "encoder.conv_in.bias");
  for (int i = 0; i < 4; i++) {
    int64_t out = b * mult[i];
    for (int j = 0; j < p[WV_RES]; j++, c = out) {
      snprintf(pre, sizeof pre, "encoder.down_blocks.%d", k++);
      wv_resnet(e, pre, c, out);
    }
    if (i == 3) continue;
    snprintf(pre, sizeof pre, "encoder.down_blocks.%d", k++);
    wv_resample(e, pre, out, out, i > 0, out);
  }
  wv_mid(e, "encoder", top);
  wv_gamma(e, top, "%s.norm_out.gamma", "encoder");
  T5(e, dt, 2 * z, top, 3, 3, 3, "encoder.conv_out.weight");
  T1(e, dt, 2 * z, "encoder.conv_out.bias");
  T5(e, dt, 2 * z, 2 * z, 1, 1, 1, "quant_conv.weight");
  T1(e, dt, 2 * z, "quant_conv.bias");
  T5(e, dt, z, z, 1, 1, 1, "post_quant_conv.weight");
  T1(e, dt, z, "post_quant_conv.bias");
  T5(e, dt, top, z, 3, 3, 3, "decoder.conv_in.weight");
  T1(e, dt, top, "decoder.conv_in.bias");
  wv_mid(e, "decoder", top);
  c = top;
  for (int i = 0; i < 4; i++) {
    int64_t out = b * mult[3 - i];
    for (int j = 0; j <= p[WV_RES]; j++, c = out) {
      snprintf(pre, sizeof pre, "decoder.up_blocks.%d.resnets.%d", i, j);
      wv_resnet(e, pre, c, out);
    }
    if (i == 3) continue;
    snprintf(pre, sizeof pre, "decoder.up_blocks.%d.upsamplers.0", i);
    wv_resample(e, pre, out / 2, out, i < 2, 2 * out);
    c = out / 2;
  }
  wv_gamma(e, b, "%s.norm_out.gamma", "decoder");
  T5(e, dt, 3, b, 3, 3, 3, "decoder.conv_out.weight");
  T1(e, dt, 3, "decoder.conv_out.bias");
}

const mlo_syn_arch mlo_syn_wan_vae = {wan_vae_params, COUNT(wan_vae_params),
                                      "{\"dim_mult\":[1,2,4,4],\"attn_scales\":[],"
                                      "\"temperal_downsample\":[false,true,true],\"dropout\":0.0}",
                                      wan_vae_emit, NULL};
