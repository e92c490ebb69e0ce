/*
 * fuzz_gguf.c — libFuzzer target for the GGUF header reader.
 *
 * GGUF files come from anywhere (Hugging Face uploads, converted
 * checkpoints), so the reader's in-memory entry point must survive any
 * bytes without a crash, a leak or undefined behaviour; an accepted file
 * must also keep the promises the loader relies on (every tensor inside
 * the file, sizes that match types and shapes, no overlaps, unique names).
 */
#include "format/gguf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_accepted(const mlo_gguf_file *f, size_t size) {
  if (f->file_size != size || (f->count && f->data_start > size) || !f->alignment ||
      (f->alignment & (f->alignment - 1)))
    abort();
  uint64_t end = 0;
  for (size_t i = 0; i < f->count; i++) {
    const mlo_gguf_tensor *t = &f->tensors[i];
    uint64_t numel = 1, bytes;
    if (t->n_dims < 0 || t->n_dims > MLO_GGUF_MAX_DIMS) abort();
    for (int k = 0; k < t->n_dims; k++) {
      if (t->shape[t->n_dims - 1 - k] != (int64_t)t->ne[k]) abort();
      numel *= t->ne[k];
    }
    if (mlo_dtype_nbytes(t->dtype, numel, &bytes) != MLO_OK || bytes != t->nbytes) abort();
    if (t->offset % f->alignment || t->file_offset != f->data_start + t->offset) abort();
    if (t->file_offset + t->nbytes > size) abort();
    if (t->nbytes && i && t->offset < end) abort(); /* sorted, no overlap */
    if (t->nbytes) end = t->offset + t->nbytes;
    if (!t->name[0]) abort();
  }
  for (size_t i = 0; i < f->kv_count; i++)
    if (!f->kv[i].key || !f->kv[i].text) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1); /* exactly size bytes: ASan sees overreads */
  if (!copy) return 0;
  memcpy(copy, data, size);
  char err[512];
  mlo_gguf_file *f = NULL;
  if (mlo_gguf_parse("fuzz", copy, size, &f, err, sizeof err) == MLO_OK) {
    check_accepted(f, size);
    mlo_gguf_close(f);
  } else if (f || strncmp(err, "fuzz: ", 6) != 0) {
    abort(); /* a refusal leaves nothing and always says why */
  }
  free(copy);
  return 0;
}
