/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors header reader.
 *
 * Every checkpoint is hostile input, so the reader's in-memory entry point
 * (the same validation as mlo_st_open) must survive any bytes without a
 * crash, a leak or undefined behaviour.  Accepted files are also checked
 * for the promises the rest of the library relies on, so a validation gap
 * shows up as a crash here rather than as a bad read later.
 */
#include "format/safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The invariants of an accepted file (docs/formats.md). */
static void check_accepted(const mlo_st_file *f, size_t size) {
  uint64_t pos = 0;
  if (f->data_start > size || f->file_size != size) abort();
  for (size_t i = 0; i < f->count; i++) {
    const mlo_st_tensor *t = &f->tensors[i];
    uint64_t numel = 1, bytes;
    for (int k = 0; k < t->ndim; k++) {
      if (t->shape[k] < 0) abort();
      numel *= (uint64_t)t->shape[k];
    }
    if (t->ndim < 0 || t->ndim > MLO_MAX_DIMS) abort();
    if (mlo_dtype_nbytes(t->dtype, numel, &bytes) != MLO_OK) abort();
    if (t->begin != pos || t->end - t->begin != bytes) abort();
    if (t->file_offset != f->data_start + t->begin) abort();
    if (mlo_st_find(f, t->name) != t) abort(); /* names are unique */
    pos = t->end;
  }
  if (f->data_start + pos != size) abort();
  for (size_t i = 0; i < f->meta_count; i++)
    if (!f->meta[i].key || !f->meta[i].value) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* a copy of exactly size bytes, so ASan catches any read past the end */
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  char err[512];
  mlo_st_file *f = NULL;
  int rc = mlo_st_parse("fuzz", copy, size, &f, err, sizeof err);
  if (rc == MLO_OK) {
    check_accepted(f, size);
    mlo_st_close(f);
  } else if (f != NULL || err[0] == '\0' || strncmp(err, "fuzz: ", 6) != 0) {
    abort(); /* a refusal leaves nothing and always says why, naming the file */
  }
  free(copy);
  return 0;
}
