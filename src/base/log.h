/*
 * log.h — the library's internal logging (one line per notable event).
 * Routed to the callback set with mlo_set_log, or to stderr; the level
 * comes from MLO_LOG (debug|info|warn|error|off, default warn).
 */
#ifndef MLO_LOG_H
#define MLO_LOG_H

#include "mlo/mlo.h"

#include <stddef.h>

#if defined(__GNUC__)
#define MLO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MLO_PRINTF(a, b)
#endif

void mlo_logf(mlo_log_level level, const char *fmt, ...) MLO_PRINTF(2, 3);
/* Formats a message into a caller's error buffer (either may be NULL/0)
 * and returns status: the one way the file layers report failures. */
int mlo_errf(char *err, size_t errlen, int status, const char *fmt, ...) MLO_PRINTF(4, 5);

/* s as a terminal may be shown it (as ls and git show names): C0 controls
 * and DEL as \xNN, C1 controls as \u00NN, bytes that are not UTF-8 as
 * \xNN, the rest as it is; cut with "..." to fit len.  Returns buf. */
char *mlo_escape(const char *s, char *buf, size_t len);

/* True if a message at this level would be emitted (skip costly formatting). */
bool mlo_log_enabled(mlo_log_level level);

#endif
