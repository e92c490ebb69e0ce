/*
 * cmd_inspect.c — `mlo inspect PATH [--json]`: what a checkpoint holds and
 * what each mode would need, before anything is loaded: components, their
 * roles and where each role came from, tensor counts, dtypes, bytes, and
 * the peak device memory of all-resident versus model-level offload.
 * Reads only the safetensors headers.
 */
#include "tool.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static void help(void) {
  printf("usage: mlo inspect PATH [--json] [--role NAME=ROLE]...\n\n"
         "PATH is a diffusers pipeline directory (model_index.json), a component folder,\n"
         "or a single .safetensors file.  Prints each component's role and where the\n"
         "role came from, its tensor count, dtypes and bytes, and the device memory each\n"
         "mode needs at its peak:\n"
         "  all resident        the sum of every component\n"
         "  model-level offload the larger of (VAEs + encoders), resident together after\n"
         "                      enable, and (VAEs + the largest DiT)\n"
         "  budget policy       at least the largest component; with room for the next\n"
         "                      component beside the strict need, prefetch hides the\n"
         "                      switches; with everything, nothing moves after the\n"
         "                      first prompt (docs/planner.md)\n\n"
         "flags:\n"
         "  --json              one JSON object on stdout\n"
         "  --role NAME=ROLE    override a component's role (dit, encoder, vae, other)\n\n"
         "examples:\n"
         "  mlo inspect ./mlo-cache/wan2.2-t2v-0.005\n"
         "  mlo inspect flux1-dev.safetensors --json\n");
}

typedef struct {
  uint64_t vae, enc, max_dit, all, max_comp;
  const char *max_dit_name, *max_comp_name;
} needs;

static void compute_needs(mlo_pipeline *pipe, needs *n) {
  memset(n, 0, sizeof *n);
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    uint64_t b = mlo_component_bytes(c);
    n->all += b;
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

static void print_text(const char *path, mlo_pipeline *pipe) {
  size_t ncomp = mlo_pipeline_component_count(pipe);
  needs n;
  compute_needs(pipe, &n);
  printf("%s: %zu component%s, %s\n\n", path, ncomp, ncomp == 1 ? "" : "s", tool_size(n.all));
  printf("  %-18s %-8s %-14s %8s  %-22s %10s\n", "component", "role", "role from", "tensors",
         "dtypes", "size");
  for (size_t i = 0; i < ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    size_t counts[MLO_DTYPE_COUNT];
    char dt[128];
    count_dtypes(c, counts);
    dtype_text(counts, dt, sizeof dt);
    printf("  %-18s %-8s %-14s %8zu  %-22s %10s\n", mlo_component_name(c),
           mlo_role_name(mlo_component_role(c)), mlo_role_source_name(mlo_component_role_source(c)),
           mlo_component_tensor_count(c), dt, tool_size(mlo_component_bytes(c)));
  }
  uint64_t model = n.vae + (n.enc > n.max_dit ? n.enc : n.max_dit);
  printf("\ndevice memory needed at the peak:\n");
  char dit_label[96];
  snprintf(dit_label, sizeof dit_label, "  DiT phase: VAEs + %s",
           n.max_dit_name ? n.max_dit_name : "(no DiT)");
  printf("  %-36s %10s\n", "all resident (--offload none)", tool_size(n.all));
  printf("  %-36s %10s\n", "model-level offload", tool_size(model));
  printf("  %-36s %10s\n", "  after enable: VAEs + encoders", tool_size(n.vae + n.enc));
  printf("  %-36s %10s\n", dit_label, tool_size(n.vae + n.max_dit));
  char least[96];
  snprintf(least, sizeof least, "  least: %s alone", n.max_comp_name ? n.max_comp_name : "-");
  uint64_t ahead = model + n.max_comp < n.all ? model + n.max_comp : n.all;
  printf("  %-36s\n", "budget policy (--policy budget --budget SIZE)");
  printf("  %-36s %10s\n", least, tool_size(n.max_comp));
  printf("  %-36s %10s\n", "  prefetch: strict need + next", tool_size(ahead));
  printf("  %-36s %10s\n", "  no copies after the first prompt", tool_size(n.all));
  if (!n.max_dit_name || !n.enc)
    printf("\nnote: model-level offload needs at least one DiT and one encoder; "
           "use --role NAME=ROLE to declare them.\n");
}

static cJSON *component_json(mlo_component *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", mlo_component_name(c));
  cJSON_AddStringToObject(o, "role", mlo_role_name(mlo_component_role(c)));
  cJSON_AddStringToObject(o, "role_source", mlo_role_source_name(mlo_component_role_source(c)));
  cJSON_AddNumberToObject(o, "tensors", (double)mlo_component_tensor_count(c));
  cJSON_AddNumberToObject(o, "bytes", (double)mlo_component_bytes(c));
  size_t counts[MLO_DTYPE_COUNT];
  count_dtypes(c, counts);
  cJSON *dt = cJSON_AddObjectToObject(o, "dtypes");
  for (int d = 0; d < MLO_DTYPE_COUNT; d++)
    if (counts[d]) cJSON_AddNumberToObject(dt, mlo_dtype_name((mlo_dtype)d), (double)counts[d]);
  return o;
}

static int print_json(const char *path, mlo_pipeline *pipe) {
  needs n;
  compute_needs(pipe, &n);
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "path", path);
  cJSON *comps = cJSON_AddArrayToObject(root, "components");
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++)
    cJSON_AddItemToArray(comps, component_json(mlo_pipeline_component_at(pipe, i)));
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
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  return tool_print_json_text(text);
}

int cmd_inspect(int argc, char **argv) {
  targs a;
  targs_init(&a, "inspect", argc, argv);
  const char *path = NULL, *val;
  bool json = false;
  mlo_role_override roles[TOOL_MAX_ROLES];
  size_t nroles = 0;
  while (targs_next(&a)) {
    if (targs_is_help(&a)) {
      help();
      targs_free_roles(roles, nroles);
      return TOOL_EXIT_OK;
    } else if (targs_flag(&a, "--json")) {
      json = true;
    } else if (targs_value(&a, "--role", &val)) {
      targs_role(&a, val, roles, &nroles, TOOL_MAX_ROLES);
    } else if (targs_cur(&a)[0] == '-' && targs_cur(&a)[1]) {
      targs_unknown(&a);
    } else if (!path) {
      path = targs_cur(&a);
    } else {
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
    }
  }
  if (!a.failed && !path) targs_error(&a, "needs a PATH");
  int code = TOOL_EXIT_USAGE;
  if (a.failed) goto out_free_roles;
  char err[512] = "";
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  int rc = mlo_platform_open("host", &plat, err, sizeof err);
  if (!rc) {
    mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
    po.platform = plat;
    mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
    oo.overrides = roles;
    oo.override_count = nroles;
    rc = mlo_pipeline_open_path(&po, path, &oo, &pipe, err, sizeof err);
    if (!rc) mlo_pipeline_warn_guessed(pipe); /* after the --role overrides */
  }
  if (rc) {
    tool_err("inspect %s: %s", path, err[0] ? err : mlo_strerror(rc));
    code = tool_exit_for(rc);
  } else if (json) {
    code = print_json(path, pipe);
  } else {
    print_text(path, pipe);
    code = TOOL_EXIT_OK;
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
out_free_roles:
  targs_free_roles(roles, nroles);
  return code;
}
