/*
 * args.c — flag parsing for every `mlo` command, so that each bad value is
 * refused the same way: one line naming the command and the flag, the
 * value quoted, a pointer to --help, and exit code 2.  Nothing here exits;
 * the command returns TOOL_EXIT_USAGE when targs.failed is set.
 */
#include "tool.h"

#include "base/log.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

char tool_last_error[1024];
bool tool_json_printed;

void tool_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tool_last_error, sizeof tool_last_error, fmt, ap);
  va_end(ap);
  fprintf(stderr, "mlo: %s\n", tool_esc(tool_last_error));
}

const char *tool_open_message(const char *path, const char *msg, int rc, char *out, size_t outlen) {
  if (msg[0] && !strncmp(msg, path, strlen(path))) /* the library named the path already */
    snprintf(out, outlen, "%s", msg);
  else
    snprintf(out, outlen, "cannot open %s: %s", path, msg[0] ? msg : mlo_strerror(rc));
  return out;
}

void tool_failf(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tool_last_error, sizeof tool_last_error, fmt, ap);
  va_end(ap);
  fprintf(stderr, "mlo %s: %s\n", cmd, tool_esc(tool_last_error));
}

int tool_print_json_text(char *text) {
  if (!text) return TOOL_EXIT_FAIL;
  puts(text);
  cJSON_free(text);
  tool_json_printed = true;
  return TOOL_EXIT_OK;
}

void tool_print_json_error(int code) {
  static const char *const names[] = {"ok", "verification_failed", "bad_input",
                                      "out_of_device_memory", "failure"};
  cJSON *o = cJSON_CreateObject();
  /* exit 3 for a host budget below what must stay in host memory says so */
  bool host = code == TOOL_EXIT_NOMEM && strstr(tool_last_error, "host budget ");
  cJSON_AddStringToObject(
      o, "error", host ? "host_budget_too_small" : names[code >= 0 && code <= 4 ? code : 4]);
  cJSON_AddNumberToObject(o, "code", code);
  cJSON_AddStringToObject(o, "message", tool_last_error[0] ? tool_last_error : "failed");
  tool_print_json_text(o ? cJSON_Print(o) : NULL);
  cJSON_Delete(o);
}

const char *tool_esc(const char *s) {
  /* rotating, as tool_size's: one printf may escape several names (the
   * tool prints from one thread; thread-local storage would be carved from
   * the stack of every thread the library starts) */
  static char bufs[8][2048];
  static unsigned next;
  char *b = bufs[next++ % 8];
  return mlo_escape(s, b, sizeof bufs[0]);
}

const char *tool_size(uint64_t bytes) {
  /* A few rotating buffers so one printf can format several sizes. */
  static char bufs[8][32];
  static unsigned next;
  char *b = bufs[next++ % 8];
  return mlo_format_size(bytes, b, sizeof bufs[0]);
}

int tool_exit_for(int status) {
  switch (status) {
  case MLO_OK:
    return TOOL_EXIT_OK;
  case MLO_ENOMEM_DEVICE:
    return TOOL_EXIT_NOMEM;
  case MLO_EINVAL:
  case MLO_EIO:
  case MLO_EFORMAT:
  case MLO_ENOTFOUND:
  case MLO_EEXIST:
  case MLO_ENODEV:
  case MLO_EUNSUPPORTED:
    return TOOL_EXIT_USAGE;
  default:
    return TOOL_EXIT_FAIL;
  }
}

void targs_init(targs *a, const char *cmd, int argc, char **argv) {
  a->cmd = cmd;
  a->argc = argc;
  a->argv = argv;
  a->i = 0; /* argv[0] is the command itself */
  a->failed = false;
}

bool targs_next(targs *a) {
  if (a->failed || a->i + 1 >= a->argc) return false;
  a->i++;
  return true;
}

const char *targs_cur(const targs *a) {
  return a->argv[a->i];
}

bool targs_is_help(const targs *a) {
  const char *s = targs_cur(a);
  return !strcmp(s, "--help") || !strcmp(s, "-h");
}

void targs_error(targs *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tool_last_error, sizeof tool_last_error, fmt, ap);
  va_end(ap);
  fprintf(stderr, "mlo %s: %s\nTry 'mlo %s --help'.\n", a->cmd, tool_esc(tool_last_error), a->cmd);
  a->failed = true;
}

bool targs_flag(targs *a, const char *name) {
  const char *s = targs_cur(a);
  size_t n = strlen(name);
  if (strncmp(s, name, n)) return false;
  if (s[n] == '\0') return true;
  if (s[n] == '=') {
    targs_error(a, "%s takes no value (got '%s')", name, s);
    return true;
  }
  return false;
}

bool targs_value(targs *a, const char *name, const char **val) {
  const char *s = targs_cur(a);
  size_t n = strlen(name);
  if (strncmp(s, name, n) || (s[n] != '\0' && s[n] != '=')) return false;
  *val = NULL;
  if (s[n] == '=') {
    *val = s + n + 1;
  } else if (a->i + 1 < a->argc) {
    *val = a->argv[++a->i];
  }
  if (!*val || !**val) {
    targs_error(a, "%s needs a value", name);
    *val = NULL;
  }
  return true;
}

void targs_unknown(targs *a) {
  /* the flags other tools use for what mlo calls otherwise */
  static const struct {
    const char *given, *hint;
  } hints[] = {
      {"--device", "--platform cuda[:N] (or opencl, host) picks the device; --device-memory "
                   "SIZE its memory"},
      {"--gpu", "--platform cuda[:N]"},
      {"--cuda", "--platform cuda[:N]"},
      {"--vram", "--device-memory SIZE"},
      {"--ram", "--host-memory SIZE"},
  };
  const char *cur = targs_cur(a);
  size_t n = strcspn(cur, "=");
  for (size_t i = 0; i < sizeof hints / sizeof *hints; i++)
    if (strlen(hints[i].given) == n && !strncmp(cur, hints[i].given, n)) {
      targs_error(a, "unknown option '%s': %s", cur, hints[i].hint);
      return;
    }
  targs_error(a, "unknown option '%s'", cur);
}

bool targs_int(targs *a, const char *flag, const char *val, long lo, long hi, long *out) {
  if (!val) return false;
  char *end = NULL;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (errno || end == val || *end || v < lo || v > hi) {
    targs_error(a, "%s: expected a whole number from %ld to %ld, got '%s'", flag, lo, hi, val);
    return false;
  }
  *out = v;
  return true;
}

bool targs_double(targs *a, const char *flag, const char *val, double lo, double hi, double *out) {
  if (!val) return false;
  char *end = NULL;
  errno = 0;
  double v = strtod(val, &end);
  /* decimal only: strtod also takes "0x10", "inf" and "nan" */
  bool decimal = val[strspn(val, "0123456789.eE+-")] == '\0';
  if (errno || end == val || *end || !decimal || !isfinite(v) || v < lo || v > hi) {
    targs_error(a, "%s: expected a number from %g to %g, got '%s'", flag, lo, hi, val);
    return false;
  }
  *out = v;
  return true;
}

bool targs_size(targs *a, const char *flag, const char *val, uint64_t *out) {
  if (!val) return false;
  if (mlo_parse_size(val, false, out) != MLO_OK) {
    targs_error(a, "%s: expected a size such as 512M, 6G or 1.5GiB, got '%s'", flag, val);
    return false;
  }
  return true;
}

bool targs_choice(targs *a, const char *flag, const char *val, const char *const *words, int *out) {
  if (!val) return false;
  for (int i = 0; words[i]; i++) {
    if (!strcmp(val, words[i])) {
      *out = i;
      return true;
    }
  }
  char list[256] = "";
  for (int i = 0; words[i]; i++) {
    size_t len = strlen(list);
    snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", words[i]);
  }
  targs_error(a, "%s: expected one of %s, got '%s'", flag, list, val);
  return false;
}

bool tool_platform_known(const char *spec, bool *indexed) {
  size_t len = strcspn(spec, ":");
  for (size_t i = 0; i < mlo_platform_count(); i++) {
    mlo_platform_info info = MLO_PLATFORM_INFO_INIT;
    if (mlo_platform_info_get(i, &info) || strlen(info.name) != len ||
        strncmp(spec, info.name, len))
      continue;
    if (indexed) *indexed = strstr(info.spec, "[:N]") != NULL;
    return true;
  }
  return false;
}

bool targs_platform(targs *a, const char *flag, const char *val) {
  if (!val) return false;
  if (tool_platform_known(val, NULL)) return true;
  /* the library's list: a platform this mlo does not know cannot be opened */
  char list[512] = "";
  for (size_t i = 0, used = 0; i < mlo_platform_count() && used < sizeof list; i++) {
    mlo_platform_info info = MLO_PLATFORM_INFO_INIT;
    if (mlo_platform_info_get(i, &info)) continue;
    int n = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", info.spec);
    if (n > 0) used += (size_t)n;
  }
  targs_error(a, "%s: expected one of %s, got '%s'", flag, list, val);
  return false;
}

bool targs_policy(targs *a, const char *flag, const char *val, int *out) {
  const char *words[MLO_POLICY_COUNT + 1] = {NULL}; /* the library's names, in enum order */
  for (int p = 0; p < MLO_POLICY_COUNT; p++) words[p] = mlo_policy_name((mlo_policy)p);
  return targs_choice(a, flag, val, words, out);
}

bool targs_role(targs *a, const char *val, mlo_role_override *list, size_t *count, size_t cap) {
  if (!val) return false;
  const char *eq = strchr(val, '=');
  mlo_role role;
  if (!eq || eq == val || mlo_role_from_name(eq + 1, &role) != MLO_OK || role == MLO_ROLE_AUTO) {
    targs_error(a, "--role: expected NAME=ROLE with ROLE one of dit, encoder, vae, other, got '%s'",
                val);
    return false;
  }
  if (*count >= cap) {
    targs_error(a, "--role: at most %zu overrides", cap);
    return false;
  }
  /* The name points into argv (lives as long as the process); cut it at '='
   * in a copy so argv stays as the user typed it. */
  size_t len = (size_t)(eq - val);
  char *name = malloc(len + 1);
  if (!name) {
    targs_error(a, "out of memory");
    return false;
  }
  memcpy(name, val, len);
  name[len] = '\0';
  list[*count].name = name;
  list[*count].role = role;
  (*count)++;
  return true;
}

void targs_free_roles(mlo_role_override *list, size_t count) {
  for (size_t i = 0; i < count; i++) free((char *)list[i].name);
}
