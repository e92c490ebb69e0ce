/*
 * readers.c — the table of readers.h over the safetensors reader
 * (safetensors.c, st_component.c) and the GGUF reader (gguf.c,
 * gguf_component.c).  GGUF is told by its magic; safetensors, which has
 * none (its first 8 bytes are a header length), takes what is left.
 */
#include "format/readers.h"

#include "format/gguf.h"
#include "format/safetensors.h"

static int st_open(const char *path, void **file, char *err, size_t errlen) {
  mlo_st_file *f = NULL;
  int rc = mlo_st_open(path, &f, err, errlen);
  *file = f;
  return rc;
}
static void st_close(void *file) {
  mlo_st_close(file);
}
static int st_add(const void *file, mlo_component *comp, unsigned flags, char *err, size_t errlen) {
  return mlo_st_add_to_component(file, comp, flags, err, errlen);
}
static void st_metadata(const void *file, mlo_meta_fn fn, void *user) {
  const mlo_st_file *f = file;
  for (size_t i = 0; i < f->meta_count; i++) fn(f->meta[i].key, f->meta[i].value, user);
}

static int gguf_open(const char *path, void **file, char *err, size_t errlen) {
  mlo_gguf_file *g = NULL;
  int rc = mlo_gguf_open(path, &g, err, errlen);
  *file = g;
  return rc;
}
static void gguf_close(void *file) {
  mlo_gguf_close(file);
}
static int gguf_add(const void *file, mlo_component *comp, unsigned flags, char *err,
                    size_t errlen) {
  return mlo_gguf_add_to_component(file, comp, flags, err, errlen);
}
static const char *gguf_architecture(const void *file) {
  return ((const mlo_gguf_file *)file)->architecture;
}
static void gguf_metadata(const void *file, mlo_meta_fn fn, void *user) {
  const mlo_gguf_file *g = file;
  for (size_t i = 0; i < g->kv_count; i++) fn(g->kv[i].key, g->kv[i].text, user);
}

static const struct mlo_reader gguf_reader = {
    .name = "gguf",
    .ext = ".gguf",
    .magic = mlo_gguf_magic,
    .open = gguf_open,
    .close = gguf_close,
    .add_to_component = gguf_add,
    .architecture = gguf_architecture,
    .metadata = gguf_metadata,
};

static const struct mlo_reader st_reader = {
    .name = "safetensors",
    .ext = ".safetensors",
    .magic = NULL,
    .open = st_open,
    .close = st_close,
    .add_to_component = st_add,
    .architecture = NULL,
    .metadata = st_metadata,
};

/* Formats with a magic first; the one without, last. */
const struct mlo_reader *const mlo_readers[] = {&gguf_reader, &st_reader};
const size_t mlo_nreaders = sizeof mlo_readers / sizeof mlo_readers[0];

const struct mlo_reader *mlo_reader_for(const uint8_t *magic, size_t len) {
  for (size_t i = 0; i < mlo_nreaders; i++)
    if (!mlo_readers[i]->magic || mlo_readers[i]->magic(magic, len)) return mlo_readers[i];
  return mlo_readers[mlo_nreaders - 1];
}
