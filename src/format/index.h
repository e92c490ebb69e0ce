/*
 * index.h — internal API for one component folder's weights: finding the
 * safetensors file(s) for a variant, reading a sharded weight map and
 * validating the shard set (include/mlo/checkpoint.h states the rules).
 * pipeline_dir.c turns folders into components with it.
 */
#ifndef MLO_FORMAT_INDEX_H
#define MLO_FORMAT_INDEX_H

#include "format/safetensors.h"

#include <stdbool.h>
#include <stddef.h>

/* The validated files of one component, opened (headers only). */
typedef struct {
  size_t count;
  mlo_st_file **files; /* shard order (sorted by file name) */
  char *index_name;    /* the weight map's file name, NULL when unsharded */
  bool used_variant;   /* the requested variant's files were found */
} mlo_weight_set;

/* Finds and validates the weights in folder for variant (NULL: plain
 * files).  Falls back to the plain files when the variant has none and
 * reports it with used_variant = false.  MLO_ENOTFOUND with a message when
 * the folder holds no safetensors file at all (callers decide whether that
 * is an error); other failures are MLO_EFORMAT/MLO_EIO/MLO_ENOMEM.  On
 * failure *ws is left empty. */
int mlo_weight_set_find(const char *folder, const char *variant, bool allow_stray,
                        mlo_weight_set *ws, char *err, size_t errlen);

/* Opens a weight map (index_name inside folder) and its shards, checking
 * the whole set.  Exposed separately for tests and for callers that name
 * the index themselves. */
int mlo_weight_set_open_index(const char *folder, const char *index_name, bool allow_stray,
                              mlo_weight_set *ws, char *err, size_t errlen);

/* Declares every tensor of every file in comp as a file range. */
int mlo_weight_set_declare(const mlo_weight_set *ws, mlo_component *comp, unsigned flags, char *err,
                           size_t errlen);

/* Closes the files and frees the set's memory; the struct becomes empty. */
void mlo_weight_set_close(mlo_weight_set *ws);

/* "<a>/<b>" into a new string (NULL on overflow/allocation failure). */
char *mlo_path_join(const char *a, const char *b);

#endif
