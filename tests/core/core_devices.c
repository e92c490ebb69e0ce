/*
 * core_devices.c — one pipeline over several devices (docs/placement.md):
 * the options' checks, placement from the schedule under each policy, pins,
 * per-device budgets and exclusion, a resident component moved to another
 * device at enable, and the accessors.  Two host platforms stand for two
 * devices; every forward checks its tensors' contents on the device.
 *
 * The Wan2.2-shaped components (testutil: text_encoder 48 KiB, two 128 KiB
 * experts, a 16 KiB VAE) under a budget of 300 KiB per device: the experts
 * and the VAE fit one device (272 KiB), not with the encoder.
 */
#include "testutil.h"

#include <string.h>

#define ROOM (300 * 1024)

typedef struct {
  mlo_platform *dev[2];
  tu_pipe *tp;
} fixture;

static mlo_pipeline *create_on(mlo_platform *const *devs, size_t n, int *rc) {
  mlo_pipeline_options o = MLO_PIPELINE_OPTIONS_INIT;
  o.platform = devs[0];
  o.devices = devs;
  o.ndevices = n;
  mlo_pipeline *p = NULL;
  *rc = mlo_pipeline_create(&o, &p);
  return p;
}

/* The Wan components over two host devices of these capacities. */
static void setup_caps(fixture *f, const char *cap0, const char *cap1) {
  f->dev[0] = tu_platform_open(cap0);
  f->dev[1] = tu_platform_open(cap1);
  f->tp = tu_pipe_new(f->dev[0], true);
  mlo_pipeline_free(f->tp->pipe);
  int rc;
  f->tp->pipe = create_on(f->dev, 2, &rc);
  assert_ok(rc);
  for (size_t i = 0; i < 4; i++) tu_add_component(f->tp, &tu_wan_specs[i]);
  mlo_schedule_entry e[4];
  for (size_t i = 0; i < 4; i++)
    e[i] = (mlo_schedule_entry){tu_comp(f->tp, tu_wan_specs[i].name), 1};
  assert_ok(mlo_pipeline_set_schedule(f->tp->pipe, e, 4));
}

static void setup(fixture *f) {
  setup_caps(f, "capacity=1M", "capacity=1M");
}

static void teardown(fixture *f) {
  tu_pipe_free(f->tp);
  mlo_platform_close(f->dev[0]);
  mlo_platform_close(f->dev[1]);
}

static int enable(fixture *f, mlo_policy policy) {
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.policy = policy;
  if (policy == MLO_POLICY_BUDGET) s.budget_bytes = ROOM;
  return mlo_offload_enable(f->tp->pipe, &s);
}

/* One request: every component's forward in schedule order. */
static void request(fixture *f) {
  for (size_t i = 0; i < 4; i++) assert_ok(tu_forward(f->tp, tu_comp(f->tp, tu_wan_specs[i].name)));
  assert_ok(mlo_pipeline_synchronize(f->tp->pipe));
}

static size_t dev_of(fixture *f, const char *name) {
  return mlo_component_device(tu_comp(f->tp, name));
}

static void test_options_are_checked(void **state) {
  (void)state;
  mlo_platform *a = tu_platform_open("capacity=1M"), *b = tu_platform_open("capacity=1M");
  int rc;
  mlo_platform *same[2] = {a, a}, *hole[2] = {a, NULL}, *two[2] = {a, b};
  assert_null(create_on(same, 2, &rc));
  assert_int_equal(rc, MLO_EINVAL); /* one device twice */
  assert_null(create_on(hole, 2, &rc));
  assert_int_equal(rc, MLO_EINVAL);
  mlo_pipeline_options o = MLO_PIPELINE_OPTIONS_INIT;
  o.platform = b; /* not devices[0] */
  o.devices = two;
  o.ndevices = 2;
  mlo_pipeline *p = NULL;
  assert_int_equal(mlo_pipeline_create(&o, &p), MLO_EINVAL);
  o.platform = NULL; /* devices[0] stands for it */
  assert_ok(mlo_pipeline_create(&o, &p));
  assert_int_equal(mlo_pipeline_device_count(p), 2);
  assert_ptr_equal(mlo_pipeline_device(p, 1), b);
  assert_ptr_equal(mlo_pipeline_platform(p), a);
  assert_null(mlo_pipeline_device(p, 2));
  mlo_pipeline_free(p);
  o.ndevices = 17;
  assert_int_equal(mlo_pipeline_create(&o, &p), MLO_EINVAL);
  /* a caller built against 0.6 passes the shorter size: one device */
  mlo_pipeline_options old = MLO_PIPELINE_OPTIONS_INIT;
  old.size = offsetof(mlo_pipeline_options, devices);
  old.platform = a;
  assert_ok(mlo_pipeline_create(&old, &p));
  assert_int_equal(mlo_pipeline_device_count(p), 1);
  mlo_pipeline_free(p);
  /* devices of two kinds */
  mlo_platform *sim = tu_open_spec("sim");
  mlo_platform *mixed[2] = {a, sim};
  assert_null(create_on(mixed, 2, &rc));
  assert_int_equal(rc, MLO_EUNSUPPORTED);
  mlo_platform_close(sim);
  mlo_platform_close(a);
  mlo_platform_close(b);
}

/* Budget: the encoder apart from the experts, nothing moved once warm, each
 * device within its own budget. */
static void test_budget_places_encoder_apart(void **state) {
  (void)state;
  fixture f;
  setup(&f);
  assert_ok(enable(&f, MLO_POLICY_BUDGET));
  size_t enc = dev_of(&f, "text_encoder");
  assert_int_equal(dev_of(&f, "transformer"), dev_of(&f, "transformer_2"));
  assert_int_not_equal(enc, dev_of(&f, "transformer"));
  assert_ptr_equal(mlo_component_platform(tu_comp(f.tp, "text_encoder")), f.dev[enc]);
  mlo_placement pl = {.size = sizeof pl};
  assert_ok(mlo_pipeline_get_placement(f.tp->pipe, &pl));
  assert_int_equal(pl.devices, 2);
  assert_int_equal(pl.moved_bytes, 0);
  assert_true(pl.one_device_bytes > 0); /* one device moves the encoder and an expert */
  assert_int_equal(pl.room_bytes[0], ROOM);
  request(&f);
  uint64_t warm = tu_h2d_counted(f.tp);
  request(&f);
  request(&f);
  assert_int_equal(tu_h2d_counted(f.tp), warm); /* nothing moved once warm */
  for (size_t d = 0; d < 2; d++) {
    mlo_device_stats ds = {.size = sizeof ds};
    assert_ok(mlo_pipeline_get_device_stats(f.tp->pipe, d, &ds));
    assert_true(ds.peak_device_bytes > 0);
    assert_true(ds.peak_device_bytes <= ROOM);
    assert_int_equal(ds.budget_bytes, ROOM);
  }
  assert_ok(mlo_pipeline_audit(f.tp->pipe));
  teardown(&f);
}

/* Strict excludes within a device: a DiT's forward leaves the encoder on
 * the other device resident. */
static void test_strict_excludes_per_device(void **state) {
  (void)state;
  fixture f;
  setup(&f);
  assert_ok(mlo_component_set_device(tu_comp(f.tp, "text_encoder"), 1));
  assert_ok(mlo_component_set_device(tu_comp(f.tp, "transformer"), 0));
  assert_ok(mlo_component_set_device(tu_comp(f.tp, "transformer_2"), 0));
  assert_ok(enable(&f, MLO_POLICY_STRICT));
  assert_int_equal(dev_of(&f, "text_encoder"), 1);
  request(&f);
  assert_true(mlo_component_is_resident(tu_comp(f.tp, "text_encoder")));
  assert_ok(tu_forward(f.tp, tu_comp(f.tp, "transformer")));
  assert_true(mlo_component_is_resident(tu_comp(f.tp, "text_encoder")));   /* other device */
  assert_false(mlo_component_is_resident(tu_comp(f.tp, "transformer_2"))); /* same: C3 */
  teardown(&f);
}

/* Pins: honoured, refused while enabled, bounded; MLO_DEVICE_ANY unpins. */
static void test_pins(void **state) {
  (void)state;
  fixture f;
  setup(&f);
  mlo_component *enc = tu_comp(f.tp, "text_encoder"), *t = tu_comp(f.tp, "transformer");
  assert_int_equal(mlo_component_set_device(enc, 2), MLO_EINVAL);
  assert_int_equal(mlo_component_set_device(enc, -2), MLO_EINVAL);
  assert_ok(mlo_component_set_device(enc, 0));
  assert_ok(mlo_component_set_device(t, 1)); /* against placement's own choice */
  assert_ok(enable(&f, MLO_POLICY_BUDGET));
  assert_int_equal(mlo_component_device(enc), 0);
  assert_int_equal(mlo_component_device(t), 1);
  request(&f);
  assert_int_equal(mlo_component_set_device(enc, 1), MLO_ESTATE);
  assert_ok(mlo_offload_disable(f.tp->pipe));
  assert_ok(mlo_component_set_device(enc, MLO_DEVICE_ANY));
  assert_ok(mlo_component_set_device(t, MLO_DEVICE_ANY));
  assert_ok(enable(&f, MLO_POLICY_BUDGET)); /* placement chooses again: moves them */
  assert_int_not_equal(dev_of(&f, "text_encoder"), dev_of(&f, "transformer"));
  request(&f); /* contents checked where they now are */
  teardown(&f);
}

/* A component resident on device 0 before enable, placed on device 1: it
 * is evicted and its events made again there; its next forward reads its
 * own bytes on device 1. */
static void test_resident_component_moves(void **state) {
  (void)state;
  fixture f;
  setup(&f);
  assert_ok(mlo_pipeline_load_all(f.tp->pipe)); /* every one on device 0 */
  assert_ok(mlo_pipeline_synchronize(f.tp->pipe));
  assert_ok(enable(&f, MLO_POLICY_BUDGET));
  size_t enc = dev_of(&f, "text_encoder");
  assert_int_equal(enc, 1);
  request(&f);
  request(&f);
  assert_ok(mlo_pipeline_audit(f.tp->pipe));
  teardown(&f);
}

/* A pinned component larger than its device's room fails the enable,
 * naming its size, and nothing is left enabled. */
static void test_pinned_too_large(void **state) {
  (void)state;
  fixture f;
  setup_caps(&f, "capacity=1M", "capacity=64K"); /* device 1's memory: no expert fits it */
  assert_ok(mlo_component_set_device(tu_comp(f.tp, "transformer"), 1));
  assert_int_equal(enable(&f, MLO_POLICY_STRICT), MLO_ENOMEM_DEVICE);
  assert_non_null(strstr(mlo_pipeline_errmsg(f.tp->pipe),
                         "'transformer' (128 KiB) cannot run on device 1, where it is pinned"));
  assert_false(mlo_offload_is_enabled(f.tp->pipe));
  /* unpinned, it goes where it fits */
  assert_ok(mlo_component_set_device(tu_comp(f.tp, "transformer"), MLO_DEVICE_ANY));
  assert_ok(enable(&f, MLO_POLICY_STRICT));
  assert_int_equal(dev_of(&f, "transformer"), 0);
  request(&f);
  teardown(&f);
}

/* Without offload, everything resident: on the first device where it
 * fits there, else spread so that it fits. */
static void test_load_all_spreads_what_does_not_fit(void **state) {
  (void)state;
  fixture f;
  setup(&f);
  assert_ok(mlo_pipeline_load_all(f.tp->pipe));
  for (size_t i = 0; i < 4; i++) assert_int_equal(dev_of(&f, tu_wan_specs[i].name), 0);
  request(&f);
  teardown(&f);
  setup_caps(&f, "capacity=200K", "capacity=200K"); /* 320 KiB of weights */
  assert_ok(mlo_pipeline_load_all(f.tp->pipe));
  assert_int_not_equal(dev_of(&f, "transformer"), dev_of(&f, "transformer_2"));
  for (size_t i = 0; i < 4; i++)
    assert_true(mlo_component_is_resident(tu_comp(f.tp, tu_wan_specs[i].name)));
  request(&f);
  teardown(&f);
}

/* Components that share storage (a tensor of one references the other's)
 * are placed on one device, whatever the bytes would say; pinned apart,
 * the enable says why. */
static void test_shared_tensors_keep_one_device(void **state) {
  (void)state;
  fixture f;
  setup(&f);
  mlo_component *enc = tu_comp(f.tp, "text_encoder"), *t = tu_comp(f.tp, "transformer");
  tu_add_alias(f.tp, t, "tied", mlo_component_tensor_at(enc, 0)); /* a tied embedding */
  assert_ok(enable(&f, MLO_POLICY_BUDGET));
  assert_int_equal(mlo_component_device(enc), mlo_component_device(t));
  request(&f); /* the alias reads the encoder's bytes on its own device */
  assert_ok(mlo_offload_disable(f.tp->pipe));
  assert_ok(mlo_component_set_device(enc, 0));
  assert_ok(mlo_component_set_device(t, 1));
  assert_int_equal(enable(&f, MLO_POLICY_BUDGET), MLO_EINVAL);
  assert_non_null(strstr(mlo_pipeline_errmsg(f.tp->pipe),
                         "'text_encoder' and 'transformer' share tensors, so they run on one "
                         "device; they are pinned to devices 0 and 1"));
  teardown(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_are_checked),
      cmocka_unit_test(test_budget_places_encoder_apart),
      cmocka_unit_test(test_strict_excludes_per_device),
      cmocka_unit_test(test_pins),
      cmocka_unit_test(test_resident_component_moves),
      cmocka_unit_test(test_pinned_too_large),
      cmocka_unit_test(test_load_all_spreads_what_does_not_fit),
      cmocka_unit_test(test_shared_tensors_keep_one_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
