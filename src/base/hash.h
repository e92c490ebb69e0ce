/*
 * hash.h — the one 64-bit mixer the library uses wherever it needs
 * deterministic pseudo-random values: generated weights (synth), the
 * workload's input X, and the host platform's copy jitter.  One definition,
 * so every backend and generator agrees on the same values.
 */
#ifndef MLO_HASH_H
#define MLO_HASH_H

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

#endif
