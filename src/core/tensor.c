/*
 * tensor.c — a component's tensors: declaring them (descriptors checked,
 * names indexed, aliases), and reading them back (shape, dtype, where the
 * bytes are on the host and on the device).  Where a resident tensor's
 * device bytes are depends on residency (residency.c) and layout (slab.c),
 * which sit below it.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include "base/nameset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mlo_tensor_free(mlo_tensor *t) {
  if (!t) return;
  free(t->name);
  free(t->src_file);
  free(t);
}

/* Tensor names are found through the component's name index
 * (core/nameset.h): declaring n tensors costs O(n). */
static mlo_tensor *find_tensor_locked(const mlo_component *c, const char *name) {
  size_t i;
  return mlo_nameset_get(&c->names, name, &i) ? c->tensors[i] : NULL;
}

/* Makes room for one more tensor in the list and the name index; nothing
 * changes on failure. */
static int reserve_tensor(mlo_component *c) {
  if (c->ntensors == c->tcap) {
    size_t cap = c->tcap ? c->tcap * 2 : 16;
    mlo_tensor **grown = mlo_realloc(c->tensors, cap * sizeof *grown);
    if (!grown) return MLO_ENOMEM;
    c->tensors = grown;
    struct mlo_keyed *room = mlo_realloc(c->scratch, cap * sizeof *room);
    if (!room) return MLO_ENOMEM; /* the list grew, tcap did not: nothing else changed */
    c->scratch = room;
    c->tcap = cap;
  }
  return mlo_nameset_reserve(&c->names, 1);
}

static void append_tensor(mlo_component *c, mlo_tensor *t) {
  mlo_nameset_put(&c->names, t->name, c->ntensors);
  c->tensors[c->ntensors++] = t;
}

/* A component's device block may not pass this many bytes: far beyond any
 * device, and low enough that the layout's sums (each tensor aligned)
 * cannot wrap 64 bits. */
#define COMPONENT_MAX_BYTES (UINT64_C(1) << 62)

/* Adds t's bytes to the component's running bound on its block size:
 * MLO_EINVAL if the total would pass COMPONENT_MAX_BYTES. */
static int add_to_bound(mlo_component *c, const mlo_tensor *t) {
  uint64_t room = COMPONENT_MAX_BYTES - c->bytes_bound;
  uint64_t need = t->nbytes + c->pipe->alignment;
  if (t->nbytes > COMPONENT_MAX_BYTES || need > room)
    return mlo_fail(c->pipe, MLO_EINVAL,
                    "%s: tensor '%s' (%llu bytes) would take the component past %llu bytes",
                    c->name, t->name, (unsigned long long)t->nbytes,
                    (unsigned long long)COMPONENT_MAX_BYTES);
  c->bytes_bound += need;
  return MLO_OK;
}

static int check_desc(mlo_component *c, const mlo_tensor_desc *d, uint64_t *nbytes,
                      mlo_file_id *id) {
  mlo_pipeline *pipe = c->pipe;
  const char *cn = c->name;
  if (d->size < sizeof(mlo_tensor_desc)) return mlo_fail(pipe, MLO_EINVAL, "tensor desc size");
  if (!d->name || !*d->name) return mlo_fail(pipe, MLO_EINVAL, "%s: tensor name is empty", cn);
  if (!mlo_dtype_name(d->dtype))
    return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': invalid dtype", cn, d->name);
  if (d->ndim < 0 || d->ndim > MLO_MAX_DIMS)
    return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': %d dimensions (0..%d allowed)", cn, d->name,
                    d->ndim, MLO_MAX_DIMS);
  uint64_t numel = 1;
  for (int i = 0; i < d->ndim; i++) {
    if (d->shape[i] < 0)
      return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': dimension %d is negative (%lld)", cn,
                      d->name, i, (long long)d->shape[i]);
    if (d->shape[i] && numel > UINT64_MAX / (uint64_t)d->shape[i])
      return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': shape overflows 64 bits", cn, d->name);
    numel *= (uint64_t)d->shape[i];
  }
  int rc = mlo_dtype_nbytes(d->dtype, numel, nbytes);
  if (rc)
    return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': %llu elements of %s are not whole bytes",
                    cn, d->name, (unsigned long long)numel, mlo_dtype_name(d->dtype));
  bool external = d->flags & (MLO_TENSOR_EXTERNAL | MLO_TENSOR_SHARDED);
  if (d->data && d->file)
    return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': both data and file given", cn, d->name);
  if (external && !d->data && *nbytes)
    return mlo_fail(pipe, MLO_EINVAL, "%s: tensor '%s': external tensors need their host data", cn,
                    d->name);
  if (d->file) {
    struct stat st;
    if (stat(d->file, &st) != 0)
      return mlo_fail(pipe, MLO_EIO, "%s: tensor '%s': cannot stat '%s'", cn, d->name, d->file);
    if (!S_ISREG(st.st_mode))
      return mlo_fail(pipe, MLO_EIO, "%s: tensor '%s': '%s' is not a regular file", cn, d->name,
                      d->file);
    mlo_file_id_from_stat(&st, id);
    uint64_t size = (uint64_t)st.st_size;
    if (d->file_offset > size || *nbytes > size - d->file_offset)
      return mlo_fail(pipe, MLO_EFORMAT,
                      "%s: tensor '%s': bytes [%llu, +%llu) lie past the end of '%s' (%llu bytes)",
                      cn, d->name, (unsigned long long)d->file_offset, (unsigned long long)*nbytes,
                      d->file, (unsigned long long)size);
  }
  return MLO_OK;
}

int mlo_tensor_add(mlo_component *c, const mlo_tensor_desc *d, mlo_tensor **out) {
  if (out) *out = NULL;
  if (!c || !d) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  uint64_t nbytes = 0;
  mlo_file_id id = {0};
  int rc = check_desc(c, d, &nbytes, &id);
  if (rc) return rc;
  mlo_tensor *t = mlo_calloc(1, sizeof *t);
  if (!t || !(t->name = mlo_strdup(d->name)) || (d->file && !(t->src_file = mlo_strdup(d->file)))) {
    mlo_tensor_free(t);
    return mlo_fail(pipe, MLO_ENOMEM, "out of host memory adding tensor '%s'", d->name);
  }
  t->comp = c;
  mlo_block_key_of(t->name, &t->bkey);
  t->dtype = d->dtype;
  t->ndim = d->ndim;
  memcpy(t->shape, d->shape, sizeof t->shape);
  t->nbytes = nbytes;
  t->flags = d->flags;
  if (t->flags & MLO_TENSOR_SHARDED) t->flags |= MLO_TENSOR_EXTERNAL;
  t->src_data = d->data;
  t->src_offset = d->file_offset;
  t->src_id = id;
  if (t->flags & MLO_TENSOR_EXTERNAL) t->host = (void *)d->data;
  rc = mlo_lock_both(pipe);
  if (rc) {
    mlo_tensor_free(t);
    return rc;
  }
  if (c->materialized)
    rc = mlo_fail(pipe, MLO_ESTATE, "%s: cannot add tensor '%s' after materialization", c->name,
                  d->name);
  else if (find_tensor_locked(c, d->name))
    rc = mlo_fail(pipe, MLO_EEXIST, "%s: tensor '%s' already exists", c->name, d->name);
  else if (reserve_tensor(c))
    rc = mlo_fail(pipe, MLO_ENOMEM, "out of host memory adding tensor '%s'", d->name);
  else
    rc = add_to_bound(c, t);
  if (!rc) {
    append_tensor(c, t);
    c->own_count++;
    if (t->flags & MLO_TENSOR_MUTABLE) c->has_mutable = true;
  }
  mlo_unlock_both(pipe);
  if (rc) {
    mlo_tensor_free(t);
    return rc;
  }
  if (out) *out = t;
  return MLO_OK;
}

int mlo_tensor_add_alias(mlo_component *c, const char *name, mlo_tensor *target) {
  if (!c || !target) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  if (!name || !*name) return mlo_fail(pipe, MLO_EINVAL, "%s: alias name is empty", c->name);
  if (target->comp->pipe != pipe)
    return mlo_fail(pipe, MLO_EINVAL, "%s: alias '%s' targets another pipeline", c->name, name);
  while (target->target) target = target->target;
  mlo_tensor *t = mlo_calloc(1, sizeof *t);
  if (!t || !(t->name = mlo_strdup(name))) {
    mlo_tensor_free(t);
    return mlo_fail(pipe, MLO_ENOMEM, "out of host memory adding alias '%s'", name);
  }
  t->comp = c;
  t->target = target;
  t->dtype = target->dtype;
  t->ndim = target->ndim;
  memcpy(t->shape, target->shape, sizeof t->shape);
  t->nbytes = target->nbytes;
  t->flags = target->flags;
  int rc = mlo_lock_both(pipe);
  if (rc) {
    mlo_tensor_free(t);
    return rc;
  }
  if (c->materialized && target->comp == c)
    rc = mlo_fail(pipe, MLO_ESTATE, "%s: cannot add alias '%s' after materialization", c->name,
                  name);
  else if (find_tensor_locked(c, name))
    rc = mlo_fail(pipe, MLO_EEXIST, "%s: tensor '%s' already exists", c->name, name);
  else if (reserve_tensor(c))
    rc = mlo_fail(pipe, MLO_ENOMEM, "out of host memory adding alias '%s'", name);
  else
    append_tensor(c, t);
  mlo_unlock_both(pipe);
  if (rc) mlo_tensor_free(t);
  return rc;
}

size_t mlo_component_tensor_count(const mlo_component *c) {
  if (!c) return 0;
  MLO_LOCK_OR(&c->pipe->lock, 0);
  size_t n = c->ntensors;
  pthread_mutex_unlock(&c->pipe->lock);
  return n;
}

mlo_tensor *mlo_component_tensor_at(const mlo_component *c, size_t index) {
  if (!c) return NULL;
  MLO_LOCK_OR(&c->pipe->lock, NULL);
  mlo_tensor *t = index < c->ntensors ? c->tensors[index] : NULL;
  pthread_mutex_unlock(&c->pipe->lock);
  return t;
}

mlo_tensor *mlo_component_find_tensor(const mlo_component *c, const char *name) {
  if (!c || !name) return NULL;
  MLO_LOCK_OR(&c->pipe->lock, NULL);
  mlo_tensor *t = find_tensor_locked(c, name);
  pthread_mutex_unlock(&c->pipe->lock);
  return t;
}

/* The bytes a load moves: the device block's layout (slab.c), known before
 * materialization. */
uint64_t mlo_component_bytes(const mlo_component *c) {
  if (!c) return 0;
  MLO_LOCK_OR(&c->pipe->lock, 0);
  uint64_t total = mlo_comp_bytes(c);
  pthread_mutex_unlock(&c->pipe->lock);
  return total;
}

uint64_t mlo_component_tensor_bytes(const mlo_component *c) {
  if (!c) return 0;
  MLO_LOCK_OR(&c->pipe->lock, 0);
  uint64_t total = 0;
  for (size_t i = 0; i < c->ntensors; i++)
    if (!c->tensors[i]->target) total += c->tensors[i]->nbytes; /* aliases share storage */
  pthread_mutex_unlock(&c->pipe->lock);
  return total;
}

const char *mlo_tensor_file(const mlo_tensor *t, uint64_t *offset) {
  if (t && t->target) t = t->target;
  if (!t || !t->src_file) return NULL;
  if (offset) *offset = t->src_offset;
  return t->src_file;
}

const char *mlo_tensor_name(const mlo_tensor *t) {
  return t ? t->name : "";
}
mlo_dtype mlo_tensor_dtype(const mlo_tensor *t) {
  return t ? t->dtype : MLO_DTYPE_COUNT;
}
int mlo_tensor_ndim(const mlo_tensor *t) {
  return t ? t->ndim : 0;
}
const int64_t *mlo_tensor_shape(const mlo_tensor *t) {
  return t ? t->shape : NULL;
}
uint64_t mlo_tensor_nbytes(const mlo_tensor *t) {
  return t ? t->nbytes : 0;
}
unsigned mlo_tensor_flags(const mlo_tensor *t) {
  return t ? t->flags : 0;
}

mlo_component *mlo_tensor_owner(const mlo_tensor *t) {
  if (!t) return NULL;
  return t->target ? t->target->comp : t->comp;
}

const void *mlo_tensor_host_data(const mlo_tensor *t) {
  if (!t) return NULL;
  const mlo_tensor *own = t->target ? t->target : t;
  mlo_pipeline *pipe = own->comp->pipe;
  MLO_LOCK_OR(&pipe->lock, NULL);
  mlo_res_finish_writeback(own->comp); /* a pending write-back lands first */
  const void *host = own->host;
  pthread_mutex_unlock(&pipe->lock);
  return host;
}

int mlo_tensor_device(const mlo_tensor *t, void **block, size_t *offset) {
  if (!t) return MLO_EINVAL;
  const mlo_tensor *own = t->target ? t->target : t;
  mlo_component *owner = own->comp;
  MLO_LOCK_OR(&owner->pipe->lock, mlo_reentered(owner->pipe));
  int rc = MLO_OK;
  bool sliced = owner->shard_bytes || owner->shard_offset;
  if (!mlo_res_is_resident(owner) || (!owner->block && own->nbytes)) {
    rc = MLO_ESTATE;
  } else if (own->block >= 0 && mlo_join_gone(owner, own->block)) {
    rc = mlo_fail(owner->pipe, MLO_ESTATE,
                  "tensor '%s' of '%s': its block's memory went to '%s', which the schedule "
                  "calls next",
                  own->name, owner->name, mlo_join_target(owner)->name);
  } else if (sliced && (own->dev_offset < owner->shard_offset ||
                        own->dev_offset + own->nbytes > owner->shard_offset + owner->shard_bytes)) {
    rc = mlo_fail(owner->pipe, MLO_ESTATE,
                  "tensor '%s' of '%s' is not in this rank's shard (bytes %llu..%llu of the "
                  "component): the caller gathers it",
                  own->name, owner->name, (unsigned long long)owner->shard_offset,
                  (unsigned long long)(owner->shard_offset + owner->shard_bytes));
  } else {
    void *handle = NULL;
    size_t local = 0;
    uint64_t at = owner->placed ? own->place : own->dev_offset - owner->shard_offset;
    if (owner->stream) rc = mlo_stream_tensor_offset(owner, own, &at);
    if (!rc) mlo_plat_resolve(mlo_dev_plat(owner), owner->block, (size_t)at, &handle, &local);
    if (block) *block = handle;
    if (offset) *offset = local;
  }
  pthread_mutex_unlock(&owner->pipe->lock);
  return rc;
}

int mlo_component_shard(mlo_component *c, void **block, uint64_t *offset, uint64_t *bytes) {
  if (!c) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  int rc = MLO_OK;
  if (!mlo_res_is_resident(c)) {
    rc = MLO_ESTATE;
  } else if (c->join && mlo_join_source(c) == c) {
    rc = mlo_fail(c->pipe, MLO_ESTATE,
                  "'%s': its block is going to '%s', which the schedule calls next (a joined "
                  "switch): ask for one tensor's address (mlo_tensor_device)",
                  c->name, mlo_join_target(c)->name);
  } else if (c->stream || c->placed) {
    rc = mlo_fail(c->pipe, MLO_EUNSUPPORTED,
                  "'%s' %s: its device block is not its layout (use mlo_tensor_device%s)", c->name,
                  c->stream            ? "streams its blocks"
                  : mlo_prog_sliced(c) ? "was loaded sharded block by block (each piece padded)"
                                       : "was loaded by a joined switch",
                  c->stream ? " between mlo_block_begin and mlo_block_end" : "");
  } else {
    bool sliced = c->shard_bytes || c->shard_offset;
    if (block) *block = c->block;
    if (offset) *offset = sliced ? c->shard_offset : 0;
    if (bytes) *bytes = sliced ? c->shard_bytes : c->block_bytes;
  }
  pthread_mutex_unlock(&c->pipe->lock);
  return rc;
}

void *mlo_tensor_device_ptr(const mlo_tensor *t) {
  void *block = NULL;
  size_t offset = 0;
  if (!t || !mlo_dev_plat(t->comp)->caps.device_pointers) return NULL;
  if (mlo_tensor_device(t, &block, &offset)) return NULL;
  return (char *)block + offset;
}

void mlo_pipeline_set_progress(mlo_pipeline *pipe, mlo_progress_fn fn, void *user) {
  if (!pipe) return;
  MLO_LOCK_OR_VOID(&pipe->lock);
  pipe->progress = fn;
  pipe->progress_user = user;
  pthread_mutex_unlock(&pipe->lock);
}

void mlo_pipeline_set_trace(mlo_pipeline *pipe, mlo_trace_fn fn, void *user) {
  if (!pipe) return;
  MLO_LOCK_OR_VOID(&pipe->lock);
  /* the platform's completion stamps serve traces: wanted while one is on */
  int delta = (fn != NULL) - (pipe->trace != NULL);
  pipe->trace = fn;
  pipe->trace_user = user;
  pthread_mutex_unlock(&pipe->lock);
  for (size_t d = 0; d < pipe->ndevs && delta; d++)
    mlo_plat_want_stamps(pipe->devs[d].platform, delta);
}
