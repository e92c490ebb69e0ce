/*
 * pipeline.c — building a pipeline in code: the pipeline handle and its
 * components (declaration only: tensors are tensor.c's, storage slab.c's,
 * residency residency.c's), plus the read-only accessors (the counters
 * are stats.c's).
 * Freeing a pipeline reaches every file of core, so it is teardown.c's.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include "base/log.h"
#include "core/policy.h"

#include "base/nameset.h"

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void init_checked_mutex(pthread_mutex_t *m) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
  pthread_mutex_init(m, &attr);
  pthread_mutexattr_destroy(&attr);
}

/* A pipeline's devices: 1..MLO_MAX_DEVICES platforms, none twice, all of
 * one kind; the first is `platform` where both are given. */
static int check_devices(mlo_platform *platform, mlo_platform *const *devs, size_t n) {
  if (!devs || n > MLO_MAX_DEVICES) return MLO_EINVAL;
  if (platform && platform != devs[0]) return MLO_EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (!devs[i]) return MLO_EINVAL;
    for (size_t j = 0; j < i; j++)
      if (devs[j] == devs[i]) return MLO_EINVAL;
    if (strcmp(mlo_platform_name(devs[i]), mlo_platform_name(devs[0]))) {
      mlo_logf(MLO_LOG_ERROR,
               "a pipeline's devices are of one kind: device %zu is '%s', device 0 "
               "'%s'",
               i, mlo_platform_name(devs[i]), mlo_platform_name(devs[0]));
      return MLO_EUNSUPPORTED;
    }
  }
  return MLO_OK;
}

int mlo_pipeline_create(const mlo_pipeline_options *opts, mlo_pipeline **out) {
  if (!out) return MLO_EINVAL;
  *out = NULL;
  /* 0.2's options end before comm; their callers get no communicator */
  size_t v02 = offsetof(mlo_pipeline_options, comm);
  if (!opts || opts->size < v02) return MLO_EINVAL;
  size_t align = opts->slab_alignment ? opts->slab_alignment : 256;
  if (align & (align - 1) || align > (1u << 20)) return MLO_EINVAL;
  bool v03 = opts->size >= offsetof(mlo_pipeline_options, devices);
  bool v07 = opts->size >= sizeof(mlo_pipeline_options);
  mlo_platform *const *devs = &opts->platform;
  size_t ndevs = 1;
  if (v07 && opts->ndevices > 1) {
    devs = opts->devices;
    ndevs = opts->ndevices;
  }
  int rc = check_devices(opts->platform, devs, ndevs);
  if (rc) return rc;
  mlo_comm *comm = v03 ? opts->comm : NULL;
  if (comm && ndevs > 1) {
    mlo_logf(MLO_LOG_ERROR,
             "a pipeline of %zu devices cannot have a communicator: ranks and "
             "devices do not combine yet (docs/placement.md)",
             ndevs);
    return MLO_EUNSUPPORTED;
  }
  bool sharded = v03 && opts->sharded_loads;
  bool shard_resident = v03 && opts->shard_resident;
  if ((sharded && !comm) || (shard_resident && !sharded)) return MLO_EINVAL;
  /* A sharded load gathers into the block: on the host through MPI (the
   * block is host memory); elsewhere through the platform's device-side
   * all-gather (CUDA: NCCL, given with mlo_comm_set_nccl). */
  if (sharded && !shard_resident && !devs[0]->caps.host_addressable &&
      !(mlo_plat_has_all_gather(devs[0]) && mlo_dist_nccl(comm)))
    return MLO_EUNSUPPORTED;
  mlo_pipeline *pipe = mlo_calloc(1, sizeof *pipe);
  if (!pipe) return MLO_ENOMEM;
  pipe->platform = devs[0];
  pipe->ndevs = ndevs;
  for (size_t i = 0; i < ndevs; i++)
    pipe->devs[i] = (struct mlo_device){.platform = devs[i], .index = i};
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

int mlo_pipeline_get_dist_stats(mlo_pipeline *pipe, mlo_dist_stats *out) {
  if (!pipe || !out || out->size < offsetof(mlo_dist_stats, lane_gathers)) return MLO_EINVAL;
  size_t keep = out->size < sizeof *out ? out->size : sizeof *out; /* an older caller's fields */
  MLO_LOCK_OR(&pipe->lock, mlo_reentered(pipe));
  memcpy(out, &pipe->dist, keep);
  pthread_mutex_unlock(&pipe->lock);
  out->size = keep;
  return MLO_OK;
}

const char *mlo_pipeline_errmsg(mlo_pipeline *pipe) {
  return pipe ? pipe->errmsg : "";
}
mlo_platform *mlo_pipeline_platform(mlo_pipeline *pipe) {
  return pipe ? pipe->platform : NULL;
}

int mlo_device_memory(mlo_pipeline *pipe, size_t d, uint64_t *total, uint64_t *avail) {
  mlo_platform_memory mem = {0};
  int rc = mlo_platform_get_memory(pipe->devs[d].platform, &mem);
  if (rc) return mlo_fail(pipe, rc, "cannot read device %zu's memory", d);
  /* what is free now plus what this pipeline already holds there: it may
   * keep those, and they are not the caller's */
  uint64_t a = mem.free_bytes + pipe->devs[d].bytes;
  *total = mem.total_bytes;
  *avail = a < mem.total_bytes ? a : mem.total_bytes;
  return MLO_OK;
}

size_t mlo_pipeline_device_count(mlo_pipeline *pipe) {
  return pipe ? pipe->ndevs : 0;
}

mlo_platform *mlo_pipeline_device(mlo_pipeline *pipe, size_t index) {
  return pipe && index < pipe->ndevs ? pipe->devs[index].platform : NULL;
}

size_t mlo_component_device(const mlo_component *c) {
  return c ? c->dev->index : 0;
}

mlo_platform *mlo_component_platform(const mlo_component *c) {
  return c ? c->dev->platform : NULL;
}

static bool valid_role(mlo_role role) {
  return (unsigned)role <= MLO_ROLE_AUTO;
}

int mlo_component_add(mlo_pipeline *pipe, const char *name, mlo_role role, mlo_component **out) {
  if (out) *out = NULL;
  if (!pipe) return MLO_EINVAL;
  if (!name || !*name) return mlo_fail(pipe, MLO_EINVAL, "component name is empty");
  /* Names are printed, logged and put in file names: no control characters
   * (a name from a file could otherwise drive the user's terminal). */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7F) {
      char safe[192];
      return mlo_fail(
          pipe, MLO_EINVAL, "component name '%s' has a control character (byte 0x%02x at %zu)",
          mlo_escape(name, safe, sizeof safe), *p, (size_t)(p - (const unsigned char *)name));
    }
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
  c->dev = &pipe->devs[0];
  c->pinned_dev = MLO_DEVICE_ANY;
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
