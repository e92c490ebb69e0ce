/*
 * pipeline_dir.c — mlo_pipeline_open_path: a diffusers pipeline directory,
 * a lone component folder or a single .safetensors or .gguf file becomes a
 * pipeline of file-backed components; mlo_pipeline_open_files builds one
 * from separate files (the ComfyUI / stable-diffusion.cpp layout).  This file reads
 * model_index.json, decides which entries are components and what role each gets (heuristic or the
 * caller's override); index.c finds and validates each folder's weights.
 * The pipeline is built privately and handed out only when everything
 * succeeded, so a failed open leaves nothing behind.
 */
#include "base/sysio.h"
#include "mlo/checkpoint.h"

#include "base/log.h"
#include "format/readers.h"
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
  const char *hint;    /* a second name for the role heuristic, or NULL */
  char misses[256];    /* components without the requested variant */
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

/* Adds one component with its role: the caller's override, else the role
 * it was given (a file on the command line), else the role its model class
 * declares, else the heuristic on its name and class, then on c->hint (a
 * file's own name, a GGUF's architecture).  Every guess is said once, by
 * mlo_pipeline_warn_guessed. */
static int add_component(open_ctx *c, const char *name, const char *cls, mlo_role declared,
                         mlo_component **out) {
  const mlo_role_override *ov = find_override(c, name);
  int rc = mlo_component_add(c->pipe, name, ov ? ov->role : declared, out);
  mlo_role role;
  if (rc != MLO_OK) {
  } else if (ov) {
    rc = mlo_component_set_role(*out, ov->role, MLO_ROLE_FROM_OVERRIDE);
  } else if (declared != MLO_ROLE_AUTO) {
  } else if (cls && mlo_role_from_class(cls, &role) == MLO_OK) {
    rc = mlo_component_set_role(*out, role, MLO_ROLE_FROM_CLASS);
  } else {
    role = mlo_role_guess(name, cls);
    if (role == MLO_ROLE_OTHER && c->hint) role = mlo_role_guess(c->hint, NULL);
    if (role != mlo_component_role(*out))
      rc = mlo_component_set_role(*out, role, MLO_ROLE_FROM_HEURISTIC);
  }
  if (rc != MLO_OK)
    return fail(c, rc, "%s: component '%s': %s", c->root, name, mlo_pipeline_errmsg(c->pipe));
  return MLO_OK;
}

/* One component from a folder's weights.  MLO_ENOTFOUND (with a message)
 * when the folder has no safetensors file. */
static int add_folder(open_ctx *c, const char *name, const char *cls, mlo_role declared,
                      const char *folder) {
  mlo_weight_set ws;
  int rc = mlo_weight_set_find(folder, c->oo->variant, c->oo->allow_stray, &ws, c->err, c->errlen);
  if (rc != MLO_OK) return rc;
  if (c->oo->variant && ws.used_variant) {
    c->variant_hits++;
  } else if (c->oo->variant) { /* said once, at the end, if some component has it */
    size_t len = strlen(c->misses);
    snprintf(c->misses + len, sizeof c->misses - len, "%s%s", len ? ", " : "", name);
  }
  mlo_component *comp = NULL;
  rc = add_component(c, name, cls, declared, &comp);
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
    rc = add_folder(c, key, cls->valuestring, MLO_ROLE_AUTO, folder);
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

/* One file as one component, in the format its first bytes say
 * (readers.h).  The role heuristic also reads the file's own name and what
 * the file says it holds (a GGUF's general.architecture). */
static int add_file(open_ctx *c, const char *name, mlo_role declared, const char *path) {
  uint8_t magic[4] = {0};
  int fd;
  mlo_file_id id;
  int rc = mlo_open_regular(path, &fd, &id, c->err, c->errlen);
  if (rc) return rc;
  if (id.size >= 4 && mlo_pread_full(fd, magic, 4, 0) != 0)
    rc = fail(c, MLO_EIO, "%s: cannot read its first bytes: %s", path,
              errno ? strerror(errno) : "the file shrank");
  close(fd);
  if (rc) return rc;
  const struct mlo_reader *r = mlo_reader_for(magic, id.size >= 4 ? 4 : 0);
  char *file_name = base_name(path, r->ext);
  if (!file_name) return fail(c, MLO_ENOMEM, "%s: out of memory", path);
  mlo_component *comp = NULL;
  const char *saved_root = c->root;
  c->root = path;
  c->hint = file_name;
  void *f = NULL;
  rc = r->open(path, &f, c->err, c->errlen);
  const char *arch = rc == MLO_OK && r->architecture ? r->architecture(f) : NULL;
  if (arch && mlo_role_guess(file_name, NULL) == MLO_ROLE_OTHER) c->hint = arch;
  if (rc == MLO_OK) rc = add_component(c, name ? name : file_name, NULL, declared, &comp);
  if (rc == MLO_OK) rc = r->add_to_component(f, comp, c->oo->tensor_flags, c->err, c->errlen);
  if (f) r->close(f);
  c->root = saved_root;
  c->hint = NULL;
  free(file_name);
  return rc;
}

/* A folder without model_index.json as one component. */
static int add_component_dir(open_ctx *c, const char *name, mlo_role declared, const char *path) {
  char *own = name ? NULL : base_name(path, NULL);
  char *cls = folder_class(path);
  int rc = name || own ? add_folder(c, name ? name : own, cls, declared, path)
                       : fail(c, MLO_ENOMEM, "out of memory");
  if (rc == MLO_ENOTFOUND)
    rc = fail(c, MLO_ENOTFOUND, "%s: neither model_index.json nor safetensors weights here", path);
  free(cls);
  free(own);
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
  open_ctx c = {.root = path, .oo = oo ? oo : &defaults, .err = err, .errlen = errlen};
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
    rc = add_file(&c, c.oo->single_name, MLO_ROLE_AUTO, path);
  else if (!S_ISDIR(st.st_mode))
    rc = fail(&c, MLO_EINVAL, "%s: not a file or a folder", path);
  else if (stat(index_path, &ist) == 0)
    rc = open_pipeline_dir(&c, index_path);
  else
    rc = add_component_dir(&c, c.oo->single_name, MLO_ROLE_AUTO, path);
  free(index_path);
  if (rc == MLO_OK) rc = check_overrides(&c, true);
  if (rc == MLO_OK && S_ISDIR(st.st_mode) && c.oo->variant && c.variant_hits == 0)
    rc = fail(&c, MLO_ENOTFOUND, "%s: no component has weights for variant '%s'", path,
              c.oo->variant);
  if (rc == MLO_OK && c.misses[0])
    mlo_logf(MLO_LOG_WARN, "%s: no '%s' files for %s; using the plain weights there", path,
             c.oo->variant, c.misses);
  if (rc != MLO_OK) {
    mlo_pipeline_free(c.pipe);
    return rc;
  }
  *out = c.pipe;
  return MLO_OK;
}

int mlo_pipeline_open_files(const mlo_pipeline_options *opts, const mlo_component_file *files,
                            size_t count, const mlo_open_options *oo, mlo_pipeline **out, char *err,
                            size_t errlen) {
  static const mlo_open_options defaults = MLO_OPEN_OPTIONS_INIT;
  open_ctx c = {.root = "(files)", .oo = oo ? oo : &defaults, .err = err, .errlen = errlen};
  if (err && errlen) err[0] = '\0';
  if (!out) return MLO_EINVAL;
  *out = NULL;
  if (!opts || !files || !count || (oo && oo->size < sizeof *oo) ||
      (oo && oo->override_count && !oo->overrides))
    return fail(&c, MLO_EINVAL, "mlo_pipeline_open_files: invalid arguments");
  for (size_t i = 0; i < count; i++)
    if (!files[i].path || !files[i].name || !files[i].name[0] ||
        (files[i].role != MLO_ROLE_AUTO &&
         (files[i].role < MLO_ROLE_DIT || files[i].role > MLO_ROLE_OTHER)))
      return fail(&c, MLO_EINVAL, "component file %zu: needs a name, a path and a role", i);
  int rc = check_overrides(&c, false);
  if (rc != MLO_OK) return rc;
  if ((rc = mlo_pipeline_create(opts, &c.pipe)) != MLO_OK)
    return fail(&c, rc, "cannot create the pipeline: %s", mlo_strerror(rc));
  size_t folders = 0;
  for (size_t i = 0; i < count && rc == MLO_OK; i++) {
    const mlo_component_file *f = &files[i];
    struct stat st;
    char *index_path = NULL;
    c.root = f->path;
    if (mlo_pipeline_find(c.pipe, f->name))
      rc = fail(&c, MLO_EEXIST, "component '%s' is given twice (%s)", f->name, f->path);
    else if (stat(f->path, &st) != 0)
      rc = fail(&c, MLO_ENOTFOUND, "component '%s': %s: %s", f->name, f->path, strerror(errno));
    else if (S_ISREG(st.st_mode))
      rc = add_file(&c, f->name, f->role, f->path);
    else if (!S_ISDIR(st.st_mode))
      rc = fail(&c, MLO_EINVAL, "component '%s': %s is not a file or a folder", f->name, f->path);
    else if (!(index_path = mlo_path_join(f->path, "model_index.json")))
      rc = fail(&c, MLO_ENOMEM, "out of memory");
    else if (access(index_path, F_OK) == 0)
      rc = fail(&c, MLO_EINVAL,
                "component '%s': %s is a whole pipeline (it has model_index.json); give it as "
                "the PATH, or name one of its component folders",
                f->name, f->path);
    else {
      folders++;
      rc = add_component_dir(&c, f->name, f->role, f->path);
    }
    free(index_path);
  }
  c.root = "(files)";
  if (rc == MLO_OK) rc = check_overrides(&c, true);
  if (rc == MLO_OK && folders && c.oo->variant && c.variant_hits == 0)
    rc = fail(&c, MLO_ENOTFOUND, "no component folder has weights for variant '%s'", c.oo->variant);
  if (rc == MLO_OK && c.misses[0])
    mlo_logf(MLO_LOG_WARN, "no '%s' files for %s; using the plain weights there", c.oo->variant,
             c.misses);
  if (rc != MLO_OK) {
    mlo_pipeline_free(c.pipe);
    return rc;
  }
  *out = c.pipe;
  return MLO_OK;
}
