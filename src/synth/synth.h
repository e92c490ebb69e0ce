/*
 * synth.h — internal interface between the generator (synth.c: scaling,
 * files, shards, weights) and the preset tables (synth_presets.c: which
 * pipelines exist and what each architecture's tensors are called;
 * synth_vae.c: the VAEs), which declare their tensors through the calls of
 * synth_emit.c.
 */
#ifndef MLO_SYNTH_SYNTH_H
#define MLO_SYNTH_SYNTH_H

#include "base/log.h" /* mlo_errf, MLO_PRINTF */
#include "mlo/checkpoint.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>

/* How a hyper-parameter follows the scale knob g = f^(1/3) (f is the
 * component's byte factor, found by bisection in synth.c); at full depth
 * g = f^(1/2), depths stay and vocabularies follow g (synth.c). */
typedef enum {
  SYN_FIXED,    /* interface sizes: channels, patch, time-embedding width */
  SYN_WIDTH,    /* x g, multiple of 4, at least 8 */
  SYN_HEADS,    /* x sqrt(g), at least 1 (head count and head width share g) */
  SYN_HEAD_DIM, /* x sqrt(g), multiple of 8, at least 8 */
  SYN_DEPTH,    /* x g, at least 1 */
  SYN_VOCAB,    /* x g^2 (embedding bytes then follow f), multiple of 64, >= 64 */
} mlo_syn_kind;

#define SYN_MAX_PARAMS 16

typedef struct {
  const char *key; /* config.json key, NULL for a value only the emitter uses */
  int base;        /* the real model's value (scale 1.0) */
  mlo_syn_kind kind;
} mlo_syn_param;

typedef struct mlo_syn_emitter mlo_syn_emitter;

/* Declares one tensor; name is printf-formatted.  Errors are sticky in the
 * emitter, so architecture code does not check each call (synth_emit.c,
 * as the two below). */
void mlo_syn_tensor(mlo_syn_emitter *e, mlo_dtype dtype, int ndim, const int64_t *shape,
                    const char *fmt, ...) MLO_PRINTF(5, 6);
/* The component's weight dtype (BF16, or F32 for the Wan VAE). */
mlo_dtype mlo_syn_dtype(const mlo_syn_emitter *e);

/* Shorthands: one tensor of 1-5 dimensions. */
#define T1(e, dt, a, ...) mlo_syn_tensor(e, dt, 1, (const int64_t[]){a}, __VA_ARGS__)
#define T2(e, dt, a, b, ...) mlo_syn_tensor(e, dt, 2, (const int64_t[]){a, b}, __VA_ARGS__)
#define T3(e, dt, a, b, c, ...) mlo_syn_tensor(e, dt, 3, (const int64_t[]){a, b, c}, __VA_ARGS__)
#define T4(e, dt, a, b, c, d, ...)                                                                 \
  mlo_syn_tensor(e, dt, 4, (const int64_t[]){a, b, c, d}, __VA_ARGS__)
#define T5(e, dt, a, b, c, d, f, ...)                                                              \
  mlo_syn_tensor(e, dt, 5, (const int64_t[]){a, b, c, d, f}, __VA_ARGS__)

/* A linear layer "<prefix>.weight" [out, in] and optionally "<prefix>.bias". */
void mlo_syn_lin(mlo_syn_emitter *e, mlo_dtype dt, int64_t out, int64_t in, bool bias,
                 const char *fmt, ...) MLO_PRINTF(6, 7);

typedef struct {
  const mlo_syn_param *params;
  size_t nparams;
  const char *extra_config; /* a JSON object merged into config.json */
  void (*emit)(mlo_syn_emitter *e, const int *p);
  /* Adds derived config.json fields (hidden_size, channel lists); may be NULL. */
  void (*config)(cJSON *cfg, const int *p);
} mlo_syn_arch;

typedef struct {
  const char *folder;  /* model_index.json key */
  const char *library; /* "diffusers" or "transformers" */
  const char *class_name;
  const mlo_syn_arch *arch;
  mlo_dtype dtype;
  bool sharded; /* written as shards with a weight map (at least two) */
} mlo_syn_component;

/* A folder without weights (tokenizer, scheduler): one small JSON file. */
typedef struct {
  const char *folder, *library, *class_name, *file, *content;
} mlo_syn_aux;

typedef struct {
  const char *name, *description;
  const char *pipeline_class;
  const char *extra_index; /* a JSON object merged into model_index.json */
  const mlo_syn_component *components;
  size_t ncomponents;
  const mlo_syn_aux *aux;
  size_t naux;
  const char *const *absent; /* keys written as [null, null]; NULL-terminated */
} mlo_syn_preset;

/* synth_files.c: atomic files and the stamp. */
int mlo_syn_make_dir(const char *path, char *err, size_t errlen);
/* Creates the folder dir/rel (not through a link; an existing folder is
 * fine). */
int mlo_syn_make_subdir(const char *dir, const char *rel, char *err, size_t errlen);
/* MLO_OK if dir/rel may be written: absent or a regular file, no link on
 * the way. */
int mlo_syn_check_target(const char *dir, const char *rel, char *err, size_t errlen);
/* Writes dir/rel atomically, never through a link (mlo_syn_check_target). */
int mlo_syn_write_text(const char *dir, const char *rel, const char *text, char *err,
                       size_t errlen);
int mlo_syn_write_json(const char *dir, const char *rel, cJSON *json, bool pretty, char *err,
                       size_t errlen);
/* Creates dir, or accepts it if empty or stamped by an earlier run: a
 * finished run of the same preset and scale sets *cached; any other run's
 * listed files are removed.  MLO_EEXIST for a foreign non-empty folder. */
int mlo_syn_stamp_prepare(const char *dir, const char *preset, double scale, bool *cached,
                          char *err, size_t errlen);
/* Undoes a failed run: the files its stamp lists, their emptied folders,
 * the stamp, and dir itself where the run created it (and it is empty). */
void mlo_syn_stamp_undo(const char *dir, bool created);
/* Writes the stamp; takes ownership of files (a JSON array of paths). */
int mlo_syn_stamp_write(const char *dir, const char *preset, double scale, uint64_t bytes,
                        bool complete, cJSON *files, char *err, size_t errlen);

extern const mlo_syn_arch mlo_syn_vae2d, mlo_syn_wan_vae; /* synth_vae.c */
extern const mlo_syn_preset mlo_syn_presets[];
extern const size_t mlo_syn_preset_count;

#endif
