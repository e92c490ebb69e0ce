/*
 * disk_store.c — the host storage of a component that lives on disk
 * (docs/disk.md): its files, opened and checked once at materialization to
 * be the ones its tensors were validated from (every load checks them
 * again), and, where it streams, the partial slab its streamed blocks are
 * read into, page-locked run by run.  slab.c materializes and frees a
 * component through these; the reader and the host plan above (disk.c)
 * read and change them.
 */
#include "base/sysio.h"
#include "core/internal.h"

#include <stdlib.h>

int mlo_disk_prepare(mlo_component *c, const mlo_layout *lay) {
  if (c->pipe->platform->caps.simulated) return MLO_OK; /* no files: a modelled disk */
  mlo_tensor **files = mlo_malloc((lay->norder ? lay->norder : 1) * sizeof *files);
  int *fds = mlo_malloc((lay->norder ? lay->norder : 1) * sizeof *fds);
  if (!files || !fds) {
    free(files);
    free(fds);
    return mlo_fail(c->pipe, MLO_ENOMEM, "%s: out of host memory", c->name);
  }
  size_t n = 0;
  for (size_t i = 0; i < lay->norder; i++)
    if (lay->order[i]->nbytes) files[n++] = lay->order[i];
  mlo_sort_by_file(files, n);
  char why[768];
  int rc = mlo_open_checked(c, files, n, fds, false, why, sizeof why);
  mlo_close_files(n, fds, false);
  free(fds);
  if (rc) {
    free(files);
    return mlo_fail(c->pipe, rc, "%s", why);
  }
  free(c->disk_files);
  c->disk_files = files;
  c->ndisk_files = n;
  return MLO_OK;
}

/* Unregisters the slab's page-locked runs. */
void mlo_disk_unpin_runs(mlo_component *c) {
  for (size_t i = 0; i < c->npinned_runs; i++) {
    c->stats.platform_calls++;
    mlo_plat_host_unregister(c->pipe->platform, c->pinned_runs[i]);
  }
  free(c->pinned_runs);
  c->pinned_runs = NULL;
  c->npinned_runs = 0;
}

void mlo_disk_free_partial(mlo_component *c) {
  if (!c->partial) return;
  mlo_disk_unpin_runs(c);
  uint64_t blocks = 0;
  for (size_t b = 0; b < c->nblocks; b++) blocks += c->filled[b] ? c->spans[b].bytes : 0;
  c->pipe->host_slab_bytes -= blocks;
  c->pipe->disk_bytes += blocks; /* slab_free takes the whole slab off disk_bytes */
  for (size_t i = 0; i < c->ntensors; i++)
    if (!c->tensors[i]->target && !(c->tensors[i]->flags & MLO_TENSOR_EXTERNAL))
      c->tensors[i]->host = NULL;
  mlo_plat_host_free(c->pipe->platform, c->slab, (size_t)c->slab_bytes, false);
  c->slab = NULL;
  free(c->filled);
  c->filled = NULL;
  c->partial = false;
}
