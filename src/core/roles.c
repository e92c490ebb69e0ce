/*
 * roles.c — what a component is, guessed from how checkpoints name it: the
 * diffusers class names (mlo_role_from_class), the folder keys of
 * model_index.json and the words of the files users download
 * (mlo_role_guess: t5xxl, umt5, flux, wan ...).  Checkpoint naming rules,
 * kept out of the ground floor (base/) where they once sat.  They live in
 * core rather than format/ because core's own API uses them
 * (mlo_component_add with MLO_ROLE_AUTO) and core may not call up into
 * format/; the format layer's readers call down to them.
 */
#include "mlo/mlo.h"

#include <ctype.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

static bool has_prefix_ci(const char *s, const char *prefix) {
  return s && !strncasecmp(s, prefix, strlen(prefix));
}

static bool contains_ci(const char *s, const char *needle) {
  if (!s) return false;
  size_t n = strlen(needle);
  for (; *s; s++)
    if (!strncasecmp(s, needle, n)) return true;
  return false;
}

/* The words of a file name ("wan2.2_t2v_high_noise_14B_fp16" -> wan2,
 * 2, t2v, high, noise, 14b, fp16), lower-cased, at most 16 of 32 bytes. */
typedef struct {
  char w[16][32];
  int n;
} words;

static void split_words(const char *s, words *out) {
  out->n = 0;
  while (s && *s && out->n < 16) {
    while (*s && (*s == '.' || *s == '_' || *s == '-' || *s == ' ')) s++;
    size_t k = 0;
    while (*s && *s != '.' && *s != '_' && *s != '-' && *s != ' ') {
      if (k < sizeof out->w[0] - 1) out->w[out->n][k++] = (char)tolower((unsigned char)*s);
      s++;
    }
    if (k) out->w[out->n++][k] = '\0';
  }
}

static bool has_word(const words *w, const char *word) {
  for (int i = 0; i < w->n; i++)
    if (!strcmp(w->w[i], word)) return true;
  return false;
}

/* A word starting with one of the prefixes ("flux1" starts with "flux"). */
static bool has_word_prefix(const words *w, const char *const *prefixes, size_t n) {
  for (int i = 0; i < w->n; i++)
    for (size_t k = 0; k < n; k++)
      if (!strncmp(w->w[i], prefixes[k], strlen(prefixes[k]))) return true;
  return false;
}

/* Roles from the names of the files users download (the header says
 * which); the VAE words first ("wan2.1_vae" is Wan's VAE), then encoders
 * ("qwen_2.5_vl" is Qwen-Image's text encoder), then DiTs. */
static mlo_role file_name_role(const char *name) {
  words w;
  split_words(name, &w);
  static const char *const vae[] = {"vae", "ae", "autoencoder", "vqvae", "taesd"};
  static const char *const enc_word[] = {"t5", "te", "llm", "mt5", "umt5", "byt5", "clip"};
  static const char *const enc[] = {"t5xxl", "umt5", "clip", "llava", "llama", "gemma", "siglip"};
  static const char *const dit[] = {"flux",    "wan",    "dit",     "transformer", "unet",
                                    "sd3",     "sdxl",   "hunyuan", "ltx",         "chroma",
                                    "hidream", "lumina", "mochi",   "cogvideox",   "diffusion",
                                    "mmdit",   "pixart", "sana",    "aura",        "cosmos"};
  for (size_t i = 0; i < sizeof vae / sizeof *vae; i++)
    if (has_word(&w, vae[i])) return MLO_ROLE_VAE;
  if (contains_ci(name, "text_encoder") || contains_ci(name, "clip_") ||
      (has_word(&w, "qwen") && has_word(&w, "vl")))
    return MLO_ROLE_ENCODER;
  for (size_t i = 0; i < sizeof enc_word / sizeof *enc_word; i++)
    if (has_word(&w, enc_word[i])) return MLO_ROLE_ENCODER;
  if (has_word_prefix(&w, enc, sizeof enc / sizeof *enc)) return MLO_ROLE_ENCODER;
  if (has_word_prefix(&w, dit, sizeof dit / sizeof *dit) || contains_ci(name, "qwen_image") ||
      contains_ci(name, "qwen-image") || contains_ci(name, "high_noise") ||
      contains_ci(name, "low_noise"))
    return MLO_ROLE_DIT;
  return MLO_ROLE_OTHER;
}

mlo_role mlo_role_guess(const char *name, const char *class_name) {
  if (has_prefix_ci(name, "transformer") || has_prefix_ci(name, "dit") ||
      has_prefix_ci(name, "unet") || has_prefix_ci(name, "prior"))
    return MLO_ROLE_DIT;
  if (has_prefix_ci(name, "text_encoder") || has_prefix_ci(name, "image_encoder") ||
      has_prefix_ci(name, "mllm") || has_prefix_ci(name, "encoder"))
    return MLO_ROLE_ENCODER;
  if (has_prefix_ci(name, "vae") || has_prefix_ci(name, "audio_vae") ||
      has_prefix_ci(name, "vqvae"))
    return MLO_ROLE_VAE;
  /* Unusual keys: fall back to the class name. */
  if (contains_ci(class_name, "Transformer2D") || contains_ci(class_name, "Transformer3D") ||
      contains_ci(class_name, "UNet"))
    return MLO_ROLE_DIT;
  if (contains_ci(class_name, "Autoencoder") || contains_ci(class_name, "VAE")) return MLO_ROLE_VAE;
  if (contains_ci(class_name, "Encoder") || contains_ci(class_name, "TextModel") ||
      contains_ci(class_name, "CLIP") || contains_ci(class_name, "T5"))
    return MLO_ROLE_ENCODER;
  return file_name_role(name);
}

static bool has_suffix(const char *s, const char *suffix) {
  size_t ls = strlen(s), lx = strlen(suffix);
  return ls >= lx && !strcmp(s + ls - lx, suffix);
}

int mlo_role_from_class(const char *cls, mlo_role *out) {
  if (!cls || !out) return MLO_EINVAL;
  static const char *const dit_suffix[] = {"Transformer2DModel", "Transformer3DModel",
                                           "PriorTransformer", "StableCascadeUNet"};
  static const char *const enc_suffix[] = {"EncoderModel",
                                           "TextModel",
                                           "TextModelWithProjection",
                                           "VisionModel",
                                           "VisionModelWithProjection",
                                           "ForConditionalGeneration",
                                           "ForCausalLM"};
  static const char *const enc_prefix[] = {"CLIPText", "CLIPVision", "Siglip", "Gemma",
                                           "Qwen2",    "Qwen3",      "Llama",  "Mistral",
                                           "ChatGLM",  "Glm",        "Bert",   "T5"};
  for (size_t i = 0; i < sizeof dit_suffix / sizeof *dit_suffix; i++)
    if (has_suffix(cls, dit_suffix[i])) return *out = MLO_ROLE_DIT, MLO_OK;
  if (!strncmp(cls, "UNet", 4) && has_suffix(cls, "Model")) return *out = MLO_ROLE_DIT, MLO_OK;
  if (!strncmp(cls, "Autoencoder", 11) || !strncmp(cls, "AsymmetricAutoencoder", 21) ||
      has_suffix(cls, "VAE") || !strcmp(cls, "VQModel"))
    return *out = MLO_ROLE_VAE, MLO_OK;
  for (size_t i = 0; i < sizeof enc_suffix / sizeof *enc_suffix; i++)
    if (has_suffix(cls, enc_suffix[i])) return *out = MLO_ROLE_ENCODER, MLO_OK;
  for (size_t i = 0; i < sizeof enc_prefix / sizeof *enc_prefix; i++)
    if (!strncmp(cls, enc_prefix[i], strlen(enc_prefix[i])) && has_suffix(cls, "Model"))
      return *out = MLO_ROLE_ENCODER, MLO_OK;
  return MLO_ENOTFOUND;
}
