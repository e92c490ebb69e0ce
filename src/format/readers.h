/*
 * readers.h — the weight-file formats mlo reads, as one table: what a file
 * of each starts with, how to open it, declare its tensors in a component,
 * and list its metadata.  pipeline_dir.c (a single file as a component) and
 * `mlo inspect` (a file's metadata) loop over it instead of each branching
 * on safetensors-or-GGUF; a third format is one more row.
 */
#ifndef MLO_FORMAT_READERS_H
#define MLO_FORMAT_READERS_H

#include "mlo/mlo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void (*mlo_meta_fn)(const char *key, const char *value, void *user);

struct mlo_reader {
  const char *name; /* "safetensors", "gguf" */
  const char *ext;  /* the file name's usual ending, ".gguf" */
  /* Whether a file starting with these bytes is this format; NULL: the
   * format of a file no other reader claims (safetensors has no magic). */
  bool (*magic)(const uint8_t *bytes, size_t len);
  int (*open)(const char *path, void **file, char *err, size_t errlen);
  void (*close)(void *file);
  /* Declares every tensor of the file in comp (files, offsets, dtypes). */
  int (*add_to_component)(const void *file, mlo_component *comp, unsigned flags, char *err,
                          size_t errlen);
  /* What model the file says it holds (GGUF's general.architecture), or
   * NULL: a hint for the role when the file's name says nothing. */
  const char *(*architecture)(const void *file);
  /* Each metadata entry as text (safetensors' __metadata__, GGUF's keys). */
  void (*metadata)(const void *file, mlo_meta_fn fn, void *user);
};

extern const struct mlo_reader *const mlo_readers[];
extern const size_t mlo_nreaders;

/* The reader for a file that starts with these bytes (at least 4 when the
 * file has them). */
const struct mlo_reader *mlo_reader_for(const uint8_t *magic, size_t len);

#endif
