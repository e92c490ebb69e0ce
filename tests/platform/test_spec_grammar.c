/*
 * test_spec_grammar.c — mlo_platform_spec_parts / _get / _compose: a
 * spec's name, index and options read and composed as mlo_platform_open
 * reads them (each composed spec here is opened, or refused for the
 * reason its platform gives), fault wrappers passing through to their
 * inner platform, and bad input refused with the output left empty.
 */
#include "testutil.h"

#include <string.h>

static void expect_compose(const char *spec, int index, const char *key, const char *value,
                           const char *want) {
  char out[256] = "junk";
  assert_int_equal(mlo_platform_spec_compose(spec, index, key, value, out, sizeof out), MLO_OK);
  assert_string_equal(out, want);
}

static void test_parts(void **state) {
  (void)state;
  char name[32];
  int index = 7;
  assert_ok(mlo_platform_spec_parts("host", name, sizeof name, &index));
  assert_string_equal(name, "host");
  assert_int_equal(index, -1);
  assert_ok(mlo_platform_spec_parts("host:capacity=1G,bw=2e9", name, sizeof name, &index));
  assert_string_equal(name, "host");
  assert_int_equal(index, -1);
  assert_ok(mlo_platform_spec_parts("cuda:3:pinned=0", name, sizeof name, &index));
  assert_string_equal(name, "cuda");
  assert_int_equal(index, 3);
  assert_ok(mlo_platform_spec_parts("cuda:pinned=0", name, sizeof name, &index));
  assert_int_equal(index, -1);
  assert_ok(mlo_platform_spec_parts("opencl:2", name, sizeof name, &index));
  assert_string_equal(name, "opencl");
  assert_int_equal(index, 2);
  /* a wrapper: its inner platform's, host where it names none */
  assert_ok(
      mlo_platform_spec_parts("fault:kind=copy,nth=2,inner=cuda:1", name, sizeof name, &index));
  assert_string_equal(name, "cuda");
  assert_int_equal(index, 1);
  assert_ok(mlo_platform_spec_parts("fault:kind=copy,nth=2", name, sizeof name, &index));
  assert_string_equal(name, "host");
  /* refused, the output empty */
  assert_int_equal(mlo_platform_spec_parts("gpu:0", name, sizeof name, &index), MLO_ENOTFOUND);
  assert_string_equal(name, "");
  assert_int_equal(mlo_platform_spec_parts("", name, sizeof name, &index), MLO_ENOTFOUND);
  assert_int_equal(mlo_platform_spec_parts("cuda:99999999999", name, sizeof name, &index),
                   MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_parts("host", name, 4, &index), MLO_EINVAL);
  /* options are key=value items, as mlo_platform_open reads them */
  assert_int_equal(mlo_platform_spec_parts("cuda:x", name, sizeof name, &index), MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_parts("host:=1", name, sizeof name, &index), MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_parts("host:bw=", name, sizeof name, &index), MLO_EINVAL);
  assert_ok(mlo_platform_spec_parts("host:bw=1e9,,poison=0", name, sizeof name, &index));
  assert_int_equal(mlo_platform_spec_parts(NULL, name, sizeof name, &index), MLO_EINVAL);
}

static void test_get(void **state) {
  (void)state;
  char v[32] = "junk";
  assert_ok(mlo_platform_spec_get("host:capacity=1G,bw=2e9", "bw", v, sizeof v));
  assert_string_equal(v, "2e9");
  assert_ok(mlo_platform_spec_get("cuda:0:stream=94,pinned=0", "stream", v, sizeof v));
  assert_string_equal(v, "94");
  /* a key is matched whole: "capacity" is not "cap" */
  assert_int_equal(mlo_platform_spec_get("host:capacity=1G", "cap", v, sizeof v), MLO_ENOTFOUND);
  assert_string_equal(v, "");
  assert_int_equal(mlo_platform_spec_get("cuda:1", "stream", v, sizeof v), MLO_ENOTFOUND);
  /* a wrapper's options are its inner platform's */
  assert_ok(
      mlo_platform_spec_get("fault:kind=copy,nth=1,inner=host:group=2", "group", v, sizeof v));
  assert_string_equal(v, "2");
  assert_int_equal(mlo_platform_spec_get("fault:kind=copy,nth=1", "kind", v, sizeof v),
                   MLO_ENOTFOUND);
  assert_int_equal(mlo_platform_spec_get("host:capacity=123456789", "capacity", v, 4), MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_get("host", "", v, sizeof v), MLO_EINVAL);
}

static void test_compose(void **state) {
  (void)state;
  expect_compose("host", -1, "capacity", "64M", "host:capacity=64M");
  expect_compose("host:capacity=1G,bw=2e9", -1, "capacity", "64M", "host:bw=2e9,capacity=64M");
  expect_compose("host:bw=2e9", -1, NULL, NULL, "host:bw=2e9");
  expect_compose("cuda", 0, "capacity", "1G", "cuda:0:capacity=1G");
  expect_compose("cuda:pinned=0", 1, "stream", "94", "cuda:1:pinned=0,stream=94");
  expect_compose("cuda:2:stream=5", -1, "stream", "94", "cuda:2:stream=94");
  expect_compose("cuda:2", 3, NULL, NULL, "cuda:3");
  /* a wrapper: its own options kept, the inner platform composed */
  expect_compose("fault:kind=copy,nth=2", -1, "capacity", "8M",
                 "fault:kind=copy,nth=2,inner=host:capacity=8M");
  expect_compose("fault:kind=copy,nth=2,inner=host:bw=1e9,capacity=1G", -1, "capacity", "8M",
                 "fault:kind=copy,nth=2,inner=host:bw=1e9,capacity=8M");
  expect_compose("fault", -1, "capacity", "8M", "fault:inner=host:capacity=8M");
  /* what is composed opens as a spec given by hand would */
  char out[256];
  mlo_platform *p = NULL;
  char err[256];
  assert_ok(mlo_platform_spec_compose("host:poison=0", -1, "capacity", "16M", out, sizeof out));
  assert_ok(mlo_platform_open(out, &p, err, sizeof err));
  mlo_platform_memory m;
  assert_ok(mlo_platform_get_memory(p, &m));
  assert_int_equal(m.total_bytes, 16u << 20);
  mlo_platform_close(p);
  /* refused, the output empty */
  strcpy(out, "junk");
  assert_int_equal(mlo_platform_spec_compose("host", 1, NULL, NULL, out, sizeof out), MLO_EINVAL);
  assert_string_equal(out, "");
  assert_int_equal(mlo_platform_spec_compose("host", -1, "a,b", "1", out, sizeof out), MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_compose("host", -1, "a", "1,2", out, sizeof out), MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_compose("host", -1, "a", NULL, out, sizeof out), MLO_EINVAL);
  assert_int_equal(mlo_platform_spec_compose("nope:1", -1, NULL, NULL, out, sizeof out),
                   MLO_ENOTFOUND);
  assert_int_equal(mlo_platform_spec_compose("host:bw=2e9", -1, "capacity", "64M", out, 12),
                   MLO_EINVAL);
  assert_string_equal(out, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parts),
      cmocka_unit_test(test_get),
      cmocka_unit_test(test_compose),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
