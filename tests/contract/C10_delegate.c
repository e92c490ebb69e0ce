/*
 * C10_delegate — a pipeline may bring its own offload delegate ({enable,
 * disable} with the settings); with one, no generic hook is installed.  The
 * exclusion group (mlo_group_*) keeps a reasoner/generator pair mutually
 * exclusive for it; a failing delegate enable is undone through its disable
 * and its error returned.
 */
#include "testutil.h"

#include <string.h>

typedef struct {
  int enable_calls, disable_calls;
  int fail_with; /* status the next enable returns (0: succeed) */
  bool use_group;
  bool got_settings;
  mlo_offload_settings seen;
  mlo_group *group;
  int group_rc;
  mlo_component *members[2];
} delegate;

static int delegate_enable(void *self, mlo_pipeline *pipe, const mlo_offload_settings *settings) {
  delegate *d = self;
  d->enable_calls++;
  d->got_settings = settings != NULL;
  if (settings) memcpy(&d->seen, settings, sizeof d->seen);
  if (d->use_group) {
    d->group_rc = mlo_group_create(pipe, "omni", &d->group);
    if (d->group_rc) return d->group_rc;
    for (int i = 0; i < 2; i++) {
      d->group_rc = mlo_group_add(d->group, d->members[i]);
      if (d->group_rc) return d->group_rc;
    }
  }
  return d->fail_with;
}

static int delegate_disable(void *self, mlo_pipeline *pipe) {
  delegate *d = self;
  (void)pipe;
  d->disable_calls++;
  mlo_group_free(d->group);
  d->group = NULL;
  return MLO_OK;
}

static const mlo_delegate_ops ops = {delegate_enable, delegate_disable};

static void test_delegate_replaces_generic_hooks(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  delegate d = {0};
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &d));
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  settings.sync = MLO_SYNC_DEVICE;
  settings.pin_host = false;
  settings.distributed = true;
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  assert_true(mlo_offload_is_enabled(tp->pipe));
  assert_int_equal(d.enable_calls, 1);
  assert_true(d.got_settings);
  assert_int_equal(d.seen.sync, MLO_SYNC_DEVICE);
  assert_false(d.seen.pin_host);
  assert_true(d.seen.distributed);
  assert_false(d.seen.per_tensor_copies);
  /* No generic exclusion: a DiT and an encoder may both stay resident. */
  mlo_component *dit = tu_comp(tp, "transformer"), *enc = tu_comp(tp, "text_encoder");
  assert_ok(tu_forward(tp, dit));
  assert_ok(tu_forward(tp, enc));
  assert_ok(tu_forward(tp, tu_comp(tp, "transformer_2")));
  assert_true(mlo_component_is_resident(dit));
  assert_true(mlo_component_is_resident(enc));
  assert_int_equal(tu_pstats(tp).total.evictions, 0);
  tu_assert_audit(tp);
  /* Idempotent: at most one call per transition. */
  assert_ok(mlo_offload_enable(tp->pipe, &settings));
  assert_int_equal(d.enable_calls, 1);
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_int_equal(d.disable_calls, 1);
  assert_false(mlo_offload_is_enabled(tp->pipe));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_delegate_gets_default_settings(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  delegate d = {0};
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &d));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_true(d.got_settings);
  assert_int_equal(d.seen.size, sizeof(mlo_offload_settings));
  assert_int_equal(d.seen.sync, MLO_SYNC_EVENT);
  assert_true(d.seen.pin_host); /* the pipeline's option */
  assert_false(d.seen.distributed);
  tu_pipe_free(tp);
  /* Freeing an enabled pipeline disables its delegate. */
  assert_int_equal(d.disable_calls, 1);
  mlo_platform_close(plat);
}

/* encoder + reasoner + generator (one transformer's two halves) + vae. */
static tu_pipe *build_omni(mlo_platform *plat, delegate *d) {
  const tu_comp_spec specs[] = {{"text_encoder", MLO_ROLE_ENCODER, 2, 4096, 0},
                                {"reasoner", MLO_ROLE_OTHER, 3, 8192, 0},
                                {"generator", MLO_ROLE_OTHER, 3, 8192, 0},
                                {"vae", MLO_ROLE_VAE, 1, 4096, 0}};
  tu_pipe *tp = tu_pipe_build(plat, specs, 4);
  d->use_group = true;
  d->members[0] = tu_comp(tp, "reasoner");
  d->members[1] = tu_comp(tp, "generator");
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, d));
  return tp;
}

typedef struct {
  tu_pipe *tp;
  mlo_component *partner;
  int partner_resident;
} pair_check;

static int pair_callback(mlo_component *comp, void *user) {
  pair_check *pc = user;
  if (mlo_component_is_resident(pc->partner)) pc->partner_resident++;
  return tu_forward_check(comp, pc->tp);
}

static void test_group_keeps_pair_exclusive(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  delegate d = {0};
  tu_pipe *tp = build_omni(plat, &d);
  tp->audit_in_forward = true;
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_ok(d.group_rc);
  mlo_component *reasoner = d.members[0], *generator = d.members[1];
  pair_check to_gen = {tp, reasoner, 0}, to_reason = {tp, generator, 0};
  for (int i = 0; i < 8; i++) {
    assert_ok(mlo_component_forward(reasoner, pair_callback, &to_reason));
    assert_false(mlo_component_is_resident(generator));
    assert_ok(mlo_component_forward(generator, pair_callback, &to_gen));
    assert_false(mlo_component_is_resident(reasoner));
  }
  assert_int_equal(to_gen.partner_resident + to_reason.partner_resident, 0);
  assert_int_equal(tu_cstats(reasoner).loads, 8);
  assert_int_equal(tu_cstats(generator).evictions, 7);
  /* Disable removes the group's hooks and moves nothing. */
  mlo_pipeline_stats before = tu_pstats(tp);
  assert_ok(mlo_offload_disable(tp->pipe));
  mlo_pipeline_stats after = tu_pstats(tp);
  assert_int_equal(after.total.h2d_bytes, before.total.h2d_bytes);
  assert_int_equal(after.total.evictions, before.total.evictions);
  assert_true(mlo_component_is_resident(generator));
  assert_ok(tu_forward(tp, reasoner));
  assert_true(mlo_component_is_resident(generator)); /* no group any more */
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_failing_enable_is_undone(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  delegate d = {0};
  tu_pipe *tp = build_omni(plat, &d);
  d.fail_with = MLO_EPLATFORM;
  assert_status(mlo_offload_enable(tp->pipe, NULL), MLO_EPLATFORM);
  assert_int_equal(d.enable_calls, 1);
  assert_int_equal(d.disable_calls, 1);
  assert_null(d.group);
  assert_false(mlo_offload_is_enabled(tp->pipe));
  /* Nothing installed: disable has nothing to undo. */
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_int_equal(d.disable_calls, 1);
  /* The retry works. */
  d.fail_with = MLO_OK;
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_int_equal(d.enable_calls, 2);
  assert_true(mlo_offload_is_enabled(tp->pipe));
  assert_ok(tu_forward(tp, d.members[0]));
  assert_ok(tu_forward(tp, d.members[1]));
  assert_false(mlo_component_is_resident(d.members[0]));
  tu_assert_forwards_clean(tp);
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

static void test_delegate_change_refused_while_enabled(void **state) {
  (void)state;
  mlo_platform *plat = tu_platform_open(NULL);
  tu_pipe *tp = tu_pipe_build_wan(plat);
  delegate d = {0}, other = {0};
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, &ops, &d));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_status(mlo_pipeline_set_delegate(tp->pipe, &ops, &other), MLO_ESTATE);
  assert_status(mlo_pipeline_set_delegate(tp->pipe, NULL, NULL), MLO_ESTATE);
  assert_ok(mlo_offload_disable(tp->pipe));
  assert_int_equal(other.enable_calls + other.disable_calls, 0);
  /* Removed, the generic path is back (C2). */
  assert_ok(mlo_pipeline_set_delegate(tp->pipe, NULL, NULL));
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  assert_int_equal(d.enable_calls, 1);
  assert_true(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
  assert_ok(tu_forward(tp, tu_comp(tp, "transformer")));
  assert_false(mlo_component_is_resident(tu_comp(tp, "text_encoder")));
  tu_pipe_free(tp);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_delegate_replaces_generic_hooks),
      cmocka_unit_test(test_delegate_gets_default_settings),
      cmocka_unit_test(test_group_keeps_pair_exclusive),
      cmocka_unit_test(test_failing_enable_is_undone),
      cmocka_unit_test(test_delegate_change_refused_while_enabled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
