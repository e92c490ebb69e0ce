/*
 * digest.c — what every back-end of the reference workload computes the
 * same way (workload.h): the digest's fold and the deterministic input.  Its
 * own file because the device back-ends are modules
 * (libmlo-workload-cuda.so, libmlo-workload-opencl.so) that compile it in,
 * beside the tool's copy: one source, so digests compare across platforms.
 */
#include "workload/workload.h"

#include "base/hash.h"

#include <stdint.h>

#define FOLD_PRIME 0x100000001b3ull

/* FNV-1a over 64-bit little-endian words (then the tail bytes): the same
 * mixing as byte-wise FNV-1a at eight times the speed, which matters when a
 * VAE's convolution weights are folded whole. */
uint64_t mlo_digest_fold(uint64_t digest, const void *bytes, size_t len) {
  const unsigned char *p = bytes;
  uint64_t h = digest;
  while (len >= 8) {
    uint64_t word = 0;
    for (int i = 7; i >= 0; i--) word = (word << 8) | p[i];
    h = (h ^ word) * FOLD_PRIME;
    p += 8;
    len -= 8;
  }
  return mlo_fnv1a(h, p, len); /* the tail, byte by byte */
}

float mlo_workload_input(uint64_t seed, int64_t t, int64_t k) {
  uint64_t h = mlo_mix64(mlo_mix64(seed) ^ mlo_mix64((uint64_t)t * 0x100000001ull + (uint64_t)k));
  /* 24 random bits to a float in [-1, 1): exact in f32, same everywhere. */
  return (float)(int32_t)((h >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}
