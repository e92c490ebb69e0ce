/*
 * cmd_synth.c — `mlo synth PRESET DIR [--scale S]`: writes a generated
 * pipeline shaped like a real one (mlo_synth_write), so that offload can be
 * tried and tested without downloading tens of gigabytes.
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#define DEFAULT_SCALE 0.005

static void help(void) {
  printf("usage: mlo synth PRESET DIR [--scale S] [--full-depth]\n\n"
         "Writes a diffusers-layout pipeline shaped like PRESET (same components,\n"
         "tensor names and layer structure, deterministic bf16/f32 weights) into DIR.\n"
         "Each component is scaled to about S x its real size.  A DIR already holding\n"
         "the same preset and scale is left as it is; a non-empty DIR that mlo did not\n"
         "write is refused.\n\n"
         "presets:\n");
  for (const mlo_synth_preset_info *p = mlo_synth_presets(); p && p->name; p++) {
    uint64_t bytes = 0;
    mlo_synth_bytes(p->name, DEFAULT_SCALE, &bytes);
    printf("  %-16s %s (%s at the default scale)\n", p->name, p->description, tool_size(bytes));
  }
  printf("\nflags:\n"
         "  --scale S     fraction of the real model's size, 0 < S <= 4 (default %g)\n"
         "  --full-depth  keep the real model's layer count, scaling widths alone, so\n"
         "                that each block is the same fraction of its component as in\n"
         "                the real model (what block streaming depends on: Wan2.2's DiT\n"
         "                has 40 blocks at any scale, not 5 at 0.002); written as the\n"
         "                preset PRESET:full-depth\n\n"
         "examples:\n"
         "  mlo synth wan2.2-t2v /tmp/wan --scale 0.002\n"
         "  mlo synth flux /tmp/flux && mlo inspect /tmp/flux\n"
         "  mlo synth wan2.2-t2v /tmp/wan40 --scale 0.002 --full-depth\n",
         DEFAULT_SCALE);
}

/* The bytes free to an unprivileged writer on the filesystem that holds
 * dir, or would hold it (its nearest existing parent); false if unknown. */
static bool free_bytes(const char *dir, uint64_t *out) {
  size_t n = strlen(dir);
  char *path = malloc(n + 2);
  if (!path) return false;
  memcpy(path, dir, n + 1);
  for (;;) {
    struct statvfs vfs;
    if (statvfs(*path ? path : ".", &vfs) == 0) {
      *out = (uint64_t)vfs.f_bavail * vfs.f_frsize;
      free(path);
      return true;
    }
    char *slash = strrchr(path, '/');
    if (!*path || (slash == path && !path[1])) break; /* "." or "/" failed: unknown */
    if (!slash)
      path[0] = '\0'; /* a bare name: the current folder */
    else if (slash == path)
      path[1] = '\0'; /* "/x": the root */
    else
      *slash = '\0';
  }
  free(path);
  return false;
}

/* Whether bytes of weights (and their headers, a few KiB a file) would not
 * fit where dir is: a full disk is no bad input (exit 4, not 2). */
static bool short_of_space(const char *dir, uint64_t bytes, uint64_t *avail) {
  uint64_t need = bytes + bytes / 64 + (1u << 20);
  return free_bytes(dir, avail) && *avail < need;
}

static bool known_preset(const char *name) {
  uint64_t bytes;
  return mlo_synth_bytes(name, DEFAULT_SCALE, &bytes) != MLO_ENOTFOUND;
}

static void list_presets(FILE *out) {
  fprintf(out, "presets:");
  for (const mlo_synth_preset_info *p = mlo_synth_presets(); p && p->name; p++)
    fprintf(out, " %s", p->name);
  fprintf(out, "\n");
}

int cmd_synth(int argc, char **argv) {
  targs a;
  targs_init(&a, "synth", argc, argv);
  const char *pos[2] = {NULL, NULL}, *val;
  int npos = 0;
  double scale = DEFAULT_SCALE;
  bool full_depth = false;
  while (targs_next(&a)) {
    if (targs_is_help(&a)) {
      help();
      return TOOL_EXIT_OK;
    } else if (targs_value(&a, "--scale", &val)) {
      targs_double(&a, "--scale", val, 1e-9, 4.0, &scale);
    } else if (targs_flag(&a, "--full-depth")) {
      full_depth = true;
    } else if (targs_cur(&a)[0] == '-' && targs_cur(&a)[1]) {
      targs_unknown(&a);
    } else if (npos < 2) {
      pos[npos++] = targs_cur(&a);
    } else {
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
    }
  }
  if (a.failed) return TOOL_EXIT_USAGE;
  if (npos < 2) {
    targs_error(&a, "needs a PRESET and a DIR");
    list_presets(stderr);
    return TOOL_EXIT_USAGE;
  }
  if (!known_preset(pos[0])) {
    targs_error(&a, "unknown preset '%s'", pos[0]);
    list_presets(stderr);
    return TOOL_EXIT_USAGE;
  }
  char name[128];
  if (full_depth && !strstr(pos[0], ":full-depth"))
    snprintf(name, sizeof name, "%s:full-depth", pos[0]);
  else
    snprintf(name, sizeof name, "%s", pos[0]);
  pos[0] = name;
  uint64_t bytes = 0, avail = 0;
  mlo_synth_bytes(pos[0], scale, &bytes);
  if (!mlo_synth_is_complete(pos[0], pos[1], scale) && short_of_space(pos[1], bytes, &avail)) {
    tool_err("synth %s into %s: needs about %s of disk, its filesystem has %s free; nothing "
             "written (a smaller --scale, or another folder)",
             pos[0], pos[1], tool_size(bytes), tool_size(avail));
    return TOOL_EXIT_FAIL;
  }
  tool_progress bar;
  progress_init(&bar, "writing", bytes);
  char err[512] = "";
  int rc = mlo_synth_write(pos[0], pos[1], scale, progress_synth_cb, &bar, err, sizeof err);
  progress_finish(&bar);
  if (rc) { /* the library removed what it wrote */
    tool_err("synth %s into %s: %s", pos[0], pos[1], err[0] ? err : mlo_strerror(rc));
    /* the disk filled while writing (another writer): still no bad input */
    return rc == MLO_EIO && short_of_space(pos[1], bytes, &avail) ? TOOL_EXIT_FAIL
                                                                  : tool_exit_for(rc);
  }
  printf("wrote %s at scale %g to %s (%s of weights)\n", pos[0], scale, pos[1], tool_size(bytes));
  return TOOL_EXIT_OK;
}
