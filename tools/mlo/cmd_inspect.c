/*
 * cmd_inspect.c — `mlo inspect PATH [--json] [--tensors]`: what a
 * checkpoint holds and what each mode would need, before anything is
 * loaded: components, their roles and where each role came from, tensor
 * counts, dtypes, the weights' bytes and the bytes on the device (with
 * alignment), the expert split of a two-DiT pipeline, the peak device
 * memory of all-resident versus model-level offload, and with --tensors
 * every tensor and each file's metadata.  Reads only the headers.
 */
#include "format/readers.h"
#include "format/safetensors.h"
#include "tool.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static void help(void) {
  printf("usage: mlo inspect PATH [--json] [--tensors] [--steps N] [flags]\n"
         "       mlo inspect --diffusion-model F --t5xxl F --vae F ... [flags]\n\n"
         "PATH is a diffusers pipeline directory (model_index.json), a component folder,\n"
         "or a single .safetensors or .gguf file.  Prints each component's role and where\n"
         "the role came from (class name, name heuristic, override), its tensor count,\n"
         "dtypes, the tensors' bytes and the bytes it takes on the device (each tensor\n"
         "aligned to 256 B), the expert split of two DiTs at --steps, and the device\n"
         "memory each mode needs at its peak:\n"
         "  all resident        the sum of every component\n"
         "  model-level offload the larger of (VAEs + encoders), resident together after\n"
         "                      enable, and (VAEs + the largest DiT)\n"
         "  budget policy       at least the largest component; with room for the next\n"
         "                      component beside the strict need, prefetch hides the\n"
         "                      switches; with everything, nothing moves after the\n"
         "                      first prompt (docs/planner.md)\n\n"
         "flags:\n"
         "  --json              one JSON object on stdout\n"
         "  --tensors           every tensor (name, dtype, shape, bytes) and each file's\n"
         "                      metadata (safetensors __metadata__, GGUF key-values)\n"
         "  --steps N           steps for the expert split (default 8)\n" TOOL_SPLIT_HELP
             TOOL_SOURCE_HELP "\n"
         "examples:\n"
         "  mlo inspect ./mlo-cache/wan2.2-t2v-full-depth-0.005   # what make demo made\n"
         "  mlo inspect Wan2.2-T2V-A14B-Diffusers --variant fp16 --steps 40\n"
         "  mlo inspect flux1-dev.safetensors --tensors --json\n"
         "  mlo inspect --diffusion-model flux1-dev-Q4_K.gguf --t5xxl t5xxl_fp16.safetensors \\\n"
         "              --clip_l clip_l.safetensors --vae ae.safetensors\n");
}

typedef struct {
  uint64_t vae, enc, max_dit, all, max_comp, tensors;
  const char *max_dit_name, *max_comp_name;
} needs;

static void compute_needs(mlo_pipeline *pipe, needs *n) {
  memset(n, 0, sizeof *n);
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    uint64_t b = mlo_component_bytes(c);
    n->all += b;
    n->tensors += mlo_component_tensor_bytes(c);
    if (b > n->max_comp || !n->max_comp_name) {
      n->max_comp = b;
      n->max_comp_name = mlo_component_name(c);
    }
    mlo_role r = mlo_component_role(c);
    if (r == MLO_ROLE_VAE) n->vae += b;
    if (r == MLO_ROLE_ENCODER) n->enc += b;
    if (r == MLO_ROLE_DIT && (b > n->max_dit || !n->max_dit_name)) {
      n->max_dit = b;
      n->max_dit_name = mlo_component_name(c);
    }
  }
}

static void count_dtypes(const mlo_component *c, size_t counts[MLO_DTYPE_COUNT]) {
  memset(counts, 0, sizeof(size_t) * MLO_DTYPE_COUNT);
  for (size_t i = 0; i < mlo_component_tensor_count(c); i++) {
    mlo_dtype d = mlo_tensor_dtype(mlo_component_tensor_at(c, i));
    if ((unsigned)d < MLO_DTYPE_COUNT) counts[d]++;
  }
}

static void dtype_text(const size_t counts[MLO_DTYPE_COUNT], char *buf, size_t len) {
  buf[0] = '\0';
  size_t n = 0;
  for (int d = 0; d < MLO_DTYPE_COUNT && n < len; d++)
    if (counts[d])
      n += (size_t)snprintf(buf + n, len - n, "%s%s %zu", n ? ", " : "",
                            mlo_dtype_name((mlo_dtype)d), counts[d]);
}

/* ---- --tensors ------------------------------------------------------------ */

static void shape_text(const mlo_tensor *t, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "[");
  const int64_t *sh = mlo_tensor_shape(t);
  for (int d = 0; d < mlo_tensor_ndim(t) && n < len; d++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)sh[d]);
  if (n < len) snprintf(buf + n, len - n, "]");
}

/* One file's metadata as key/value pairs: safetensors' __metadata__, or a
 * GGUF's key-values (values abridged).  Calls fn for each; false if the file
 * cannot be read again. */
static bool file_metadata(const char *path, mlo_meta_fn fn, void *user) {
  char err[256];
  for (size_t i = 0; i < mlo_nreaders; i++) {
    const struct mlo_reader *r = mlo_readers[i];
    void *f = NULL;
    if (r->open(path, &f, err, sizeof err) != MLO_OK) continue;
    r->metadata(f, fn, user);
    r->close(f);
    return true;
  }
  return false;
}

static void print_meta_line(const char *key, const char *value, void *user) {
  (void)user;
  char v[104];
  snprintf(v, sizeof v, "%.100s", value);
  printf("      %-28s %s%s\n", tool_esc(key), tool_esc(v), strlen(value) > 100 ? "..." : "");
}

static void print_tensors(mlo_pipeline *pipe) {
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    printf("\n%s (%s, %zu tensors, %s)\n", tool_esc(mlo_component_name(c)),
           mlo_role_name(mlo_component_role(c)), mlo_component_tensor_count(c),
           tool_size(mlo_component_tensor_bytes(c)));
    const char **files = NULL;
    size_t nf = tool_files(pipe, c, &files);
    for (size_t k = 0; k < nf; k++) {
      printf("  file %s\n", tool_esc(files[k]));
      file_metadata(files[k], print_meta_line, NULL);
    }
    free(files);
    printf("  %-56s %-8s %-20s %10s\n", "tensor", "dtype", "shape", "bytes");
    for (size_t k = 0; k < mlo_component_tensor_count(c); k++) {
      const mlo_tensor *t = mlo_component_tensor_at(c, k);
      char shape[96];
      shape_text(t, shape, sizeof shape);
      bool ref = mlo_tensor_owner(t) != c;
      printf("  %-56s %-8s %-20s %10llu%s\n", tool_esc(mlo_tensor_name(t)),
             mlo_dtype_name(mlo_tensor_dtype(t)), shape, (unsigned long long)mlo_tensor_nbytes(t),
             ref ? "  (reference)" : "");
    }
  }
}

static void add_meta_json(const char *key, const char *value, void *user) {
  cJSON_AddStringToObject((cJSON *)user, key, value);
}

static cJSON *tensors_json(mlo_pipeline *pipe, const mlo_component *c) {
  cJSON *files = cJSON_CreateArray();
  const char **names = NULL;
  size_t nf = tool_files(pipe, c, &names);
  for (size_t k = 0; k < nf; k++) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "path", names[k]);
    file_metadata(names[k], add_meta_json, cJSON_AddObjectToObject(f, "metadata"));
    cJSON_AddItemToArray(files, f);
  }
  free(names);
  return files;
}

static cJSON *tensor_list_json(const mlo_component *c) {
  cJSON *arr = cJSON_CreateArray();
  for (size_t k = 0; k < mlo_component_tensor_count(c); k++) {
    const mlo_tensor *t = mlo_component_tensor_at(c, k);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", mlo_tensor_name(t));
    cJSON_AddStringToObject(o, "dtype", mlo_dtype_name(mlo_tensor_dtype(t)));
    cJSON *shape = cJSON_AddArrayToObject(o, "shape");
    for (int d = 0; d < mlo_tensor_ndim(t); d++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)mlo_tensor_shape(t)[d]));
    cJSON_AddNumberToObject(o, "bytes", (double)mlo_tensor_nbytes(t));
    if (mlo_tensor_owner(t) != c)
      cJSON_AddStringToObject(o, "reference_to", mlo_component_name(mlo_tensor_owner(t)));
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

/* ---- the summary ------------------------------------------------------------ */

typedef struct {
  bool json, tensors;
  int steps;
  const tool_split *split; /* NULL when there are not two DiTs, or no split */
  const char *first, *second;
  const char *no_split; /* two DiTs whose split cannot be computed: why */
} view;

/* A component's pieces (docs/streaming.md): its blocks, the largest, the
 * prologue and epilogue, and the least budget the budget policy runs it in
 * (mlo_component_stream_least: streamed, or whole where it cannot
 * stream). */
typedef struct {
  size_t blocks;
  uint64_t largest, prologue, epilogue, least;
} block_view;

static void blocks_of(mlo_component *c, block_view *b) {
  memset(b, 0, sizeof *b);
  b->least = mlo_component_bytes(c);
  size_t n = 0;
  if (mlo_component_blocks(c, NULL, 0, &n) || n < 2) return;
  mlo_block_info *info = calloc(n, sizeof *info);
  if (!info || mlo_component_blocks(c, info, n, NULL)) {
    free(info);
    return;
  }
  b->blocks = n - 2;
  b->prologue = info[0].bytes;
  b->epilogue = info[n - 1].bytes;
  for (size_t i = 1; i + 1 < n; i++)
    if (info[i].bytes > b->largest) b->largest = info[i].bytes;
  free(info);
  b->least = mlo_component_stream_least(c);
}

static void print_blocks(mlo_pipeline *pipe) {
  size_t ncomp = mlo_pipeline_component_count(pipe);
  bool any = false;
  for (size_t i = 0; i < ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    block_view b;
    blocks_of(c, &b);
    if (!b.blocks) continue;
    if (!any) printf("\nblocks (the order the forward runs them; docs/streaming.md):\n");
    any = true;
    printf("  %-18s %4zu blocks, largest %s; prologue %s, epilogue %s",
           tool_esc(mlo_component_name(c)), b.blocks, tool_size(b.largest), tool_size(b.prologue),
           tool_size(b.epilogue));
    if (b.least < mlo_component_bytes(c))
      printf("; streams in %s or more\n", tool_size(b.least));
    else
      printf("; too few to stream\n");
  }
}

/* Host memory for the slabs: all of them; the least with the disk tier
 * (what is not from files stays); and at the least streaming budget, room,
 * what keeps the streamed blocks in host memory too (with less, each is
 * read from disk at each use: docs/disk.md). */
typedef struct {
  uint64_t all, least, stream_keep;
} host_need;

static void host_needs(mlo_pipeline *pipe, uint64_t room, host_need *h) {
  mlo_pipeline_needs n = {.size = sizeof n};
  mlo_pipeline_get_needs(pipe, room, &n); /* the host plan's own rule */
  *h = (host_need){n.host_all, n.host_least, n.host_stream_keep};
}

static void print_text(const char *path, mlo_pipeline *pipe, const view *v) {
  size_t ncomp = mlo_pipeline_component_count(pipe);
  needs n;
  compute_needs(pipe, &n);
  printf("%s: %zu component%s, %s of tensors, %s on the device\n\n", path, ncomp,
         ncomp == 1 ? "" : "s", tool_size(n.tensors), tool_size(n.all));
  printf("  %-18s %-8s %-14s %8s  %-22s %10s %10s\n", "component", "role", "role from", "tensors",
         "dtypes", "bytes", "on device");
  for (size_t i = 0; i < ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    size_t counts[MLO_DTYPE_COUNT];
    char dt[128];
    count_dtypes(c, counts);
    dtype_text(counts, dt, sizeof dt);
    printf("  %-18s %-8s %-14s %8zu  %-22s %10s %10s\n", tool_esc(mlo_component_name(c)),
           mlo_role_name(mlo_component_role(c)), mlo_role_source_name(mlo_component_role_source(c)),
           mlo_component_tensor_count(c), dt, tool_size(mlo_component_tensor_bytes(c)),
           tool_size(mlo_component_bytes(c)));
  }
  print_blocks(pipe);
  if (v->split)
    printf("\nexperts at %d steps: %s %d, %s %d (timestep >= %.3g x %d; %s, shift %.3g; %s)\n",
           v->steps, tool_esc(v->first), v->split->first_steps, tool_esc(v->second),
           v->steps - v->split->first_steps, v->split->sched.boundary_ratio,
           v->split->sched.num_train_timesteps, mlo_denoise_kind_name(v->split->sched.kind),
           v->split->sched.shift, v->split->source);
  if (v->no_split)
    printf("\nexperts %s and %s: the split cannot be computed: %s\n", tool_esc(v->first),
           tool_esc(v->second), tool_esc(v->no_split));
  uint64_t model = n.vae + (n.enc > n.max_dit ? n.enc : n.max_dit);
  printf("\ndevice memory needed at the peak:\n");
  char dit_label[96];
  snprintf(dit_label, sizeof dit_label, "  DiT phase: VAEs + %s",
           n.max_dit_name ? tool_esc(n.max_dit_name) : "(no DiT)");
  printf("  %-36s %10s\n", "all resident (--offload none)", tool_size(n.all));
  printf("  %-36s %10s\n", "model-level offload", tool_size(model));
  printf("  %-36s %10s\n", "  after enable: VAEs + encoders", tool_size(n.vae + n.enc));
  printf("  %-36s %10s\n", dit_label, tool_size(n.vae + n.max_dit));
  char least[96];
  snprintf(least, sizeof least, "  least: %s alone",
           n.max_comp_name ? tool_esc(n.max_comp_name) : "-");
  uint64_t ahead = model + n.max_comp < n.all ? model + n.max_comp : n.all;
  printf("  %-36s\n", "budget policy (--policy budget --budget SIZE)");
  printf("  %-36s %10s\n", least, tool_size(n.max_comp));
  printf("  %-36s %10s\n", "  prefetch: strict need + next", tool_size(ahead));
  printf("  %-36s %10s\n", "  no copies after the first prompt", tool_size(n.all));
  mlo_component *streams = NULL;
  uint64_t stream_least = mlo_workload_stream_least_bytes(pipe, &streams);
  if (streams && stream_least < n.max_comp) {
    char label[96];
    snprintf(label, sizeof label, "  least, streaming: %s", tool_esc(mlo_component_name(streams)));
    printf("  %-36s %10s\n", label, tool_size(stream_least));
  }
  host_need h;
  host_needs(pipe, stream_least, &h);
  printf("\nhost memory for the weights (--host-memory SIZE; docs/disk.md):\n");
  printf("  %-36s %10s\n", "every slab in host memory", tool_size(h.all));
  printf("  %-36s %10s\n", "least: every slab on disk", tool_size(h.least));
  printf("    (plus the disk tier's pinned staging ring, %s)\n", tool_size(MLO_STAGING_MAX_BYTES));
  if (h.stream_keep) {
    char label[96];
    snprintf(label, sizeof label, "streaming at %s, blocks kept", tool_size(stream_least));
    printf("  %-36s %10s\n", label, tool_size(h.stream_keep));
    printf("    (its streamed blocks in host memory: copied every step; with less, each is\n"
           "     read from disk at each use, docs/disk.md)\n");
  }
  if (!n.max_dit_name && !n.enc && !n.vae)
    printf("\nnote: nothing here would run (every component is 'other'); name the roles "
           "with --role NAME=dit|encoder|vae.\n");
  else if (!n.max_dit_name || !n.enc)
    printf("\nnote: model-level offload needs at least one DiT and one encoder; "
           "use --role NAME=ROLE to declare them.\n");
  if (v->tensors) print_tensors(pipe);
}

static cJSON *component_json(mlo_pipeline *pipe, mlo_component *c, bool tensors) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", mlo_component_name(c));
  cJSON_AddStringToObject(o, "role", mlo_role_name(mlo_component_role(c)));
  cJSON_AddStringToObject(o, "role_source", mlo_role_source_name(mlo_component_role_source(c)));
  cJSON_AddNumberToObject(o, "tensors", (double)mlo_component_tensor_count(c));
  cJSON_AddNumberToObject(o, "tensor_bytes", (double)mlo_component_tensor_bytes(c));
  cJSON_AddNumberToObject(o, "device_bytes", (double)mlo_component_bytes(c));
  block_view b;
  blocks_of(c, &b);
  cJSON *bj = cJSON_AddObjectToObject(o, "blocks");
  cJSON_AddNumberToObject(bj, "count", (double)b.blocks);
  cJSON_AddNumberToObject(bj, "largest_bytes", (double)b.largest);
  cJSON_AddNumberToObject(bj, "prologue_bytes", (double)b.prologue);
  cJSON_AddNumberToObject(bj, "epilogue_bytes", (double)b.epilogue);
  cJSON_AddNumberToObject(bj, "stream_least_bytes", (double)b.least);
  size_t counts[MLO_DTYPE_COUNT];
  count_dtypes(c, counts);
  cJSON *dt = cJSON_AddObjectToObject(o, "dtypes");
  for (int d = 0; d < MLO_DTYPE_COUNT; d++)
    if (counts[d]) cJSON_AddNumberToObject(dt, mlo_dtype_name((mlo_dtype)d), (double)counts[d]);
  if (tensors) {
    cJSON_AddItemToObject(o, "files", tensors_json(pipe, c));
    cJSON_AddItemToObject(o, "tensor_list", tensor_list_json(c));
  }
  return o;
}

static int print_json(const char *path, mlo_pipeline *pipe, const view *v) {
  needs n;
  compute_needs(pipe, &n);
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "path", path);
  cJSON *comps = cJSON_AddArrayToObject(root, "components");
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++)
    cJSON_AddItemToArray(comps,
                         component_json(pipe, mlo_pipeline_component_at(pipe, i), v->tensors));
  if (v->split) {
    cJSON *ex = cJSON_AddObjectToObject(root, "experts");
    cJSON_AddNumberToObject(ex, "steps", v->steps);
    cJSON_AddStringToObject(ex, "first", v->first);
    cJSON_AddStringToObject(ex, "second", v->second);
    cJSON_AddNumberToObject(ex, "first_steps", v->split->first_steps);
    cJSON_AddNumberToObject(ex, "second_steps", v->steps - v->split->first_steps);
    cJSON_AddNumberToObject(ex, "boundary_ratio", v->split->sched.boundary_ratio);
    cJSON_AddStringToObject(ex, "scheduler", mlo_denoise_kind_name(v->split->sched.kind));
    cJSON_AddNumberToObject(ex, "shift", v->split->sched.shift);
    cJSON_AddStringToObject(ex, "source", v->split->source);
  } else if (v->no_split) {
    cJSON *ex = cJSON_AddObjectToObject(root, "experts");
    cJSON_AddStringToObject(ex, "first", v->first);
    cJSON_AddStringToObject(ex, "second", v->second);
    cJSON_AddStringToObject(ex, "error", v->no_split);
  }
  cJSON_AddNumberToObject(root, "tensor_bytes", (double)n.tensors);
  cJSON_AddNumberToObject(root, "all_resident_bytes", (double)n.all);
  cJSON_AddNumberToObject(root, "model_offload_bytes",
                          (double)(n.vae + (n.enc > n.max_dit ? n.enc : n.max_dit)));
  cJSON_AddNumberToObject(root, "enable_phase_bytes", (double)(n.vae + n.enc));
  cJSON_AddNumberToObject(root, "dit_phase_bytes", (double)(n.vae + n.max_dit));
  cJSON_AddNumberToObject(root, "max_component_bytes", (double)n.max_comp);
  uint64_t model = n.vae + (n.enc > n.max_dit ? n.enc : n.max_dit);
  cJSON *budget = cJSON_AddObjectToObject(root, "budget_policy");
  cJSON_AddNumberToObject(budget, "least_bytes", (double)n.max_comp);
  cJSON_AddNumberToObject(budget, "prefetch_bytes",
                          (double)(model + n.max_comp < n.all ? model + n.max_comp : n.all));
  cJSON_AddNumberToObject(budget, "no_copies_bytes", (double)n.all);
  host_need h;
  host_needs(pipe, mlo_workload_stream_least_bytes(pipe, NULL), &h);
  cJSON *host = cJSON_AddObjectToObject(root, "host_memory");
  cJSON_AddNumberToObject(host, "all_bytes", (double)h.all);
  cJSON_AddNumberToObject(host, "least_bytes", (double)h.least);
  cJSON_AddNumberToObject(host, "streamed_kept_bytes",
                          (double)(h.stream_keep ? h.stream_keep : h.least));
  cJSON_AddNumberToObject(host, "staging_bytes", (double)MLO_STAGING_MAX_BYTES);
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  return tool_print_json_text(text);
}

int cmd_inspect(int argc, char **argv) {
  targs a;
  targs_init(&a, "inspect", argc, argv);
  tool_source src = {0};
  tool_split_args sa = {0};
  view v = {.steps = 8};
  long steps = 8;
  const char *val;
  while (targs_next(&a)) {
    if (targs_is_help(&a)) {
      help();
      source_free(&src);
      return TOOL_EXIT_OK;
    } else if (targs_flag(&a, "--json")) {
      v.json = true;
    } else if (targs_flag(&a, "--tensors")) {
      v.tensors = true;
    } else if (targs_value(&a, "--steps", &val)) {
      if (targs_int(&a, "--steps", val, 1, 100000, &steps)) v.steps = (int)steps;
    } else if (split_flag(&a, &sa) || source_flag(&a, &src)) {
    } else if (targs_cur(&a)[0] == '-' && targs_cur(&a)[1]) {
      targs_unknown(&a);
    } else if (!src.path) {
      src.path = targs_cur(&a);
    } else {
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
    }
  }
  source_finish(&a, &src);
  int code = TOOL_EXIT_USAGE;
  if (a.failed) goto out_free;
  char err[1024] = "";
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  tool_split split;
  int rc = mlo_platform_open("host", &plat, err, sizeof err);
  if (!rc) rc = source_open(&src, &plat, 1, NULL, 0, &pipe, err, sizeof err);
  if (!rc) mlo_pipeline_warn_guessed(pipe); /* after the --role overrides */
  char why[1024] = "";
  if (!rc && tool_dits(pipe, &v.first, &v.second) == 2) {
    /* Without the split inspect still shows the components, and says what
     * is missing: it is what a user runs to find out. */
    if (split_resolve(&src, &sa, pipe, v.steps, &split, why, sizeof why) == MLO_OK)
      v.split = &split;
    else
      v.no_split = why;
  }
  if (rc) {
    tool_failf("inspect", "%s", err[0] ? err : mlo_strerror(rc));
    code = tool_exit_for(rc);
  } else if (v.json) {
    code = print_json(src.label, pipe, &v);
  } else {
    print_text(src.label, pipe, &v);
    code = TOOL_EXIT_OK;
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
out_free:
  source_free(&src);
  return code;
}
