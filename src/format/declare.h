/*
 * declare.h — one place that turns a validated file's tensor into a
 * file-backed tensor of a component, for every reader (safetensors, GGUF),
 * with the one message a refusal gets.
 */
#ifndef MLO_FORMAT_DECLARE_H
#define MLO_FORMAT_DECLARE_H

#include "mlo/mlo.h"

#include <stddef.h>
#include <stdint.h>

/* Declares tensor `name` of file `path` (bytes at `offset`) in comp.  On
 * failure err gets "PATH: tensor 'NAME': cannot add to component 'C': why". */
int mlo_declare_file_tensor(mlo_component *comp, const char *path, const char *name,
                            mlo_dtype dtype, int ndim, const int64_t *shape, uint64_t offset,
                            unsigned flags, char *err, size_t errlen);

#endif
