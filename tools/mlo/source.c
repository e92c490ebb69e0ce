/*
 * source.c — what a command runs on, said the same way for `run` and
 * `inspect`: a PATH (a diffusers directory, a component folder, one
 * .safetensors or .gguf file) or separate component files as ComfyUI and
 * stable-diffusion.cpp users keep them (--diffusion-model, --t5xxl, ...,
 * or --component NAME[:ROLE]=PATH), with --variant and --role; and the
 * expert split of a two-DiT run, from the pipeline's own scheduler as
 * diffusers computes it, with --boundary, --flow-shift and
 * --boundary-steps to override it.
 */
#include "base/log.h" /* mlo_errf, the library's own message helper */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

/* The stable-diffusion.cpp flags: the component each names and its role. */
static const struct {
  const char *flag, *name;
  mlo_role role;
} sdcpp_flags[] = {
    {"--diffusion-model", "transformer", MLO_ROLE_DIT},
    {"--high-noise-diffusion-model", "transformer", MLO_ROLE_DIT},
    {"--t5xxl", "t5xxl", MLO_ROLE_ENCODER},
    {"--umt5", "umt5", MLO_ROLE_ENCODER},
    {"--clip_l", "clip_l", MLO_ROLE_ENCODER},
    {"--clip-l", "clip_l", MLO_ROLE_ENCODER},
    {"--clip_g", "clip_g", MLO_ROLE_ENCODER},
    {"--clip-g", "clip_g", MLO_ROLE_ENCODER},
    {"--llm", "llm", MLO_ROLE_ENCODER},
    {"--vae", "vae", MLO_ROLE_VAE},
};

static bool add_file(targs *a, tool_source *src, const char *flag, char *name, mlo_role role,
                     const char *path, bool high_noise) {
  if (!name) {
    targs_error(a, "out of memory");
    return false;
  }
  if (src->nfiles >= TOOL_MAX_FILES) {
    free(name);
    targs_error(a, "%s: at most %d component files", flag, TOOL_MAX_FILES);
    return false;
  }
  if (!path[0]) {
    free(name);
    targs_error(a, "%s: needs a file path", flag);
    return false;
  }
  src->files[src->nfiles] = (mlo_component_file){name, role, path};
  src->high_noise[src->nfiles] = high_noise;
  src->nfiles++;
  return true;
}

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n), d[n] = '\0';
  return d;
}

/* --component NAME[:ROLE]=PATH */
static bool component_flag(targs *a, tool_source *src, const char *val) {
  const char *eq = strchr(val, '=');
  const char *colon = eq ? memchr(val, ':', (size_t)(eq - val)) : NULL;
  const char *name_end = colon ? colon : eq;
  mlo_role role = MLO_ROLE_AUTO;
  if (!eq || name_end == val) goto bad;
  if (colon) {
    char word[16];
    size_t n = (size_t)(eq - colon - 1);
    if (n == 0 || n >= sizeof word) goto bad;
    memcpy(word, colon + 1, n), word[n] = '\0';
    if (mlo_role_from_name(word, &role) != MLO_OK || role == MLO_ROLE_AUTO) goto bad;
  }
  return add_file(a, src, "--component", dup_n(val, (size_t)(name_end - val)), role, eq + 1, false);
bad:
  targs_error(a,
              "--component: expected NAME[:ROLE]=PATH with ROLE one of dit, encoder, vae, "
              "other, got '%s'",
              val);
  return false;
}

bool source_flag(targs *a, tool_source *src) {
  const char *v;
  for (size_t i = 0; i < sizeof sdcpp_flags / sizeof *sdcpp_flags; i++)
    if (targs_value(a, sdcpp_flags[i].flag, &v)) {
      if (v)
        add_file(a, src, sdcpp_flags[i].flag,
                 dup_n(sdcpp_flags[i].name, strlen(sdcpp_flags[i].name)), sdcpp_flags[i].role, v,
                 !strcmp(sdcpp_flags[i].flag, "--high-noise-diffusion-model"));
      return true;
    }
  if (targs_value(a, "--component", &v)) {
    if (v) component_flag(a, src, v);
  } else if (targs_value(a, "--variant", &v)) {
    if (v && (!v[0] || strchr(v, '/') || strchr(v, '.')))
      targs_error(a, "--variant: expected a name such as fp16 or bf16, got '%s'", v);
    src->variant = v;
  } else if (targs_value(a, "--role", &v)) {
    targs_role(a, v, src->roles, &src->nroles, TOOL_MAX_ROLES);
  } else if (targs_flag(a, "--allow-stray")) {
    src->allow_stray = true;
  } else {
    return false;
  }
  return true;
}

bool source_finish(targs *a, tool_source *src) {
  if (a->failed) return false;
  if (src->path && src->nfiles) {
    targs_error(a, "give a PATH or component files (--diffusion-model, --vae, --component ...), "
                   "not both");
    return false;
  }
  if (!src->path && !src->nfiles) {
    targs_error(a, "needs a PATH (a pipeline directory or a file), or component files "
                   "(--diffusion-model FILE --t5xxl FILE --vae FILE ...)");
    return false;
  }
  /* Wan2.2 as stable-diffusion.cpp names it: the high-noise expert runs
   * first, so it is "transformer" and comes first; the other DiT becomes
   * "transformer_2", as in a diffusers directory. */
  size_t hi = src->nfiles, lo = src->nfiles;
  for (size_t i = 0; i < src->nfiles; i++) {
    if (src->high_noise[i] && hi == src->nfiles) hi = i;
    if (!src->high_noise[i] && !strcmp(src->files[i].name, "transformer") && lo == src->nfiles)
      lo = i;
  }
  if (hi < src->nfiles && lo < src->nfiles) {
    char *two = dup_n("transformer_2", strlen("transformer_2"));
    if (!two) {
      targs_error(a, "out of memory");
      return false;
    }
    free((char *)src->files[lo].name);
    src->files[lo].name = two;
    if (hi > lo) { /* move the high-noise expert in front of the other */
      mlo_component_file f = src->files[hi];
      memmove(&src->files[lo + 1], &src->files[lo], (hi - lo) * sizeof *src->files);
      src->files[lo] = f;
    }
  }
  for (size_t i = 0; i < src->nfiles; i++)
    for (size_t k = 0; k < i; k++)
      if (!strcmp(src->files[i].name, src->files[k].name)) {
        targs_error(a, "component '%s' is given twice (%s and %s)", src->files[i].name,
                    src->files[k].path, src->files[i].path);
        return false;
      }
  if (src->nfiles)
    src->label = src->files[0].path;
  else
    src->label = src->path;
  return true;
}

void source_init_path(tool_source *src, const char *path) {
  memset(src, 0, sizeof *src);
  src->path = src->label = path;
}

void source_free(tool_source *src) {
  for (size_t i = 0; i < src->nfiles; i++) free((char *)src->files[i].name);
  targs_free_roles(src->roles, src->nroles);
  memset(src, 0, sizeof *src);
}

int source_open(const tool_source *src, mlo_platform *const *devs, size_t ndevs,
                const mlo_role_override *roles, size_t nroles, mlo_pipeline **out, char *err,
                size_t errlen) {
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = devs[0];
  po.devices = devs;
  po.ndevices = ndevs;
  po.comm = src->comm;
  po.sharded_loads = src->sharded;
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.overrides = roles ? roles : src->roles;
  oo.override_count = roles ? nroles : src->nroles;
  oo.variant = src->variant;
  oo.allow_stray = src->allow_stray;
  char msg[768] = "";
  int rc = src->nfiles
               ? mlo_pipeline_open_files(&po, src->files, src->nfiles, &oo, out, msg, sizeof msg)
               : mlo_pipeline_open_path(&po, src->path, &oo, out, msg, sizeof msg);
  if (rc) tool_open_message(src->label, msg, rc, err, errlen);
  return rc;
}

/* ---- the expert split ------------------------------------------------------ */

bool split_flag(targs *a, tool_split_args *sa) {
  const char *v;
  long n;
  if (targs_value(a, "--boundary", &v)) {
    sa->have_ratio = targs_double(a, "--boundary", v, 0.0, 1.0, &sa->ratio);
  } else if (targs_value(a, "--flow-shift", &v)) {
    sa->have_shift = targs_double(a, "--flow-shift", v, 0.01, 1000.0, &sa->shift);
  } else if (targs_value(a, "--boundary-steps", &v)) {
    if ((sa->have_steps = targs_int(a, "--boundary-steps", v, 0, 100000, &n))) sa->steps = n;
  } else {
    return false;
  }
  return true;
}

size_t tool_dits(mlo_pipeline *pipe, const char **first, const char **second) {
  size_t n = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    if (mlo_component_role(c) != MLO_ROLE_DIT) continue;
    if (n == 0 && first) *first = mlo_component_name(c);
    if (n == 1 && second) *second = mlo_component_name(c);
    n++;
  }
  return n;
}

size_t tool_files(mlo_pipeline *pipe, const mlo_component *only, const char ***out) {
  size_t n = 0, cap = 0;
  const char **files = NULL;
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    if (only && c != only) continue;
    for (size_t k = 0; k < mlo_component_tensor_count(c); k++) {
      const char *f = mlo_tensor_file(mlo_component_tensor_at(c, k), NULL);
      bool seen = !f;
      for (size_t j = n; j-- > 0 && !seen;) seen = !strcmp(files[j], f);
      if (seen) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        const char **grown = realloc(files, cap * sizeof *files);
        if (!grown) break;
        files = grown;
      }
      files[n++] = f;
    }
  }
  *out = files;
  return n;
}

int split_resolve(const tool_source *src, const tool_split_args *sa, mlo_pipeline *pipe, int steps,
                  tool_split *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->first_steps = steps;
  out->sched = (mlo_denoise_schedule)MLO_DENOISE_SCHEDULE_INIT;
  bool two = tool_dits(pipe, NULL, NULL) == 2;
  if (sa->have_steps) {
    if (sa->steps > steps)
      return mlo_errf(err, errlen, MLO_EINVAL, "--boundary-steps %ld is more than --steps %d",
                      sa->steps, steps);
    out->first_steps = (int)sa->steps;
    snprintf(out->source, sizeof out->source, "--boundary-steps");
    return MLO_OK;
  }
  int rc = MLO_ENOTFOUND;
  char why[512] = "";
  if (src->sched) {
    out->sched = *src->sched;
    rc = MLO_OK;
  } else if (src->path) {
    rc = mlo_denoise_schedule_read(src->path, &out->sched, why, sizeof why);
  }
  if (rc == MLO_EUNSUPPORTED || rc == MLO_EFORMAT || rc == MLO_ENOMEM || rc == MLO_EIO) {
    if (!two) { /* one expert: its schedule does not matter here */
      out->sched = (mlo_denoise_schedule)MLO_DENOISE_SCHEDULE_INIT;
      snprintf(out->source, sizeof out->source, "one DiT");
      return MLO_OK;
    }
    return mlo_errf(err, errlen, rc == MLO_EUNSUPPORTED ? MLO_EINVAL : rc,
                    "%s; give the split as --boundary-steps N", why);
  }
  if (rc == MLO_ENOTFOUND && two && !sa->have_ratio)
    out->sched.boundary_ratio = 0.875; /* Wan2.2 T2V's, for files without a model_index.json */
  if (sa->have_ratio) out->sched.boundary_ratio = sa->ratio;
  if (sa->have_shift) out->sched.shift = sa->shift;
  snprintf(out->source, sizeof out->source, "%s", out->sched.source);
  if (!two) return MLO_OK;
  rc = mlo_denoise_first_expert_steps(&out->sched, steps, &out->first_steps);
  if (rc) return mlo_errf(err, errlen, rc, "cannot compute the expert split");
  return MLO_OK;
}
