/*
 * nameset.h — a name -> index table (open addressing, at most half full)
 * for the places that must find or refuse a repeated name among many: a
 * component's tensors and the safetensors writer's.  A 100k-tensor header
 * then costs O(n), not the O(n^2) of a scan per name.  Keys are borrowed:
 * each must stay valid, unchanged, while it is in the table.
 */
#ifndef MLO_CORE_NAMESET_H
#define MLO_CORE_NAMESET_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  const char **keys;
  size_t *vals;
  size_t nslots, count;
} mlo_nameset;

/* Room for `more` further names without allocating: MLO_ENOMEM or MLO_OK,
 * the table unchanged on failure. */
int mlo_nameset_reserve(mlo_nameset *s, size_t more);
/* Adds key -> val; the room must have been reserved. */
void mlo_nameset_put(mlo_nameset *s, const char *key, size_t val);
/* The value of key, if present. */
bool mlo_nameset_get(const mlo_nameset *s, const char *key, size_t *val);
void mlo_nameset_free(mlo_nameset *s);

#endif
