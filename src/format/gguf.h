/*
 * gguf.h — internal API of the GGUF reader (stable-diffusion.cpp and
 * ComfyUI-GGUF keep DiTs and text encoders in GGUF files).
 *
 * Like the safetensors reader it treats the file as hostile: the header
 * (magic, version, counts, every metadata key-value and every tensor info)
 * is validated completely, every count, length and offset overflow-checked
 * against the file's size, before a tensor is exposed; each violation is
 * its own message naming the file, the byte offset and the key or tensor.
 * Tensor data is never read here: mlo_gguf_add_to_component declares each
 * tensor as a file range.  Block-quantized tensors keep their GGML type
 * (MLO_DTYPE_Q4_K, ...) and are moved as the opaque bytes they are.
 */
#ifndef MLO_GGUF_H
#define MLO_GGUF_H

#include "base/sysio.h"
#include "mlo/mlo.h"

#include <stddef.h>
#include <stdint.h>

#define MLO_GGUF_HEADER_CAP (512u * 1024u * 1024u) /* metadata + tensor infos */
#define MLO_GGUF_MAX_DIMS 4                        /* GGML_MAX_DIMS */
#define MLO_GGUF_NAME_CAP 4096u                    /* bytes in a tensor name */
#define MLO_GGUF_KEY_CAP 65535u                    /* bytes in a metadata key */
#define MLO_GGUF_ARRAY_DEPTH 4                     /* arrays of arrays of ... */

typedef struct {
  char *name;
  uint32_t ggml_type; /* the file's type id */
  mlo_dtype dtype;    /* the same type as mlo names it */
  int n_dims;
  uint64_t ne[MLO_GGUF_MAX_DIMS];   /* GGUF order: ne[0] is the innermost */
  int64_t shape[MLO_GGUF_MAX_DIMS]; /* row-major (ne reversed), as mlo declares it */
  uint64_t offset;                  /* relative to the data section */
  uint64_t nbytes;
  uint64_t file_offset; /* absolute */
} mlo_gguf_tensor;

typedef struct {
  char *key;
  uint32_t type; /* GGUF value type (0..12) */
  char *text;    /* the value rendered for people (arrays abridged) */
} mlo_gguf_kv;

typedef struct {
  char *path;
  uint64_t file_size;
  uint32_t version;
  uint64_t alignment;  /* general.alignment, or 32 */
  uint64_t data_start; /* the aligned end of the tensor infos */
  size_t count;
  mlo_gguf_tensor *tensors; /* sorted by offset */
  size_t kv_count;
  mlo_gguf_kv *kv;    /* in file order */
  char *architecture; /* general.architecture, or NULL */
  mlo_file_id id;     /* the file that was validated (mlo_gguf_open only) */
} mlo_gguf_file;

/* Reads and validates a file's header.  err gets "FILE: what is wrong"
 * (MLO_EIO, MLO_EFORMAT, MLO_ENOMEM). */
int mlo_gguf_open(const char *path, mlo_gguf_file **out, char *err, size_t errlen);
/* The same over bytes in memory (the fuzz target's entry point); len is
 * the whole file. */
int mlo_gguf_parse(const char *name, const uint8_t *bytes, size_t len, mlo_gguf_file **out,
                   char *err, size_t errlen);
void mlo_gguf_close(mlo_gguf_file *f);
/* True when the first bytes of a file are GGUF's magic. */
bool mlo_gguf_magic(const uint8_t *bytes, size_t len);
/* The mlo dtype of a GGML type id; false for an unknown id. */
bool mlo_gguf_type_dtype(uint32_t ggml_type, mlo_dtype *out);

/* Declares every tensor of f in comp as a file-backed tensor (no data read
 * now); flags are added to each. */
int mlo_gguf_add_to_component(const mlo_gguf_file *f, mlo_component *comp, unsigned flags,
                              char *err, size_t errlen);

#endif
