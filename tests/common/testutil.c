/*
 * testutil.c — shared test helpers (see testutil.h for why they exist).
 *
 * Patterns are a hash of (seed, byte index) so that a wrong offset, a stale
 * block, poisoned memory (0xA5) and zero-filled memory all show up as a
 * mismatch in the first few bytes.
 */
#include "testutil.h"

#include "platform/fault.h"
#include "platform/platform.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- platform */

const char *tu_platform_base_spec(void) {
  const char *env = getenv("MLO_TEST_PLATFORM");
  return env && *env ? env : TU_DEFAULT_PLATFORM;
}

bool tu_platform_is_host(void) {
  const char *spec = tu_platform_base_spec();
  return !strncmp(spec, "host", 4) && (spec[4] == '\0' || spec[4] == ':');
}

/* Appends key=value to buf unless a key of the same name is in skip_keys. */
static void append_kv(char *buf, size_t len, const char *item, size_t item_len) {
  size_t used = strlen(buf);
  if (used + item_len + 2 >= len) return;
  if (buf[used - 1] != ':') buf[used++] = ',';
  memcpy(buf + used, item, item_len);
  buf[used + item_len] = '\0';
}

static bool list_has_key(const char *list, const char *key, size_t key_len) {
  for (const char *p = list; p && *p;) {
    const char *end = strchr(p, ',');
    size_t item_len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', item_len);
    if (eq && (size_t)(eq - p) == key_len && !strncmp(p, key, key_len)) return true;
    p = end ? end + 1 : NULL;
  }
  return false;
}

void tu_merge_host_spec(const char *base, const char *overrides, char *buf, size_t len) {
  snprintf(buf, len, "host:");
  const char *colon = strchr(base, ':');
  for (const char *p = colon ? colon + 1 : NULL; p && *p;) {
    const char *end = strchr(p, ',');
    size_t item_len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', item_len);
    size_t key_len = eq ? (size_t)(eq - p) : item_len;
    if (!list_has_key(overrides, p, key_len)) append_kv(buf, len, p, item_len);
    p = end ? end + 1 : NULL;
  }
  for (const char *p = overrides; p && *p;) {
    const char *end = strchr(p, ',');
    size_t item_len = end ? (size_t)(end - p) : strlen(p);
    append_kv(buf, len, p, item_len);
    p = end ? end + 1 : NULL;
  }
  size_t used = strlen(buf);
  if (buf[used - 1] == ':') buf[used - 1] = '\0';
}

mlo_platform *tu_platform_open(const char *host_overrides) {
  char spec[512];
  const char *base = tu_platform_base_spec();
  if (host_overrides && *host_overrides) {
    if (!tu_platform_is_host()) skip();
    tu_merge_host_spec(base, host_overrides, spec, sizeof spec);
  } else {
    snprintf(spec, sizeof spec, "%s", base);
  }
  mlo_platform *plat = NULL;
  char err[256] = "";
  int rc = mlo_platform_open(spec, &plat, err, sizeof err);
  if (rc == MLO_ENODEV) skip(); /* the chosen device is not present here */
  if (rc != MLO_OK) fail_msg("mlo_platform_open(\"%s\") -> %s: %s", spec, mlo_err_name(rc), err);
  return plat;
}

mlo_platform *tu_open_spec(const char *spec) {
  mlo_platform *plat = NULL;
  char err[256] = "";
  int rc = mlo_platform_open(spec, &plat, err, sizeof err);
  if (rc) fail_msg("mlo_platform_open(\"%s\") -> %s: %s", spec, mlo_err_name(rc), err);
  assert_non_null(plat);
  return plat;
}

bool tu_device_pointers(const mlo_platform *plat) {
  mlo_platform_caps caps;
  memset(&caps, 0, sizeof caps);
  mlo_platform_get_caps(plat, &caps);
  return caps.device_pointers;
}

bool tu_host_addressable(const mlo_platform *plat) {
  mlo_platform_caps caps;
  memset(&caps, 0, sizeof caps);
  mlo_platform_get_caps(plat, &caps);
  return caps.host_addressable;
}

/* ----------------------------------------------------------------- content */

static uint32_t fnv1a(const char *s, uint32_t h) {
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

uint32_t tu_seed(const char *comp_name, const char *tensor_name) {
  return fnv1a(tensor_name, fnv1a("/", fnv1a(comp_name, 2166136261u)));
}

uint8_t tu_pattern_byte(uint32_t seed, size_t index) {
  uint32_t x = seed ^ ((uint32_t)index * 0x9E3779B1u) ^ (uint32_t)((uint64_t)index >> 32);
  x ^= x >> 15;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return (uint8_t)x;
}

void tu_fill_pattern(void *dst, size_t bytes, uint32_t seed) {
  uint8_t *d = dst;
  for (size_t i = 0; i < bytes; i++) d[i] = tu_pattern_byte(seed, i);
}

size_t tu_pattern_mismatch(const void *src, size_t bytes, uint32_t seed) {
  const uint8_t *s = src;
  for (size_t i = 0; i < bytes; i++)
    if (s[i] != tu_pattern_byte(seed, i)) return i;
  return bytes;
}

/* --------------------------------------------------------------- pipelines */

const tu_comp_spec tu_wan_specs[4] = {
    {"text_encoder", MLO_ROLE_ENCODER, 3, 16 * 1024, 0},
    {"transformer", MLO_ROLE_DIT, 4, 32 * 1024, 0},
    {"transformer_2", MLO_ROLE_DIT, 4, 32 * 1024, 0},
    {"vae", MLO_ROLE_VAE, 2, 8 * 1024, 0},
};

tu_pipe *tu_pipe_new(mlo_platform *plat, bool pin_host) {
  tu_pipe *tp = calloc(1, sizeof *tp);
  assert_non_null(tp);
  tp->plat = plat;
  tp->device_pointers = tu_device_pointers(plat);
  tp->host_addressable = tu_host_addressable(plat);
  atomic_flag_clear(&tp->failure_taken);
  mlo_pipeline_options opts = MLO_PIPELINE_OPTIONS_INIT;
  opts.platform = plat;
  opts.pin_host = pin_host;
  assert_ok(mlo_pipeline_create(&opts, &tp->pipe));
  assert_non_null(tp->pipe);
  return tp;
}

/* Declares an F32 1-D tensor of bytes from desc's source and records it as
 * holding the pattern of (component, name). */
static mlo_tensor *declare_pattern(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                                   mlo_tensor_desc *desc) {
  desc->name = name;
  desc->dtype = MLO_DTYPE_F32;
  desc->ndim = 1;
  desc->shape[0] = (int64_t)(bytes / 4);
  mlo_tensor *t = NULL;
  assert_ok(mlo_tensor_add(comp, desc, &t));
  assert_non_null(t);
  tp->recs[tp->nrecs++] =
      (tu_tensor_rec){t, comp, tu_seed(mlo_component_name(comp), name), bytes, false};
  return t;
}

mlo_tensor *tu_add_tensor(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                          unsigned flags) {
  assert_true(tp->nrecs < TU_MAX_TENSORS && tp->nsources < TU_MAX_TENSORS);
  assert_true(bytes % 4 == 0);
  void *src = malloc(bytes ? bytes : 1);
  assert_non_null(src);
  tu_fill_pattern(src, bytes, tu_seed(mlo_component_name(comp), name));
  tp->sources[tp->nsources++] = src;
  mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
  desc.flags = flags;
  desc.data = src;
  return declare_pattern(tp, comp, name, bytes, &desc);
}

mlo_tensor *tu_add_tensor_at(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                             unsigned flags, void *src) {
  assert_true(tp->nrecs < TU_MAX_TENSORS);
  assert_true(bytes % 4 == 0);
  tu_fill_pattern(src, bytes, tu_seed(mlo_component_name(comp), name));
  mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
  desc.flags = flags;
  desc.data = src;
  return declare_pattern(tp, comp, name, bytes, &desc);
}

void tu_write_file_pattern(const char *comp_name, const char *name, size_t bytes, const char *path,
                           uint64_t offset) {
  void *src = malloc(bytes ? bytes : 1);
  assert_non_null(src);
  tu_fill_pattern(src, bytes, tu_seed(comp_name, name));
  int fd = open(path, O_WRONLY | O_CREAT, 0600);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, src, bytes, (off_t)offset), (ssize_t)bytes);
  close(fd);
  free(src);
}

mlo_tensor *tu_add_file_tensor(tu_pipe *tp, mlo_component *comp, const char *name, size_t bytes,
                               const char *path, uint64_t offset) {
  assert_true(tp->nrecs < TU_MAX_TENSORS);
  assert_true(bytes % 4 == 0);
  mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
  desc.file = path;
  desc.file_offset = offset;
  return declare_pattern(tp, comp, name, bytes, &desc);
}

void tu_add_alias(tu_pipe *tp, mlo_component *comp, const char *name, mlo_tensor *target) {
  tu_tensor_rec *target_rec = tu_rec(tp, target);
  assert_non_null(target_rec);
  assert_ok(mlo_tensor_add_alias(comp, name, target));
  mlo_tensor *alias = mlo_component_find_tensor(comp, name);
  assert_non_null(alias);
  assert_true(tp->nrecs < TU_MAX_TENSORS);
  bool reference = mlo_tensor_owner(target) != comp;
  tp->recs[tp->nrecs++] =
      (tu_tensor_rec){alias, comp, target_rec->seed, target_rec->bytes, reference};
}

mlo_component *tu_add_component(tu_pipe *tp, const tu_comp_spec *spec) {
  mlo_component *comp = NULL;
  assert_ok(mlo_component_add(tp->pipe, spec->name, spec->role, &comp));
  assert_non_null(comp);
  for (unsigned i = 0; i < spec->ntensors; i++) {
    char name[32];
    snprintf(name, sizeof name, "t%u", i);
    unsigned flags = i + spec->nmutable >= spec->ntensors
                         ? (unsigned)(MLO_TENSOR_BUFFER | MLO_TENSOR_MUTABLE)
                         : (unsigned)MLO_TENSOR_PARAMETER;
    tu_add_tensor(tp, comp, name, spec->tensor_bytes, flags);
  }
  return comp;
}

tu_pipe *tu_pipe_build(mlo_platform *plat, const tu_comp_spec *specs, size_t n) {
  tu_pipe *tp = tu_pipe_new(plat, true);
  for (size_t i = 0; i < n; i++) tu_add_component(tp, &specs[i]);
  return tp;
}

tu_pipe *tu_pipe_build_wan(mlo_platform *plat) {
  return tu_pipe_build(plat, tu_wan_specs, 4);
}

void tu_pipe_free(tu_pipe *tp) {
  if (!tp) return;
  mlo_pipeline_free(tp->pipe);
  for (size_t i = 0; i < tp->nsources; i++) free(tp->sources[i]);
  free(tp);
}

mlo_component *tu_comp(tu_pipe *tp, const char *name) {
  mlo_component *comp = mlo_pipeline_find(tp->pipe, name);
  if (!comp) fail_msg("no component named %s", name);
  return comp;
}

tu_tensor_rec *tu_rec(tu_pipe *tp, const mlo_tensor *t) {
  for (size_t i = 0; i < tp->nrecs; i++)
    if (tp->recs[i].tensor == t) return &tp->recs[i];
  return NULL;
}

/* ------------------------------------------------------------ device bytes */

int tu_read_device(tu_pipe *tp, const mlo_tensor *t, void *dst, size_t bytes) {
  if (tp->host_addressable) {
    const void *p = mlo_tensor_device_ptr(t);
    if (!p) return MLO_ESTATE;
    memcpy(dst, p, bytes);
    return MLO_OK;
  }
  void *block = NULL;
  size_t offset = 0;
  int rc = mlo_tensor_device(t, &block, &offset);
  if (rc) return rc;
  /* As a kernel would read it: after what the compute queue has waited for
   * (the load, if the forward ordered itself after it — and not if it did
   * not, which is what the race checks must be able to see), whichever
   * queue the platform copies device-to-host on. */
  mlo_event *ev = NULL;
  rc = mlo_plat_event_create(tp->plat, &ev);
  if (!rc) rc = mlo_plat_event_record_compute(tp->plat, ev);
  if (!rc) rc = mlo_plat_readback_wait(tp->plat, ev);
  if (!rc) rc = mlo_plat_copy_d2h(tp->plat, dst, block, offset, bytes);
  if (!rc) rc = mlo_plat_synchronize(tp->plat);
  mlo_plat_event_destroy(tp->plat, ev);
  return rc;
}

int tu_write_device(tu_pipe *tp, const mlo_tensor *t, const void *src, size_t bytes) {
  if (tp->host_addressable) {
    void *p = mlo_tensor_device_ptr(t);
    if (!p) return MLO_ESTATE;
    memcpy(p, src, bytes);
    return MLO_OK;
  }
  void *block = NULL;
  size_t offset = 0;
  int rc = mlo_tensor_device(t, &block, &offset);
  if (rc) return rc;
  rc = mlo_plat_copy_h2d(tp->plat, block, offset, src, bytes);
  return rc ? rc : mlo_plat_synchronize(tp->plat);
}

bool tu_device_content_ok(tu_pipe *tp, mlo_component *comp, char *why, size_t whylen) {
  /* a streamed block's tensors are read between its begin and end */
  mlo_stream_info si;
  bool streamed = mlo_component_stream_info(comp, &si) == MLO_OK && si.slots;
  for (size_t i = 0; i < tp->nrecs; i++) {
    const tu_tensor_rec *r = &tp->recs[i];
    if (r->comp != comp || r->reference) continue;
    uint8_t *buf = malloc(r->bytes ? r->bytes : 1);
    if (!buf) return false;
    int block = streamed ? mlo_tensor_block(r->tensor) : MLO_BLOCK_PROLOGUE;
    int rc = block >= 0 ? mlo_block_begin(comp, (size_t)block) : MLO_OK;
    if (!rc) rc = tu_read_device(tp, r->tensor, buf, r->bytes);
    if (block >= 0) {
      int erc = mlo_block_end(comp, (size_t)block);
      if (!rc) rc = erc;
    }
    size_t at = rc ? 0 : tu_pattern_mismatch(buf, r->bytes, r->seed);
    if (rc || at != r->bytes)
      snprintf(why, whylen, "%s/%s: %s at byte %zu (got 0x%02x want 0x%02x)",
               mlo_component_name(comp), mlo_tensor_name(r->tensor),
               rc ? mlo_err_name(rc) : "wrong device content", at, rc ? 0 : buf[at],
               tu_pattern_byte(r->seed, at));
    free(buf);
    if (rc || at != r->bytes) return false;
  }
  return true;
}

bool tu_host_content_ok(tu_pipe *tp, mlo_component *comp, char *why, size_t whylen) {
  for (size_t i = 0; i < tp->nrecs; i++) {
    const tu_tensor_rec *r = &tp->recs[i];
    if (r->comp != comp || r->reference) continue;
    const void *host = mlo_tensor_host_data(r->tensor);
    size_t at = host ? tu_pattern_mismatch(host, r->bytes, r->seed) : 0;
    if (!host || at != r->bytes) {
      snprintf(why, whylen, "%s/%s: %s at byte %zu", mlo_component_name(comp),
               mlo_tensor_name(r->tensor), host ? "wrong host content" : "no host data", at);
      return false;
    }
  }
  return true;
}

void tu_mutate(tu_pipe *tp, const mlo_tensor *t, uint32_t new_seed) {
  tu_tensor_rec *r = tu_rec(tp, t);
  assert_non_null(r);
  void *buf = malloc(r->bytes);
  assert_non_null(buf);
  tu_fill_pattern(buf, r->bytes, new_seed);
  int rc = tu_write_device(tp, t, buf, r->bytes);
  free(buf);
  assert_ok(rc);
  /* Every record of the same storage (aliases) now expects the new bytes. */
  uint32_t old_seed = r->seed;
  for (size_t i = 0; i < tp->nrecs; i++)
    if (tp->recs[i].seed == old_seed) tp->recs[i].seed = new_seed;
}

/* -------------------------------------------------------- forward checking */

void tu_note_failure(tu_pipe *tp, const char *fmt, ...) {
  if (atomic_flag_test_and_set(&tp->failure_taken)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tp->first_failure, sizeof tp->first_failure, fmt, ap);
  va_end(ap);
}

bool tu_exclusion_ok(tu_pipe *tp, mlo_component *comp, char *why, size_t whylen) {
  mlo_role role = mlo_component_role(comp);
  size_t n = mlo_pipeline_component_count(tp->pipe);
  for (size_t i = 0; i < n; i++) {
    mlo_component *other = mlo_pipeline_component_at(tp->pipe, i);
    if (other == comp || mlo_component_bytes(other) == 0) continue;
    mlo_role other_role = mlo_component_role(other);
    bool excluded =
        (role == MLO_ROLE_DIT && (other_role == MLO_ROLE_DIT || other_role == MLO_ROLE_ENCODER)) ||
        (role == MLO_ROLE_ENCODER && other_role == MLO_ROLE_DIT);
    if (excluded && mlo_component_is_resident(other)) {
      snprintf(why, whylen, "%s is resident while %s runs", mlo_component_name(other),
               mlo_component_name(comp));
      return false;
    }
  }
  return true;
}

int tu_forward_check(mlo_component *comp, void *user) {
  tu_pipe *tp = user;
  int bad = 0;
  atomic_fetch_add(&tp->forwards, 1);
  if (!mlo_component_is_resident(comp)) {
    atomic_fetch_add(&tp->not_resident, 1);
    tu_note_failure(tp, "%s not resident inside its forward", mlo_component_name(comp));
    return 1;
  }
  char why[256] = "";
  if (!tu_device_content_ok(tp, comp, why, sizeof why)) {
    atomic_fetch_add(&tp->bad_content, 1);
    tu_note_failure(tp, "inside forward: %s", why);
    bad = 1;
  }
  /* The rule holds while offload is enabled.  That state cannot change
   * during a forward (enable and disable refuse with MLO_EBUSY while anything
   * executes), so a test that toggles it still checks every hooked forward. */
  if (tp->exclusion_in_forward && mlo_offload_is_enabled(tp->pipe) &&
      !tu_exclusion_ok(tp, comp, why, sizeof why)) {
    atomic_fetch_add(&tp->excluded_resident, 1);
    tu_note_failure(tp, "inside forward: %s", why);
    bad = 1;
  }
  if (tp->audit_in_forward) {
    int rc = mlo_pipeline_audit(tp->pipe);
    if (rc) {
      atomic_fetch_add(&tp->audit_failed, 1);
      tu_note_failure(tp, "audit inside %s's forward: %s: %s", mlo_component_name(comp),
                      mlo_err_name(rc), mlo_pipeline_errmsg(tp->pipe));
      bad = 1;
    }
  }
  return bad;
}

int tu_forward(tu_pipe *tp, mlo_component *comp) {
  return mlo_component_forward(comp, tu_forward_check, tp);
}

void tu_assert_forwards_clean(tu_pipe *tp) {
  if (atomic_load(&tp->bad_content) || atomic_load(&tp->not_resident) ||
      atomic_load(&tp->audit_failed) || atomic_load(&tp->excluded_resident))
    fail_msg("forwards saw %u bad content, %u not resident, %u failed audits, %u exclusion "
             "breaches; first: %s",
             atomic_load(&tp->bad_content), atomic_load(&tp->not_resident),
             atomic_load(&tp->audit_failed), atomic_load(&tp->excluded_resident),
             tp->first_failure);
}

void tu_reset_observations(tu_pipe *tp) {
  atomic_store(&tp->forwards, 0);
  atomic_store(&tp->bad_content, 0);
  atomic_store(&tp->not_resident, 0);
  atomic_store(&tp->audit_failed, 0);
  atomic_store(&tp->excluded_resident, 0);
  atomic_flag_clear(&tp->failure_taken);
  tp->first_failure[0] = '\0';
}

/* ---------------------------------------------------------------- counters */

mlo_component_stats tu_cstats(mlo_component *comp) {
  mlo_component_stats s;
  memset(&s, 0, sizeof s);
  assert_ok(mlo_component_get_stats(comp, &s));
  return s;
}

mlo_pipeline_stats tu_pstats(tu_pipe *tp) {
  mlo_pipeline_stats s;
  memset(&s, 0, sizeof s);
  assert_ok(mlo_pipeline_get_stats(tp->pipe, &s));
  return s;
}

uint64_t tu_copy_ns(uint64_t bytes, uint64_t link) {
  return bytes * 1000000000ull / link;
}

void tu_assert_near_ns(uint64_t got, uint64_t want) {
  uint64_t d = got > want ? got - want : want - got;
  if (d > 1000)
    fail_msg("%llu ns, computed by hand %llu ns", (unsigned long long)got,
             (unsigned long long)want);
}

uint64_t tu_device_used(mlo_platform *plat) {
  mlo_platform_memory mem;
  memset(&mem, 0, sizeof mem);
  assert_ok(mlo_platform_get_memory(plat, &mem));
  return mem.used_bytes;
}

void tu_assert_audit(tu_pipe *tp) {
  int rc = mlo_pipeline_audit(tp->pipe);
  if (rc) fail_msg("audit: %s: %s", mlo_err_name(rc), mlo_pipeline_errmsg(tp->pipe));
}

/* ------------------------------------------------------------------- model */

void tu_model_init(tu_pipe *tp, tu_model *m) {
  memset(m, 0, sizeof *m);
  size_t n = mlo_pipeline_component_count(tp->pipe);
  for (size_t i = 0; i < n; i++) {
    mlo_component *comp = mlo_pipeline_component_at(tp->pipe, i);
    if (mlo_component_bytes(comp) == 0) continue;
    assert_true(m->n < TU_MAX_COMPS);
    m->comps[m->n] = comp;
    m->resident[m->n] = mlo_component_is_resident(comp);
    m->base[m->n] = tu_cstats(comp);
    m->n++;
  }
}

static void model_load(tu_model *m, size_t i) {
  if (m->resident[i]) return;
  m->resident[i] = true;
  m->loads[i]++;
  m->h2d[i] += mlo_component_bytes(m->comps[i]);
}

static void model_evict(tu_model *m, size_t i) {
  if (!m->resident[i]) return;
  m->resident[i] = false;
  m->evictions[i]++;
}

void tu_model_enable(tu_model *m) {
  for (size_t i = 0; i < m->n; i++) {
    mlo_role role = mlo_component_role(m->comps[i]);
    if (role == MLO_ROLE_ENCODER || role == MLO_ROLE_VAE) model_load(m, i);
  }
}

void tu_enable_modelled(tu_pipe *tp, tu_model *m) {
  tu_model_init(tp, m);
  assert_ok(mlo_offload_enable(tp->pipe, NULL));
  tu_model_enable(m);
}

void tu_forward_modelled(tu_pipe *tp, tu_model *m, mlo_component *comp) {
  assert_ok(tu_forward(tp, comp));
  tu_model_forward(m, comp);
}

void tu_model_forward(tu_model *m, mlo_component *comp) {
  mlo_role role = mlo_component_role(comp);
  for (size_t i = 0; i < m->n; i++) {
    if (m->comps[i] == comp) continue;
    mlo_role other = mlo_component_role(m->comps[i]);
    if (role == MLO_ROLE_DIT && (other == MLO_ROLE_DIT || other == MLO_ROLE_ENCODER))
      model_evict(m, i);
    if (role == MLO_ROLE_ENCODER && other == MLO_ROLE_DIT) model_evict(m, i);
  }
  for (size_t i = 0; i < m->n; i++)
    if (m->comps[i] == comp) model_load(m, i);
}

void tu_model_check(const tu_model *m) {
  for (size_t i = 0; i < m->n; i++) {
    mlo_component *comp = m->comps[i];
    mlo_component_stats s = tu_cstats(comp);
    const char *name = mlo_component_name(comp);
    bool resident = mlo_component_is_resident(comp);
    if (resident != m->resident[i])
      fail_msg("%s: resident=%d, the contract says %d", name, resident, m->resident[i]);
    if (s.loads - m->base[i].loads != m->loads[i])
      fail_msg("%s: %llu loads, the contract says %llu", name,
               (unsigned long long)(s.loads - m->base[i].loads), (unsigned long long)m->loads[i]);
    if (s.evictions - m->base[i].evictions != m->evictions[i])
      fail_msg("%s: %llu evictions, the contract says %llu", name,
               (unsigned long long)(s.evictions - m->base[i].evictions),
               (unsigned long long)m->evictions[i]);
    if (s.h2d_bytes - m->base[i].h2d_bytes != m->h2d[i])
      fail_msg("%s: %llu bytes loaded, the contract says %llu", name,
               (unsigned long long)(s.h2d_bytes - m->base[i].h2d_bytes),
               (unsigned long long)m->h2d[i]);
  }
}

/* --------------------------------------------------------------------- log */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned log_warnings;
static char log_text[8192];

static void capture_log(mlo_log_level level, const char *msg, void *user) {
  (void)user;
  pthread_mutex_lock(&log_lock);
  if (level >= MLO_LOG_WARN) log_warnings++;
  size_t used = strlen(log_text);
  if (used + strlen(msg) + 2 < sizeof log_text) {
    strcat(log_text, msg);
    strcat(log_text, "\n");
  }
  pthread_mutex_unlock(&log_lock);
}

void tu_log_capture_begin(void) {
  pthread_mutex_lock(&log_lock);
  log_warnings = 0;
  log_text[0] = '\0';
  pthread_mutex_unlock(&log_lock);
  mlo_set_log(capture_log, NULL, MLO_LOG_DEBUG);
}

void tu_log_capture_end(void) {
  mlo_set_log(NULL, NULL, MLO_LOG_WARN);
}

unsigned tu_log_warnings(void) {
  pthread_mutex_lock(&log_lock);
  unsigned n = log_warnings;
  pthread_mutex_unlock(&log_lock);
  return n;
}

bool tu_log_contains(const char *needle) {
  pthread_mutex_lock(&log_lock);
  bool found = tu_contains_ci(log_text, needle);
  pthread_mutex_unlock(&log_lock);
  return found;
}

/* ------------------------------------------------------------------ misc */

bool tu_contains_ci(const char *haystack, const char *needle) {
  if (!haystack || !needle) return false;
  size_t n = strlen(needle);
  for (const char *h = haystack; *h; h++) {
    size_t i = 0;
    while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return true;
  }
  return n == 0;
}

void tu_sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* ------------------------------------------------------------------ holder */

static void *holder_main(void *arg) {
  tu_holder *h = arg;
  h->rc_acquire = mlo_component_acquire(h->comp);
  atomic_store(&h->phase, 1);
  while (atomic_load(&h->phase) != 2) tu_sleep_ms(1);
  h->rc_release = h->rc_acquire ? MLO_OK : mlo_component_release(h->comp);
  return NULL;
}

void tu_holder_start(tu_holder *h, mlo_component *comp) {
  h->comp = comp;
  atomic_init(&h->phase, 0);
  h->rc_acquire = h->rc_release = MLO_OK;
  assert_int_equal(pthread_create(&h->thread, NULL, holder_main, h), 0);
  while (!atomic_load(&h->phase)) tu_sleep_ms(1);
}

void tu_holder_finish(tu_holder *h) {
  atomic_store(&h->phase, 2);
  pthread_join(h->thread, NULL);
}

void tu_temp_file(char *path_template, const void *data, size_t n) {
  int fd = mkstemp(path_template);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, data, n), (ssize_t)n);
  assert_int_equal(close(fd), 0);
}

uint8_t *tu_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  assert_true(n >= 0);
  assert_int_equal(fseek(f, 0, SEEK_SET), 0);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

void tu_assert_corpus_covered(const char *dir, const char *ext, const char *const *names,
                              size_t n) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  size_t seen = 0, lx = strlen(ext);
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len <= lx || strcmp(e->d_name + len - lx, ext) != 0) continue;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++)
      found = strlen(names[i]) == len - lx && strncmp(names[i], e->d_name, len - lx) == 0;
    if (!found) fail_msg("corpus file %s/%s has no expected error in this test", dir, e->d_name);
    seen++;
  }
  closedir(d);
  assert_int_equal(seen, n);
}

static void refusal_message(const char *err, const char *name, const char *lead,
                            const char *words) {
  char want[800];
  snprintf(want, sizeof want, "%s: %s", name, lead);
  if (strncmp(err, want, strlen(want)) != 0)
    fail_msg("%s: message \"%s\" does not start with \"%s\"", name, err, want);
  if (!strstr(err, words)) fail_msg("%s: message \"%s\" lacks \"%s\"", name, err, words);
}

void tu_assert_refused(const tu_reader *r, const char *path, const char *mem_name, const char *lead,
                       const char *words) {
  char err[1024];
  void *f = (void *)1;
  int rc = r->open(path, &f, err, sizeof err);
  if (rc != MLO_EFORMAT)
    fail_msg("%s: got %s (%s), expected MLO_EFORMAT", path, mlo_err_name(rc), err);
  assert_null(f);
  refusal_message(err, path, lead, words);
  size_t len;
  uint8_t *bytes = tu_read_file(path, &len);
  f = (void *)1;
  rc = r->parse(mem_name, bytes, len, &f, err, sizeof err);
  free(bytes);
  if (rc != MLO_EFORMAT)
    fail_msg("%s from memory: got %s (%s), expected MLO_EFORMAT", path, mlo_err_name(rc), err);
  assert_null(f);
  refusal_message(err, mem_name, lead, words);
}

void tu_write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_true(fputs(text, f) >= 0);
  assert_int_equal(fclose(f), 0);
}

/* A sweep's trace: each LOAD_BEGIN of a component closed by an EVICT
 * before its next (a rolled-back load, a join that ended early, a drop
 * included), so that what is open is what is resident. */
typedef struct {
  const mlo_component *c[32];
  bool open[32];
  size_t n;
  char bad[256];
} load_pairs;

static void pair_loads(const mlo_trace_event *ev, void *user) {
  load_pairs *lp = user;
  if (ev->kind != MLO_TRACE_LOAD_BEGIN && ev->kind != MLO_TRACE_EVICT) return;
  size_t i = 0;
  while (i < lp->n && lp->c[i] != ev->comp) i++;
  if (i == lp->n && lp->n < 32) lp->c[lp->n++] = ev->comp;
  if (i == 32) return;
  bool begin = ev->kind == MLO_TRACE_LOAD_BEGIN;
  if (lp->open[i] == begin && !lp->bad[0])
    snprintf(lp->bad, sizeof lp->bad, "%s: %s traced twice without %s",
             mlo_component_name(ev->comp), begin ? "a load's begin" : "an eviction",
             begin ? "an eviction between" : "a load between");
  lp->open[i] = begin;
}

static void assert_pairs(tu_pipe *tp, const load_pairs *lp) {
  if (lp->bad[0]) fail_msg("trace: %s", lp->bad);
  for (size_t i = 0; i < lp->n; i++)
    if (lp->open[i] != mlo_component_is_resident((mlo_component *)lp->c[i]))
      fail_msg("trace: %s is %sresident with its last load %s", mlo_component_name(lp->c[i]),
               lp->open[i] ? "not " : "", lp->open[i] ? "open" : "closed");
  (void)tp;
}

uint64_t tu_h2d_counted(tu_pipe *tp) {
  uint64_t n = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++) {
    mlo_component_stats st;
    assert_ok(mlo_component_get_stats(mlo_pipeline_component_at(tp->pipe, i), &st));
    n += st.h2d_bytes;
  }
  return n;
}

unsigned tu_fault_sweep(const char *inner_spec, const tu_fault_case *fc, void *self) {
  char spec[512];
  snprintf(spec, sizeof spec, "fault:kind=any,nth=0,inner=%s", inner_spec);
  unsigned fired = 0;
  for (uint64_t nth = 1;; nth++) {
    mlo_platform *plat = NULL;
    char err[256] = "";
    assert_ok(mlo_platform_open(spec, &plat, err, sizeof err));
    tu_pipe *tp = fc->build(self, plat);
    load_pairs lp = {0};
    mlo_pipeline_set_trace(tp->pipe, pair_loads, &lp);
    mlo_fault_arm(plat, MLO_FAULT_ANY, nth);
    int rc = fc->run(self);
    bool hit = mlo_fault_fired(plat);
    mlo_fault_arm(plat, MLO_FAULT_ANY, 0);
    assert_pairs(tp, &lp);
    if (!hit) { /* past the last call: the sweep is done */
      assert_ok(rc);
      fc->destroy(self);
      mlo_platform_close(plat);
      return fired;
    }
    fired++;
    if (rc && rc != MLO_ECALLBACK) assert_true(mlo_pipeline_errmsg(tp->pipe)[0] != '\0');
    /* nothing half-done: the platform's bytes are the pipeline's, and
     * every byte copied, a failed load's too, is in some h2d_bytes */
    tu_assert_audit(tp);
    assert_int_equal(tu_device_used(plat), tu_pstats(tp).device_bytes);
    assert_int_equal(mlo_fault_h2d_bytes(plat), tu_h2d_counted(tp));
    /* and the next prompts are right (a failure inside a forward may have
     * been absorbed: a prefetch or a fill ahead only costs its overlap) */
    tu_reset_observations(tp);
    assert_ok(fc->run(self));
    assert_ok(fc->run(self));
    tu_assert_forwards_clean(tp);
    tu_assert_audit(tp);
    assert_pairs(tp, &lp);
    fc->destroy(self);
    mlo_platform_close(plat);
  }
}
