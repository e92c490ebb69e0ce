/*
 * test_ratio_note.c — the note `mlo run --verify` prints beside a ratio
 * against all resident (tools/mlo/ratio_note.c, issue 43): a ratio below
 * 1.00 is called noise in the same line, with the baseline's own spread
 * over its steady prompts when there are two or more, else with the advice
 * to measure a steady state; a ratio of 1.00 or more gets no note.  A real
 * run cannot be made faster than all resident on purpose, so the wording
 * is checked here with the figures given.
 */
#include "testutil.h"

#include "ratio_note.h"

#include <string.h>

static void test_at_or_above_one_has_no_note(void **state) {
  (void)state;
  const double walls[] = {0.5, 0.10, 0.11, 0.12};
  const double ratios[] = {1.0, 0.996, 1.7, 0.0};
  for (size_t i = 0; i < sizeof ratios / sizeof ratios[0]; i++) {
    ratio_note n = ratio_note_make(ratios[i], walls, 4);
    assert_false(n.noise);
    char buf[256] = "x";
    ratio_note_text(&n, buf, sizeof buf);
    assert_string_equal(buf, "");
  }
}

static void test_below_one_with_spread(void **state) {
  (void)state;
  /* the cold prompt (0.5 s) is not part of the spread */
  const double walls[] = {0.5, 0.12, 0.10, 0.11};
  ratio_note n = ratio_note_make(0.56, walls, 4);
  assert_true(n.noise);
  assert_true(n.spread_known);
  assert_true(n.lo_s == 0.10 && n.hi_s == 0.12);
  assert_true(n.spread > 0.199 && n.spread < 0.201);
  char buf[256];
  ratio_note_text(&n, buf, sizeof buf);
  assert_non_null(strstr(buf, "below 1.00 is noise"));
  assert_non_null(strstr(buf, "same compute plus copies"));
  assert_non_null(strstr(buf, "0.100-0.120 s, 20% apart"));
  assert_null(strstr(buf, "--prompts"));
}

static void test_below_one_single_measurement(void **state) {
  (void)state;
  const double one[] = {0.5}, two[] = {0.5, 0.1};
  ratio_note n1 = ratio_note_make(0.92, one, 1), n2 = ratio_note_make(0.92, two, 2);
  const ratio_note *ns[] = {&n1, &n2};
  for (int i = 0; i < 2; i++) {
    assert_true(ns[i]->noise);
    assert_false(ns[i]->spread_known);
    char buf[256];
    ratio_note_text(ns[i], buf, sizeof buf);
    assert_non_null(strstr(buf, "below 1.00 is noise"));
    assert_non_null(strstr(buf, "one measurement cannot tell"));
    assert_non_null(strstr(buf, "--prompts 4 gives a steady state"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_at_or_above_one_has_no_note),
      cmocka_unit_test(test_below_one_with_spread),
      cmocka_unit_test(test_below_one_single_measurement),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
