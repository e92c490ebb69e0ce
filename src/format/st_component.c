/*
 * st_component.c — declares a validated safetensors file's tensors in a
 * component as file ranges.  Kept apart from the reader so that the reader
 * (and the fuzz target built from it alone) depends on nothing in the core.
 */
#include "format/safetensors.h"

#include <stdio.h>

int mlo_st_add_to_component(const mlo_st_file *f, mlo_component *comp, unsigned flags, char *err,
                            size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!f || !comp) return MLO_EINVAL;
  /* f->tensors is sorted by offset: materialization then reads the file
   * front to back. */
  for (size_t i = 0; i < f->count; i++) {
    const mlo_st_tensor *st = &f->tensors[i];
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = st->name;
    d.dtype = st->dtype;
    d.ndim = st->ndim;
    for (int k = 0; k < st->ndim; k++) d.shape[k] = st->shape[k];
    d.flags = flags;
    d.file = f->path;
    d.file_offset = st->file_offset;
    mlo_tensor *t = NULL;
    int rc = mlo_tensor_add(comp, &d, &t);
    if (rc != MLO_OK) {
      if (err && errlen)
        snprintf(err, errlen, "%s: tensor '%s': cannot add to component '%s': %s (%s)", f->path,
                 st->name, mlo_component_name(comp), mlo_strerror(rc),
                 mlo_pipeline_errmsg(mlo_component_pipeline(comp)));
      return rc;
    }
  }
  /* The declared tensors recorded the file as it is now; if that is not the
   * file whose header was validated, it was swapped in between. */
  return mlo_file_id_recheck(f->path, &f->id, err, errlen);
}
