/*
 * main.c — the `mlo` command: dispatches to one file per subcommand and
 * prints the overview.  Each command parses its own flags (args.c) and
 * returns an exit code from tool.h.
 */
#include "plan.h"

#include <errno.h>
#include <string.h>

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *summary;
} commands[] = {
    {"demo", cmd_demo, "generate a Wan2.2-shaped pipeline, run it offloaded, verify, report"},
    {"synth", cmd_synth, "write a generated pipeline shaped like a real one"},
    {"inspect", cmd_inspect, "show a checkpoint's components, roles, sizes and memory needs"},
    {"run", cmd_run, "run the reference workload on a checkpoint, offloaded or not"},
    {"plan", cmd_plan, "project offload's cost on a card, without a GPU or the weights"},
    {"bench", cmd_bench, "measure offload's costs as ratios against raw copies"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: mlo COMMAND [ARGS...]\n\n"
               "mlo runs multi-component diffusion pipelines on a device that cannot hold\n"
               "them all, keeping only the executing component resident.\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\n'mlo COMMAND --help' shows a command's flags and examples.\n"
               "Exit codes: 0 ok, 1 verification failed, 2 bad usage or input,\n"
               "3 out of device memory, 4 other failure.\n"
               "Environment: MLO_CACHE (demo cache folder), MLO_LOG (log level),\n"
               "MLO_NO_PROGRESS=1 (no progress bar even on a terminal).\n");
}

/* A report nobody received is a failure: stdout on a full disk, a closed
 * pipe or /dev/full must not end in exit 0. */
static int finish(int code) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "mlo: cannot write to standard output: %s\n", strerror(errno));
    if (code == TOOL_EXIT_OK) code = TOOL_EXIT_FAIL;
  }
  return code;
}

static int run(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return TOOL_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return TOOL_EXIT_OK;
  }
  if (!strcmp(cmd, "--version")) {
    /* The platforms are the library's list: built in, or modules found (or
     * not, and why) where mlo_platform_open would look. */
    printf("mlo %s\nplatforms:\n", mlo_version());
    for (size_t i = 0; i < mlo_platform_count(); i++) {
      mlo_platform_info info = MLO_PLATFORM_INFO_INIT;
      info.probe = true;
      if (mlo_platform_info_get(i, &info)) continue;
      printf("  %-7s %s: %s\n", info.name, info.available ? "yes" : "no ",
             info.module ? info.detail : "built in");
    }
    printf("ranks (MPI): %s\n",
#ifdef MLO_HAVE_MPI
           "yes (libmlo-mpi)"
#else
           "no (built without MPI)"
#endif
    );
    return TOOL_EXIT_OK;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "mlo: unknown command '%s'\n", cmd);
  usage(stderr);
  return TOOL_EXIT_USAGE;
}

/* With --json, a failure still answers in JSON: one object on stdout
 * naming the error, when the command printed none of its own. */
static bool wants_json(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--json")) return true;
  return false;
}

int main(int argc, char **argv) {
  int code = run(argc, argv);
  if (code != TOOL_EXIT_OK && !tool_json_printed && wants_json(argc, argv))
    tool_print_json_error(code);
  return finish(code);
}
