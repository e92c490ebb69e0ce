/*
 * testutil.h — helpers shared by the test programs (cmocka).
 */
#ifndef MLO_TESTUTIL_H
#define MLO_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mlo/mlo.h"

/* Asserts a status is MLO_OK, printing the code's name if not. */
#define assert_ok(expr)                                                                 \
  do {                                                                                  \
    int rc_ = (expr);                                                                   \
    if (rc_ != MLO_OK) fail_msg("%s -> %s (%s)", #expr, mlo_err_name(rc_), mlo_strerror(rc_)); \
  } while (0)

#endif
