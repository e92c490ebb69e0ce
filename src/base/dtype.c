/*
 * dtype.c — the safetensors dtypes: names, widths and overflow-checked byte
 * sizes.  Every layer that sizes a tensor (the checkpoint reader, the
 * writer, the core's slab packing) goes through mlo_dtype_nbytes so that a
 * hostile shape can never wrap a size silently.
 */
#include "mlo/mlo.h"

#include <string.h>

static const struct {
  const char *name;
  unsigned bits;
} dtype_table[MLO_DTYPE_COUNT] = {
    [MLO_DTYPE_BOOL] = {"BOOL", 8},       [MLO_DTYPE_U8] = {"U8", 8},
    [MLO_DTYPE_I8] = {"I8", 8},           [MLO_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [MLO_DTYPE_F8_E4M3] = {"F8_E4M3", 8}, [MLO_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [MLO_DTYPE_I16] = {"I16", 16},        [MLO_DTYPE_U16] = {"U16", 16},
    [MLO_DTYPE_F16] = {"F16", 16},        [MLO_DTYPE_BF16] = {"BF16", 16},
    [MLO_DTYPE_I32] = {"I32", 32},        [MLO_DTYPE_U32] = {"U32", 32},
    [MLO_DTYPE_F32] = {"F32", 32},        [MLO_DTYPE_F64] = {"F64", 64},
    [MLO_DTYPE_I64] = {"I64", 64},        [MLO_DTYPE_U64] = {"U64", 64},
    [MLO_DTYPE_C64] = {"C64", 64},        [MLO_DTYPE_F4] = {"F4", 4},
    [MLO_DTYPE_F6_E2M3] = {"F6_E2M3", 6}, [MLO_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
};

static int dtype_valid(mlo_dtype dtype) {
  /* The enum may be signed or unsigned depending on the compiler; compare
   * through int so a hostile value such as -1 is rejected either way. */
  return (int)dtype >= 0 && (int)dtype < MLO_DTYPE_COUNT;
}

const char *mlo_dtype_name(mlo_dtype dtype) {
  return dtype_valid(dtype) ? dtype_table[dtype].name : NULL;
}

int mlo_dtype_from_name(const char *name, mlo_dtype *out) {
  if (!name || !out) return MLO_EINVAL;
  for (int i = 0; i < MLO_DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_table[i].name) == 0) {
      *out = (mlo_dtype)i;
      return MLO_OK;
    }
  }
  return MLO_EINVAL;
}

unsigned mlo_dtype_bits(mlo_dtype dtype) {
  return dtype_valid(dtype) ? dtype_table[dtype].bits : 0;
}

int mlo_dtype_nbytes(mlo_dtype dtype, uint64_t numel, uint64_t *bytes) {
  if (!bytes || !dtype_valid(dtype)) return MLO_EINVAL;
  uint64_t bits = dtype_table[dtype].bits;
  /* numel*bits may overflow although the byte count fits, so split numel
   * into whole groups of 8 elements (always whole bytes: 8*bits/8 = bits)
   * and a remainder whose bit count is tiny. */
  uint64_t tail_bits = (numel % 8) * bits;
  if (tail_bits % 8 != 0) return MLO_EINVAL;
  uint64_t whole;
  if (__builtin_mul_overflow(numel / 8, bits, &whole)) return MLO_EFORMAT;
  if (__builtin_add_overflow(whole, tail_bits / 8, bytes)) return MLO_EFORMAT;
  return MLO_OK;
}
