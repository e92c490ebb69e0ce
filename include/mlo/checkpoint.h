/*
 * checkpoint.h — checkpoints on disk: opening diffusers pipeline
 * directories and single safetensors files, and writing synthetic
 * pipelines shaped like real ones.  The reference manual for both.
 *
 * Opening declares tensors as file ranges; nothing past the safetensors
 * headers is read until mlo_pipeline_materialize.  Every file is hostile
 * input: each problem is its own error (MLO_EFORMAT, MLO_EIO, MLO_ENOTFOUND)
 * with a message naming the folder and the file, and a failed open leaves
 * nothing behind.  The conventions of mlo.h apply (status codes, options
 * structs with a size and an _INIT macro, NULL-tolerant frees).
 *
 * The layout understood (docs/formats.md):
 *
 *   DIR/model_index.json         names the components
 *   DIR/<component>/config.json  optional for the loader
 *   DIR/<component>/<stem>[.<variant>].safetensors          one file, or
 *   DIR/<component>/<stem>.safetensors.index[.<variant>].json  a weight map
 *   DIR/<component>/<shard files named by the weight map>
 *
 * where <stem> is "diffusion_pytorch_model" (diffusers) or "model"
 * (transformers); any other stem is accepted when it is the only candidate.
 * Variant shards are named "<stem>.<variant>-00001-of-00002.safetensors"
 * (today's diffusers and transformers) or, for older diffusers saves,
 * "<stem>-00001-of-00002.<variant>.safetensors"; only the weight map's own
 * names are read, so both work.
 *
 * model_index.json rules:
 *  - A key starting with '_' is metadata ("_class_name").
 *  - A value that is an array is a component entry and must be
 *    [library, class] (two strings) or [null, null] (an absent component,
 *    skipped).  Any other array is an error naming the key.
 *  - A value that is not an array (a number, a boolean, a string, an
 *    object) is pipeline configuration such as Wan2.2's "boundary_ratio"
 *    and is ignored.
 *  - Classes that never hold weights (names ending in Scheduler, Tokenizer,
 *    TokenizerFast, Processor, FeatureExtractor, ImageProcessor) are
 *    skipped without looking at their folder.
 *  - Any other listed component whose folder is missing is an error naming
 *    it.  A folder that exists but holds no safetensors file is skipped with
 *    an info line if its role would be OTHER, and is an error if its role is
 *    DIT, ENCODER or VAE (a truncated download must not load half a
 *    pipeline).
 *
 * Roles.  A component whose model class (model_index.json's entry, a lone
 * folder's config.json) is one mlo_role_from_class knows gets that role
 * (source MLO_ROLE_FROM_CLASS: WanTransformer3DModel, UMT5EncoderModel,
 * AutoencoderKLWan, CLIPTextModel, T5EncoderModel, ...).  Otherwise the
 * role is the heuristic mlo_role_guess(key, class_name) (source
 * MLO_ROLE_FROM_HEURISTIC; one warning names every guess, see
 * mlo_pipeline_warn_guessed).  The caller's override wins over both
 * (source MLO_ROLE_FROM_OVERRIDE).  An override naming a component that is not in
 * the pipeline is an error (MLO_ENOTFOUND), so a typo never goes unnoticed.
 *
 * Sharded components are validated as a set before anything is declared:
 * the index must be a JSON object whose "weight_map" is an object of
 * tensor name -> shard file name (a plain file name in the same folder);
 * every shard must exist and be a valid safetensors file; every tensor in
 * the map must be in its shard; a tensor in a shard must be mapped to that
 * shard (a tensor found in two shards, or in a shard the map does not name
 * for it, is an error).  A STRAY file — a safetensors file in the folder
 * whose name belongs to the same family as the weight map (same stem and
 * variant: an unsharded "<stem>.safetensors" or a shard the map does not
 * name) — is an error by default, because it means two saves are mixed;
 * allow_stray turns it into a warning.  Files of other variants are not
 * strays.  Without an index, a folder with several candidate files for the
 * requested variant is ambiguous and an error listing them.
 */
#ifndef MLO_CHECKPOINT_H
#define MLO_CHECKPOINT_H

#include "mlo/mlo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One role override: the component called `name` gets `role`. */
typedef struct {
  const char *name;
  mlo_role role; /* DIT, ENCODER, VAE or OTHER (AUTO is refused) */
} mlo_role_override;

typedef struct {
  size_t size;                        /* sizeof(mlo_open_options) */
  const mlo_role_override *overrides; /* may be NULL when count is 0 */
  size_t override_count;
  /* A weights variant ("fp16", "bf16"): each component uses its files for
   * that variant and falls back, with a warning, to the plain files where
   * it has none.  MLO_ENOTFOUND if no component has the variant.  NULL: the
   * plain files. */
  const char *variant;
  /* A stray safetensors file next to a weight map warns instead of failing. */
  bool allow_stray;
  /* The component name for a single .safetensors file or a folder without
   * model_index.json; NULL: the file stem / folder name. */
  const char *single_name;
  /* Tensor flags added to every tensor declared (MLO_TENSOR_*). */
  unsigned tensor_flags;
} mlo_open_options;
#define MLO_OPEN_OPTIONS_INIT                                                                      \
  { sizeof(mlo_open_options), NULL, 0, NULL, false, NULL, 0 }

/* Opens a checkpoint as a new pipeline on opts->platform.  path is one of:
 *  - a diffusers pipeline directory (has model_index.json): one component
 *    per weight-bearing entry, in the order of model_index.json;
 *  - a component folder (no model_index.json, but safetensors files): one
 *    component named after the folder;
 *  - a single .safetensors or GGUF file: one component named after the
 *    file stem ("wan2.1_vae.safetensors" -> "wan2.1_vae"), its role guessed
 *    from that name (mlo_role_guess; for GGUF also general.architecture).
 *    GGUF (v2, v3) tensors keep their GGML types (MLO_DTYPE_Q4_K, ...) and
 *    move as the bytes they are.
 * oo may be NULL for defaults.  On success *out owns the pipeline (free with
 * mlo_pipeline_free); tensors are declared as file ranges and no weight byte
 * has been read.  On failure *out is NULL, nothing is left allocated or
 * open, and err (when given) holds a message naming the folder and file. */
MLO_API int mlo_pipeline_open_path(const mlo_pipeline_options *opts, const char *path,
                                   const mlo_open_options *oo, mlo_pipeline **out, char *err,
                                   size_t errlen);

/* One component of a pipeline assembled from separate files, the layout of
 * ComfyUI and stable-diffusion.cpp users ("flux1-dev.safetensors",
 * "t5xxl_fp16.safetensors", "clip_l.safetensors", "ae.safetensors"). */
typedef struct {
  const char *name; /* the component's name, unique in the pipeline */
  mlo_role role;    /* a declared role, or MLO_ROLE_AUTO: guessed from the
                       file's name (and a GGUF's general.architecture) */
  const char *path; /* a .safetensors or GGUF file, or a component folder */
} mlo_component_file;

/* Opens count files as one pipeline, one component each, in the order
 * given (so a high-noise DiT listed first runs first, as Wan2.2's
 * transformer does).  A file is GGUF when it starts with GGUF's magic,
 * else safetensors.  oo's overrides, variant (for folders) and tensor flags
 * apply; single_name is ignored.  A pipeline directory (model_index.json)
 * is refused here: it is opened whole with mlo_pipeline_open_path.  The
 * same guarantees as mlo_pipeline_open_path: nothing is read past the
 * headers and a failure leaves nothing behind. */
MLO_API int mlo_pipeline_open_files(const mlo_pipeline_options *opts,
                                    const mlo_component_file *files, size_t count,
                                    const mlo_open_options *oo, mlo_pipeline **out, char *err,
                                    size_t errlen);

/* ------------------------------------------------------------------------
 * The denoising schedule: which expert runs each step
 *
 * Wan2.2 has two DiT experts.  diffusers' WanPipeline runs `transformer`
 * (high noise) for a step whose timestep t >= boundary_ratio x
 * num_train_timesteps, and `transformer_2` after, with the timesteps its
 * scheduler computes, so the split depends on the scheduler's flow shift
 * and spacing: with the UniPC scheduler (flow shift 3) a Wan2.2 directory
 * ships, 8 steps put 3 on the high-noise expert, not 7 of 8.  These calls
 * compute the same split, in diffusers' arithmetic.
 * ---------------------------------------------------------------------- */
typedef enum {
  MLO_SCHED_FLOW_MATCH_EULER, /* FlowMatchEulerDiscreteScheduler */
  MLO_SCHED_UNIPC_FLOW,       /* UniPCMultistepScheduler, use_flow_sigmas */
  MLO_SCHED_UNIPC_DISCRETE,   /* UniPCMultistepScheduler, linspace/leading/trailing */
} mlo_sched_kind;
MLO_API const char *mlo_denoise_kind_name(mlo_sched_kind kind);

typedef struct {
  size_t size; /* sizeof(mlo_denoise_schedule) */
  mlo_sched_kind kind;
  char class_name[64];     /* the scheduler's class, "" for the default */
  int num_train_timesteps; /* 1000 */
  double shift;            /* flow shift ("shift", UniPC's "flow_shift") */
  int spacing;             /* discrete UniPC: 0 linspace, 1 leading, 2 trailing */
  int steps_offset;        /* leading spacing's offset */
  double shift_terminal;   /* 0: none */
  double boundary_ratio;   /* model_index.json's; < 0: none (every step on the first DiT) */
  char source[32];         /* "scheduler config" or "default" */
} mlo_denoise_schedule;
/* The default when a pipeline has no scheduler config (files from ComfyUI
 * or stable-diffusion.cpp): flow-match Euler, shift 5, no boundary. */
#define MLO_DENOISE_SCHEDULE_INIT                                                                  \
  {                                                                                                \
    sizeof(mlo_denoise_schedule), MLO_SCHED_FLOW_MATCH_EULER, "", 1000, 5.0, 0, 0, 0.0, -1.0,      \
        "default"                                                                                  \
  }

/* Reads dir/model_index.json's boundary_ratio and, when there is one,
 * dir/scheduler/scheduler_config.json into *out (whose size must be set;
 * fields it does not find keep MLO_DENOISE_SCHEDULE_INIT's values).
 * MLO_ENOTFOUND without model_index.json; MLO_EUNSUPPORTED (naming the
 * option) for a scheduler or option not modelled (Karras, exponential or
 * beta sigmas, dynamic shifting); MLO_EFORMAT for malformed configs.
 * *out is written only on success. */
MLO_API int mlo_denoise_schedule_read(const char *dir, mlo_denoise_schedule *out, char *err,
                                      size_t errlen);
/* The timesteps of a steps-step run, in order, into t[0..steps). */
MLO_API int mlo_denoise_timesteps(const mlo_denoise_schedule *s, int steps, double *t);
/* How many of the first steps run on the first (high-noise) expert: the
 * count of t >= boundary_ratio x num_train_timesteps (the timesteps fall,
 * so they are a prefix); all steps when there is no boundary. */
MLO_API int mlo_denoise_first_expert_steps(const mlo_denoise_schedule *s, int steps, int *first);

/* ------------------------------------------------------------------------
 * Synthetic pipelines (the generator behind `mlo demo` and the benches)
 *
 * A preset is a real pipeline's shape: its model_index.json, component
 * folders, config.json files, tensor names and layer structure, with
 * deterministic weights.  scale = 1.0 is the real model's size (Wan2.2 at
 * 1.0 is two 14B transformers, a 5.7B encoder and an f32 VAE: 69 GB; Flux
 * 34 GB, Qwen-Image 58 GB, SD3.5-Large 27 GB).  Each component is scaled on
 * its own so that its bytes are close to scale x its real bytes: widths
 * (hidden size, FFN) and depths scale by g = f^(1/3), head count and head
 * width by sqrt(g) each, vocabularies by g^2, interface sizes (latent
 * channels, text-embedding input) stay fixed, and f is found by bisection
 * on the exact byte count.  Because sizes are whole numbers, totals land
 * within 15% of scale x full size from scale 0.001 (tens of MB) upward
 * (tests hold them to 25%).  Widths and depths have minimums (8 wide, one
 * layer), so below that the small components (the VAE) stay larger than
 * their share and the total exceeds the target.
 *
 * A preset named "NAME:full-depth" (every function below takes it) keeps
 * the real model's layer counts and scales widths alone, by g = f^(1/2)
 * (vocabularies by g): each block is then the same fraction of its
 * component as in the real model, which block streaming's figures depend
 * on (Wan2.2's DiT has 40 blocks at any scale, not 5 at 0.002).
 *
 * Weights are bf16 (norm weights and Wan's fp32-kept modules are f32, the
 * Wan VAE is f32, as in the real checkpoints), drawn from a counter-based
 * hash seeded by the tensor name: finite, |x| <= 0.03, identical on every
 * run and machine.  The biggest components are sharded with a weight map
 * (at least two shards at any scale); files are written atomically, and a
 * stamp `.mlo-synth.json` records the preset and scale once everything is
 * complete so that a second call with the same arguments returns at once.
 * ---------------------------------------------------------------------- */

typedef struct {
  const char *name;        /* "wan2.2-t2v" */
  const char *description; /* one line */
} mlo_synth_preset_info;

/* The presets, terminated by an entry whose name is NULL.  Static storage. */
MLO_API const mlo_synth_preset_info *mlo_synth_presets(void);

/* The preset a name stands for: the preset's own name for NAME and for
 * NAME:full-depth (which at scale 1 is the same model); NULL for any other
 * name.  Static storage. */
MLO_API const char *mlo_synth_preset_of(const char *name);

/* Progress: bytes of tensor data written so far over the total, and the
 * file being written (relative to dir). */
typedef void (*mlo_synth_progress_fn)(const char *file, uint64_t done, uint64_t total, void *user);

/* The sum of tensor bytes (what mlo_pipeline_open_path then reports as the
 * sum of mlo_tensor_nbytes) that mlo_synth_write(preset, ..., scale) would
 * write.  Computes shapes only.  MLO_ENOTFOUND for an unknown preset,
 * MLO_EINVAL for a scale outside (0, 4]. */
MLO_API int mlo_synth_bytes(const char *preset, double scale, uint64_t *bytes);

/* Writes the preset at scale into dir (created if missing).  If dir holds
 * a complete stamp for the same preset and scale, returns MLO_OK without
 * writing (and without reading the weights back).  If dir holds a stamp of
 * another or an interrupted run, the files listed in it are removed first.
 * A dir that is not empty and has no stamp is refused (MLO_EEXIST): the
 * generator never writes over files it did not make.  progress may be NULL.
 * On failure err names the file, and what this call wrote is removed again
 * (dir too, where this call created it). */
MLO_API int mlo_synth_write(const char *preset, const char *dir, double scale,
                            mlo_synth_progress_fn progress, void *user, char *err, size_t errlen);

/* True if dir holds a complete stamp for preset at scale. */
MLO_API bool mlo_synth_is_complete(const char *preset, const char *dir, double scale);

/* The preset at scale as a new pipeline, without writing or reading a
 * file: the components mlo_synth_write would write, in the same order and
 * with the same names, tensor names, shapes and dtypes, each tensor
 * zero-filled (no source) and each role from its class
 * (MLO_ROLE_FROM_CLASS).  For projections on the simulated platform
 * ("sim": `mlo plan wan2.2-t2v` at scale 1 in milliseconds), where no byte
 * is stored; on another platform materializing allocates and zeroes every
 * byte.  sched (may be NULL; its size set) gets the preset's denoising
 * schedule, as mlo_denoise_schedule_read reads it from the written
 * directory.  On failure *out is NULL and nothing is left allocated. */
MLO_API int mlo_synth_open(const mlo_pipeline_options *opts, const char *preset, double scale,
                           mlo_pipeline **out, mlo_denoise_schedule *sched, char *err,
                           size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* MLO_CHECKPOINT_H */
