/*
 * schedule.c — which expert runs each denoising step, as diffusers decides
 * it.  Wan2.2's pipeline runs `transformer` (the high-noise expert) for a
 * step whose timestep t satisfies t >= boundary_ratio x num_train_timesteps
 * and `transformer_2` after; the timesteps come from the scheduler the
 * directory ships, so the split depends on its flow shift and spacing,
 * not on a fraction of the steps.  This file reads model_index.json's
 * boundary_ratio and scheduler/scheduler_config.json and computes the
 * timesteps in the same arithmetic as diffusers' set_timesteps (float64
 * where numpy computes, float32 where torch does, truncation where it casts
 * to int64), for the two schedulers Wan ships: UniPCMultistepScheduler
 * (flow sigmas, or the discrete linspace/leading/trailing spacings) and
 * FlowMatchEulerDiscreteScheduler.  tests/format/real/expect.json holds
 * diffusers' own answers for the fixtures; test_schedule.c compares.
 */
#include "base/sysio.h"
#include "mlo/checkpoint.h"

#include "base/log.h"
#include "format/index.h" /* mlo_path_join */
#include "format/json.h"
#include "format/schedule.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_CAP (1u << 20)

static const cJSON *item(const cJSON *obj, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static bool truthy(const cJSON *obj, const char *key) {
  const cJSON *v = item(obj, key);
  return v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) &&
         !(cJSON_IsNumber(v) && v->valuedouble == 0.0) &&
         !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0);
}

/* A number field: absent or null keeps *out; anything else not a finite
 * number in [lo, hi] is an error. */
static int number(const char *where, const cJSON *obj, const char *key, double lo, double hi,
                  double *out, char *err, size_t errlen) {
  const cJSON *v = item(obj, key);
  if (!v || cJSON_IsNull(v)) return MLO_OK;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: \"%s\" must be a number in [%g, %g]", where, key,
                    lo, hi);
  *out = v->valuedouble;
  return MLO_OK;
}

/* The scheduler's class as diffusers picks it: the one model_index.json
 * names ("scheduler": ["diffusers", CLASS]; the config's _class_name only
 * filters its keys there), else the config's own _class_name.  Where both
 * are given and differ (a pipeline whose scheduler was swapped), the
 * index's is used and the difference said. */
static int read_scheduler(const char *where, const cJSON *cfg, const char *index_class,
                          mlo_denoise_schedule *s, char *err, size_t errlen) {
  const cJSON *cls = item(cfg, "_class_name");
  if (cls && !cJSON_IsString(cls))
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: \"_class_name\" is not a string", where);
  if (!cls && !index_class)
    return mlo_errf(err, errlen, MLO_EFORMAT,
                    "%s: no \"_class_name\", and model_index.json names no scheduler class", where);
  if (cls && index_class && strcmp(cls->valuestring, index_class))
    mlo_logf(MLO_LOG_WARN,
             "%s: _class_name %.80s, but model_index.json names %.80s: using %.80s, "
             "as diffusers does",
             where, cls->valuestring, index_class, index_class);
  snprintf(s->class_name, sizeof s->class_name, "%s", index_class ? index_class : cls->valuestring);
  double n = 1000, shift = 1.0, offset = 0, terminal = 0;
  int rc = number(where, cfg, "num_train_timesteps", 1, 1e6, &n, err, errlen);
  if (rc) return rc;
  if (n != floor(n))
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: \"num_train_timesteps\" is not whole", where);
  s->num_train_timesteps = (int)n;
  bool unipc = !strcmp(s->class_name, "UniPCMultistepScheduler");
  bool flowmatch = !strcmp(s->class_name, "FlowMatchEulerDiscreteScheduler");
  if (!unipc && !flowmatch)
    return mlo_errf(err, errlen, MLO_EUNSUPPORTED,
                    "%s: scheduler %s is not modelled (UniPCMultistepScheduler and "
                    "FlowMatchEulerDiscreteScheduler are)",
                    where, s->class_name);
  static const char *const unmodelled[] = {"use_karras_sigmas", "use_exponential_sigmas",
                                           "use_beta_sigmas", "use_dynamic_shifting",
                                           "invert_sigmas"};
  for (size_t i = 0; i < sizeof unmodelled / sizeof *unmodelled; i++)
    if (truthy(cfg, unmodelled[i]))
      return mlo_errf(err, errlen, MLO_EUNSUPPORTED,
                      "%s: %s with \"%s\" is not modelled (use --boundary-steps to split the "
                      "experts by hand)",
                      where, s->class_name, unmodelled[i]);
  if ((rc = number(where, cfg, unipc ? "flow_shift" : "shift", 1e-6, 1e6, &shift, err, errlen)) ||
      (rc = number(where, cfg, "shift_terminal", 0, 1 - 1e-9, &terminal, err, errlen)) ||
      (rc = number(where, cfg, "steps_offset", 0, 1e6, &offset, err, errlen)))
    return rc;
  s->shift = shift;
  s->shift_terminal = terminal;
  s->steps_offset = (int)offset;
  if (flowmatch) {
    s->kind = MLO_SCHED_FLOW_MATCH_EULER;
    return MLO_OK;
  }
  if (truthy(cfg, "use_flow_sigmas")) {
    s->kind = MLO_SCHED_UNIPC_FLOW;
    return MLO_OK;
  }
  s->kind = MLO_SCHED_UNIPC_DISCRETE;
  const cJSON *sp = item(cfg, "timestep_spacing");
  const char *spacing = cJSON_IsString(sp) ? sp->valuestring : "linspace";
  static const char *const spacings[] = {"linspace", "leading", "trailing"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(spacing, spacings[i])) {
      s->spacing = i;
      return MLO_OK;
    }
  return mlo_errf(err, errlen, MLO_EFORMAT,
                  "%s: timestep_spacing '%.40s' is not one of "
                  "linspace, leading, trailing",
                  where, spacing);
}

/* The schedule from a parsed model_index.json (root) and, when given, a
 * parsed scheduler config (cfg); where_* name them in messages. */
static int schedule_from_json(const char *where_index, const cJSON *root, const char *where_sched,
                              const cJSON *cfg, mlo_denoise_schedule *s, char *err, size_t errlen) {
  if (!cJSON_IsObject(root))
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: not a JSON object", where_index);
  const cJSON *b = item(root, "boundary_ratio");
  if (b && !cJSON_IsNull(b)) {
    double r = -1;
    int rc = number(where_index, root, "boundary_ratio", 0, 1, &r, err, errlen);
    if (rc) return rc;
    s->boundary_ratio = r;
  }
  if (!cfg) return MLO_OK;
  if (!cJSON_IsObject(cfg))
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: not a JSON object", where_sched);
  const cJSON *entry = item(root, "scheduler"); /* ["diffusers", "UniPCMultistepScheduler"] */
  const cJSON *cls =
      cJSON_IsArray(entry) && cJSON_GetArraySize(entry) == 2 ? cJSON_GetArrayItem(entry, 1) : NULL;
  int rc = read_scheduler(where_sched, cfg, cJSON_IsString(cls) ? cls->valuestring : NULL, s, err,
                          errlen);
  if (!rc) snprintf(s->source, sizeof s->source, "scheduler config");
  return rc;
}

int mlo_denoise_schedule_read(const char *dir, mlo_denoise_schedule *out, char *err,
                              size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!dir || !out || out->size < sizeof *out) return MLO_EINVAL;
  mlo_denoise_schedule s = MLO_DENOISE_SCHEDULE_INIT;
  char *index = mlo_path_join(dir, "model_index.json");
  char *sched = mlo_path_join(dir, "scheduler/scheduler_config.json");
  cJSON *root = NULL, *cfg = NULL;
  int rc = index && sched ? MLO_OK : MLO_ENOMEM;
  if (!rc && access(index, F_OK) != 0)
    rc = mlo_errf(err, errlen, MLO_ENOTFOUND, "%s: no model_index.json", dir);
  if (!rc) rc = mlo_json_read_file(index, CONFIG_CAP, 0, &root, err, errlen);
  if (!rc && access(sched, F_OK) == 0)
    rc = mlo_json_read_file(sched, CONFIG_CAP, 0, &cfg, err, errlen);
  if (!rc) rc = schedule_from_json(index, root, sched, cfg, &s, err, errlen);
  cJSON_Delete(root);
  cJSON_Delete(cfg);
  free(index);
  free(sched);
  if (rc == MLO_OK) *out = s;
  return rc;
}

int mlo_denoise_schedule_parse(const char *index_json, const char *scheduler_json,
                               mlo_denoise_schedule *out, char *err, size_t errlen) {
  if (!index_json || !out || out->size < sizeof *out) return MLO_EINVAL;
  mlo_denoise_schedule s = MLO_DENOISE_SCHEDULE_INIT;
  cJSON *root = cJSON_Parse(index_json);
  cJSON *cfg = scheduler_json ? cJSON_Parse(scheduler_json) : NULL;
  int rc = root && (cfg || !scheduler_json)
               ? schedule_from_json("model_index.json", root, "scheduler_config.json", cfg, &s, err,
                                    errlen)
               : mlo_errf(err, errlen, MLO_EFORMAT, "the schedule's JSON does not parse");
  cJSON_Delete(root);
  cJSON_Delete(cfg);
  if (rc == MLO_OK) *out = s;
  return rc;
}

/* numpy.linspace(start, stop, num) in float64: start + i*step, the last
 * element exactly stop. */
static double np_linspace(double start, double stop, int num, int i) {
  if (num == 1) return start;
  double step = (stop - start) / (double)(num - 1);
  return i == num - 1 ? stop : (double)i * step + start;
}

/* FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal over n values. */
static void stretch_to_terminal(double *sig, int n, double terminal) {
  double scale = (1.0 - sig[n - 1]) / (1.0 - terminal);
  for (int i = 0; i < n; i++) sig[i] = 1.0 - (1.0 - sig[i]) / scale;
}

int mlo_denoise_timesteps(const mlo_denoise_schedule *s, int steps, double *t) {
  if (!s || s->size < sizeof *s || steps < 1 || !t || s->num_train_timesteps < 1) return MLO_EINVAL;
  double N = (double)s->num_train_timesteps, shift = s->shift;
  double *sig = mlo_calloc((size_t)steps + 1, sizeof *sig);
  if (!sig) return MLO_ENOMEM;
  switch (s->kind) {
  case MLO_SCHED_FLOW_MATCH_EULER: {
    /* __init__ (torch float32): sigma_min is the shifted 1/N. */
    float smin = 1.0f / (float)N;
    smin = (float)shift * smin / (1.0f + (float)(shift - 1.0) * smin);
    double tmax = 1.0 * N, tmin = (double)smin * N;
    for (int i = 0; i < steps; i++) {
      double x = np_linspace(tmax, tmin, steps, i) / N;
      sig[i] = shift * x / (1.0 + (shift - 1.0) * x);
    }
    if (s->shift_terminal > 0) stretch_to_terminal(sig, steps, s->shift_terminal);
    for (int i = 0; i < steps; i++) t[i] = (double)((float)sig[i] * (float)N);
    break;
  }
  case MLO_SCHED_UNIPC_FLOW:
    for (int i = 0; i < steps; i++) {
      double x = np_linspace(1.0, 1.0 / N, steps + 1, i);
      sig[i] = shift * x / (1.0 + (shift - 1.0) * x);
    }
    if (s->shift_terminal > 0) stretch_to_terminal(sig, steps, s->shift_terminal);
    if (fabs(sig[0] - 1.0) < 1e-6) sig[0] -= 1e-6;
    for (int i = 0; i < steps; i++) t[i] = trunc(sig[i] * N); /* .astype(int64) */
    break;
  case MLO_SCHED_UNIPC_DISCRETE:
    for (int i = 0; i < steps; i++) {
      if (s->spacing == 0) /* linspace(0, N-1, steps+1).round()[::-1][:-1] */
        t[i] = nearbyint(np_linspace(0, N - 1, steps + 1, steps - i));
      else if (s->spacing == 1) /* arange(0, steps+1) * (N // (steps+1)), reversed, [:-1] */
        t[i] = (double)(steps - i) * floor(N / (steps + 1)) + s->steps_offset;
      else /* arange(N, 0, -N/steps).round() - 1 */
        t[i] = nearbyint(N - (double)i * (N / steps)) - 1;
    }
    break;
  default:
    free(sig);
    return MLO_EINVAL;
  }
  free(sig);
  return MLO_OK;
}

int mlo_denoise_first_expert_steps(const mlo_denoise_schedule *s, int steps, int *first) {
  if (!first) return MLO_EINVAL;
  if (s && s->size >= sizeof *s && s->boundary_ratio < 0) {
    *first = steps; /* no boundary: one expert runs every step */
    return steps >= 1 ? MLO_OK : MLO_EINVAL;
  }
  double *t = mlo_calloc(steps > 0 ? (size_t)steps : 1, sizeof *t);
  if (!t) return MLO_ENOMEM;
  int rc = mlo_denoise_timesteps(s, steps, t);
  if (rc == MLO_OK) {
    double boundary = s->boundary_ratio * (double)s->num_train_timesteps;
    int n = 0;
    for (int i = 0; i < steps; i++) n += t[i] >= boundary;
    *first = n;
  }
  free(t);
  return rc;
}

const char *mlo_denoise_kind_name(mlo_sched_kind kind) {
  switch (kind) {
  case MLO_SCHED_FLOW_MATCH_EULER:
    return "flow-match Euler";
  case MLO_SCHED_UNIPC_FLOW:
    return "UniPC, flow sigmas";
  case MLO_SCHED_UNIPC_DISCRETE:
    return "UniPC, discrete";
  }
  return "invalid";
}
