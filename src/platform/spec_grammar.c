/*
 * spec_grammar.c — the platform spec's grammar for callers that read or
 * compose specs without opening them: "NAME[:N][:key=value,...]", the
 * index N for the platforms that take one (cuda, opencl: their shape in
 * the registry says "[:N]"), and "fault:...,inner=SPEC", whose options
 * belong to the platform inside.  The tool (its --device-memory, --ranks'
 * GPU per rank, --node's options) and mlo.torch (the CUDA stream it
 * orders loads on) used to split specs by hand, each its own way; they call
 * these now (issue 40).  The options themselves are each platform's
 * (platform_spec.c parses them at open).
 */
#include "mlo/mlo.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The platform a spec names: for a fault wrapper the one inside it
 * ("host" where it names none), and *head the wrapper's bytes before it
 * (the whole wrapper where it has no inner=). */
static const char *platform_of(const char *spec, size_t *head, bool *wrapped) {
  *wrapped = !strncmp(spec, "fault", 5) && (spec[5] == '\0' || spec[5] == ':');
  *head = 0;
  if (!*wrapped) return spec;
  const char *args = spec[5] ? spec + 6 : "";
  for (const char *p = args; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (!strncmp(p, "inner=", 6)) {
      *head = (size_t)(p + 6 - spec);
      return p[6] ? p + 6 : "host";
    }
  *head = strlen(spec);
  return "host";
}

/* Whether the platform named by s's first len bytes is known, and takes an
 * index. */
static bool known(const char *s, size_t len, bool *indexed) {
  for (size_t i = 0; i < mlo_platform_count(); i++) {
    mlo_platform_info info = MLO_PLATFORM_INFO_INIT;
    if (mlo_platform_info_get(i, &info) || strlen(info.name) != len || strncmp(s, info.name, len))
      continue;
    *indexed = strstr(info.spec, "[:N]") != NULL;
    return true;
  }
  return false;
}

/* s split: its name's length, the index given (-1: none) and its options
 * (after the name and index, "" where none). */
static int split(const char *s, size_t *name_len, bool *indexed, int *index, const char **opts) {
  *name_len = strcspn(s, ":");
  if (!*name_len || !known(s, *name_len, indexed)) return MLO_ENOTFOUND;
  const char *p = s[*name_len] ? s + *name_len + 1 : "";
  *index = -1;
  size_t digits = *indexed ? strspn(p, "0123456789") : 0;
  if (digits && (p[digits] == '\0' || p[digits] == ':')) {
    long v = digits <= 9 ? strtol(p, NULL, 10) : -1;
    if (v < 0 || v > INT_MAX) return MLO_EINVAL;
    *index = (int)v;
    p += digits + (p[digits] == ':');
  }
  *opts = p;
  while (*p) { /* key=value items, as platform_spec.c reads them (empty ones skipped) */
    size_t item = strcspn(p, ","), key = strcspn(p, "=,");
    if (item && (!key || key >= item || key + 1 == item)) return MLO_EINVAL;
    p += item + (p[item] == ',');
  }
  return MLO_OK;
}

int mlo_platform_spec_parts(const char *spec, char *name, size_t namelen, int *index) {
  if (!spec || !name || !namelen || !index) return MLO_EINVAL;
  size_t head, len;
  bool wrapped, indexed;
  const char *opts;
  name[0] = '\0';
  *index = -1;
  const char *s = platform_of(spec, &head, &wrapped);
  int rc = split(s, &len, &indexed, index, &opts);
  if (rc) return rc;
  if (len >= namelen) return MLO_EINVAL;
  memcpy(name, s, len);
  name[len] = '\0';
  return MLO_OK;
}

/* Whether the option item at p (item bytes, "key=value") is key's. */
static bool is_key(const char *p, size_t item, const char *key) {
  size_t klen = strlen(key);
  return item > klen && !strncmp(p, key, klen) && p[klen] == '=';
}

int mlo_platform_spec_get(const char *spec, const char *key, char *value, size_t len) {
  if (!spec || !key || !*key || !value || !len) return MLO_EINVAL;
  size_t head, name_len, klen = strlen(key);
  bool wrapped, indexed;
  int index;
  const char *opts;
  value[0] = '\0';
  int rc = split(platform_of(spec, &head, &wrapped), &name_len, &indexed, &index, &opts);
  if (rc) return rc;
  for (const char *p = opts; *p;) {
    size_t item = strcspn(p, ",");
    if (is_key(p, item, key)) {
      size_t vlen = item - klen - 1;
      if (vlen >= len) return MLO_EINVAL;
      memcpy(value, p + klen + 1, vlen);
      value[vlen] = '\0';
      return MLO_OK;
    }
    p += item + (p[item] == ',');
  }
  return MLO_ENOTFOUND;
}

/* Appends fmt's text at *n of out; false where out is full. */
static bool put(char *out, size_t outlen, size_t *n, const char *fmt, const char *s, size_t len) {
  int w = snprintf(out + *n, outlen - *n, fmt, (int)len, s);
  if (w < 0 || (size_t)w >= outlen - *n) return false;
  *n += (size_t)w;
  return true;
}

int mlo_platform_spec_compose(const char *spec, int index, const char *key, const char *value,
                              char *out, size_t outlen) {
  if (!spec || !out || !outlen || index < -1 || (key && (!*key || !value)) ||
      (key && (strpbrk(key, ",:=") || strchr(value, ','))))
    return MLO_EINVAL;
  out[0] = '\0';
  size_t head, name_len, n = 0;
  bool wrapped, indexed;
  int given;
  const char *opts, *s = platform_of(spec, &head, &wrapped);
  int rc = split(s, &name_len, &indexed, &given, &opts);
  if (rc) return rc;
  if (index >= 0 && !indexed) return MLO_EINVAL; /* host, sim: no index to set */
  bool ok = true;
  if (wrapped) /* the wrapper as given, then inner= the platform composed */
    ok = put(out, outlen, &n, "%.*s", spec, head) &&
         (spec[head - 1] == '=' ||
          put(out, outlen, &n, "%.*s", spec[5] ? (spec[6] ? ",inner=" : "inner=") : ":inner=", 16));
  ok = ok && put(out, outlen, &n, "%.*s", s, name_len);
  int at = index >= 0 ? index : given;
  char digits[16];
  snprintf(digits, sizeof digits, "%d", at);
  if (ok && at >= 0) ok = put(out, outlen, &n, ":%.*s", digits, strlen(digits));
  bool first = true;
  for (const char *p = opts; ok && *p;) {
    size_t item = strcspn(p, ",");
    bool replaced = key && is_key(p, item, key);
    if (item && !replaced) {
      ok = put(out, outlen, &n, first ? ":%.*s" : ",%.*s", p, item);
      first = false;
    }
    p += item + (p[item] == ',');
  }
  if (ok && key) {
    ok = put(out, outlen, &n, first ? ":%.*s=" : ",%.*s=", key, strlen(key)) &&
         put(out, outlen, &n, "%.*s", value, strlen(value));
  }
  if (!ok) {
    out[0] = '\0';
    return MLO_EINVAL;
  }
  return MLO_OK;
}
