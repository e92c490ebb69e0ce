/*
 * nameset.c — the name index of nameset.h: FNV-1a mixed through splitmix,
 * linear probing, doubling when half full.
 */
#include "base/nameset.h"

#include "base/hash.h"
#include "base/sysio.h"
#include "mlo/mlo.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t slot_of(const char *key, size_t nslots) {
  return (size_t)mlo_mix64(mlo_fnv1a(MLO_FNV_BASIS, key, strlen(key))) & (nslots - 1);
}

static void insert(const char **keys, size_t *vals, size_t nslots, const char *key, size_t val) {
  size_t i = slot_of(key, nslots);
  while (keys[i]) i = (i + 1) & (nslots - 1);
  keys[i] = key;
  vals[i] = val;
}

int mlo_nameset_reserve(mlo_nameset *s, size_t more) {
  if ((s->count + more) * 2 <= s->nslots) return MLO_OK;
  size_t n = s->nslots ? s->nslots : 32;
  while ((s->count + more) * 2 > n) {
    if (n > SIZE_MAX / 4 / sizeof(size_t)) return MLO_ENOMEM;
    n *= 2;
  }
  const char **keys = mlo_calloc(n, sizeof *keys);
  size_t *vals = mlo_calloc(n, sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    return MLO_ENOMEM;
  }
  for (size_t i = 0; i < s->nslots; i++)
    if (s->keys[i]) insert(keys, vals, n, s->keys[i], s->vals[i]);
  free(s->keys);
  free(s->vals);
  s->keys = keys;
  s->vals = vals;
  s->nslots = n;
  return MLO_OK;
}

void mlo_nameset_put(mlo_nameset *s, const char *key, size_t val) {
  insert(s->keys, s->vals, s->nslots, key, val);
  s->count++;
}

bool mlo_nameset_get(const mlo_nameset *s, const char *key, size_t *val) {
  if (!s->nslots) return false;
  for (size_t i = slot_of(key, s->nslots);; i = (i + 1) & (s->nslots - 1)) {
    if (!s->keys[i]) return false;
    if (!strcmp(s->keys[i], key)) {
      if (val) *val = s->vals[i];
      return true;
    }
  }
}

void mlo_nameset_free(mlo_nameset *s) {
  free(s->keys);
  free(s->vals);
  memset(s, 0, sizeof *s);
}
