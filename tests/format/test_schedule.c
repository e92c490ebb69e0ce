/*
 * test_schedule.c — the expert split against diffusers itself.  The
 * fixtures' expect.json (tests/format/real/generate.py) holds, for each
 * pipeline diffusers saved, the timesteps its scheduler made and the steps
 * its WanPipeline ran on the high-noise expert, for 1..50 steps.  mlo
 * reads the same model_index.json and scheduler_config.json and must give
 * the same timesteps (exactly, or to float32's last bit where torch
 * computes in float32) and the same split.  Then the configs mlo refuses
 * to model, and malformed ones, each with its message.
 *
 *   test_schedule REAL_DIR
 */
#include "testutil.h"

#include "mlo/checkpoint.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *real_dir;

static cJSON *load_expect(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/expect.json", real_dir);
  char *text = (char *)tu_read_file(path, NULL);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  return root;
}

static void check_dir(const cJSON *expect, const char *dir, mlo_sched_kind kind) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/%s", real_dir, dir);
  mlo_denoise_schedule s = MLO_DENOISE_SCHEDULE_INIT;
  if (mlo_denoise_schedule_read(path, &s, err, sizeof err)) fail_msg("%s: %s", dir, err);
  assert_int_equal(s.kind, kind);
  assert_string_equal(s.source, "scheduler config");
  const cJSON *sched = cJSON_GetObjectItem(cJSON_GetObjectItem(expect, dir), "schedule"), *it;
  assert_non_null(sched);
  size_t checked = 0;
  cJSON_ArrayForEach(it, sched) {
    int steps = atoi(it->string), first = -1;
    const cJSON *want_t = cJSON_GetObjectItem(it, "timesteps");
    double *t = calloc((size_t)steps, sizeof *t);
    assert_ok(mlo_denoise_timesteps(&s, steps, t));
    for (int i = 0; i < steps; i++) {
      double want = cJSON_GetArrayItem(want_t, i)->valuedouble;
      /* float32 timesteps (flow-match) may differ in the last bit */
      if (fabs(t[i] - want) > (kind == MLO_SCHED_FLOW_MATCH_EULER ? 1e-4 : 0.0))
        fail_msg("%s, %d steps: timestep %d is %.9g, diffusers has %.9g", dir, steps, i, t[i],
                 want);
    }
    free(t);
    assert_ok(mlo_denoise_first_expert_steps(&s, steps, &first));
    int want_first = cJSON_GetObjectItem(it, "first")->valueint;
    if (first != want_first)
      fail_msg("%s, %d steps: %d on the high-noise expert, diffusers runs %d", dir, steps, first,
               want_first);
    checked++;
  }
  assert_true(checked >= 8);
}

static void test_matches_diffusers(void **state) {
  (void)state;
  cJSON *expect = load_expect();
  check_dir(expect, "wan22", MLO_SCHED_UNIPC_FLOW);         /* shift 3 */
  check_dir(expect, "wan22-shift12", MLO_SCHED_UNIPC_FLOW); /* Wan2.2 T2V's 12 */
  check_dir(expect, "wan22-flowmatch", MLO_SCHED_FLOW_MATCH_EULER);
  check_dir(expect, "wan21", MLO_SCHED_UNIPC_FLOW); /* no boundary: every step on one */
  cJSON_Delete(expect);
}

/* ---- configs written here -------------------------------------------------- */

static char tmp[256];

static void write_configs(const char *index, const char *sched) {
  char path[512];
  snprintf(path, sizeof path, "%s/model_index.json", tmp);
  tu_write_text(path, index);
  snprintf(path, sizeof path, "%s/scheduler", tmp);
  mkdir(path, 0777);
  snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", tmp);
  if (sched)
    tu_write_text(path, sched);
  else
    unlink(path);
}

static int read_tmp(mlo_denoise_schedule *s, char *err, size_t errlen) {
  *s = (mlo_denoise_schedule)MLO_DENOISE_SCHEDULE_INIT;
  return mlo_denoise_schedule_read(tmp, s, err, errlen);
}

static void test_refusals_and_defaults(void **state) {
  (void)state;
  snprintf(tmp, sizeof tmp, "/tmp/mlo_schedule_XXXXXX");
  assert_non_null(mkdtemp(tmp));
  char err[512];
  mlo_denoise_schedule s;
  /* no scheduler folder: the default, with model_index.json's boundary */
  write_configs("{\"boundary_ratio\": 0.9}", NULL);
  assert_ok(read_tmp(&s, err, sizeof err));
  assert_string_equal(s.source, "default");
  assert_true(s.boundary_ratio == 0.9);
  /* options not modelled are refused by name, never approximated */
  static const char *const unmodelled[] = {"use_karras_sigmas", "use_dynamic_shifting",
                                           "use_exponential_sigmas", "use_beta_sigmas"};
  for (size_t i = 0; i < 4; i++) {
    char cfg[256];
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"%s\": true}", unmodelled[i]);
    write_configs("{\"boundary_ratio\": 0.875}", cfg);
    assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EUNSUPPORTED);
    assert_non_null(strstr(err, unmodelled[i]));
  }
  /* a config without _class_name: the class model_index.json names, as
   * diffusers takes it; without either, said so */
  write_configs("{\"scheduler\": [\"diffusers\", \"UniPCMultistepScheduler\"]}",
                "{\"use_flow_sigmas\": true, \"flow_shift\": 12.0}");
  assert_ok(read_tmp(&s, err, sizeof err));
  assert_string_equal(s.class_name, "UniPCMultistepScheduler");
  assert_int_equal(s.kind, MLO_SCHED_UNIPC_FLOW);
  assert_true(s.shift == 12.0);
  /* both given and different (a swapped scheduler): model_index.json's, as
   * diffusers loads it */
  write_configs("{\"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"]}",
                "{\"_class_name\": \"UniPCMultistepScheduler\", \"use_flow_sigmas\": true}");
  assert_ok(read_tmp(&s, err, sizeof err));
  assert_int_equal(s.kind, MLO_SCHED_FLOW_MATCH_EULER);
  assert_string_equal(s.class_name, "FlowMatchEulerDiscreteScheduler");
  write_configs("{}", "{\"flow_shift\": 12.0}");
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EFORMAT);
  assert_non_null(strstr(err, "model_index.json names no scheduler class"));
  write_configs("{\"scheduler\": [\"diffusers\", \"UniPCMultistepScheduler\"]}",
                "{\"_class_name\": 7}");
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EFORMAT);
  assert_non_null(strstr(err, "is not a string"));
  write_configs("{}", "{\"_class_name\": \"DPMSolverMultistepScheduler\"}");
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EUNSUPPORTED);
  assert_non_null(strstr(err, "DPMSolverMultistepScheduler is not modelled"));
  /* malformed values */
  write_configs("{\"boundary_ratio\": 1.5}", NULL);
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EFORMAT);
  assert_non_null(strstr(err, "boundary_ratio"));
  write_configs("{}", "{\"_class_name\": \"UniPCMultistepScheduler\", \"flow_shift\": \"x\"}");
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EFORMAT);
  assert_non_null(strstr(err, "flow_shift"));
  write_configs("{}", "{\"_class_name\": \"UniPCMultistepScheduler\", \"timestep_spacing\": "
                      "\"sideways\"}");
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EFORMAT);
  write_configs("[1]", NULL);
  assert_int_equal(read_tmp(&s, err, sizeof err), MLO_EFORMAT);
  /* the discrete UniPC spacings: diffusers' integer timesteps */
  cJSON *expect = load_expect(), *it;
  size_t checked = 0;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(expect, "unipc_discrete")) {
    char cfg[256];
    const char *spacing = cJSON_GetObjectItem(it, "spacing")->valuestring;
    int offset = cJSON_GetObjectItem(it, "steps_offset")->valueint;
    int steps = cJSON_GetObjectItem(it, "steps")->valueint;
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"UniPCMultistepScheduler\", \"timestep_spacing\": \"%s\", "
             "\"steps_offset\": %d}",
             spacing, offset);
    write_configs("{\"boundary_ratio\": 0.5}", cfg);
    assert_ok(read_tmp(&s, err, sizeof err));
    assert_int_equal(s.kind, MLO_SCHED_UNIPC_DISCRETE);
    double t[64];
    assert_ok(mlo_denoise_timesteps(&s, steps, t));
    int want_first = 0;
    for (int i = 0; i < steps; i++) {
      double want = cJSON_GetArrayItem(cJSON_GetObjectItem(it, "timesteps"), i)->valuedouble;
      if (t[i] != want)
        fail_msg("%s, offset %d, %d steps: timestep %d is %g, diffusers has %g", spacing, offset,
                 steps, i, t[i], want);
      want_first += want >= 500;
    }
    int first;
    assert_ok(mlo_denoise_first_expert_steps(&s, steps, &first));
    assert_int_equal(first, want_first);
    checked++;
  }
  assert_int_equal(checked, 30);
  cJSON_Delete(expect);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s REAL_DIR\n", argv[0]);
    return 2;
  }
  real_dir = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_diffusers),
      cmocka_unit_test(test_refusals_and_defaults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
