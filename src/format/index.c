/*
 * index.c — a component folder's weights: which safetensors file(s) hold
 * them for a variant, and, when sharded, whether the weight map and the
 * shards agree.  Everything here is hostile input, so the whole shard set
 * is checked before a single tensor is declared; each problem is its own
 * message naming the folder and the file (rules in include/mlo/checkpoint.h).
 */
#include "base/sysio.h"
#include "format/index.h"
#include "format/json.h"

#include "base/log.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_FILE_CAP (64u * 1024u * 1024u) /* a weight map is a few hundred KiB */

static const char *const known_stems[] = {"diffusion_pytorch_model", "model"};

char *mlo_path_join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *p = mlo_malloc(la + lb + 2);
  if (!p) return NULL;
  memcpy(p, a, la);
  size_t n = la;
  if (la && a[la - 1] != '/') p[n++] = '/';
  memcpy(p + n, b, lb + 1);
  return p;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t ls = strlen(s), lx = strlen(suffix);
  return ls >= lx && memcmp(s + ls - lx, suffix, lx) == 0;
}

/* True if s[0..len) ends with "-<digits>-of-<digits>" (a shard suffix). */
static bool has_shard_suffix(const char *s, size_t len) {
  size_t i = len, d2 = 0, d1 = 0;
  while (i > 0 && isdigit((unsigned char)s[i - 1])) i--, d2++;
  if (!d2 || i < 4 || memcmp(s + i - 4, "-of-", 4) != 0) return false;
  i -= 4;
  while (i > 0 && isdigit((unsigned char)s[i - 1])) i--, d1++;
  return d1 && i > 0 && s[i - 1] == '-';
}

/* ---- folder listing ---------------------------------------------------- */

typedef struct {
  size_t count, cap;
  char **names;
} name_list;

static void names_free(name_list *l) {
  for (size_t i = 0; i < l->count; i++) free(l->names[i]);
  free(l->names);
  memset(l, 0, sizeof *l);
}

static int names_push(name_list *l, const char *name) {
  if (l->count == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    char **grown = mlo_realloc(l->names, cap * sizeof *grown);
    if (!grown) return MLO_ENOMEM;
    l->names = grown;
    l->cap = cap;
  }
  if (!(l->names[l->count] = mlo_strdup(name))) return MLO_ENOMEM;
  l->count++;
  return MLO_OK;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Entries whose names end in .safetensors or .json, sorted; folders are
 * left out.  Anything else is listed even when it is not a regular file (a
 * FIFO, a dangling link into the Hugging Face cache's blobs/): opening it
 * then says what it is, instead of the file silently not being there. */
static int list_folder(const char *folder, name_list *out, char *err, size_t errlen) {
  DIR *d = opendir(folder);
  if (!d)
    return mlo_errf(err, errlen, MLO_EIO, "%s: cannot list folder: %s", folder, strerror(errno));
  int rc = MLO_OK;
  struct dirent *e;
  while (rc == MLO_OK && (e = readdir(d)) != NULL) {
    if (!ends_with(e->d_name, ".safetensors") && !ends_with(e->d_name, ".json")) continue;
    char *full = mlo_path_join(folder, e->d_name);
    struct stat st;
    if (!full)
      rc = MLO_ENOMEM;
    else if (stat(full, &st) != 0 || !S_ISDIR(st.st_mode))
      rc = names_push(out, e->d_name);
    free(full);
  }
  closedir(d);
  if (rc != MLO_OK) {
    names_free(out);
    return mlo_errf(err, errlen, rc, "%s: out of memory listing the folder", folder);
  }
  if (out->count) qsort(out->names, out->count, sizeof *out->names, cmp_str);
  return MLO_OK;
}

/* ---- the weight map ---------------------------------------------------- */

typedef struct {
  const char *tensor; /* borrowed from the cJSON tree */
  size_t shard;       /* index into the sorted shard names */
} map_entry;

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const map_entry *)a)->tensor, ((const map_entry *)b)->tensor);
}

static const map_entry *map_find(const map_entry *map, size_t n, const char *tensor) {
  map_entry key = {tensor, 0};
  return bsearch(&key, map, n, sizeof *map, cmp_entry);
}

static bool shard_name_ok(const char *name) {
  return name[0] && strcmp(name, ".") && strcmp(name, "..") && !strchr(name, '/') &&
         !strchr(name, '\\');
}

/* Collects the distinct shard names of the weight map (sorted) and the
 * map itself (sorted by tensor), checking every entry's shape. */
static int parse_weight_map(const char *where, const cJSON *wm, name_list *shards,
                            map_entry **map_out, size_t *count_out, char *err, size_t errlen) {
  size_t n = (size_t)cJSON_GetArraySize(wm);
  map_entry *map = mlo_calloc(n ? n : 1, sizeof *map);
  if (!map) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", where);
  size_t i = 0;
  const cJSON *it;
  int rc = MLO_OK;
  cJSON_ArrayForEach(it, wm) {
    if (!cJSON_IsString(it))
      rc = mlo_errf(err, errlen, MLO_EFORMAT, "%s: weight_map entry '%s' is not a file name string",
                    where, it->string);
    else if (!shard_name_ok(it->valuestring))
      rc = mlo_errf(err, errlen, MLO_EFORMAT,
                    "%s: tensor '%s' maps to '%s', which is not a file name in this folder", where,
                    it->string, it->valuestring);
    else if (names_push(shards, it->valuestring) != MLO_OK)
      rc = mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", where);
    if (rc != MLO_OK) {
      free(map);
      return rc;
    }
    map[i++].tensor = it->string;
  }
  /* Distinct shard names, sorted; then point each entry at its shard. */
  qsort(shards->names, shards->count, sizeof *shards->names, cmp_str);
  size_t distinct = 0;
  for (size_t k = 0; k < shards->count; k++) {
    if (distinct && !strcmp(shards->names[distinct - 1], shards->names[k])) {
      free(shards->names[k]);
      continue;
    }
    shards->names[distinct++] = shards->names[k];
  }
  shards->count = distinct;
  i = 0;
  cJSON_ArrayForEach(it, wm) {
    char *key = it->valuestring;
    char **hit = bsearch(&key, shards->names, shards->count, sizeof *shards->names, cmp_str);
    map[i++].shard = (size_t)(hit - shards->names);
  }
  qsort(map, n, sizeof *map, cmp_entry);
  for (size_t k = 1; k < n; k++)
    if (!strcmp(map[k - 1].tensor, map[k].tensor)) {
      int dup_rc = mlo_errf(err, errlen, MLO_EFORMAT, "%s: tensor '%s' appears twice in weight_map",
                            where, map[k].tensor);
      free(map); /* after the message: it names a tensor inside map */
      return dup_rc;
    }
  *map_out = map;
  *count_out = n;
  return MLO_OK;
}

/* Every tensor of every shard is mapped to that shard, and every mapped
 * tensor is in its shard. */
static int cross_check(const char *where, const mlo_weight_set *ws, const name_list *shards,
                       const map_entry *map, size_t n, char *err, size_t errlen) {
  for (size_t s = 0; s < ws->count; s++) {
    const mlo_st_file *f = ws->files[s];
    for (size_t t = 0; t < f->count; t++) {
      const map_entry *e = map_find(map, n, f->tensors[t].name);
      if (!e)
        return mlo_errf(err, errlen, MLO_EFORMAT,
                        "%s: tensor '%s' is in shard %s but not in the weight map", where,
                        f->tensors[t].name, shards->names[s]);
      if (e->shard != s)
        return mlo_errf(
            err, errlen, MLO_EFORMAT,
            "%s: tensor '%s' is in shard %s but the weight map puts it in %s (tensor in "
            "two shards or mapped to the wrong one)",
            where, e->tensor, shards->names[s], shards->names[e->shard]);
    }
  }
  for (size_t k = 0; k < n; k++)
    if (!mlo_st_find(ws->files[map[k].shard], map[k].tensor))
      return mlo_errf(err, errlen, MLO_EFORMAT,
                      "%s: tensor '%s' is listed in the weight map but missing from its shard %s",
                      where, map[k].tensor, shards->names[map[k].shard]);
  return MLO_OK;
}

/* The family of an index "<stem>.safetensors.index[.<v>].json": the file
 * names one save with that stem and variant would produce. */
static bool in_family(const char *name, const char *stem, const char *variant) {
  size_t ls = strlen(stem);
  if (strncmp(name, stem, ls) != 0 || !ends_with(name, ".safetensors")) return false;
  const char *rest = name + ls;
  size_t lr = strlen(rest) - strlen(".safetensors"); /* rest[0..lr) is what follows stem */
  if (!variant) return lr == 0 || has_shard_suffix(rest, lr);
  size_t lv = strlen(variant);
  if (lr > lv && rest[0] == '.' && !strncmp(rest + 1, variant, lv)) {
    /* "<stem>.<v>" or "<stem>.<v>-00001-of-00002" */
    if (lr == lv + 1) return true;
    return has_shard_suffix(rest, lr) && rest[lv + 1] == '-';
  }
  /* the older "<stem>-00001-of-00002.<v>" */
  return lr > lv + 1 && rest[lr - lv - 1] == '.' && !strncmp(rest + lr - lv, variant, lv) &&
         has_shard_suffix(rest, lr - lv - 1);
}

static int check_strays(const char *folder, const char *index_name, const name_list *shards,
                        bool allow_stray, char *err, size_t errlen) {
  /* index_name is "<stem>.safetensors.index.json" or "...index.<v>.json" */
  const char *mark = strstr(index_name, ".safetensors.index.");
  if (!mark) return MLO_OK;
  char stem[512], variant[128];
  size_t ls = (size_t)(mark - index_name);
  const char *tail = mark + strlen(".safetensors.index.");
  size_t lv = strlen(tail) - strlen("json");
  if (ls >= sizeof stem || lv >= sizeof variant) return MLO_OK;
  memcpy(stem, index_name, ls), stem[ls] = '\0';
  memcpy(variant, tail, lv), variant[lv] = '\0';
  if (lv) variant[lv - 1] = '\0'; /* drop the '.' before "json" */
  name_list all = {0};
  int rc = list_folder(folder, &all, err, errlen);
  if (rc != MLO_OK) return rc;
  for (size_t i = 0; i < all.count && rc == MLO_OK; i++) {
    const char *name = all.names[i];
    if (!in_family(name, stem, lv ? variant : NULL)) continue;
    if (bsearch(&name, shards->names, shards->count, sizeof *shards->names, cmp_str)) continue;
    if (allow_stray) {
      mlo_logf(MLO_LOG_WARN, "%s: stray file %s is not referenced by %s; ignored", folder, name,
               index_name);
      continue;
    }
    rc = mlo_errf(err, errlen, MLO_EFORMAT,
                  "%s: stray file %s is not referenced by %s (two saves mixed? remove it, or allow "
                  "strays)",
                  folder, name, index_name);
  }
  names_free(&all);
  return rc;
}

static int load_index_json(const char *where, const char *path, cJSON **root_out, char *err,
                           size_t errlen) {
  cJSON *root = NULL;
  int rc = mlo_json_read_file(path, INDEX_FILE_CAP, 0, &root, err, errlen);
  if (rc) return rc;
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: not a JSON object", where);
  }
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(wm)) {
    cJSON_Delete(root);
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: \"weight_map\" is %s, not an object", where,
                    wm ? "present" : "missing");
  }
  if (!wm->child) {
    cJSON_Delete(root);
    return mlo_errf(err, errlen, MLO_EFORMAT, "%s: \"weight_map\" is empty", where);
  }
  *root_out = root;
  return MLO_OK;
}

static int open_shards(const char *folder, const char *index_name, const name_list *shards,
                       mlo_weight_set *ws, char *err, size_t errlen) {
  if (!(ws->files = mlo_calloc(shards->count, sizeof *ws->files)))
    return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", folder);
  for (size_t s = 0; s < shards->count; s++) {
    char *path = mlo_path_join(folder, shards->names[s]);
    if (!path) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", folder);
    struct stat st;
    int rc;
    if (stat(path, &st) != 0)
      rc = mlo_errf(err, errlen, MLO_EFORMAT, "%s: shard %s named by %s is missing", folder,
                    shards->names[s], index_name);
    else
      rc = mlo_st_open(path, &ws->files[s], err, errlen);
    free(path);
    if (rc != MLO_OK) return rc;
    ws->count = s + 1;
  }
  return MLO_OK;
}

int mlo_weight_set_open_index(const char *folder, const char *index_name, bool allow_stray,
                              mlo_weight_set *ws, char *err, size_t errlen) {
  memset(ws, 0, sizeof *ws);
  char *path = mlo_path_join(folder, index_name);
  if (!path) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", folder);
  char where[1024];
  snprintf(where, sizeof where, "%s", path);
  cJSON *root = NULL;
  name_list shards = {0};
  map_entry *map = NULL;
  size_t n = 0;
  int rc = load_index_json(where, path, &root, err, errlen);
  if (rc != MLO_OK) goto out_free_path;
  rc = parse_weight_map(where, cJSON_GetObjectItemCaseSensitive(root, "weight_map"), &shards, &map,
                        &n, err, errlen);
  if (rc == MLO_OK) rc = open_shards(folder, index_name, &shards, ws, err, errlen);
  if (rc == MLO_OK) rc = cross_check(where, ws, &shards, map, n, err, errlen);
  if (rc == MLO_OK) rc = check_strays(folder, index_name, &shards, allow_stray, err, errlen);
  if (rc == MLO_OK && !(ws->index_name = mlo_strdup(index_name)))
    rc = mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", where);
  if (rc != MLO_OK) mlo_weight_set_close(ws);
  free(map);
  names_free(&shards); /* a failed parse leaves the names it collected */
  cJSON_Delete(root);
  free(path);
  return rc;
out_free_path:
  free(path);
  return rc;
}

static int open_single(const char *folder, const char *name, mlo_weight_set *ws, char *err,
                       size_t errlen) {
  memset(ws, 0, sizeof *ws);
  char *path = mlo_path_join(folder, name);
  if (!path) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", folder);
  int rc = mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of host memory", folder);
  if ((ws->files = mlo_calloc(1, sizeof *ws->files)))
    rc = mlo_st_open(path, &ws->files[0], err, errlen);
  free(path);
  if (rc == MLO_OK)
    ws->count = 1;
  else
    mlo_weight_set_close(ws);
  return rc;
}

/* Candidates for a variant: weight maps and unsharded files. */
static bool is_index_for(const char *name, const char *variant) {
  const char *mark = strstr(name, ".safetensors.index.");
  if (!mark || mark == name) return false;
  const char *tail = mark + strlen(".safetensors.index.");
  if (!variant) return !strcmp(tail, "json");
  size_t lv = strlen(variant);
  return !strncmp(tail, variant, lv) && !strcmp(tail + lv, ".json");
}

static bool is_single_for(const char *name, const char *variant) {
  if (!ends_with(name, ".safetensors")) return false;
  size_t len = strlen(name) - strlen(".safetensors");
  if (len == 0 || has_shard_suffix(name, len)) return false;
  if (!variant) return true;
  size_t lv = strlen(variant);
  if (len <= lv + 1 || name[len - lv - 1] != '.' || strncmp(name + len - lv, variant, lv))
    return false;
  return !has_shard_suffix(name, len - lv - 1); /* older-style variant shard */
}

static bool has_known_stem(const char *name) {
  for (size_t i = 0; i < sizeof known_stems / sizeof *known_stems; i++) {
    size_t l = strlen(known_stems[i]);
    if (!strncmp(name, known_stems[i], l) && name[l] == '.') return true;
  }
  return false;
}

/* A variant's file by its name: "<known stem>.<v>.safetensors" or a shard
 * "<known stem>.<v>-00001-of-00002.safetensors", or the older
 * "<stem>-00001-of-00002.<v>.safetensors".  Without a requested variant
 * these are not candidates while plain files are there (a hub folder keeps
 * both, and diffusers loads the plain ones). */
static bool looks_like_variant(const char *name) {
  for (size_t i = 0; i < sizeof known_stems / sizeof *known_stems; i++) {
    size_t l = strlen(known_stems[i]);
    if (!strncmp(name, known_stems[i], l) && name[l] == '.' &&
        strncmp(name + l + 1, "safetensors", strlen("safetensors")))
      return true;
  }
  if (!ends_with(name, ".safetensors")) return false;
  size_t len = strlen(name) - strlen(".safetensors");
  size_t dot = len;
  while (dot > 0 && name[dot - 1] != '.') dot--; /* just after the last '.' before the suffix */
  return dot > 1 && has_shard_suffix(name, dot - 1);
}

/* The variant a weight file's name carries ("fp16" in
 * "x.safetensors.index.fp16.json", "diffusion_pytorch_model.fp16.safetensors",
 * "diffusion_pytorch_model.fp16-00001-of-00002.safetensors",
 * "x-00001-of-00002.fp16.safetensors"); false for a plain name. */
static bool variant_of(const char *name, char *v, size_t vlen) {
  const char *mark = strstr(name, ".safetensors.index.");
  const char *from = NULL;
  size_t n = 0;
  if (mark && mark != name) {
    from = mark + strlen(".safetensors.index.");
    size_t l = strlen(from);
    n = l > 5 && !strcmp(from + l - 5, ".json") ? l - 5 : 0;
  } else if (ends_with(name, ".safetensors") && looks_like_variant(name)) {
    /* a safetensors file only: "x.bin.index.json" is PyTorch's, no variant */
    for (size_t i = 0; i < sizeof known_stems / sizeof *known_stems && !from; i++) {
      size_t l = strlen(known_stems[i]);
      if (!strncmp(name, known_stems[i], l) && name[l] == '.') {
        from = name + l + 1;
        n = strcspn(from, ".-");
      }
    }
    if (!from) { /* the older shard form: the last part before the suffix */
      size_t len = strlen(name) - strlen(".safetensors"), dot = len;
      while (dot > 0 && name[dot - 1] != '.') dot--;
      from = name + dot;
      n = len - dot;
    }
  }
  if (!from || !n || n >= vlen || memchr(from, '/', n)) return false;
  memcpy(v, from, n);
  v[n] = '\0';
  return true;
}

/* The one variant a folder without plain weights holds, into v ("" if it
 * holds none); two variants are ambiguous: the caller must name one. */
static int lone_variant(const char *folder, const name_list *all, char *v, size_t vlen, char *err,
                        size_t errlen) {
  v[0] = '\0';
  char cur[64];
  for (size_t i = 0; i < all->count; i++) {
    if (!variant_of(all->names[i], cur, sizeof cur)) continue;
    if (!v[0])
      snprintf(v, vlen, "%s", cur);
    else if (strcmp(v, cur))
      return mlo_errf(err, errlen, MLO_EFORMAT,
                      "%s: no plain weights, and two variants ('%s' and '%s'): name one "
                      "(--variant)",
                      folder, v, cur);
  }
  return MLO_OK;
}

/* Picks the one candidate at the first priority level that has any:
 * known-stem map, known-stem file, any map, any file.  plain_only (no
 * variant requested) leaves out variant-named files. */
static int pick_candidate(const char *folder, const name_list *all, const char *variant,
                          bool plain_only, const char **pick, bool *is_index, char *err,
                          size_t errlen) {
  for (int level = 0; level < 4; level++) {
    bool want_index = level == 0 || level == 2, want_known = level < 2;
    const char *found = NULL, *second = NULL;
    for (size_t i = 0; i < all->count; i++) {
      const char *name = all->names[i];
      bool match = want_index ? is_index_for(name, variant) : is_single_for(name, variant);
      if (!match || (want_known && !has_known_stem(name))) continue;
      if (plain_only && looks_like_variant(name)) continue;
      if (!found)
        found = name;
      else if (!second)
        second = name;
    }
    if (second)
      return mlo_errf(err, errlen, MLO_EFORMAT,
                      "%s: ambiguous weights: %s and %s are both candidates%s%s (keep one, or add "
                      "a weight map)",
                      folder, found, second, variant ? " for variant " : "",
                      variant ? variant : "");
    if (found) {
      *pick = found;
      *is_index = want_index;
      return MLO_OK;
    }
  }
  *pick = NULL;
  return MLO_OK;
}

int mlo_weight_set_find(const char *folder, const char *variant, bool allow_stray,
                        mlo_weight_set *ws, char *err, size_t errlen) {
  memset(ws, 0, sizeof *ws);
  name_list all = {0};
  int rc = list_folder(folder, &all, err, errlen);
  if (rc != MLO_OK) return rc;
  const char *pick = NULL;
  bool is_index = false, used_variant = variant != NULL;
  rc = pick_candidate(folder, &all, variant, !variant, &pick, &is_index, err, errlen);
  if (rc == MLO_OK && !pick && variant) {
    used_variant = false;
    rc = pick_candidate(folder, &all, NULL, true, &pick, &is_index, err, errlen);
  }
  char lone[64] = "";
  if (rc == MLO_OK && !pick) { /* only one variant's files: they are used, said so */
    rc = lone_variant(folder, &all, lone, sizeof lone, err, errlen);
    if (rc == MLO_OK && lone[0])
      rc = pick_candidate(folder, &all, lone, false, &pick, &is_index, err, errlen);
    if (rc == MLO_OK && pick)
      mlo_logf(MLO_LOG_WARN,
               "%s: no plain weights; using variant '%s' (%s), the only one here (diffusers "
               "needs variant=\"%s\"; --variant %s says it)",
               folder, lone, pick, lone, lone);
  }
  if (rc == MLO_OK && !pick)
    rc = mlo_errf(err, errlen, MLO_ENOTFOUND, "%s: no safetensors weights in this folder", folder);
  if (rc == MLO_OK) {
    rc = is_index ? mlo_weight_set_open_index(folder, pick, allow_stray, ws, err, errlen)
                  : open_single(folder, pick, ws, err, errlen);
    ws->used_variant = rc == MLO_OK && used_variant;
  }
  names_free(&all);
  return rc;
}

int mlo_weight_set_declare(const mlo_weight_set *ws, mlo_component *comp, unsigned flags, char *err,
                           size_t errlen) {
  for (size_t i = 0; i < ws->count; i++) {
    int rc = mlo_st_add_to_component(ws->files[i], comp, flags, err, errlen);
    if (rc != MLO_OK) return rc;
  }
  return MLO_OK;
}

void mlo_weight_set_close(mlo_weight_set *ws) {
  if (!ws) return;
  for (size_t i = 0; i < ws->count; i++) mlo_st_close(ws->files[i]);
  free(ws->files);
  free(ws->index_name);
  memset(ws, 0, sizeof *ws);
}
