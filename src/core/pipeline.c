/*
 * pipeline.c — building a pipeline in code: the pipeline handle, its
 * components and their tensors (declaration only; storage is slab.c's and
 * residency is residency.c's), plus the read-only accessors and counters.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include "base/nameset.h"

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int mlo_fail(mlo_pipeline *pipe, int status, const char *fmt, ...) {
  if (pipe) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pipe->errmsg, sizeof pipe->errmsg, fmt, ap);
    va_end(ap);
  }
  return status;
}

int mlo_reentered(mlo_pipeline *pipe) {
  return mlo_fail(pipe, MLO_EDEADLK,
                  "called from inside a callback that holds this pipeline's lock (trace, log, "
                  "progress or delegate callbacks must not call these functions; see mlo.h)");
}

void mlo_log_reentry(const char *func) {
  mlo_logf(MLO_LOG_ERROR, "%s: called from inside a callback of the same pipeline; refused", func);
}

int mlo_lock_both(mlo_pipeline *pipe) {
  if (pthread_mutex_lock(&pipe->setup_lock)) return mlo_reentered(pipe);
  if (pthread_mutex_lock(&pipe->lock)) {
    pthread_mutex_unlock(&pipe->setup_lock);
    return mlo_reentered(pipe);
  }
  return MLO_OK;
}

void mlo_unlock_both(mlo_pipeline *pipe) {
  pthread_mutex_unlock(&pipe->lock);
  pthread_mutex_unlock(&pipe->setup_lock);
}

static void init_checked_mutex(pthread_mutex_t *m) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
  pthread_mutex_init(m, &attr);
  pthread_mutexattr_destroy(&attr);
}

int mlo_pipeline_create(const mlo_pipeline_options *opts, mlo_pipeline **out) {
  if (!out) return MLO_EINVAL;
  *out = NULL;
  /* 0.2's options end before comm; their callers get no communicator */
  size_t v02 = offsetof(mlo_pipeline_options, comm);
  if (!opts || opts->size < v02 || !opts->platform) return MLO_EINVAL;
  size_t align = opts->slab_alignment ? opts->slab_alignment : 256;
  if (align & (align - 1) || align > (1u << 20)) return MLO_EINVAL;
  bool v03 = opts->size >= sizeof(mlo_pipeline_options);
  mlo_comm *comm = v03 ? opts->comm : NULL;
  bool sharded = v03 && opts->sharded_loads;
  bool shard_resident = v03 && opts->shard_resident;
  if ((sharded && !comm) || (shard_resident && !sharded)) return MLO_EINVAL;
  /* A sharded load gathers into the block: on the host through MPI (the
   * block is host memory); elsewhere through the platform's device-side
   * all-gather (CUDA: NCCL, given with mlo_comm_set_nccl). */
  if (sharded && !shard_resident && !opts->platform->caps.host_addressable &&
      !(mlo_plat_has_all_gather(opts->platform) && mlo_dist_nccl(comm)))
    return MLO_EUNSUPPORTED;
  mlo_pipeline *pipe = mlo_calloc(1, sizeof *pipe);
  if (!pipe) return MLO_ENOMEM;
  pipe->platform = opts->platform;
  pipe->pin_host = opts->pin_host;
  pipe->alignment = align;
  pipe->comm = comm;
  pipe->sharded = sharded;
  pipe->shard_resident = shard_resident;
  pipe->dist = (mlo_dist_stats)MLO_DIST_STATS_INIT;
  if (comm) {
    pipe->dist.rank = mlo_comm_rank(comm);
    pipe->dist.ranks = mlo_comm_size(comm);
    pipe->dist.node_rank = mlo_comm_node_rank(comm);
    pipe->dist.node_ranks = mlo_comm_node_size(comm);
  }
  init_checked_mutex(&pipe->lock);
  init_checked_mutex(&pipe->setup_lock);
  pthread_cond_init(&pipe->idle, NULL);
  *out = pipe;
  return MLO_OK;
}

static void tensor_free(mlo_tensor *t) {
  if (!t) return;
  free(t->name);
  free(t->src_file);
  free(t);
}

void mlo_pipeline_free(mlo_pipeline *pipe) {
  if (!pipe) return;
  mlo_offload_disable(pipe);
  MLO_LOCK_OR_VOID(&pipe->lock);
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    if (mlo_res_is_resident(c) && mlo_res_evict(c)) mlo_res_drop(c); /* write-back failed */
    mlo_res_finish_writeback(c);
  }
  /* Slabs may still be the source of queued copies: drain first.  A failed
   * drain is retried once; if the device still cannot confirm that the
   * copies are done, the slabs are leaked rather than freed under a copy
   * that may still read them (C9). */
  bool drained = mlo_plat_synchronize(pipe->platform) == MLO_OK ||
                 mlo_plat_synchronize(pipe->platform) == MLO_OK;
  if (!drained)
    mlo_logf(MLO_LOG_ERROR, "freeing a pipeline: the device did not drain its copies; "
                            "host slabs are left allocated rather than freed under a copy");
  /* Node-shared slabs are freed together (MPI_Win_free waits for every
   * rank): only once every rank is here, else they are left mapped. */
  bool shared = false;
  for (size_t i = 0; i < pipe->ncomps; i++) shared = shared || pipe->comps[i]->slab_shared;
  if (shared && mlo_collective(pipe, NULL, COLL_FREE, drained ? MLO_OK : MLO_EPLATFORM,
                               drained ? NULL : "the device did not drain", NULL)) {
    mlo_logf(MLO_LOG_ERROR, "freeing a pipeline: %s; its node-shared slabs are left mapped",
             pipe->errmsg);
    drained = false;
  }
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    mlo_res_release_events(c);
    if (drained) mlo_slab_free(c);
    if (c->users)
      mlo_logf(MLO_LOG_ERROR, "freeing a pipeline while '%s' has %d acquire(s) not released",
               c->name, c->users);
    for (size_t j = 0; j < c->ntensors; j++) tensor_free(c->tensors[j]);
    free(c->tensors);
    mlo_nameset_free(&c->names);
    free(c->holders);
    free(c->name);
    free(c);
  }
  for (size_t i = 0; i < pipe->ngroups; i++) {
    free(pipe->groups[i]->members);
    free(pipe->groups[i]->name);
    free(pipe->groups[i]);
  }
  free(pipe->groups);
  mlo_plan_free(pipe);
  free(pipe->comps);
  pthread_mutex_unlock(&pipe->lock);
  pthread_mutex_destroy(&pipe->lock);
  pthread_mutex_destroy(&pipe->setup_lock);
  pthread_cond_destroy(&pipe->idle);
  free(pipe);
}

/* Component names for the agreement's messages; the id is the component's
 * index times 8 plus the step. */
static const char *collective_name(uint64_t id, void *user) {
  mlo_pipeline *pipe = user;
  static const char *const steps[] = {"?", "materialize", "loaded", "load", "gather", "free"};
  static _Thread_local char buf[192];
  uint64_t index = id >> 3;
  const char *step = steps[(id & 7) < 6 ? id & 7 : 0];
  if (index == 0xffffff)
    snprintf(buf, sizeof buf, "%s the pipeline", step);
  else if (index < pipe->ncomps)
    snprintf(buf, sizeof buf, "%s '%s'", step, pipe->comps[index]->name);
  else
    snprintf(buf, sizeof buf, "%s component #%llu", step, (unsigned long long)index);
  return buf;
}

int mlo_collective(mlo_pipeline *pipe, const mlo_component *c, unsigned step, int status,
                   const char *msg, bool *together) {
  if (together) *together = true;
  if (!pipe->comm) return MLO_OK;
  uint64_t id = ((c ? (uint64_t)c->index : 0xffffffu) << 3) | step;
  char err[512];
  pipe->dist.collectives++;
  int rc =
      mlo_dist_agree(pipe->comm, id, status, msg, collective_name, pipe, together, err, sizeof err);
  if (rc) return mlo_fail(pipe, rc, "rank %d: %s", pipe->dist.rank, err);
  return MLO_OK;
}

int mlo_pipeline_get_dist_stats(mlo_pipeline *pipe, mlo_dist_stats *out) {
  if (!pipe || !out || out->size < sizeof *out) return MLO_EINVAL;
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  *out = pipe->dist;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

const char *mlo_pipeline_errmsg(mlo_pipeline *pipe) {
  return pipe ? pipe->errmsg : "";
}
mlo_platform *mlo_pipeline_platform(mlo_pipeline *pipe) {
  return pipe ? pipe->platform : NULL;
}

static bool valid_role(mlo_role role) {
  return (unsigned)role <= MLO_ROLE_AUTO;
}

int mlo_component_add(mlo_pipeline *pipe, const char *name, mlo_role role, mlo_component **out) {
  if (out) *out = NULL;
  if (!pipe) return MLO_EINVAL;
  if (!name || !*name) return mlo_fail(pipe, MLO_EINVAL, "component name is empty");
  if (!valid_role(role)) return mlo_fail(pipe, MLO_EINVAL, "component '%s': invalid role", name);
  int rc = mlo_lock_both(pipe);
  if (rc) return rc;
  if (pipe->enabled) {
    rc = mlo_fail(pipe, MLO_ESTATE, "cannot add component '%s' while offload is enabled", name);
    goto out_unlock;
  }
  for (size_t i = 0; i < pipe->ncomps; i++)
    if (!strcmp(pipe->comps[i]->name, name)) {
      rc = mlo_fail(pipe, MLO_EEXIST, "component '%s' already exists", name);
      goto out_unlock;
    }
  if (pipe->ncomps == pipe->ccap) {
    size_t cap = pipe->ccap ? pipe->ccap * 2 : 8;
    mlo_component **grown = mlo_realloc(pipe->comps, cap * sizeof *grown);
    if (!grown) goto out_nomem;
    pipe->comps = grown;
    pipe->ccap = cap;
  }
  mlo_component *c = mlo_calloc(1, sizeof *c);
  if (!c || !(c->name = mlo_strdup(name))) {
    free(c);
    goto out_nomem;
  }
  c->pipe = pipe;
  c->index = pipe->ncomps;
  c->state = MLO_RES_UNMATERIALIZED;
  if (role == MLO_ROLE_AUTO) {
    c->role = mlo_role_guess(name, NULL);
    c->role_source = MLO_ROLE_FROM_HEURISTIC; /* said by mlo_pipeline_warn_guessed */
  } else {
    c->role = role;
    c->role_source = MLO_ROLE_FROM_DECLARATION;
  }
  pipe->comps[pipe->ncomps++] = c;
  if (out) *out = c;
  goto out_unlock;
out_nomem:
  rc = mlo_fail(pipe, MLO_ENOMEM, "out of host memory adding component '%s'", name);
out_unlock:
  mlo_unlock_both(pipe);
  return rc;
}

void mlo_pipeline_warn_guessed(mlo_pipeline *pipe) {
  if (!pipe) return;
  MLO_LOCK_OR_VOID(&pipe->lock);
  if (pipe->warned_heuristic) {
    pthread_mutex_unlock(&pipe->lock);
    return;
  }
  char list[768];
  size_t len = 0, n = 0;
  list[0] = '\0';
  for (size_t i = 0; i < pipe->ncomps; i++) {
    const mlo_component *c = pipe->comps[i];
    if (c->role_source != MLO_ROLE_FROM_HEURISTIC) continue;
    n++;
    if (len < sizeof list - 1)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%s (%s)", len ? ", " : "", c->name,
                              mlo_role_name(c->role));
  }
  if (n) {
    pipe->warned_heuristic = true;
    mlo_logf(MLO_LOG_WARN,
             "role%s guessed from the component name%s: %s; declare %s to be sure (the mlo "
             "tool: --role NAME=ROLE; in code: a role at mlo_component_add)",
             n > 1 ? "s" : "", n > 1 ? "s" : "", list, n > 1 ? "them" : "it");
  }
  pthread_mutex_unlock(&pipe->lock);
}

int mlo_component_set_role(mlo_component *c, mlo_role role, mlo_role_source source) {
  if (!c) return MLO_EINVAL;
  mlo_pipeline *pipe = c->pipe;
  if (role == MLO_ROLE_AUTO || !valid_role(role) || (unsigned)source > MLO_ROLE_FROM_CLASS)
    return mlo_fail(pipe, MLO_EINVAL, "component '%s': invalid role or role source", c->name);
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  int rc = MLO_OK;
  if (pipe->enabled)
    rc = mlo_fail(pipe, MLO_ESTATE, "cannot change the role of '%s' while offload is enabled",
                  c->name);
  else if ((source == MLO_ROLE_FROM_HEURISTIC || source == MLO_ROLE_FROM_CLASS) &&
           (c->role_source == MLO_ROLE_FROM_DECLARATION ||
            c->role_source == MLO_ROLE_FROM_OVERRIDE))
    /* C1: an inferred role never overrides a declaration or an explicit
     * override. */
    rc = mlo_fail(pipe, MLO_EINVAL, "component '%s': a guessed role cannot replace a %s role",
                  c->name, mlo_role_source_name(c->role_source));
  else {
    c->role = role;
    c->role_source = source;
  }
  pthread_mutex_unlock(&pipe->lock);
  return rc;
}

size_t mlo_pipeline_component_count(mlo_pipeline *pipe) {
  if (!pipe) return 0;
  MLO_LOCK_OR(&pipe->lock, 0);
  size_t n = pipe->ncomps;
  pthread_mutex_unlock(&pipe->lock);
  return n;
}

mlo_component *mlo_pipeline_component_at(mlo_pipeline *pipe, size_t index) {
  if (!pipe) return NULL;
  MLO_LOCK_OR(&pipe->lock, NULL);
  mlo_component *c = index < pipe->ncomps ? pipe->comps[index] : NULL;
  pthread_mutex_unlock(&pipe->lock);
  return c;
}

mlo_component *mlo_pipeline_find(mlo_pipeline *pipe, const char *name) {
  if (!pipe || !name) return NULL;
  mlo_component *found = NULL;
  MLO_LOCK_OR(&pipe->lock, NULL);
  for (size_t i = 0; i < pipe->ncomps && !found; i++)
    if (!strcmp(pipe->comps[i]->name, name)) found = pipe->comps[i];
  pthread_mutex_unlock(&pipe->lock);
  return found;
}

const char *mlo_component_name(const mlo_component *c) {
  return c ? c->name : "";
}
mlo_role mlo_component_role(const mlo_component *c) {
  return c ? c->role : MLO_ROLE_OTHER;
}
mlo_role_source mlo_component_role_source(const mlo_component *c) {
  return c ? c->role_source : MLO_ROLE_FROM_DECLARATION;
}
mlo_pipeline *mlo_component_pipeline(const mlo_component *c) {
  return c ? c->pipe : NULL;
}

/* ---- tensors ---------------------------------------------------------- */

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
    tensor_free(t);
    return mlo_fail(pipe, MLO_ENOMEM, "out of host memory adding tensor '%s'", d->name);
  }
  t->comp = c;
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
    tensor_free(t);
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
    tensor_free(t);
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
    tensor_free(t);
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
    tensor_free(t);
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
  if (rc) tensor_free(t);
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
  uint64_t total = mlo_slab_layout((mlo_component *)c, false, NULL);
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
    mlo_plat_resolve(owner->pipe->platform, owner->block,
                     (size_t)(own->dev_offset - owner->shard_offset), &handle, &local);
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
  if (!t || !t->comp->pipe->platform->caps.device_pointers) return NULL;
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
  pipe->trace = fn;
  pipe->trace_user = user;
  pthread_mutex_unlock(&pipe->lock);
}

/* ---- counters --------------------------------------------------------- */

int mlo_component_get_stats(mlo_component *c, mlo_component_stats *out) {
  if (!c || !out) return MLO_EINVAL;
  MLO_LOCK_OR(&c->pipe->lock, mlo_reentered(c->pipe));
  *out = c->stats;
  pthread_mutex_unlock(&c->pipe->lock);
  return MLO_OK;
}

int mlo_pipeline_get_stats(mlo_pipeline *pipe, mlo_pipeline_stats *out) {
  if (!pipe || !out) return MLO_EINVAL;
  memset(out, 0, sizeof *out);
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  for (size_t i = 0; i < pipe->ncomps; i++) {
    const mlo_component_stats *s = &pipe->comps[i]->stats;
    out->total.loads += s->loads;
    out->total.evictions += s->evictions;
    out->total.forwards += s->forwards;
    out->total.h2d_bytes += s->h2d_bytes;
    out->total.d2h_bytes += s->d2h_bytes;
    out->total.copy_calls += s->copy_calls;
    out->total.platform_calls += s->platform_calls;
    out->total.wait_ns += s->wait_ns;
    out->total.forward_ns += s->forward_ns;
    out->total.prefetches += s->prefetches;
  }
  out->budget_bytes = mlo_budget_policy(pipe) ? pipe->budget : 0;
  out->device_bytes = pipe->device_bytes;
  out->peak_device_bytes = pipe->peak_device_bytes;
  out->host_slab_bytes = pipe->host_slab_bytes;
  out->pinned_bytes = pipe->pinned_bytes;
  pthread_mutex_unlock(&pipe->lock);
  return MLO_OK;
}

void mlo_pipeline_reset_stats(mlo_pipeline *pipe) {
  if (!pipe) return;
  MLO_LOCK_OR_VOID(&pipe->lock);
  for (size_t i = 0; i < pipe->ncomps; i++)
    memset(&pipe->comps[i]->stats, 0, sizeof(mlo_component_stats));
  pipe->peak_device_bytes = pipe->device_bytes;
  pipe->dist.gather_bytes = pipe->dist.gather_ns = pipe->dist.collectives = 0;
  pthread_mutex_unlock(&pipe->lock);
}
