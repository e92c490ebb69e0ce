/*
 * st_component.c — declares a validated safetensors file's tensors in a
 * component as file ranges (and mlo_declare_file_tensor, which the GGUF
 * reader's twin uses too).  Kept apart from the reader so that the reader
 * (and the fuzz target built from it alone) depends on nothing in the core.
 */
#include "format/declare.h"
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
    int rc = mlo_declare_file_tensor(comp, f->path, st->name, st->dtype, st->ndim, st->shape,
                                     st->file_offset, flags, err, errlen);
    if (rc != MLO_OK) return rc;
  }
  /* The declared tensors recorded the file as it is now; if that is not the
   * file whose header was validated, it was swapped in between. */
  return mlo_file_id_recheck(f->path, &f->id, err, errlen);
}

int mlo_declare_file_tensor(mlo_component *comp, const char *path, const char *name,
                            mlo_dtype dtype, int ndim, const int64_t *shape, uint64_t offset,
                            unsigned flags, char *err, size_t errlen) {
  mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
  d.name = name;
  d.dtype = dtype;
  d.ndim = ndim;
  for (int k = 0; k < ndim && k < MLO_MAX_DIMS; k++) d.shape[k] = shape[k];
  d.flags = flags;
  d.file = path;
  d.file_offset = offset;
  int rc = mlo_tensor_add(comp, &d, NULL);
  if (rc != MLO_OK && err && errlen)
    snprintf(err, errlen, "%s: tensor '%s': cannot add to component '%s': %s (%s)", path, name,
             mlo_component_name(comp), mlo_strerror(rc),
             mlo_pipeline_errmsg(mlo_component_pipeline(comp)));
  return rc;
}
