/*
 * teardown.c — mlo_pipeline_free: offload off, every resident component
 * evicted (written back where it must be), the device drained before any
 * slab is freed under a queued copy (C9), node-shared slabs freed together
 * by every rank, then the declarations.  The one place that reaches every
 * other file of core, so it sits above them all.
 */
#include "core/internal.h"
#include "core/policy.h"

#include "base/log.h"
#include "base/nameset.h"

#include <stdlib.h>

void mlo_pipeline_free(mlo_pipeline *pipe) {
  if (!pipe) return;
  mlo_pipeline_set_trace(pipe, NULL, NULL); /* its stamps no longer wanted */
  mlo_offload_disable(pipe);
  mlo_disk_stop(pipe); /* a load from disk in flight ends, undone */
  MLO_LOCK_OR_VOID(&pipe->lock);
  for (size_t i = 0; i < pipe->ncomps; i++) /* a switch held open by an acquire not released */
    mlo_join_drop(pipe->comps[i]);
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    if (mlo_res_is_resident(c) && mlo_res_evict(c)) mlo_res_drop(c); /* write-back failed */
    mlo_res_finish_writeback(c);
  }
  mlo_gather_stop(pipe); /* every component's gathers waited for above */
  /* Slabs may still be the source of queued copies: drain first.  A failed
   * drain is retried once; if the device still cannot confirm that the
   * copies are done, the slabs are leaked rather than freed under a copy
   * that may still read them (C9). */
  bool drained = mlo_devices_synchronize(pipe) == MLO_OK || mlo_devices_synchronize(pipe) == MLO_OK;
  if (!drained)
    mlo_logf(MLO_LOG_ERROR, "freeing a pipeline: the device did not drain its copies; "
                            "host slabs are left allocated rather than freed under a copy");
  /* Node-shared slabs are freed together (MPI_Win_free waits for every
   * rank): only once every rank is here, else they are left mapped. */
  bool shared = false;
  for (size_t i = 0; i < pipe->ncomps; i++) shared = shared || pipe->comps[i]->slab_shared;
  if (shared && mlo_collective(pipe, NULL, COLL_FREE, 0, drained ? MLO_OK : MLO_EPLATFORM,
                               drained ? NULL : "the device did not drain", NULL)) {
    mlo_logf(MLO_LOG_ERROR, "freeing a pipeline: %s; its node-shared slabs are left mapped",
             pipe->errmsg);
    drained = false;
  }
  /* offload still on (its disable failed: an acquire not released): the
   * policy's state goes while the components it looks at are still here */
  if (pipe->policy && pipe->policy->disable) pipe->policy->disable(pipe);
  pipe->policy = NULL;
  for (size_t i = 0; i < pipe->ncomps; i++) {
    mlo_component *c = pipe->comps[i];
    mlo_res_release_events(c);
    mlo_stream_drop(c);
    if (drained) mlo_slab_free(c); /* a partial slab's blocks are its spans: before them */
    free(c->spans);
    free(c->scratch);
    free(c->disk_files);
    if (c->users)
      mlo_logf(MLO_LOG_ERROR, "freeing a pipeline while '%s' has %d acquire(s) not released",
               c->name, c->users);
    for (size_t j = 0; j < c->ntensors; j++) mlo_tensor_free(c->tensors[j]);
    free(c->tensors);
    mlo_nameset_free(&c->names);
    free(c->holders);
    free(c->begun);
    free(c->name);
    free(c);
  }
  for (size_t i = 0; i < pipe->ngroups; i++) {
    free(pipe->groups[i]->members);
    free(pipe->groups[i]->name);
    free(pipe->groups[i]);
  }
  free(pipe->groups);
  mlo_sched_free(pipe);
  free(pipe->comps);
  pthread_mutex_unlock(&pipe->lock);
  pthread_mutex_destroy(&pipe->lock);
  pthread_mutex_destroy(&pipe->setup_lock);
  pthread_cond_destroy(&pipe->idle);
  free(pipe);
}
