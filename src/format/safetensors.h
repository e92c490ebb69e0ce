/*
 * safetensors.h — internal API of the safetensors reader and writer.
 *
 * The reader treats every file as hostile (docs/formats.md): the header
 * is validated completely before any tensor is exposed, each violation is
 * its own error naming the file and the tensor.  It never maps or copies
 * the data section; mlo_st_add_to_component declares each tensor as a file
 * range so that materialization reads it once, straight into the slab.
 */
#ifndef MLO_SAFETENSORS_H
#define MLO_SAFETENSORS_H

#include "base/sysio.h"
#include "mlo/mlo.h"

#include <stddef.h>
#include <stdint.h>

#define MLO_ST_HEADER_CAP (100u * 1000u * 1000u) /* bytes of JSON header */

typedef struct {
  char *name;
  mlo_dtype dtype;
  int ndim;
  int64_t shape[MLO_MAX_DIMS];
  uint64_t begin, end;  /* offsets relative to the data section */
  uint64_t file_offset; /* absolute offset of the first byte in the file */
} mlo_st_tensor;

typedef struct {
  char *key, *value;
} mlo_st_meta;

typedef struct {
  char *path; /* as given (for messages) */
  uint64_t file_size;
  uint64_t data_start; /* 8 + header length */
  size_t count;
  mlo_st_tensor *tensors; /* sorted by begin offset */
  size_t meta_count;
  mlo_st_meta *meta; /* the __metadata__ string map, in file order */
  mlo_file_id id;    /* the file that was validated (mlo_st_open only) */
} mlo_st_file;

/* Reads and validates the header of a file.  err gets "FILE: tensor 'X':
 * what is wrong" on failure (MLO_EIO, MLO_EFORMAT, MLO_ENOMEM). */
int mlo_st_open(const char *path, mlo_st_file **out, char *err, size_t errlen);
/* Same validation over bytes in memory (the fuzz target's entry point);
 * `name` is used in messages; len is the whole file's size. */
int mlo_st_parse(const char *name, const uint8_t *bytes, size_t len, mlo_st_file **out, char *err,
                 size_t errlen);
void mlo_st_close(mlo_st_file *f);
/* The offset of the first byte of s that is not valid UTF-8 (or is NUL),
 * len if none: the rule the reader applies to headers, shared with the
 * writer so that it never writes a file the reader would refuse. */
size_t mlo_st_utf8_bad_offset(const uint8_t *s, size_t len);
const mlo_st_tensor *mlo_st_find(const mlo_st_file *f, const char *name);

/* Declares every tensor of f in comp as a file-backed tensor (no data read
 * now).  flags are added to each tensor. */
int mlo_st_add_to_component(const mlo_st_file *f, mlo_component *comp, unsigned flags, char *err,
                            size_t errlen);

/* Writer: collects tensors, then writes a reference-compatible file whose
 * data section is aligned (header padded with spaces to a multiple of 8). */
typedef struct mlo_st_writer mlo_st_writer;
int mlo_st_writer_create(mlo_st_writer **out);
/* data is copied when copy is true, else must live until write/free. */
int mlo_st_writer_add(mlo_st_writer *w, const char *name, mlo_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, uint64_t nbytes, bool copy);
/* Tensors whose bytes are produced on demand (generated checkpoints of many
 * GiB): fill(buf, offset, len, user) writes len bytes of the tensor
 * starting at offset. */
typedef void (*mlo_st_fill_fn)(void *buf, uint64_t offset, size_t len, void *user);
int mlo_st_writer_add_generated(mlo_st_writer *w, const char *name, mlo_dtype dtype, int ndim,
                                const int64_t *shape, mlo_st_fill_fn fill, void *user);
int mlo_st_writer_set_metadata(mlo_st_writer *w, const char *key, const char *value);
/* Writes atomically (a temporary file renamed into place). */
int mlo_st_writer_write(mlo_st_writer *w, const char *path, char *err, size_t errlen);
void mlo_st_writer_free(mlo_st_writer *w);

#endif
