/*
 * dtype.c — the safetensors dtypes and GGML's block types: names, widths
 * and overflow-checked byte sizes.  Every layer that sizes a tensor (the checkpoint reader, the
 * writer, the core's slab packing) goes through mlo_dtype_nbytes so that a
 * hostile shape can never wrap a size silently.
 */
#include "mlo/mlo.h"

#include <string.h>

static const struct {
  const char *name;
  unsigned bits;                     /* 0 for block types */
  uint32_t block_elems, block_bytes; /* block types only */
} dtype_table[MLO_DTYPE_COUNT] = {
#define PLAIN(name, bits)                                                                          \
  { name, bits, 0, 0 }
#define BLOCK(name, elems, bytes)                                                                  \
  { name, 0, elems, bytes }
    [MLO_DTYPE_BOOL] = PLAIN("BOOL", 8),
    [MLO_DTYPE_U8] = PLAIN("U8", 8),
    [MLO_DTYPE_I8] = PLAIN("I8", 8),
    [MLO_DTYPE_F8_E5M2] = PLAIN("F8_E5M2", 8),
    [MLO_DTYPE_F8_E4M3] = PLAIN("F8_E4M3", 8),
    [MLO_DTYPE_F8_E8M0] = PLAIN("F8_E8M0", 8),
    [MLO_DTYPE_I16] = PLAIN("I16", 16),
    [MLO_DTYPE_U16] = PLAIN("U16", 16),
    [MLO_DTYPE_F16] = PLAIN("F16", 16),
    [MLO_DTYPE_BF16] = PLAIN("BF16", 16),
    [MLO_DTYPE_I32] = PLAIN("I32", 32),
    [MLO_DTYPE_U32] = PLAIN("U32", 32),
    [MLO_DTYPE_F32] = PLAIN("F32", 32),
    [MLO_DTYPE_F64] = PLAIN("F64", 64),
    [MLO_DTYPE_I64] = PLAIN("I64", 64),
    [MLO_DTYPE_U64] = PLAIN("U64", 64),
    [MLO_DTYPE_C64] = PLAIN("C64", 64),
    [MLO_DTYPE_F4] = PLAIN("F4", 4),
    [MLO_DTYPE_F6_E2M3] = PLAIN("F6_E2M3", 6),
    [MLO_DTYPE_F6_E3M2] = PLAIN("F6_E3M2", 6),
    /* GGML's block layouts (ggml-common.h; the gguf package's
     * GGML_QUANT_SIZES, which tests/format/gguf_crosscheck.py compares). */
    [MLO_DTYPE_Q4_0] = BLOCK("Q4_0", 32, 18),
    [MLO_DTYPE_Q4_1] = BLOCK("Q4_1", 32, 20),
    [MLO_DTYPE_Q5_0] = BLOCK("Q5_0", 32, 22),
    [MLO_DTYPE_Q5_1] = BLOCK("Q5_1", 32, 24),
    [MLO_DTYPE_Q8_0] = BLOCK("Q8_0", 32, 34),
    [MLO_DTYPE_Q8_1] = BLOCK("Q8_1", 32, 40),
    [MLO_DTYPE_Q2_K] = BLOCK("Q2_K", 256, 84),
    [MLO_DTYPE_Q3_K] = BLOCK("Q3_K", 256, 110),
    [MLO_DTYPE_Q4_K] = BLOCK("Q4_K", 256, 144),
    [MLO_DTYPE_Q5_K] = BLOCK("Q5_K", 256, 176),
    [MLO_DTYPE_Q6_K] = BLOCK("Q6_K", 256, 210),
    [MLO_DTYPE_Q8_K] = BLOCK("Q8_K", 256, 292),
    [MLO_DTYPE_IQ2_XXS] = BLOCK("IQ2_XXS", 256, 66),
    [MLO_DTYPE_IQ2_XS] = BLOCK("IQ2_XS", 256, 74),
    [MLO_DTYPE_IQ3_XXS] = BLOCK("IQ3_XXS", 256, 98),
    [MLO_DTYPE_IQ1_S] = BLOCK("IQ1_S", 256, 50),
    [MLO_DTYPE_IQ4_NL] = BLOCK("IQ4_NL", 32, 18),
    [MLO_DTYPE_IQ3_S] = BLOCK("IQ3_S", 256, 110),
    [MLO_DTYPE_IQ2_S] = BLOCK("IQ2_S", 256, 82),
    [MLO_DTYPE_IQ4_XS] = BLOCK("IQ4_XS", 256, 136),
    [MLO_DTYPE_IQ1_M] = BLOCK("IQ1_M", 256, 56),
    [MLO_DTYPE_TQ1_0] = BLOCK("TQ1_0", 256, 54),
    [MLO_DTYPE_TQ2_0] = BLOCK("TQ2_0", 256, 66),
    [MLO_DTYPE_MXFP4] = BLOCK("MXFP4", 32, 17),
    [MLO_DTYPE_NVFP4] = BLOCK("NVFP4", 64, 36),
    [MLO_DTYPE_Q1_0] = BLOCK("Q1_0", 128, 18),
#undef PLAIN
#undef BLOCK
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

bool mlo_dtype_block(mlo_dtype dtype, uint32_t *elems, uint32_t *bytes) {
  if (!dtype_valid(dtype) || !dtype_table[dtype].block_elems) return false;
  if (elems) *elems = dtype_table[dtype].block_elems;
  if (bytes) *bytes = dtype_table[dtype].block_bytes;
  return true;
}

int mlo_dtype_nbytes(mlo_dtype dtype, uint64_t numel, uint64_t *bytes) {
  if (!bytes || !dtype_valid(dtype)) return MLO_EINVAL;
  uint32_t block_elems, block_bytes;
  if (mlo_dtype_block(dtype, &block_elems, &block_bytes)) {
    if (numel % block_elems) return MLO_EINVAL;
    if (__builtin_mul_overflow(numel / block_elems, (uint64_t)block_bytes, bytes))
      return MLO_EFORMAT;
    return MLO_OK;
  }
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
