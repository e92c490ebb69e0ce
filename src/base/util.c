/*
 * util.c — the small shared pieces of the public API: version, status
 * codes, logging, the clock, sizes in human units, and the names of roles,
 * sync modes and residency states.
 */
#include "base/log.h"
#include "base/sysio.h"
#include "base/utf8.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MLO_STR2(x) #x
#define MLO_STR(x) MLO_STR2(x)
const char *mlo_version(void) {
  return MLO_STR(MLO_VERSION_MAJOR) "." MLO_STR(MLO_VERSION_MINOR) "." MLO_STR(MLO_VERSION_PATCH);
}

static const struct {
  int code;
  const char *name, *text;
} status_table[] = {
    {MLO_OK, "MLO_OK", "success"},
    {MLO_EINVAL, "MLO_EINVAL", "invalid argument"},
    {MLO_ENOMEM, "MLO_ENOMEM", "host out of memory"},
    {MLO_ENOMEM_DEVICE, "MLO_ENOMEM_DEVICE", "device out of memory"},
    {MLO_EBUSY, "MLO_EBUSY", "component busy"},
    {MLO_ESTATE, "MLO_ESTATE", "not valid in the current state"},
    {MLO_EUNSUPPORTED, "MLO_EUNSUPPORTED", "unsupported"},
    {MLO_EIO, "MLO_EIO", "input/output error"},
    {MLO_EFORMAT, "MLO_EFORMAT", "malformed file"},
    {MLO_ENOTFOUND, "MLO_ENOTFOUND", "not found"},
    {MLO_EEXIST, "MLO_EEXIST", "name already exists"},
    {MLO_EPLATFORM, "MLO_EPLATFORM", "device API error"},
    {MLO_ENODEV, "MLO_ENODEV", "no such device"},
    {MLO_EOWNED, "MLO_EOWNED", "another offload strategy owns the pipeline"},
    {MLO_EDEADLK, "MLO_EDEADLK", "calling thread holds a conflicting component"},
    {MLO_ECALLBACK, "MLO_ECALLBACK", "callback failed"},
};

const char *mlo_strerror(int status) {
  for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
    if (status_table[i].code == status) return status_table[i].text;
  return "unknown error";
}

const char *mlo_err_name(int status) {
  for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
    if (status_table[i].code == status) return status_table[i].name;
  return "MLO_E?";
}

/* ---- logging ---------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static mlo_log_fn log_fn;
static void *log_user;
static int log_min = -1; /* -1: not read from MLO_LOG yet */

static int log_level_from_env(void) {
  const char *v = getenv("MLO_LOG");
  if (!v || !*v) return MLO_LOG_WARN;
  static const char *names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 5; i++)
    if (!strcasecmp(v, names[i])) return i;
  fprintf(stderr, "mlo: warning: MLO_LOG=%s is not one of debug|info|warn|error|off; using warn\n",
          v);
  return MLO_LOG_WARN;
}

void mlo_set_log(mlo_log_fn fn, void *user, mlo_log_level min_level) {
  pthread_mutex_lock(&log_lock);
  log_fn = fn;
  log_user = user;
  log_min = (int)min_level;
  pthread_mutex_unlock(&log_lock);
}

bool mlo_log_enabled(mlo_log_level level) {
  pthread_mutex_lock(&log_lock);
  if (log_min < 0) log_min = log_level_from_env();
  bool on = (int)level >= log_min && level != MLO_LOG_OFF;
  pthread_mutex_unlock(&log_lock);
  return on;
}

void mlo_logf(mlo_log_level level, const char *fmt, ...) {
  if (!mlo_log_enabled(level)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  static const char *tags[] = {"debug", "info", "warning", "error", "off"};
  /* The callback runs outside log_lock, so it may call mlo_set_log or any
   * mlo function that logs; a message logged from inside the callback
   * itself goes to stderr instead of recursing. */
  static _Thread_local int in_callback;
  pthread_mutex_lock(&log_lock);
  mlo_log_fn fn = log_fn;
  void *user = log_user;
  pthread_mutex_unlock(&log_lock);
  if (fn && !in_callback) {
    in_callback++;
    fn(level, msg, user);
    in_callback--;
  } else { /* a terminal: names read from files may carry escapes */
    char safe[4096];
    fprintf(stderr, "mlo: %s: %s\n", tags[level], mlo_escape(msg, safe, sizeof safe));
  }
}

char *mlo_escape(const char *s, char *buf, size_t len) {
  if (!buf || !len) return buf;
  size_t o = 0;
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  const unsigned char *end = p + strlen((const char *)p);
  while (*p) {
    char piece[8];
    size_t take = 1;
    if (*p < 0x20 || *p == 0x7F) {
      snprintf(piece, sizeof piece, "\\x%02x", *p);
    } else if (*p < 0x80) {
      piece[0] = (char)*p, piece[1] = '\0';
    } else if ((take = mlo_utf8_seq_len(p, (size_t)(end - p))) == 0) {
      take = 1; /* not UTF-8 (overlong forms included): the byte, shown */
      snprintf(piece, sizeof piece, "\\x%02x", *p);
    } else if (take == 2 && p[0] == 0xC2 && p[1] < 0xA0) { /* a C1 control, U+0080..U+009F */
      snprintf(piece, sizeof piece, "\\u%04x", (unsigned)(p[1] & 0x3F) | 0x80u);
    } else {
      memcpy(piece, p, take);
      piece[take] = '\0';
    }
    size_t n = strlen(piece);
    if (o + n + 1 > len) { /* cut: say so where there is room */
      if (len >= 4)
        memcpy(buf + (o + 4 <= len ? o : len - 4), "...", 4);
      else
        buf[o < len ? o : len - 1] = '\0';
      return buf;
    }
    memcpy(buf + o, piece, n);
    o += n;
    p += take;
  }
  buf[o] = '\0';
  return buf;
}

int mlo_errf(char *err, size_t errlen, int status, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return status;
}

uint64_t mlo_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void mlo_sleep_until_ns(uint64_t deadline) {
  struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

/* ---- sizes ------------------------------------------------------------ */

int mlo_parse_size(const char *text, bool allow_zero, uint64_t *out) {
  if (!text || !out) return MLO_EINVAL;
  const char *s = text;
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s) && *s != '.') return MLO_EINVAL;
  if (strpbrk(s, "xXpP")) return MLO_EINVAL; /* strtod would take hex floats */
  errno = 0;
  char *end = NULL;
  double value = strtod(s, &end);
  if (errno || end == s || !isfinite(value) || value < 0) return MLO_EINVAL;
  double mult = 1;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    mult = 1024.0;
    end++;
    break;
  case 'M':
    mult = 1024.0 * 1024;
    end++;
    break;
  case 'G':
    mult = 1024.0 * 1024 * 1024;
    end++;
    break;
  case 'T':
    mult = 1024.0 * 1024 * 1024 * 1024;
    end++;
    break;
  default:
    break;
  }
  if (mult > 1 && (!strcasecmp(end, "iB") || !strcasecmp(end, "B")))
    end += strlen(end);
  else if (mult == 1 && (*end == 'B' || *end == 'b') && end[1] == '\0')
    end++;
  while (isspace((unsigned char)*end)) end++;
  if (*end) return MLO_EINVAL;
  double bytes = value * mult;
  if (bytes >= 18446744073709551615.0) return MLO_EINVAL;
  uint64_t result = (uint64_t)(bytes + 0.5);
  if (!allow_zero && result == 0) return MLO_EINVAL;
  *out = result;
  return MLO_OK;
}

char *mlo_format_size(uint64_t bytes, char *buf, size_t buflen) {
  static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (!buf || !buflen) return buf;
  if (bytes < 1024) {
    snprintf(buf, buflen, "%llu B", (unsigned long long)bytes);
    return buf;
  }
  double v = (double)bytes / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, buflen, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

/* ---- names ------------------------------------------------------------ */

static const char *role_names[] = {"dit", "encoder", "vae", "other", "auto"};

const char *mlo_role_name(mlo_role role) {
  return (unsigned)role <= MLO_ROLE_AUTO ? role_names[role] : "invalid";
}

int mlo_role_from_name(const char *name, mlo_role *out) {
  if (!name || !out) return MLO_EINVAL;
  for (int i = 0; i < 4; i++)
    if (!strcasecmp(name, role_names[i])) {
      *out = (mlo_role)i;
      return MLO_OK;
    }
  return MLO_EINVAL;
}

const char *mlo_role_source_name(mlo_role_source source) {
  switch (source) {
  case MLO_ROLE_FROM_DECLARATION:
    return "declared";
  case MLO_ROLE_FROM_OVERRIDE:
    return "override";
  case MLO_ROLE_FROM_HEURISTIC:
    return "name heuristic";
  case MLO_ROLE_FROM_CLASS:
    return "class name";
  }
  return "invalid";
}

const char *mlo_sync_name(mlo_sync_mode mode) {
  switch (mode) {
  case MLO_SYNC_EVENT:
    return "event";
  case MLO_SYNC_DEVICE:
    return "device";
  case MLO_SYNC_UNSAFE_NONE:
    return "unsafe-none";
  }
  return "invalid";
}

int mlo_sync_from_name(const char *name, mlo_sync_mode *out) {
  if (!name || !out) return MLO_EINVAL;
  if (!strcasecmp(name, "event"))
    *out = MLO_SYNC_EVENT;
  else if (!strcasecmp(name, "device"))
    *out = MLO_SYNC_DEVICE;
  else
    return MLO_EINVAL;
  return MLO_OK;
}

const char *mlo_residency_name(mlo_residency r) {
  switch (r) {
  case MLO_RES_UNMATERIALIZED:
    return "declared";
  case MLO_RES_HOST:
    return "host";
  case MLO_RES_LOADING:
    return "loading";
  case MLO_RES_DEVICE:
    return "device";
  }
  return "invalid";
}
