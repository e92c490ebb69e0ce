/*
 * gguf_dump.c — prints what mlo's GGUF reader makes of each file as one
 * JSON line, for gguf_crosscheck.py to compare with PyPI's gguf reader:
 *   {"ok": true, "version", "alignment", "data_start", "architecture",
 *    "kv": [keys], "tensors": [{"name", "type", "ne", "offset", "nbytes"}]}
 * or {"ok": false, "error": "..."}.
 */
#include "format/gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

static cJSON *exact(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
  return cJSON_CreateRaw(buf);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    char err[1024];
    mlo_gguf_file *f = NULL;
    int rc = mlo_gguf_open(argv[i], &f, err, sizeof err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", rc == MLO_OK);
    if (rc) {
      cJSON_AddStringToObject(o, "error", err);
    } else {
      cJSON_AddNumberToObject(o, "version", f->version);
      cJSON_AddNumberToObject(o, "alignment", (double)f->alignment);
      cJSON_AddNumberToObject(o, "data_start", (double)f->data_start);
      if (f->architecture) cJSON_AddStringToObject(o, "architecture", f->architecture);
      cJSON *kv = cJSON_AddArrayToObject(o, "kv");
      for (size_t k = 0; k < f->kv_count; k++)
        cJSON_AddItemToArray(kv, cJSON_CreateString(f->kv[k].key));
      cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
      for (size_t k = 0; k < f->count; k++) {
        const mlo_gguf_tensor *t = &f->tensors[k];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddNumberToObject(e, "type", t->ggml_type);
        cJSON *ne = cJSON_AddArrayToObject(e, "ne");
        for (int d = 0; d < t->n_dims; d++) /* exact: a double would round 2^56 + 1 */
          cJSON_AddItemToArray(ne, exact(t->ne[d]));
        cJSON_AddItemToObject(e, "offset", exact(t->file_offset));
        cJSON_AddItemToObject(e, "nbytes", exact(t->nbytes));
        cJSON_AddItemToArray(ts, e);
      }
    }
    char *text = cJSON_PrintUnformatted(o);
    printf("%s\n", text ? text : "{\"ok\": false, \"error\": \"out of memory\"}");
    cJSON_free(text);
    cJSON_Delete(o);
    mlo_gguf_close(f);
  }
  return 0;
}
