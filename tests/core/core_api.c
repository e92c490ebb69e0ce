/*
 * core_api — API hygiene: NULL is a harmless no-op for the free and close calls,
 * every status code has a name and a description, the name tables round
 * trip, and human sizes parse and format as the header documents (junk is
 * MLO_EINVAL, never a guess).
 */
#include "testutil.h"

#include "base/log.h"

#include <string.h>

static void test_null_is_noop(void **state) {
  (void)state;
  mlo_pipeline_free(NULL);
  mlo_platform_close(NULL);
  mlo_group_free(NULL);
  mlo_platform *plat = NULL;
  char err[128] = "";
  assert_status(mlo_platform_open("no-such-device", &plat, err, sizeof err), MLO_EINVAL);
  assert_null(plat);
  assert_true(err[0] != '\0');
  assert_true(mlo_platform_open("host:capacity=lots", &plat, err, sizeof err) != MLO_OK);
  assert_null(plat);
  if (!strstr(err, "capacity")) fail_msg("message \"%s\" does not name the option", err);
  mlo_pipeline *pipe = (mlo_pipeline *)&plat;
  mlo_pipeline_options opts = MLO_PIPELINE_OPTIONS_INIT; /* no platform */
  assert_status(mlo_pipeline_create(&opts, &pipe), MLO_EINVAL);
  assert_null(pipe);
}

static void test_status_codes(void **state) {
  (void)state;
  static const struct {
    int code;
    const char *name;
  } codes[] = {
      {MLO_OK, "MLO_OK"},
      {MLO_EINVAL, "MLO_EINVAL"},
      {MLO_ENOMEM, "MLO_ENOMEM"},
      {MLO_ENOMEM_DEVICE, "MLO_ENOMEM_DEVICE"},
      {MLO_EBUSY, "MLO_EBUSY"},
      {MLO_ESTATE, "MLO_ESTATE"},
      {MLO_EUNSUPPORTED, "MLO_EUNSUPPORTED"},
      {MLO_EIO, "MLO_EIO"},
      {MLO_EFORMAT, "MLO_EFORMAT"},
      {MLO_ENOTFOUND, "MLO_ENOTFOUND"},
      {MLO_EEXIST, "MLO_EEXIST"},
      {MLO_EPLATFORM, "MLO_EPLATFORM"},
      {MLO_ENODEV, "MLO_ENODEV"},
      {MLO_EOWNED, "MLO_EOWNED"},
      {MLO_EDEADLK, "MLO_EDEADLK"},
      {MLO_ECALLBACK, "MLO_ECALLBACK"},
  };
  size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(mlo_err_name(codes[i].code), codes[i].name);
    const char *desc = mlo_strerror(codes[i].code);
    assert_non_null(desc);
    assert_true(strlen(desc) > 3);
    assert_string_not_equal(desc, "unknown error");
    for (size_t j = 0; j < i; j++) assert_string_not_equal(desc, mlo_strerror(codes[j].code));
  }
  assert_string_equal(mlo_strerror(-999), "unknown error");
  assert_string_equal(mlo_strerror(7), "unknown error");
  assert_non_null(mlo_err_name(-999));
  assert_string_equal(mlo_version(), "0.7.0"); /* the header's MLO_VERSION_* */
}

static void test_name_tables(void **state) {
  (void)state;
  const char *roles[] = {"dit", "encoder", "vae", "other"};
  for (int r = MLO_ROLE_DIT; r <= MLO_ROLE_OTHER; r++) {
    assert_string_equal(mlo_role_name((mlo_role)r), roles[r]);
    mlo_role back;
    assert_ok(mlo_role_from_name(roles[r], &back));
    assert_int_equal(back, r);
  }
  mlo_role role;
  assert_ok(mlo_role_from_name("DiT", &role));
  assert_int_equal(role, MLO_ROLE_DIT);
  assert_status(mlo_role_from_name("transformer", &role), MLO_EINVAL);
  assert_status(mlo_role_from_name("", &role), MLO_EINVAL);
  /* The unsafe mode is for tests only; parsing it may be refused. */
  for (int s = MLO_SYNC_EVENT; s <= MLO_SYNC_DEVICE; s++) {
    mlo_sync_mode back;
    assert_ok(mlo_sync_from_name(mlo_sync_name((mlo_sync_mode)s), &back));
    assert_int_equal(back, s);
  }
  mlo_sync_mode sync;
  assert_status(mlo_sync_from_name("sometimes", &sync), MLO_EINVAL);
  for (int d = 0; d < MLO_DTYPE_COUNT; d++) {
    const char *name = mlo_dtype_name((mlo_dtype)d);
    assert_non_null(name);
    mlo_dtype back;
    assert_ok(mlo_dtype_from_name(name, &back));
    assert_int_equal(back, d);
    assert_true(d >= MLO_DTYPE_FIRST_BLOCK ? mlo_dtype_block((mlo_dtype)d, NULL, NULL)
                                           : mlo_dtype_bits((mlo_dtype)d) > 0);
  }
  assert_null(mlo_dtype_name(MLO_DTYPE_COUNT));
  assert_int_equal(mlo_dtype_bits(MLO_DTYPE_COUNT), 0);
  assert_string_equal(mlo_dtype_name(MLO_DTYPE_BF16), "BF16");
  assert_int_equal(mlo_dtype_bits(MLO_DTYPE_F4), 4);
  assert_int_equal(mlo_dtype_bits(MLO_DTYPE_F6_E2M3), 6);
  uint64_t bytes = 0;
  assert_ok(mlo_dtype_nbytes(MLO_DTYPE_BF16, 10, &bytes));
  assert_int_equal(bytes, 20);
  assert_ok(mlo_dtype_nbytes(MLO_DTYPE_F4, 6, &bytes));
  assert_int_equal(bytes, 3);
  assert_status(mlo_dtype_nbytes(MLO_DTYPE_F4, 3, &bytes), MLO_EINVAL);
  assert_status(mlo_dtype_nbytes(MLO_DTYPE_F64, UINT64_MAX / 4, &bytes), MLO_EFORMAT);
  for (int r = MLO_RES_UNMATERIALIZED; r <= MLO_RES_DEVICE; r++) {
    const char *name = mlo_residency_name((mlo_residency)r);
    assert_true(name && name[0]);
    for (int q = MLO_RES_UNMATERIALIZED; q < r; q++)
      assert_string_not_equal(name, mlo_residency_name((mlo_residency)q));
  }
  assert_non_null(mlo_role_source_name(MLO_ROLE_FROM_HEURISTIC));
}

static void test_parse_size(void **state) {
  (void)state;
  static const struct {
    const char *text;
    uint64_t want;
  } good[] = {
      {"6G", 6ull << 30},     {"512M", 512ull << 20}, {"1.5GiB", 3ull << 29}, {"4096", 4096},
      {"8e9", 8000000000ull}, {"64K", 64ull << 10},   {"2T", 2ull << 40},     {"1", 1},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    uint64_t got = 0;
    int rc = mlo_parse_size(good[i].text, false, &got);
    if (rc || got != good[i].want)
      fail_msg("mlo_parse_size(\"%s\") = %s, %llu; want %llu", good[i].text, mlo_err_name(rc),
               (unsigned long long)got, (unsigned long long)good[i].want);
  }
  const char *junk[] = {
      "",    "abc", "12X",     "-5", "G", "1.5.2G", "0x10", "1e999", "99999999999999999999999",
      "nan", "inf", "4096junk"};
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    uint64_t got = 12345;
    int rc = mlo_parse_size(junk[i], true, &got);
    if (rc != MLO_EINVAL)
      fail_msg("mlo_parse_size(\"%s\") = %s, want MLO_EINVAL", junk[i], mlo_err_name(rc));
  }
  uint64_t got = 1;
  assert_status(mlo_parse_size("0", false, &got), MLO_EINVAL);
  assert_ok(mlo_parse_size("0", true, &got));
  assert_int_equal(got, 0);
  assert_status(mlo_parse_size(NULL, true, &got), MLO_EINVAL);
}

static void test_format_size(void **state) {
  (void)state;
  char buf[32];
  assert_string_equal(mlo_format_size(3ull << 29, buf, sizeof buf), "1.50 GiB");
  assert_string_equal(mlo_format_size(12ull << 20, buf, sizeof buf), "12.0 MiB");
  assert_string_equal(mlo_format_size(512, buf, sizeof buf), "512 B");
  assert_ptr_equal(mlo_format_size(0, buf, sizeof buf), buf);
  assert_true(strchr(buf, 'B') != NULL);
  /* A short buffer is truncated, still terminated. */
  char small[4];
  mlo_format_size(3ull << 29, small, sizeof small);
  assert_true(strlen(small) < sizeof small);
}

/* Names from files as a terminal may see them (base/log.h). */
static void test_escape(void **state) {
  (void)state;
  char b[64];
  assert_string_equal(mlo_escape("plain_name.weight", b, sizeof b), "plain_name.weight");
  assert_string_equal(mlo_escape("a\x1b[2Jb\x07", b, sizeof b), "a\\x1b[2Jb\\x07");
  assert_string_equal(mlo_escape("del\x7f", b, sizeof b), "del\\x7f");
  /* UTF-8 as it is; a C1 control (U+009B, CSI) and stray bytes escaped */
  assert_string_equal(mlo_escape("caf\xc3\xa9 \xe2\x86\x92", b, sizeof b),
                      "caf\xc3\xa9 \xe2\x86\x92");
  assert_string_equal(mlo_escape("x\xc2\x9by", b, sizeof b), "x\\u009by");
  assert_string_equal(mlo_escape("\xff\xc3", b, sizeof b), "\\xff\\xc3");
  /* not UTF-8 however it looks: an overlong CSI, a surrogate, past U+10FFFF */
  assert_string_equal(mlo_escape("\xe0\x82\x9b", b, sizeof b), "\\xe0\\x82\\x9b");
  assert_string_equal(mlo_escape("\xed\xa0\x80", b, sizeof b), "\\xed\\xa0\\x80");
  assert_string_equal(mlo_escape("\xf4\x90\x80\x80", b, sizeof b), "\\xf4\\x90\\x80\\x80");
  /* cut to fit, and saying so */
  char small[8];
  assert_string_equal(mlo_escape("abcdefghij", small, sizeof small), "abcd...");
  assert_string_equal(mlo_escape("\x1b\x1b\x1b", small, sizeof small), "\\x1b...");
  assert_string_equal(mlo_escape(NULL, b, sizeof b), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_is_noop), cmocka_unit_test(test_status_codes),
      cmocka_unit_test(test_name_tables),  cmocka_unit_test(test_parse_size),
      cmocka_unit_test(test_format_size),  cmocka_unit_test(test_escape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
