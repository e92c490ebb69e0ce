/*
 * pipeline_dir.c — mlo_pipeline_open_path: a diffusers pipeline directory,
 * a lone component folder or a single .safetensors file becomes a pipeline
 * of file-backed components.  This file reads model_index.json, decides
 * which entries are components and what role each gets (heuristic or the
 * caller's override); index.c finds and validates each folder's weights.
 * The pipeline is built privately and handed out only when everything
 * succeeded, so a failed open leaves nothing behind.
 */
#include "base/sysio.h"
#include "mlo/checkpoint.h"

#include "base/log.h"
#include "format/index.h"
#include "format/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL_INDEX_CAP (16u * 1024u * 1024u)

typedef struct {
  const char *root;           /* the path given */
  const mlo_open_options *oo; /* never NULL inside */
  mlo_pipeline *pipe;
  size_t variant_hits; /* components that had the requested variant */
  char *err;
  size_t errlen;
} open_ctx;

static int fail(open_ctx *c, int status, const char *fmt, ...) MLO_PRINTF(3, 4);
static int fail(open_ctx *c, int status, const char *fmt, ...) {
  if (c->err && c->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
  }
  return status;
}

/* Classes that never carry weights; their folders are not even looked at. */
static bool class_is_weightless(const char *cls) {
  static const char *const suffixes[] = {"Scheduler", "Tokenizer",        "TokenizerFast",
                                         "Processor", "FeatureExtractor", "ImageProcessor"};
  size_t lc = strlen(cls);
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
    size_t ls = strlen(suffixes[i]);
    if (lc >= ls && !strcmp(cls + lc - ls, suffixes[i])) return true;
  }
  return false;
}

static const mlo_role_override *find_override(const open_ctx *c, const char *name) {
  for (size_t i = 0; i < c->oo->override_count; i++)
    if (!strcmp(c->oo->overrides[i].name, name)) return &c->oo->overrides[i];
  return NULL;
}

/* Adds one component with its role: the caller's override, else the
 * heuristic on key and class (said once, for every guess, by
 * mlo_pipeline_warn_guessed). */
static int add_component(open_ctx *c, const char *name, const char *cls, mlo_component **out) {
  const mlo_role_override *ov = find_override(c, name);
  mlo_role role = ov ? ov->role : MLO_ROLE_AUTO;
  int rc = mlo_component_add(c->pipe, name, role, out);
  if (rc == MLO_OK) {
    if (ov) {
      rc = mlo_component_set_role(*out, ov->role, MLO_ROLE_FROM_OVERRIDE);
    } else {
      mlo_role guess = mlo_role_guess(name, cls);
      if (guess != mlo_component_role(*out))
        rc = mlo_component_set_role(*out, guess, MLO_ROLE_FROM_HEURISTIC);
    }
  }
  if (rc != MLO_OK)
    return fail(c, rc, "%s: component '%s': %s", c->root, name, mlo_pipeline_errmsg(c->pipe));
  return MLO_OK;
}

/* One component from a folder's weights.  MLO_ENOTFOUND (with a message)
 * when the folder has no safetensors file. */
static int add_folder(open_ctx *c, const char *name, const char *cls, const char *folder) {
  mlo_weight_set ws;
  int rc = mlo_weight_set_find(folder, c->oo->variant, c->oo->allow_stray, &ws, c->err, c->errlen);
  if (rc != MLO_OK) return rc;
  if (c->oo->variant && ws.used_variant)
    c->variant_hits++;
  else if (c->oo->variant)
    mlo_logf(MLO_LOG_WARN, "%s: no '%s' variant files; using the plain weights", folder,
             c->oo->variant);
  mlo_component *comp = NULL;
  rc = add_component(c, name, cls, &comp);
  if (rc == MLO_OK) rc = mlo_weight_set_declare(&ws, comp, c->oo->tensor_flags, c->err, c->errlen);
  mlo_weight_set_close(&ws);
  return rc;
}

static bool plain_name(const char *s) {
  return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\\');
}

/* One model_index.json entry.  Skips what is not a weight-bearing
 * component; errors for malformed entries and missing folders. */
static int open_entry(open_ctx *c, const cJSON *entry) {
  const char *key = entry->string;
  if (key[0] == '_' || !cJSON_IsArray(entry)) return MLO_OK; /* metadata, configuration */
  const cJSON *lib = cJSON_GetArrayItem(entry, 0), *cls = cJSON_GetArrayItem(entry, 1);
  if (cJSON_GetArraySize(entry) != 2 ||
      !((cJSON_IsNull(lib) && cJSON_IsNull(cls)) || (cJSON_IsString(lib) && cJSON_IsString(cls))))
    return fail(c, MLO_EFORMAT,
                "%s/model_index.json: entry \"%s\" is not a 2-element [library, class] array "
                "(or [null, null])",
                c->root, key);
  if (cJSON_IsNull(lib) || class_is_weightless(cls->valuestring)) return MLO_OK;
  if (!plain_name(key))
    return fail(c, MLO_EFORMAT, "%s/model_index.json: entry \"%s\" is not a folder name", c->root,
                key);
  char *folder = mlo_path_join(c->root, key);
  if (!folder) return fail(c, MLO_ENOMEM, "%s: out of memory", c->root);
  struct stat st;
  int rc = MLO_OK;
  if (stat(folder, &st) != 0 || !S_ISDIR(st.st_mode))
    rc = fail(c, MLO_ENOTFOUND,
              "%s: component '%s' (%s) is listed in model_index.json but its folder %s is missing",
              c->root, key, cls->valuestring, folder);
  else
    rc = add_folder(c, key, cls->valuestring, folder);
  if (rc == MLO_ENOTFOUND && stat(folder, &st) == 0) {
    mlo_role role = mlo_role_guess(key, cls->valuestring);
    if (role == MLO_ROLE_OTHER && !find_override(c, key)) {
      mlo_logf(MLO_LOG_INFO, "%s: no weights, skipped", folder);
      rc = MLO_OK;
    } else {
      rc = fail(c, MLO_EFORMAT, "%s: component '%s' (%s, role %s) has no safetensors weights",
                folder, key, cls->valuestring, mlo_role_name(role));
    }
  }
  free(folder);
  return rc;
}

static int open_pipeline_dir(open_ctx *c, const char *index_path) {
  cJSON *root = NULL;
  int rc = mlo_json_read_file(index_path, MODEL_INDEX_CAP, 0, &root, c->err, c->errlen);
  if (rc != MLO_OK) return rc;
  if (!cJSON_IsObject(root))
    rc = fail(c, MLO_EFORMAT, "%s/model_index.json: not a JSON object", c->root);
  const cJSON *entry;
  if (rc == MLO_OK) cJSON_ArrayForEach(entry, root) {
      if ((rc = open_entry(c, entry)) != MLO_OK) break;
    }
  cJSON_Delete(root);
  if (rc == MLO_OK && mlo_pipeline_component_count(c->pipe) == 0)
    rc = fail(c, MLO_EFORMAT, "%s: model_index.json lists no component with weights", c->root);
  return rc;
}

/* The name of the last path element, without a trailing '/' or suffix. */
static char *base_name(const char *path, const char *suffix) {
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') len--;
  size_t start = len;
  while (start > 0 && path[start - 1] != '/') start--;
  size_t ls = suffix ? strlen(suffix) : 0;
  if (ls && len - start > ls && !strncmp(path + len - ls, suffix, ls)) len -= ls;
  char *name = mlo_malloc(len - start + 1);
  if (name) memcpy(name, path + start, len - start), name[len - start] = '\0';
  return name;
}

/* The class of a lone component folder, from its config.json when there
 * is one (diffusers "_class_name", transformers "architectures"[0]). */
static char *folder_class(const char *folder) {
  char *path = mlo_path_join(folder, "config.json"), *cls = NULL;
  char why[512];
  cJSON *root = NULL;
  /* Best effort: the class only names the role.  Absent is fine; a config
   * that cannot be read (a FIFO, bad JSON) is said, not guessed through. */
  if (path && access(path, F_OK) == 0 &&
      mlo_json_read_file(path, MODEL_INDEX_CAP, 0, &root, why, sizeof why))
    mlo_logf(MLO_LOG_WARN, "%s; its class is not used", why);
  free(path);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
  if (!cJSON_IsString(v))
    v = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0);
  if (cJSON_IsString(v)) cls = mlo_strdup(v->valuestring);
  cJSON_Delete(root);
  return cls;
}

static int open_single_file(open_ctx *c) {
  char *name =
      c->oo->single_name ? mlo_strdup(c->oo->single_name) : base_name(c->root, ".safetensors");
  if (!name) return fail(c, MLO_ENOMEM, "%s: out of memory", c->root);
  mlo_st_file *f = NULL;
  mlo_component *comp = NULL;
  int rc = mlo_st_open(c->root, &f, c->err, c->errlen);
  if (rc == MLO_OK) rc = add_component(c, name, NULL, &comp);
  if (rc == MLO_OK) rc = mlo_st_add_to_component(f, comp, c->oo->tensor_flags, c->err, c->errlen);
  mlo_st_close(f);
  free(name);
  return rc;
}

static int open_component_dir(open_ctx *c) {
  char *name = c->oo->single_name ? mlo_strdup(c->oo->single_name) : base_name(c->root, NULL);
  char *cls = folder_class(c->root);
  int rc = name ? add_folder(c, name, cls, c->root) : fail(c, MLO_ENOMEM, "out of memory");
  if (rc == MLO_ENOTFOUND)
    rc = fail(c, MLO_ENOTFOUND, "%s: neither model_index.json nor safetensors weights here",
              c->root);
  free(cls);
  free(name);
  return rc;
}

static int check_overrides(open_ctx *c, bool after_open) {
  for (size_t i = 0; i < c->oo->override_count; i++) {
    const mlo_role_override *ov = &c->oo->overrides[i];
    if (!after_open && (!ov->name || ov->role < MLO_ROLE_DIT || ov->role > MLO_ROLE_OTHER))
      return fail(c, MLO_EINVAL, "role override %zu: needs a name and a concrete role", i);
    if (after_open && !mlo_pipeline_find(c->pipe, ov->name)) {
      char names[512] = "";
      for (size_t k = 0; k < mlo_pipeline_component_count(c->pipe); k++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "",
                 mlo_component_name(mlo_pipeline_component_at(c->pipe, k)));
      }
      return fail(c, MLO_ENOTFOUND,
                  "%s: role override names '%s', which is not a component "
                  "(components: %s)",
                  c->root, ov->name, names);
    }
  }
  return MLO_OK;
}

int mlo_pipeline_open_path(const mlo_pipeline_options *opts, const char *path,
                           const mlo_open_options *oo, mlo_pipeline **out, char *err,
                           size_t errlen) {
  static const mlo_open_options defaults = MLO_OPEN_OPTIONS_INIT;
  open_ctx c = {path, oo ? oo : &defaults, NULL, 0, err, errlen};
  if (err && errlen) err[0] = '\0';
  if (!out) return MLO_EINVAL;
  *out = NULL;
  if (!opts || !path || (oo && oo->size < sizeof *oo) ||
      (oo && oo->override_count && !oo->overrides))
    return fail(&c, MLO_EINVAL, "mlo_pipeline_open_path: invalid arguments");
  int rc = check_overrides(&c, false);
  if (rc != MLO_OK) return rc;
  struct stat st;
  if (stat(path, &st) != 0) return fail(&c, MLO_ENOTFOUND, "%s: %s", path, strerror(errno));
  if ((rc = mlo_pipeline_create(opts, &c.pipe)) != MLO_OK)
    return fail(&c, rc, "%s: cannot create the pipeline: %s", path, mlo_strerror(rc));
  char *index_path = mlo_path_join(path, "model_index.json");
  struct stat ist;
  if (!index_path)
    rc = fail(&c, MLO_ENOMEM, "%s: out of memory", path);
  else if (S_ISREG(st.st_mode))
    rc = open_single_file(&c);
  else if (!S_ISDIR(st.st_mode))
    rc = fail(&c, MLO_EINVAL, "%s: not a file or a folder", path);
  else if (stat(index_path, &ist) == 0)
    rc = open_pipeline_dir(&c, index_path);
  else
    rc = open_component_dir(&c);
  free(index_path);
  if (rc == MLO_OK) rc = check_overrides(&c, true);
  if (rc == MLO_OK && S_ISDIR(st.st_mode) && c.oo->variant && c.variant_hits == 0)
    rc = fail(&c, MLO_ENOTFOUND, "%s: no component has weights for variant '%s'", path,
              c.oo->variant);
  if (rc != MLO_OK) {
    mlo_pipeline_free(c.pipe);
    return rc;
  }
  *out = c.pipe;
  return MLO_OK;
}
