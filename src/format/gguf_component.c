/*
 * gguf_component.c — declares a validated GGUF file's tensors in a
 * component as file ranges, the GGUF twin of st_component.c.  Kept apart
 * from the reader so that the reader (and its fuzz target) depends on
 * nothing in the core.
 */
#include "format/gguf.h"

#include <stdio.h>

int mlo_gguf_add_to_component(const mlo_gguf_file *f, mlo_component *comp, unsigned flags,
                              char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!f || !comp) return MLO_EINVAL;
  for (size_t i = 0; i < f->count; i++) { /* sorted by offset: read front to back */
    const mlo_gguf_tensor *g = &f->tensors[i];
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = g->name;
    d.dtype = g->dtype;
    d.ndim = g->n_dims;
    for (int k = 0; k < g->n_dims; k++) d.shape[k] = g->shape[k];
    d.flags = flags;
    d.file = f->path;
    d.file_offset = g->file_offset;
    int rc = mlo_tensor_add(comp, &d, NULL);
    if (rc != MLO_OK) {
      if (err && errlen)
        snprintf(err, errlen, "%s: tensor '%s': cannot add to component '%s': %s (%s)", f->path,
                 g->name, mlo_component_name(comp), mlo_strerror(rc),
                 mlo_pipeline_errmsg(mlo_component_pipeline(comp)));
      return rc;
    }
  }
  return mlo_file_id_recheck(f->path, &f->id, err, errlen);
}
