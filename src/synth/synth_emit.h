/*
 * synth_emit.h — the emitter an architecture declares its tensors to
 * (synth_emit.c), as the generator (synth.c) sees it: counting bytes while
 * it scales a component, recording every tensor when it plans the files.
 * The preset tables see only synth.h's opaque handle and its calls.
 */
#ifndef MLO_SYNTH_SYNTH_EMIT_H
#define MLO_SYNTH_SYNTH_EMIT_H

#include "synth/synth.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One declared tensor, as recorded. */
typedef struct {
  char *name;
  mlo_dtype dtype;
  int ndim;
  int64_t shape[MLO_MAX_DIMS];
  uint64_t nbytes;
  int shard; /* the shard file it goes to (synth.c assigns it) */
} mlo_syn_rec;

struct mlo_syn_emitter {
  mlo_dtype dtype; /* the component's weight dtype (mlo_syn_dtype) */
  bool record;     /* keep every tensor in list; otherwise only count bytes */
  mlo_syn_rec *list;
  size_t count, cap;
  uint64_t bytes; /* of every tensor declared */
  int status;     /* the first error, sticky */
};

/* Frees what a recording emitter holds, and zeroes it. */
void mlo_syn_emitter_free(mlo_syn_emitter *e);

#endif
