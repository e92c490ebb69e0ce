/*
 * hash.h — the one 64-bit mixer the library uses wherever it needs
 * deterministic pseudo-random values: generated weights (synth), the
 * workload's input X, and the host platform's copy jitter; and the one byte
 * hash (FNV-1a).  One definition of each, so every backend and generator
 * agrees on the same values.
 */
#ifndef MLO_HASH_H
#define MLO_HASH_H

#include <stddef.h>
#include <stdint.h>

#define MLO_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* splitmix64's output function of x + golden gamma: a cheap, well-mixed
 * hash of one 64-bit value. */
static inline uint64_t mlo_mix64(uint64_t x) {
  uint64_t z = x + MLO_GOLDEN_GAMMA;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* 64-bit FNV-1a over n bytes, continuing from h (start at MLO_FNV_BASIS):
 * the byte hash of name slots and of what ranks must agree on. */
#define MLO_FNV_BASIS 0xcbf29ce484222325ull
static inline uint64_t mlo_fnv1a(uint64_t h, const void *bytes, size_t n) {
  const unsigned char *p = (const unsigned char *)bytes;
  while (n--) h = (h ^ *p++) * 0x100000001b3ull;
  return h;
}

#endif
