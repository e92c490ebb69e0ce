/*
 * platform_spec.c — parsing a platform spec's options ("key=value,..." and
 * "N:key=value,..."), for every platform's constructor: the built-in ones
 * (host.c, sim.c, fault.c) and, through the module host table, the CUDA
 * and OpenCL modules.  Calls nothing of the platform layer, so every
 * platform sits above it and the registry (registry.c) above them all.
 */
#include "base/sysio.h"
#include "platform/platform.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *msg, const char *what) {
  if (err && errlen) snprintf(err, errlen, "%s%s%s", msg, what ? ": " : "", what ? what : "");
}

int mlo_spec_parse_kv(const char *args, mlo_spec_kv_fn fn, void *user, char *err, size_t errlen) {
  if (!args || !*args) return MLO_OK;
  size_t len = strlen(args);
  char *copy = mlo_malloc(len + 1);
  if (!copy) return MLO_ENOMEM;
  memcpy(copy, args, len + 1);
  int rc = MLO_OK;
  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1]) {
      set_err(err, errlen, "expected key=value in platform options, got", item);
      rc = MLO_EINVAL;
      break;
    }
    *eq = '\0';
    rc = fn(item, eq + 1, user, err, errlen);
    if (rc) break;
  }
  free(copy);
  return rc;
}

int mlo_spec_parse_indexed(const char *name, const char *args, unsigned long max_index,
                           unsigned long *index, mlo_spec_kv_fn fn, void *user, char *err,
                           size_t errlen) {
  const char *colon = strchr(args, ':');
  size_t head_len = colon ? (size_t)(colon - args) : strlen(args);
  if (!head_len && !colon) return MLO_OK;
  if (memchr(args, '=', head_len) && !colon) return mlo_spec_parse_kv(args, fn, user, err, errlen);
  char *end = NULL;
  unsigned long n = strtoul(args, &end, 10);
  if (!head_len || args[0] < '0' || args[0] > '9' || end != args + head_len || n > max_index) {
    if (err && errlen)
      snprintf(err, errlen, "%s platform: bad device index '%.*s' in \"%s:%s\" (expected N)", name,
               (int)head_len, args, name, args);
    return MLO_EINVAL;
  }
  *index = n;
  return colon ? mlo_spec_parse_kv(colon + 1, fn, user, err, errlen) : MLO_OK;
}
