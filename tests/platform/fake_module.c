/*
 * fake_module.c — a module of this build that misbehaves on request, for
 * test_module.c (issue 44): the module loader must survive what a broken or
 * planted libmlo-<name>.so answers, and must never run one it should not
 * trust.  test_module.c copies it into its temporary folders under the name
 * it needs and runs a probe program over it.
 *
 * Its constructor appends a line to $MLO_FAKEMOD_MARKER (when set): a marker
 * that says the file was loaded and its code ran, and how many times.
 * $MLO_FAKEMOD_MODE picks what mlo_module_init answers (default "ok": a
 * well-formed platform module named $MLO_FAKEMOD_NAME, "cuda" by default,
 * whose platform refuses to open).
 */
#include "platform/module.h"
#include "workload/workload.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((constructor)) static void mark_loaded(void) {
  const char *marker = getenv("MLO_FAKEMOD_MARKER");
  if (!marker) return;
  FILE *f = fopen(marker, "a");
  if (!f) return;
  fputs("loaded\n", f);
  fclose(f);
}

static int create_refuses(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  (void)spec_args, (void)p;
  snprintf(err, errlen, "the fake platform opens nothing");
  return MLO_EUNSUPPORTED;
}

/* "noops": says it opened, and leaves the platform with no ops table. */
static int create_without_ops(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  (void)spec_args, (void)err, (void)errlen;
  p->ops = NULL;
  return MLO_OK;
}

/* "partialops": an ops table with a name and nothing else. */
static const struct mlo_platform_ops partial_ops = {.name = "cuda"};
static int create_partial_ops(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  (void)spec_args, (void)err, (void)errlen;
  p->ops = &partial_ops;
  return MLO_OK;
}

/* "partialcoll": every slot core calls, and a collective group without its
 * wait (platform.h: all of it, or none). */
static void stub_destroy(void *ctx) {
  (void)ctx;
}
static void stub_caps(void *ctx, mlo_platform_caps *caps) {
  (void)ctx;
  memset(caps, 0, sizeof *caps);
}
static int stub_memory(void *ctx, uint64_t *total, uint64_t *free_bytes) {
  (void)ctx;
  *total = *free_bytes = 1 << 20;
  return MLO_OK;
}
static int stub_alloc(void *ctx, size_t bytes, void **block) {
  (void)ctx, (void)bytes, (void)block;
  return MLO_ENOMEM;
}
static int stub_free(void *ctx, void *block, size_t bytes) {
  (void)ctx, (void)block, (void)bytes;
  return MLO_OK;
}
static int stub_h2d(void *ctx, void *block, size_t offset, const void *src, size_t bytes) {
  (void)ctx, (void)block, (void)offset, (void)src, (void)bytes;
  return MLO_OK;
}
static int stub_d2h(void *ctx, void *dst, const void *block, size_t offset, size_t bytes) {
  (void)ctx, (void)dst, (void)block, (void)offset, (void)bytes;
  return MLO_OK;
}
static int stub_sync(void *ctx) {
  (void)ctx;
  return MLO_OK;
}
static int stub_gather(void *ctx, void *block, size_t offset, size_t slice, int rank, void *coll,
                       unsigned timeout_ms) {
  (void)ctx, (void)block, (void)offset, (void)slice, (void)rank, (void)coll, (void)timeout_ms;
  return MLO_OK;
}
static const struct mlo_platform_coll_ops half_coll = {.gather = stub_gather};
static const struct mlo_platform_ops half_coll_ops = {.name = "cuda",
                                                      .destroy = stub_destroy,
                                                      .get_caps = stub_caps,
                                                      .get_memory = stub_memory,
                                                      .dev_alloc = stub_alloc,
                                                      .dev_free = stub_free,
                                                      .copy_h2d = stub_h2d,
                                                      .copy_d2h = stub_d2h,
                                                      .synchronize = stub_sync,
                                                      .coll = &half_coll};
static int create_half_coll(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  (void)spec_args, (void)err, (void)errlen;
  p->ops = &half_coll_ops;
  return MLO_OK;
}

/* "wlpartial": a workload back-end with its platform's name and no calls. */
static const struct mlo_workload_ops partial_workload = {.platform = "fake"};

static char name[32];
static struct mlo_module table;

__attribute__((visibility("default"))) int mlo_module_init(const struct mlo_module_host *host,
                                                           const struct mlo_module **out, char *err,
                                                           size_t errlen) {
  (void)host;
  const char *mode = getenv("MLO_FAKEMOD_MODE");
  const char *want = getenv("MLO_FAKEMOD_NAME");
  snprintf(name, sizeof name, "%s", want ? want : "cuda");
  mode = mode ? mode : "ok";
  table = (struct mlo_module){.abi = MLO_MODULE_ABI,
                              .version = MLO_MODULE_VERSION,
                              .kind = MLO_MODULE_PLATFORM,
                              .name = name,
                              .create = create_refuses};
  *out = &table;
  if (!strcmp(mode, "notable")) { /* MLO_OK and no table */
    *out = NULL;
  } else if (!strcmp(mode, "refuse")) { /* a refusal with its reason */
    snprintf(err, errlen, "the fake module refuses on purpose");
    return MLO_EINVAL;
  } else if (!strcmp(mode, "rcnomsg")) { /* a refusal with no reason */
    return MLO_EPLATFORM;
  } else if (!strcmp(mode, "rcunknown")) { /* an rc that is no mlo status */
    return 12345;
  } else if (!strcmp(mode, "noversion")) {
    table.version = NULL;
  } else if (!strcmp(mode, "badversion")) { /* garbage: no string anywhere */
    table.version = (const char *)(uintptr_t)16;
  } else if (!strcmp(mode, "noops")) {
    table.create = create_without_ops;
  } else if (!strcmp(mode, "partialops")) {
    table.create = create_partial_ops;
  } else if (!strcmp(mode, "partialcoll")) {
    table.create = create_half_coll;
  } else if (!strcmp(mode, "nocreate")) {
    table.create = NULL;
  } else if (!strcmp(mode, "wlpartial")) {
    table.kind = MLO_MODULE_WORKLOAD;
    table.create = NULL;
    table.impl = &partial_workload;
  }
  return MLO_OK;
}
