/*
 * gguf_component.c — declares a validated GGUF file's tensors in a
 * component as file ranges, the GGUF twin of st_component.c.  Kept apart
 * from the reader so that the reader (and its fuzz target) depends on
 * nothing in the core.
 */
#include "format/declare.h"
#include "format/gguf.h"

int mlo_gguf_add_to_component(const mlo_gguf_file *f, mlo_component *comp, unsigned flags,
                              char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!f || !comp) return MLO_EINVAL;
  for (size_t i = 0; i < f->count; i++) { /* sorted by offset: read front to back */
    const mlo_gguf_tensor *g = &f->tensors[i];
    int rc = mlo_declare_file_tensor(comp, f->path, g->name, g->dtype, g->n_dims, g->shape,
                                     g->file_offset, flags, err, errlen);
    if (rc != MLO_OK) return rc;
  }
  return mlo_file_id_recheck(f->path, &f->id, err, errlen);
}
