/*
 * synth.c — the generator: turns a preset (synth_presets.c) and a scale
 * into a diffusers pipeline directory on disk.  It scales each component by
 * bisection on its exact byte count, splits the big ones into shards with a
 * weight map, streams deterministic weights through the safetensors writer
 * (nothing is held whole in memory, so 50 GB pipelines are fine), and keeps
 * a stamp so that a finished directory is recognised and reused.  The
 * contract is in include/mlo/checkpoint.h.
 */
#include "base/sysio.h"
#include "synth/synth.h"
#include "synth/synth_emit.h"

#include "base/hash.h"
#include "format/index.h"
#include "format/safetensors.h"
#include "format/schedule.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_TARGET 5e9 /* bytes per shard, as save_pretrained's "5GB" */
#define PROGRESS_STEP (64u << 20)
#define DIFFUSERS_VERSION "0.35.1"

/* ---- scaling ------------------------------------------------------------ */

static int round_to(double x, int multiple, int minimum) {
  long v = lround(x / multiple) * multiple;
  return v < minimum ? minimum : (int)v;
}

/* Scaled, a component keeps its shape: depth, width and vocabulary each
 * follow g = f^(1/3).  At full depth (a preset named "NAME:full-depth")
 * the layer count stays the real model's and the width alone follows
 * g = f^(1/2): what a component's blocks are, as a fraction of it, is then
 * the real model's too, which is what block streaming's figures depend on
 * (a DiT of 5 blocks streams nothing like one of 40). */
static void scale_params(const mlo_syn_arch *a, double f, bool full_depth, int *out) {
  double g = full_depth ? sqrt(f) : cbrt(f), sg = sqrt(g);
  for (size_t i = 0; i < a->nparams; i++) {
    double b = a->params[i].base;
    switch (a->params[i].kind) {
    case SYN_FIXED:
      out[i] = a->params[i].base;
      break;
    case SYN_WIDTH:
      out[i] = round_to(b * g, 4, 8);
      break;
    case SYN_HEADS:
      out[i] = round_to(b * sg, 1, 1);
      break;
    case SYN_HEAD_DIM:
      out[i] = round_to(b * sg, 8, 8);
      break;
    case SYN_DEPTH:
      out[i] = full_depth ? b : round_to(b * g, 1, 1);
      break;
    case SYN_VOCAB: /* embedding bytes (vocabulary x width) follow f */
      out[i] = round_to(b * (full_depth ? g : g * g), 64, 64);
      break;
    }
  }
}

static uint64_t arch_bytes(const mlo_syn_component *c, double f, bool full_depth) {
  int p[SYN_MAX_PARAMS];
  scale_params(c->arch, f, full_depth, p);
  mlo_syn_emitter e = {c->dtype, false, NULL, 0, 0, 0, MLO_OK};
  c->arch->emit(&e, p);
  return e.bytes;
}

/* The factor f whose byte count is closest to scale x the full size.
 * Bytes are monotone in f, so bisection on log f finds the crossing. */
static double find_factor(const mlo_syn_component *c, double scale, bool full_depth) {
  if (scale == 1.0) return 1.0;
  double target = scale * (double)arch_bytes(c, 1.0, full_depth);
  double lo = log(1e-12), hi = log(8.0);
  for (int i = 0; i < 64; i++) {
    double mid = 0.5 * (lo + hi);
    if ((double)arch_bytes(c, exp(mid), full_depth) >= target)
      hi = mid;
    else
      lo = mid;
  }
  double blo = (double)arch_bytes(c, exp(lo), full_depth);
  double bhi = (double)arch_bytes(c, exp(hi), full_depth);
  return fabs(blo - target) < fabs(bhi - target) ? exp(lo) : exp(hi);
}

#define FULL_DEPTH ":full-depth"

/* NAME or NAME:full-depth (scale_params). */
static const mlo_syn_preset *find_preset(const char *name, bool *full_depth) {
  for (size_t i = 0; name && i < mlo_syn_preset_count; i++) {
    size_t n = strlen(mlo_syn_presets[i].name);
    if (strncmp(mlo_syn_presets[i].name, name, n)) continue;
    *full_depth = !strcmp(name + n, FULL_DEPTH);
    if (!name[n] || *full_depth) return &mlo_syn_presets[i];
  }
  return NULL;
}

const char *mlo_synth_preset_of(const char *name) {
  bool deep;
  const mlo_syn_preset *p = find_preset(name, &deep);
  return p ? p->name : NULL;
}

static bool scale_ok(double scale) {
  return scale > 0 && scale <= 4.0 && isfinite(scale);
}

int mlo_synth_bytes(const char *preset, double scale, uint64_t *bytes) {
  bool deep;
  const mlo_syn_preset *p = find_preset(preset, &deep);
  if (!p) return MLO_ENOTFOUND;
  if (!scale_ok(scale) || !bytes) return MLO_EINVAL;
  uint64_t total = 0;
  for (size_t i = 0; i < p->ncomponents; i++)
    total += arch_bytes(&p->components[i], find_factor(&p->components[i], scale, deep), deep);
  *bytes = total;
  return MLO_OK;
}

static pthread_once_t infos_once = PTHREAD_ONCE_INIT;
static mlo_synth_preset_info infos[16];

static void infos_init(void) {
  for (size_t i = 0; i < mlo_syn_preset_count && i + 1 < sizeof infos / sizeof *infos; i++)
    infos[i] = (mlo_synth_preset_info){mlo_syn_presets[i].name, mlo_syn_presets[i].description};
}

const mlo_synth_preset_info *mlo_synth_presets(void) {
  pthread_once(&infos_once, infos_init);
  return infos;
}

/* ---- the plan: every component's tensors, shards and file names --------- */

typedef struct {
  const mlo_syn_component *spec;
  double factor;
  int params[SYN_MAX_PARAMS];
  mlo_syn_emitter tensors; /* recorded */
  int nshards;             /* 0: one unsharded file */
} comp_plan;

typedef struct {
  const mlo_syn_preset *preset;
  const char *name; /* as asked for: NAME or NAME:full-depth */
  bool full_depth;
  double scale;
  comp_plan *comps;
  uint64_t bytes;
} mlo_syn_plan;

static const char *stem_of(const mlo_syn_component *c) {
  return strcmp(c->library, "diffusers") ? "model" : "diffusion_pytorch_model";
}

/* Greedy split at byte-count boundaries: at least two shards, about
 * SHARD_TARGET bytes each. */
static void assign_shards(comp_plan *cp) {
  mlo_syn_emitter *e = &cp->tensors;
  uint64_t n = (uint64_t)ceil((double)e->bytes / SHARD_TARGET), cum = 0;
  if (n < 2) n = 2;
  int last = -1, used = 0;
  for (size_t i = 0; i < e->count; i++) {
    uint64_t s = e->bytes ? cum * n / e->bytes : 0;
    int shard = (int)(s < n ? s : n - 1);
    if (shard != last) used++, last = shard;
    e->list[i].shard = used - 1;
    cum += e->list[i].nbytes;
  }
  if (used < 2 && e->count >= 2) e->list[e->count - 1].shard = used++;
  cp->nshards = used;
}

static void plan_free(mlo_syn_plan *pl) {
  if (pl->comps)
    for (size_t i = 0; i < pl->preset->ncomponents; i++)
      mlo_syn_emitter_free(&pl->comps[i].tensors);
  free(pl->comps);
  memset(pl, 0, sizeof *pl);
}

static int plan_build(const char *name, double scale, mlo_syn_plan *pl) {
  memset(pl, 0, sizeof *pl);
  const mlo_syn_preset *p = find_preset(name, &pl->full_depth);
  pl->preset = p, pl->name = name, pl->scale = scale;
  if (!(pl->comps = mlo_calloc(p->ncomponents, sizeof *pl->comps))) return MLO_ENOMEM;
  for (size_t i = 0; i < p->ncomponents; i++) {
    comp_plan *cp = &pl->comps[i];
    cp->spec = &p->components[i];
    cp->factor = find_factor(cp->spec, scale, pl->full_depth);
    scale_params(cp->spec->arch, cp->factor, pl->full_depth, cp->params);
    cp->tensors = (mlo_syn_emitter){cp->spec->dtype, true, NULL, 0, 0, 0, MLO_OK};
    cp->spec->arch->emit(&cp->tensors, cp->params);
    if (cp->tensors.status != MLO_OK) {
      int rc = cp->tensors.status;
      plan_free(pl);
      return rc;
    }
    if (cp->spec->sharded) assign_shards(cp);
    pl->bytes += cp->tensors.bytes;
  }
  return MLO_OK;
}

static void shard_name(const comp_plan *cp, int shard, char *buf, size_t len) {
  if (cp->nshards == 0)
    snprintf(buf, len, "%s.safetensors", stem_of(cp->spec));
  else
    snprintf(buf, len, "%s-%05d-of-%05d.safetensors", stem_of(cp->spec), shard + 1, cp->nshards);
}

/* Every file the plan writes, relative to the directory (for the stamp). */
static cJSON *plan_files(const mlo_syn_plan *pl) {
  cJSON *files = cJSON_CreateArray();
  char buf[512], name[256];
  cJSON_AddItemToArray(files, cJSON_CreateString("model_index.json"));
  for (size_t i = 0; i < pl->preset->naux; i++) {
    snprintf(buf, sizeof buf, "%s/%s", pl->preset->aux[i].folder, pl->preset->aux[i].file);
    cJSON_AddItemToArray(files, cJSON_CreateString(buf));
  }
  for (size_t i = 0; i < pl->preset->ncomponents; i++) {
    const comp_plan *cp = &pl->comps[i];
    snprintf(buf, sizeof buf, "%s/config.json", cp->spec->folder);
    cJSON_AddItemToArray(files, cJSON_CreateString(buf));
    for (int s = 0; s < (cp->nshards ? cp->nshards : 1); s++) {
      shard_name(cp, s, name, sizeof name);
      snprintf(buf, sizeof buf, "%s/%s", cp->spec->folder, name);
      cJSON_AddItemToArray(files, cJSON_CreateString(buf));
    }
    if (!cp->nshards) continue;
    snprintf(buf, sizeof buf, "%s/%s.safetensors.index.json", cp->spec->folder, stem_of(cp->spec));
    cJSON_AddItemToArray(files, cJSON_CreateString(buf));
  }
  return files;
}

/* ---- deterministic weights ---------------------------------------------- */

typedef struct {
  mlo_synth_progress_fn fn;
  void *user;
  const char *file;
  uint64_t done, total, reported;
} mlo_syn_progress;

typedef struct {
  uint64_t seed;
  mlo_dtype dtype;
  mlo_syn_progress *progress;
} fill_ctx;

static uint64_t name_seed(const char *name) {
  uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 0x100000001B3ull;
  return mlo_mix64(h);
}

/* A bf16 with a random sign and mantissa and an exponent in [2^-13, 2^-6]:
 * |x| < 2^-5 ~ 0.031, never NaN or Inf.  One hash serves four elements. */
static uint16_t bf16_at(uint64_t seed, uint64_t i) {
  uint16_t bits =
      (uint16_t)(mlo_mix64(seed ^ ((i >> 2) * 0xD1B54A32D192ED03ull)) >> (16 * (i & 3)));
  return (uint16_t)((bits & 0x807Fu) | ((114u + ((bits >> 7) & 7u)) << 7));
}

/* Element-aligned chunks (the writer's) take the fast loop; any other
 * range is assembled byte by byte from the same elements. */
static void fill_weights(void *buf, uint64_t offset, size_t len, void *user) {
  fill_ctx *c = user;
  unsigned es = c->dtype == MLO_DTYPE_F32 ? 4 : 2;
  uint8_t *out = buf;
  if (offset % es == 0 && len % es == 0) {
    for (uint64_t i = offset / es, end = (offset + len) / es; i < end; i++) {
      uint32_t v = (uint32_t)bf16_at(c->seed, i) << (es == 4 ? 16 : 0);
      for (unsigned k = 0; k < es; k++) *out++ = (uint8_t)(v >> (8 * k));
    }
  } else {
    for (uint64_t pos = offset; pos < offset + len;) {
      uint64_t i = pos / es;
      unsigned b = (unsigned)(pos % es);
      uint32_t v = (uint32_t)bf16_at(c->seed, i) << (es == 4 ? 16 : 0); /* f32: widened bf16 */
      uint8_t bytes[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
      size_t take = es - b < offset + len - pos ? es - b : (size_t)(offset + len - pos);
      memcpy(out, bytes + b, take);
      out += take, pos += take;
    }
  }
  mlo_syn_progress *pr = c->progress;
  pr->done += len;
  if (pr->fn && (pr->done - pr->reported >= PROGRESS_STEP || pr->done == pr->total)) {
    pr->fn(pr->file, pr->done, pr->total, pr->user);
    pr->reported = pr->done;
  }
}

static void merge_json(cJSON *into, const char *text) {
  cJSON *extra = text ? cJSON_Parse(text) : NULL, *it;
  cJSON_ArrayForEach(it, extra) cJSON_AddItemToObject(into, it->string, cJSON_Duplicate(it, 1));
  cJSON_Delete(extra);
}

static int cmp_key(const void *a, const void *b) {
  return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

/* model_index.json: metadata first, then entries sorted as diffusers does. */
static cJSON *model_index_json(const mlo_syn_preset *p) {
  cJSON *root = cJSON_CreateObject(), *entries[64];
  size_t n = 0;
  cJSON_AddStringToObject(root, "_class_name", p->pipeline_class);
  cJSON_AddStringToObject(root, "_diffusers_version", DIFFUSERS_VERSION);
  merge_json(root, p->extra_index);
  for (size_t i = 0; i < p->ncomponents && n < 64; i++) {
    const char *pair[2] = {p->components[i].library, p->components[i].class_name};
    entries[n] = cJSON_CreateStringArray(pair, 2);
    entries[n++]->string = mlo_strdup(p->components[i].folder);
  }
  for (size_t i = 0; i < p->naux && n < 64; i++) {
    const char *pair[2] = {p->aux[i].library, p->aux[i].class_name};
    entries[n] = cJSON_CreateStringArray(pair, 2);
    entries[n++]->string = mlo_strdup(p->aux[i].folder);
  }
  for (const char *const *a = p->absent; a && *a && n < 64; a++) {
    entries[n] = cJSON_CreateArray();
    cJSON_AddItemToArray(entries[n], cJSON_CreateNull());
    cJSON_AddItemToArray(entries[n], cJSON_CreateNull());
    entries[n++]->string = mlo_strdup(*a);
  }
  qsort(entries, n, sizeof *entries, cmp_key);
  for (size_t i = 0; i < n; i++) {
    char *key = entries[i]->string;
    entries[i]->string = NULL;
    cJSON_AddItemToObject(root, key, entries[i]);
    free(key);
  }
  return root;
}

static cJSON *config_json(const mlo_syn_plan *pl, const comp_plan *cp) {
  const mlo_syn_component *c = cp->spec;
  cJSON *cfg = cJSON_CreateObject();
  bool diffusers = !strcmp(c->library, "diffusers");
  if (diffusers) {
    cJSON_AddStringToObject(cfg, "_class_name", c->class_name);
    cJSON_AddStringToObject(cfg, "_diffusers_version", DIFFUSERS_VERSION);
  } else {
    cJSON_AddItemToObject(cfg, "architectures", cJSON_CreateStringArray(&c->class_name, 1));
  }
  for (size_t i = 0; i < c->arch->nparams; i++)
    if (c->arch->params[i].key) cJSON_AddNumberToObject(cfg, c->arch->params[i].key, cp->params[i]);
  merge_json(cfg, c->arch->extra_config);
  if (c->arch->config) c->arch->config(cfg, cp->params);
  if (!diffusers)
    cJSON_AddStringToObject(cfg, "torch_dtype", c->dtype == MLO_DTYPE_F32 ? "float32" : "bfloat16");
  cJSON *prov = cJSON_AddObjectToObject(cfg, "_mlo_synth");
  cJSON_AddStringToObject(prov, "preset", pl->name);
  cJSON_AddNumberToObject(prov, "scale", pl->scale);
  cJSON_AddNumberToObject(prov, "factor", cp->factor);
  return cfg;
}

static int write_shard(const char *folder, const comp_plan *cp, int shard, fill_ctx *ctx,
                       mlo_syn_progress *pr, const char *rel, char *err, size_t errlen) {
  mlo_st_writer *w = NULL;
  int rc = mlo_st_writer_create(&w);
  if (rc == MLO_OK) rc = mlo_st_writer_set_metadata(w, "format", "pt");
  const mlo_syn_emitter *e = &cp->tensors;
  for (size_t i = 0; i < e->count && rc == MLO_OK; i++) {
    const mlo_syn_rec *r = &e->list[i];
    if (cp->nshards && r->shard != shard) continue;
    /* Seeded by folder and tensor: two DiTs of one shape (Wan2.2's experts)
     * get different weights, so a forward that read the wrong one changes
     * the digest. */
    ctx[i] = (fill_ctx){name_seed(r->name) ^ mlo_mix64(name_seed(cp->spec->folder)), r->dtype, pr};
    rc =
        mlo_st_writer_add_generated(w, r->name, r->dtype, r->ndim, r->shape, fill_weights, &ctx[i]);
  }
  if (rc != MLO_OK) {
    mlo_st_writer_free(w);
    return mlo_errf(err, errlen, rc, "%s: cannot prepare %s: %s", folder, rel, mlo_strerror(rc));
  }
  char name[256];
  shard_name(cp, shard, name, sizeof name);
  char *path = mlo_path_join(folder, name);
  pr->file = rel;
  rc = path ? mlo_st_writer_write(w, path, err, errlen)
            : mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", folder);
  free(path);
  mlo_st_writer_free(w);
  return rc;
}

static int write_index(const char *dir, const comp_plan *cp, char *err, size_t errlen) {
  cJSON *root = cJSON_CreateObject();
  cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
  cJSON_AddNumberToObject(meta, "total_size", (double)cp->tensors.bytes);
  cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
  char name[256], rel[512];
  for (size_t i = 0; i < cp->tensors.count; i++) {
    shard_name(cp, cp->tensors.list[i].shard, name, sizeof name);
    cJSON_AddStringToObject(map, cp->tensors.list[i].name, name);
  }
  snprintf(rel, sizeof rel, "%s/%s.safetensors.index.json", cp->spec->folder, stem_of(cp->spec));
  int rc = mlo_syn_write_json(dir, rel, root, true, err, errlen);
  cJSON_Delete(root);
  return rc;
}

static int write_component(const char *dir, const mlo_syn_plan *pl, const comp_plan *cp,
                           mlo_syn_progress *pr, char *err, size_t errlen) {
  char *folder = mlo_path_join(dir, cp->spec->folder);
  fill_ctx *ctx = mlo_calloc(cp->tensors.count ? cp->tensors.count : 1, sizeof *ctx);
  int rc = folder && ctx ? mlo_syn_make_subdir(dir, cp->spec->folder, err, errlen)
                         : mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", dir);
  char rel[512], name[256];
  if (rc == MLO_OK) {
    cJSON *cfg = config_json(pl, cp);
    snprintf(rel, sizeof rel, "%s/config.json", cp->spec->folder);
    rc = mlo_syn_write_json(dir, rel, cfg, true, err, errlen);
    cJSON_Delete(cfg);
  }
  for (int s = 0; rc == MLO_OK && s < (cp->nshards ? cp->nshards : 1); s++) {
    shard_name(cp, s, name, sizeof name);
    snprintf(rel, sizeof rel, "%s/%s", cp->spec->folder, name);
    rc = mlo_syn_check_target(dir, rel, err, errlen);
    if (rc == MLO_OK) rc = write_shard(folder, cp, s, ctx, pr, rel, err, errlen);
  }
  if (rc == MLO_OK && cp->nshards) rc = write_index(dir, cp, err, errlen);
  free(ctx);
  free(folder);
  return rc;
}

int mlo_synth_write(const char *preset, const char *dir, double scale,
                    mlo_synth_progress_fn progress, void *user, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  bool deep;
  const mlo_syn_preset *p = find_preset(preset, &deep);
  if (!p)
    return mlo_errf(err, errlen, MLO_ENOTFOUND, "unknown synth preset '%s'",
                    preset ? preset : "(null)");
  if (!dir || !scale_ok(scale))
    return mlo_errf(err, errlen, MLO_EINVAL, "synth: need a folder and a scale in (0, 4], got %g",
                    scale);
  mlo_syn_plan pl;
  int rc = plan_build(preset, scale, &pl);
  if (rc != MLO_OK)
    return mlo_errf(err, errlen, rc, "synth %s: cannot plan: %s", preset, mlo_strerror(rc));
  bool cached = false;
  struct stat st;
  bool created = stat(dir, &st) != 0; /* a failed run removes it again */
  rc = mlo_syn_stamp_prepare(dir, preset, scale, &cached, err, errlen);
  if (rc != MLO_OK || cached) goto out_free_plan;
  /* The stamp goes first, incomplete, so an interrupted run is recognised
   * and cleaned by the next one; it is marked complete last. */
  if ((rc = mlo_syn_stamp_write(dir, preset, scale, pl.bytes, false, plan_files(&pl), err,
                                errlen)) != MLO_OK)
    goto out_free_plan;
  cJSON *index = model_index_json(p);
  rc = mlo_syn_write_json(dir, "model_index.json", index, true, err, errlen);
  cJSON_Delete(index);
  for (size_t i = 0; rc == MLO_OK && i < p->naux; i++) {
    char rel[512];
    rc = mlo_syn_make_subdir(dir, p->aux[i].folder, err, errlen);
    snprintf(rel, sizeof rel, "%s/%s", p->aux[i].folder, p->aux[i].file);
    if (rc == MLO_OK) rc = mlo_syn_write_text(dir, rel, p->aux[i].content, err, errlen);
  }
  mlo_syn_progress pr = {progress, user, NULL, 0, pl.bytes, 0};
  for (size_t i = 0; rc == MLO_OK && i < p->ncomponents; i++)
    rc = write_component(dir, &pl, &pl.comps[i], &pr, err, errlen);
  if (rc == MLO_OK)
    rc = mlo_syn_stamp_write(dir, preset, scale, pl.bytes, true, plan_files(&pl), err, errlen);
  if (rc != MLO_OK) mlo_syn_stamp_undo(dir, created); /* a failed run leaves nothing behind */
out_free_plan:
  plan_free(&pl);
  return rc;
}

/* ---- declared without files (projections) -------------------------------- */

static int declare_component(mlo_pipeline *pipe, const comp_plan *cp, char *err, size_t errlen) {
  mlo_role role = MLO_ROLE_OTHER;
  bool by_class = mlo_role_from_class(cp->spec->class_name, &role) == MLO_OK;
  mlo_component *comp = NULL;
  int rc = mlo_component_add(pipe, cp->spec->folder, MLO_ROLE_AUTO, &comp);
  if (!rc && by_class) rc = mlo_component_set_role(comp, role, MLO_ROLE_FROM_CLASS);
  for (size_t i = 0; !rc && i < cp->tensors.count; i++) {
    const mlo_syn_rec *r = &cp->tensors.list[i];
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = r->name;
    d.dtype = r->dtype;
    d.ndim = r->ndim;
    memcpy(d.shape, r->shape, (size_t)r->ndim * sizeof *r->shape);
    rc = mlo_tensor_add(comp, &d, NULL);
  }
  if (rc)
    return mlo_errf(err, errlen, rc, "synth: cannot declare %s: %s", cp->spec->folder,
                    mlo_pipeline_errmsg(pipe)[0] ? mlo_pipeline_errmsg(pipe) : mlo_strerror(rc));
  return MLO_OK;
}

int mlo_synth_open(const mlo_pipeline_options *opts, const char *preset, double scale,
                   mlo_pipeline **out, mlo_denoise_schedule *sched, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (out) *out = NULL;
  bool deep;
  const mlo_syn_preset *p = find_preset(preset, &deep);
  if (!p)
    return mlo_errf(err, errlen, MLO_ENOTFOUND, "unknown synth preset '%s'",
                    preset ? preset : "(null)");
  if (!opts || !out || !scale_ok(scale) || (sched && sched->size < sizeof *sched))
    return mlo_errf(err, errlen, MLO_EINVAL,
                    "synth: need options, an output and a scale in (0, 4], got %g", scale);
  mlo_denoise_schedule s = MLO_DENOISE_SCHEDULE_INIT;
  const char *sched_json = NULL;
  for (size_t i = 0; i < p->naux; i++)
    if (!strcmp(p->aux[i].folder, "scheduler")) sched_json = p->aux[i].content;
  int rc = mlo_denoise_schedule_parse(p->extra_index ? p->extra_index : "{}", sched_json, &s, err,
                                      errlen);
  if (rc) return rc;
  mlo_syn_plan pl;
  if ((rc = plan_build(preset, scale, &pl)) != MLO_OK)
    return mlo_errf(err, errlen, rc, "synth %s: cannot plan: %s", preset, mlo_strerror(rc));
  mlo_pipeline *pipe = NULL;
  rc = mlo_pipeline_create(opts, &pipe);
  if (rc) mlo_errf(err, errlen, rc, "synth %s: cannot create the pipeline", preset);
  for (size_t i = 0; !rc && i < p->ncomponents; i++)
    rc = declare_component(pipe, &pl.comps[i], err, errlen);
  plan_free(&pl);
  if (rc) {
    mlo_pipeline_free(pipe);
    return rc;
  }
  if (sched) *sched = s;
  *out = pipe;
  return MLO_OK;
}
