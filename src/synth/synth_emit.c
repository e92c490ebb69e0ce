/*
 * synth_emit.c — declaring tensors: the calls architecture code makes
 * (synth_vae.c, synth_presets.c) to say what a component holds, counted
 * or recorded by the emitter the generator (synth.c) hands them.  Below
 * all three: it calls none of them.
 */
#include "base/sysio.h"
#include "synth/synth_emit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mlo_dtype mlo_syn_dtype(const mlo_syn_emitter *e) {
  return e->dtype;
}

void mlo_syn_tensor(mlo_syn_emitter *e, mlo_dtype dtype, int ndim, const int64_t *shape,
                    const char *fmt, ...) {
  if (e->status != MLO_OK) return;
  uint64_t numel = 1, nbytes = 0;
  for (int i = 0; i < ndim; i++) numel *= (uint64_t)shape[i];
  if ((e->status = mlo_dtype_nbytes(dtype, numel, &nbytes)) != MLO_OK) return;
  e->bytes += nbytes;
  if (!e->record) return;
  if (e->count == e->cap) {
    size_t cap = e->cap ? 2 * e->cap : 256;
    mlo_syn_rec *grown = mlo_realloc(e->list, cap * sizeof *grown);
    if (!grown) {
      e->status = MLO_ENOMEM;
      return;
    }
    e->list = grown, e->cap = cap;
  }
  mlo_syn_rec *r = &e->list[e->count];
  memset(r, 0, sizeof *r);
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  if (!(r->name = mlo_strdup(name))) {
    e->status = MLO_ENOMEM;
    return;
  }
  r->dtype = dtype, r->ndim = ndim, r->nbytes = nbytes;
  memcpy(r->shape, shape, (size_t)ndim * sizeof *shape);
  e->count++;
}

void mlo_syn_lin(mlo_syn_emitter *e, mlo_dtype dt, int64_t out, int64_t in, bool bias,
                 const char *fmt, ...) {
  char prefix[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  T2(e, dt, out, in, "%s.weight", prefix);
  if (bias) T1(e, dt, out, "%s.bias", prefix);
}

void mlo_syn_emitter_free(mlo_syn_emitter *e) {
  for (size_t i = 0; i < e->count; i++) free(e->list[i].name);
  free(e->list);
  memset(e, 0, sizeof *e);
}
