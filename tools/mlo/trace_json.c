/*
 * trace_json.c — records the pipeline's trace events during a run (the
 * hook must be quick and must not call back into the pipeline: it only
 * appends under a mutex) and writes them as Chrome trace-event JSON, which
 * Perfetto and chrome://tracing open.  Loads, forwards, evictions and waits
 * go on separate tracks so that an overlap or a stall is visible at a
 * glance; device memory is a counter track.
 */
#include "tool.h"

#include "base/sysio.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { TRACK_LOADS = 1, TRACK_FORWARDS = 2, TRACK_EVICTIONS = 3, TRACK_WAITS = 4 };

int tool_trace_init(tool_trace *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_t *m = malloc(sizeof *m);
  if (!m) return MLO_ENOMEM;
  pthread_mutex_init(m, NULL);
  t->lock = m;
  return MLO_OK;
}

void tool_trace_destroy(tool_trace *t) {
  if (!t) return;
  if (t->lock) {
    pthread_mutex_destroy(t->lock);
    free(t->lock);
  }
  free(t->events);
  memset(t, 0, sizeof *t);
}

void tool_trace_hook(const mlo_trace_event *ev, void *user) {
  tool_trace *t = user;
  pthread_mutex_lock(t->lock);
  if (t->count == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    mlo_trace_event *grown = realloc(t->events, cap * sizeof *grown);
    if (!grown) {
      t->overflow = true;
      pthread_mutex_unlock(t->lock);
      return;
    }
    t->events = grown;
    t->cap = cap;
  }
  t->events[t->count++] = *ev;
  pthread_mutex_unlock(t->lock);
}

int tool_write_file(const char *path, const char *data, size_t len, char *err, size_t errlen) {
  return mlo_out_write_all(path, data, len, err, errlen);
}

int tool_check_output(const char *cmd, const char *flag, const char *path) {
  if (!path) return TOOL_EXIT_OK;
  char why[1024];
  int rc = mlo_out_check(path, why, sizeof why);
  if (!rc) return TOOL_EXIT_OK;
  tool_failf(cmd, "%s: %s", flag, why);
  return rc == MLO_ENOMEM ? TOOL_EXIT_FAIL : TOOL_EXIT_USAGE;
}

static double us_since(uint64_t t_ns, uint64_t t0) {
  return (double)(t_ns - t0) / 1000.0;
}

static cJSON *add_event(cJSON *list, const char *name, const char *ph, int tid, double ts) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "name", name);
  cJSON_AddStringToObject(e, "ph", ph);
  cJSON_AddNumberToObject(e, "pid", 1);
  cJSON_AddNumberToObject(e, "tid", tid);
  cJSON_AddNumberToObject(e, "ts", ts);
  cJSON_AddItemToArray(list, e);
  return e;
}

static void add_track_name(cJSON *list, int tid, const char *name) {
  cJSON *e = add_event(list, "thread_name", "M", tid, 0);
  cJSON_AddItemToObject(e, "args", cJSON_CreateObject());
  cJSON_AddStringToObject(cJSON_GetObjectItem(e, "args"), "name", name);
  cJSON *s = add_event(list, "thread_sort_index", "M", tid, 0);
  cJSON_AddItemToObject(s, "args", cJSON_CreateObject());
  cJSON_AddNumberToObject(cJSON_GetObjectItem(s, "args"), "sort_index", tid);
}

/* The matching END for the BEGIN at index i (same component), or count. */
/* The event that ends the span beginning at i: its end_kind; for a load,
 * also an eviction (or a next load) of the component before that, which
 * ends a load rolled back or dropped before it completed. */
static size_t find_end(const tool_trace *t, size_t i, mlo_trace_kind end_kind) {
  for (size_t j = i + 1; j < t->count; j++) {
    const mlo_trace_event *e = &t->events[j];
    if (e->comp != t->events[i].comp) continue;
    if (e->kind == end_kind) return j;
    if (end_kind == MLO_TRACE_LOAD_END &&
        (e->kind == MLO_TRACE_EVICT || e->kind == MLO_TRACE_LOAD_BEGIN))
      return j;
  }
  return t->count;
}

/* Whether the load that begins at index i is a prefetch (its PREFETCH mark
 * follows before anything else of the component). */
static bool is_prefetch(const tool_trace *t, size_t i) {
  for (size_t j = i + 1; j < t->count; j++)
    if (t->events[j].comp == t->events[i].comp) return t->events[j].kind == MLO_TRACE_PREFETCH;
  return false;
}

static void add_span(cJSON *list, const tool_trace *t, size_t i, mlo_trace_kind end_kind, int tid,
                     uint64_t t0) {
  const mlo_trace_event *b = &t->events[i];
  size_t j = find_end(t, i, end_kind);
  uint64_t end_ns = j < t->count ? t->events[j].t_ns : t->events[t->count - 1].t_ns;
  bool prefetch = tid == TRACK_LOADS && is_prefetch(t, i);
  char name[160];
  snprintf(name, sizeof name, "%s%s", prefetch ? "prefetch " : "", mlo_component_name(b->comp));
  cJSON *e = add_event(list, name, "X", tid, us_since(b->t_ns, t0));
  cJSON_AddNumberToObject(e, "dur", us_since(end_ns, b->t_ns));
  cJSON *args = cJSON_AddObjectToObject(e, "args");
  cJSON_AddStringToObject(args, "role", mlo_role_name(mlo_component_role(b->comp)));
  if (tid == TRACK_LOADS) cJSON_AddNumberToObject(args, "bytes", (double)b->bytes);
  if (prefetch) cJSON_AddBoolToObject(args, "prefetch", true);
  if (j == t->count)
    cJSON_AddBoolToObject(args, "unfinished", true);
  else if (t->events[j].kind != end_kind)
    cJSON_AddBoolToObject(args, "abandoned", true);
}

static void add_memory_sample(cJSON *list, const mlo_trace_event *ev, uint64_t t0) {
  cJSON *e = add_event(list, "device memory", "C", 0, us_since(ev->t_ns, t0));
  cJSON *args = cJSON_AddObjectToObject(e, "args");
  cJSON_AddNumberToObject(args, "bytes", (double)ev->device_bytes);
}

static cJSON *build_trace(const tool_trace *t) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
  cJSON *list = cJSON_AddArrayToObject(root, "traceEvents");
  cJSON *pn = add_event(list, "process_name", "M", 0, 0);
  cJSON_AddStringToObject(cJSON_AddObjectToObject(pn, "args"), "name", "mlo pipeline");
  add_track_name(list, TRACK_LOADS, "copies (loads)");
  add_track_name(list, TRACK_FORWARDS, "forwards");
  add_track_name(list, TRACK_EVICTIONS, "evictions");
  add_track_name(list, TRACK_WAITS, "waits");
  uint64_t t0 = t->count ? t->events[0].t_ns : 0;
  for (size_t i = 0; i < t->count; i++) {
    const mlo_trace_event *ev = &t->events[i];
    switch (ev->kind) {
    case MLO_TRACE_LOAD_BEGIN:
      add_span(list, t, i, MLO_TRACE_LOAD_END, TRACK_LOADS, t0);
      break;
    case MLO_TRACE_FORWARD_BEGIN:
      add_span(list, t, i, MLO_TRACE_FORWARD_END, TRACK_FORWARDS, t0);
      break;
    case MLO_TRACE_WAIT_BEGIN:
      add_span(list, t, i, MLO_TRACE_WAIT_END, TRACK_WAITS, t0);
      break;
    case MLO_TRACE_EVICT: {
      cJSON *e = add_event(list, mlo_component_name(ev->comp), "i", TRACK_EVICTIONS,
                           us_since(ev->t_ns, t0));
      cJSON_AddStringToObject(e, "s", "t");
      cJSON_AddNumberToObject(cJSON_AddObjectToObject(e, "args"), "d2h_bytes", (double)ev->bytes);
      break;
    }
    case MLO_TRACE_BLOCK_LOAD: { /* a streamed block's copy, issued on the copy queue */
      cJSON *e =
          add_event(list, mlo_component_name(ev->comp), "i", TRACK_LOADS, us_since(ev->t_ns, t0));
      cJSON_AddStringToObject(e, "s", "t");
      cJSON_AddNumberToObject(cJSON_AddObjectToObject(e, "args"), "block_bytes", (double)ev->bytes);
      break;
    }
    default:
      break;
    }
    /* Memory changes at a load's allocation and at an eviction; a LOAD_END
     * carries an earlier time (the copy's end) than the bytes it was emitted with. */
    if (ev->kind == MLO_TRACE_LOAD_BEGIN || ev->kind == MLO_TRACE_EVICT)
      add_memory_sample(list, ev, t0);
  }
  return root;
}

int tool_trace_write_json(const tool_trace *t, const char *path, char *err, size_t errlen) {
  cJSON *root = build_trace(t);
  char *text = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!text) {
    snprintf(err, errlen, "out of memory formatting the trace");
    return MLO_ENOMEM;
  }
  int rc = tool_write_file(path, text, strlen(text), err, errlen);
  cJSON_free(text);
  return rc;
}
