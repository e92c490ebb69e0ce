/*
 * test_module.c — the module loader (src/platform/module.c) against what a
 * hostile or broken libmlo-<name>.so does (issue 44): a module planted in
 * the current folder and reached through an empty LD_LIBRARY_PATH element
 * or a relative MLO_MODULE_PATH element, one in a folder others may write,
 * one owned by another user, a FIFO in the module's place, libmlo itself
 * reached through a relative path, and modules whose init answers no table,
 * no version, no ops or a refusal.
 *
 * A module is loaded once per process, and the library path is read by the
 * dynamic loader when a process starts, so every case runs in a process of
 * its own: this program re-executed as a probe ("probe ..." below) with the
 * environment and current folder the case needs, its output read back, a
 * crash or a hang (killed after a timeout) failing the test rather than the
 * suite.  The module is tests/platform/fake_module.c, copied into a
 * temporary folder under the name the case needs; its constructor appends
 * a line to a marker file, so "the marker was never written" means "its code
 * never ran".
 */
#define _GNU_SOURCE /* dlopen of the relative libmlo */
#include "testutil.h"

#include "platform/module.h"
#include "workload/workload.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MLO_TEST_FAKEMOD
#error "MLO_TEST_FAKEMOD: the path of the built fake module"
#endif
#ifndef MLO_TEST_LIBMLO
#error "MLO_TEST_LIBMLO: the path of the built libmlo.so"
#endif

extern char **environ;

/* ---- the probe: one load in a fresh process, its outcome on stdout ------ */

static int probe(int argc, char **argv) {
  if (argc < 3) return 2;
  const char *what = argv[2];
  int times = argc > 5 ? atoi(argv[5]) : 1;
  char err[2048];
  if (!strcmp(what, "load") && argc >= 5) { /* load FILE platform|workload [TIMES] */
    mlo_module_kind kind = strcmp(argv[4], "workload") ? MLO_MODULE_PLATFORM : MLO_MODULE_WORKLOAD;
    for (int i = 0; i < times; i++) {
      const struct mlo_module *m = NULL;
      const char *path = NULL;
      err[0] = '\0';
      int rc = mlo_module_load(argv[3], kind, &m, &path, err, sizeof err);
      printf("rc=%d path=%s err=%s\n", rc, rc ? "" : path, rc ? err : "");
      fflush(stdout);
    }
    return 0;
  }
  if (!strcmp(what, "open") && argc >= 4) { /* open SPEC */
    mlo_platform *p = NULL;
    err[0] = '\0';
    int rc = mlo_platform_open(argv[3], &p, err, sizeof err);
    printf("rc=%d err=%s\n", rc, err);
    mlo_platform_close(p);
    return 0;
  }
  if (!strcmp(what, "workload") && argc >= 4) { /* workload PLATFORM */
    const struct mlo_workload_ops *ops = NULL;
    err[0] = '\0';
    int rc = mlo_workload_backend(argv[3], &ops, err, sizeof err);
    printf("rc=%d err=%s\n", rc, err);
    return 0;
  }
  if (!strcmp(what, "dlopen") && argc >= 4) { /* dlopen LIBMLO: probe cuda through it */
    void *lib = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      printf("dlopen failed: %s\n", dlerror());
      return 0;
    }
    size_t (*count)(void) = NULL;
    int (*info_get)(size_t, mlo_platform_info *) = NULL;
    *(void **)&count = dlsym(lib, "mlo_platform_count");
    *(void **)&info_get = dlsym(lib, "mlo_platform_info_get");
    if (!count || !info_get) {
      printf("no mlo_platform_info_get in %s\n", argv[3]);
      return 0;
    }
    for (size_t i = 0; i < count(); i++) {
      mlo_platform_info info = MLO_PLATFORM_INFO_INIT;
      info.probe = true;
      if (info_get(i, &info) == MLO_OK && !strcmp(info.name, "cuda"))
        printf("available=%d detail=%s\n", info.available, info.detail);
    }
    return 0;
  }
  return 2;
}

/* ---- running a probe ---------------------------------------------------- */

static char self_exe[PATH_MAX];

/* The probe's outcome: how it ended, and what it printed. */
typedef struct {
  bool exited; /* ran to its end (not killed by a signal, not timed out) */
  bool timed_out;
  int status; /* exit code, or the signal that killed it */
  char out[8192];
} probe_result;

/* Runs `probe ARGS...` in folder cwd with the environment of this process
 * less the variables this test controls, plus `set` ("NAME=value" each),
 * killing it after timeout_s. */
static void run_probe(const char *cwd, const char *const *set, const char *const *args,
                      int timeout_s, probe_result *r) {
  static const char *const controlled[] = {
      "MLO_MODULE_PATH=",  "LD_LIBRARY_PATH=",    "MLO_FAKEMOD_MODE=",
      "MLO_FAKEMOD_NAME=", "MLO_FAKEMOD_MARKER=", "MLO_LOG="};
  const char *envp[512];
  size_t n = 0;
  for (char **e = environ; *e && n < 480; e++) {
    bool skip = false;
    for (size_t i = 0; i < sizeof controlled / sizeof *controlled; i++)
      skip |= !strncmp(*e, controlled[i], strlen(controlled[i]));
    if (!skip) envp[n++] = *e;
  }
  for (; set && *set && n < 510; set++) envp[n++] = *set;
  envp[n] = NULL;
  const char *argv[16] = {self_exe, "probe"};
  size_t na = 2;
  for (; *args && na < 15; args++) argv[na++] = *args;
  argv[na] = NULL;

  memset(r, 0, sizeof *r);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    if (chdir(cwd) != 0) _exit(126);
    execve(self_exe, (char *const *)argv, (char *const *)envp);
    _exit(127);
  }
  close(fds[1]);
  size_t used = 0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long left_ms = timeout_s * 1000L -
                   ((now.tv_sec - t0.tv_sec) * 1000L + (now.tv_nsec - t0.tv_nsec) / 1000000L);
    if (left_ms <= 0) {
      r->timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int pr = poll(&pfd, 1, (int)left_ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue; /* timed out: the next turn says so */
    ssize_t got = read(fds[0], r->out + used, sizeof r->out - 1 - used);
    if (got <= 0) break; /* the probe closed its end: it is done */
    used += (size_t)got;
    if (used == sizeof r->out - 1) used = 0; /* keep reading; the tail is what counts */
  }
  r->out[used] = '\0';
  close(fds[0]);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  r->exited = !r->timed_out && WIFEXITED(ws);
  r->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? WTERMSIG(ws) : -1;
}

/* The probe ran to its end, printing `want`. */
static void assert_probe_said(const probe_result *r, const char *want) {
  if (r->timed_out) fail_msg("the probe hung (killed after its timeout); it printed:\n%s", r->out);
  if (!r->exited) fail_msg("the probe died of signal %d; it printed:\n%s", r->status, r->out);
  if (!strstr(r->out, want)) fail_msg("wanted \"%s\" in the probe's output:\n%s", want, r->out);
}

static void assert_probe_silent_on(const probe_result *r, const char *unwanted) {
  if (strstr(r->out, unwanted))
    fail_msg("\"%s\" should not be in the probe's output:\n%s", unwanted, r->out);
}

/* ---- temporary folders -------------------------------------------------- */

static char tmp[512]; /* this test's folder (resolved), made and removed per test */

static int setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char made[PATH_MAX], resolved[PATH_MAX];
  snprintf(made, sizeof made, "%s/mlo_module_XXXXXX", base);
  if (!mkdtemp(made) || !realpath(made, resolved) || strlen(resolved) >= sizeof tmp) return -1;
  memcpy(tmp, resolved, strlen(resolved) + 1);
  return 0;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)ftw;
  return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static int teardown(void **state) {
  (void)state;
  chmod(tmp, 0700);
  return nftw(tmp, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* tmp/rel, made with exactly `mode` (the umask left out). */
static void make_dir(const char *rel, mode_t mode, char *out, size_t len) {
  assert_true((size_t)snprintf(out, len, "%s/%s", tmp, rel) < len);
  assert_int_equal(mkdir(out, 0700), 0);
  assert_int_equal(chmod(out, mode), 0);
}

/* A copy of the fake module (or of `from`) at dir/name, with `mode`. */
static void copy_file(const char *from, const char *dir, const char *name, mode_t mode) {
  char to[PATH_MAX];
  snprintf(to, sizeof to, "%s/%s", dir, name);
  int in = open(from, O_RDONLY | O_CLOEXEC);
  assert_true(in >= 0);
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  assert_true(out >= 0);
  char buf[65536];
  ssize_t n;
  while ((n = read(in, buf, sizeof buf)) > 0) assert_int_equal(write(out, buf, (size_t)n), n);
  assert_int_equal(n, 0);
  close(in);
  close(out);
  assert_int_equal(chmod(to, mode), 0);
}
static void plant(const char *dir, const char *name, mode_t mode) {
  copy_file(MLO_TEST_FAKEMOD, dir, name, mode);
}

/* How many times the fake module's constructor ran. */
static int marker_lines(void) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/marker", tmp);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  int lines = 0;
  for (int c; (c = fgetc(f)) != EOF;) lines += c == '\n';
  fclose(f);
  return lines;
}

static char marker_env[PATH_MAX + 32];
static const char *marker(void) {
  snprintf(marker_env, sizeof marker_env, "MLO_FAKEMOD_MARKER=%s/marker", tmp);
  return marker_env;
}

static char path_env[PATH_MAX + 32];
static const char *module_path(const char *dirs) {
  snprintf(path_env, sizeof path_env, "MLO_MODULE_PATH=%s", dirs);
  return path_env;
}

/* ---- F5: the current folder, folders others may write, libmlo's own ----- */

/* `export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/x` with it unset leaves an
 * empty element, which the loader reads as the current folder: mlo, with no
 * MLO_MODULE_PATH and no module installed, must not run a module planted
 * in the folder the program was started from. */
static void test_empty_library_path_element_never_searched(void **state) {
  (void)state;
  char empty[PATH_MAX], lib_path[PATH_MAX + 32];
  make_dir("empty", 0755, empty, sizeof empty);
  plant(tmp, "libmlo-plant.so", 0755);
  snprintf(lib_path, sizeof lib_path, "LD_LIBRARY_PATH=:%s", empty);
  const char *set[] = {lib_path, marker(), "MLO_FAKEMOD_NAME=plant", "MLO_LOG=debug", NULL};
  probe_result r;
  run_probe(tmp, set, (const char *[]){"load", "plant", "platform", NULL}, 60, &r);
  assert_probe_said(&r, "module libmlo-plant.so not found");
  assert_int_equal(marker_lines(), 0);
  assert_probe_silent_on(&r, "./libmlo-plant.so");
  /* and the debug log says what was skipped */
  assert_probe_said(&r, "skipped '.'");
}

/* MLO_MODULE_PATH's empty and relative elements are refused, not resolved
 * against whatever the current folder is: the error names them. */
static void test_relative_module_path_elements_refused(void **state) {
  (void)state;
  char sub[PATH_MAX];
  make_dir("sub", 0755, sub, sizeof sub);
  plant(tmp, "libmlo-plant.so", 0755);
  plant(sub, "libmlo-plant.so", 0755);
  const char *set[] = {module_path("::.:sub:./sub"), marker(), "MLO_FAKEMOD_NAME=plant", NULL};
  probe_result r;
  run_probe(tmp, set, (const char *[]){"load", "plant", "platform", NULL}, 60, &r);
  assert_probe_said(&r, "module libmlo-plant.so not found");
  assert_probe_said(&r, "'.' (relative: skipped)");
  assert_probe_said(&r, "'sub' (relative: skipped)");
  assert_int_equal(marker_lines(), 0);
}

/* A module in a folder others may write (world- or group-writable, not
 * sticky) is refused before it is opened, naming the folder; so is a module
 * file others may write, and (as root, who can make one) a module or a
 * folder owned by another user.  In a sticky world-writable folder (/tmp's
 * mode) a module of ours is loaded: the positive control that the fake
 * module is otherwise good. */
static void test_writable_by_others_refused(void **state) {
  (void)state;
  static const struct {
    const char *dir;
    mode_t dir_mode, file_mode;
    const char *why; /* NULL: loaded */
  } cases[] = {
      {"world", 0777, 0755,
       "its folder %s is writable by others than its owner and root (mode 0777)"},
      {"group", 0775, 0755,
       "its folder %s is writable by others than its owner and root (mode 0775)"},
      {"file", 0755, 0757, "the file is writable by others than its owner and root (mode 0757)"},
      {"gfile", 0755, 0775, "the file is writable by others than its owner and root (mode 0775)"},
      {"sticky", 01777, 0755, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char dir[PATH_MAX], want[PATH_MAX * 3];
    make_dir(cases[i].dir, cases[i].dir_mode, dir, sizeof dir);
    plant(dir, "libmlo-plant.so", cases[i].file_mode);
    const char *set[] = {module_path(dir), marker(), "MLO_FAKEMOD_NAME=plant", NULL};
    probe_result r;
    run_probe(tmp, set, (const char *[]){"load", "plant", "platform", NULL}, 60, &r);
    if (cases[i].why) {
      snprintf(want, sizeof want, "%s/libmlo-plant.so refused: ", dir);
      assert_probe_said(&r, want);
      snprintf(want, sizeof want, cases[i].why, dir);
      assert_probe_said(&r, want);
      assert_int_equal(marker_lines(), 0);
    } else {
      snprintf(want, sizeof want, "rc=0 path=%s/libmlo-plant.so", dir);
      assert_probe_said(&r, want);
      assert_int_equal(marker_lines(), 1);
    }
  }
  if (geteuid() != 0) return; /* only root can give a file away */
  char dir[PATH_MAX], want[PATH_MAX * 3], file[PATH_MAX + 32];
  make_dir("theirs", 0755, dir, sizeof dir);
  plant(dir, "libmlo-plant.so", 0755);
  snprintf(file, sizeof file, "%s/libmlo-plant.so", dir);
  assert_int_equal(chown(file, 65534, 65534), 0);
  const char *set[] = {module_path(dir), marker(), "MLO_FAKEMOD_NAME=plant", NULL};
  probe_result r;
  run_probe(tmp, set, (const char *[]){"load", "plant", "platform", NULL}, 60, &r);
  snprintf(want, sizeof want, "%s refused: the file is owned by uid 65534", file);
  assert_probe_said(&r, want);
  assert_int_equal(chown(file, 0, 0), 0);
  assert_int_equal(chown(dir, 65534, 65534), 0);
  run_probe(tmp, set, (const char *[]){"load", "plant", "platform", NULL}, 60, &r);
  snprintf(want, sizeof want, "%s refused: its folder %s is owned by uid 65534", file, dir);
  assert_probe_said(&r, want);
  assert_int_equal(marker_lines(), 1); /* the sticky case's, and no other */
}

/* libmlo reached through a relative path (dlopen("lib/libmlo.so"), as a
 * program or an interpreter may do) searches the folder beside libmlo, not
 * beside the program. */
static void test_beside_relative_libmlo(void **state) {
  (void)state;
  char lib[PATH_MAX], mods[PATH_MAX], want[PATH_MAX * 2];
  make_dir("lib", 0755, lib, sizeof lib);
  make_dir("lib/mlo", 0755, mods, sizeof mods);
  copy_file(MLO_TEST_LIBMLO, lib, "libmlo.so", 0755);
  plant(mods, "libmlo-cuda.so", 0755);
  const char *set[] = {marker(), NULL};
  probe_result r;
  run_probe(tmp, set, (const char *[]){"dlopen", "lib/libmlo.so", NULL}, 60, &r);
  snprintf(want, sizeof want, "available=1 detail=%s/libmlo-cuda.so\n", mods);
  assert_probe_said(&r, want);
  assert_int_equal(marker_lines(), 1);
}

/* ---- F6: a FIFO in the module's place ----------------------------------- */

static void test_fifo_is_refused_not_waited_on(void **state) {
  (void)state;
  char dir[PATH_MAX], fifo[PATH_MAX + 32], want[PATH_MAX * 2];
  make_dir("fifo", 0755, dir, sizeof dir);
  snprintf(fifo, sizeof fifo, "%s/libmlo-cuda.so", dir);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  const char *set[] = {module_path(dir), NULL};
  probe_result r;
  run_probe(tmp, set, (const char *[]){"open", "cuda:0", NULL}, 30, &r);
  snprintf(want, sizeof want, "%s is not a regular file (a FIFO)", fifo);
  assert_probe_said(&r, want);
  run_probe(tmp, set, (const char *[]){"load", "cuda", "platform", NULL}, 30, &r);
  assert_probe_said(&r, want);
}

/* ---- F9, F14: what init answers is checked before it is used ----------- */

/* The fake module in `mode`, answering to `name`, as tmp/m/file, probed with
 * args. */
static void probe_mode(const char *mode, const char *name, const char *file,
                       const char *const *args, probe_result *r) {
  char dir[PATH_MAX], mode_env[64], name_env[64];
  snprintf(dir, sizeof dir, "%s/m", tmp);
  if (access(dir, F_OK) != 0) make_dir("m", 0755, dir, sizeof dir);
  char target[PATH_MAX + 64];
  snprintf(target, sizeof target, "%s/%s", dir, file);
  unlink(target);
  plant(dir, file, 0755);
  snprintf(mode_env, sizeof mode_env, "MLO_FAKEMOD_MODE=%s", mode);
  snprintf(name_env, sizeof name_env, "MLO_FAKEMOD_NAME=%s", name);
  const char *set[] = {module_path(dir), marker(), mode_env, name_env, NULL};
  run_probe(tmp, set, args, 60, r);
}

/* A platform module whose constructor says it opened and leaves no ops, or
 * an ops table missing what every caller calls: an error, no crash. */
static void test_module_without_ops(void **state) {
  (void)state;
  probe_result r;
  probe_mode("noops", "cuda", "libmlo-cuda.so", (const char *[]){"open", "cuda", NULL}, &r);
  assert_probe_said(&r, "the cuda platform's constructor returned no ops table");
  probe_mode("partialops", "cuda", "libmlo-cuda.so", (const char *[]){"open", "cuda", NULL}, &r);
  assert_probe_said(&r, "the cuda platform's ops table has no destroy");
  /* a collective group is all of it or none (platform.h) */
  probe_mode("partialcoll", "cuda", "libmlo-cuda.so", (const char *[]){"open", "cuda", NULL}, &r);
  assert_probe_said(&r, "the cuda platform's ops table has no coll->check");
  probe_mode("nocreate", "cuda", "libmlo-cuda.so", (const char *[]){"open", "cuda", NULL}, &r);
  assert_probe_said(&r, "is a platform module with no constructor (create)");
  probe_mode("wlpartial", "fake", "libmlo-workload-fake.so",
             (const char *[]){"workload", "fake", NULL}, &r);
  assert_probe_said(&r, "rc=");
  assert_probe_silent_on(&r, "rc=0 ");
  assert_probe_said(&r, "its ops table has no create");
}

/* No version string, or a version pointer to nowhere: refused, no crash. */
static void test_module_version_pointer_checked(void **state) {
  (void)state;
  probe_result r;
  probe_mode("noversion", "plant", "libmlo-plant.so",
             (const char *[]){"load", "plant", "platform", NULL}, &r);
  assert_probe_said(&r, "libmlo-plant.so gave no version string");
  probe_mode("badversion", "plant", "libmlo-plant.so",
             (const char *[]){"load", "plant", "platform", NULL}, &r);
  assert_probe_said(&r, "libmlo-plant.so gave a version pointer outside the module");
}

/* A refused module is loaded once: a second probe answers the remembered
 * refusal, without running the module's code again. */
static void test_refusal_remembered(void **state) {
  (void)state;
  probe_result r;
  probe_mode("refuse", "plant", "libmlo-plant.so",
             (const char *[]){"load", "plant", "platform", "2", NULL}, &r);
  assert_probe_said(&r, "refused to start: the fake module refuses on purpose");
  const char *first = strstr(r.out, "rc=");
  const char *second = first ? strstr(first + 1, "rc=") : NULL;
  assert_non_null(second);
  const char *eol = strchr(first, '\n');
  assert_non_null(eol);
  assert_int_equal(strncmp(first, second, (size_t)(eol - first) + 1), 0); /* the same answer */
  assert_int_equal(marker_lines(), 1);
}

/* An init that fails with no reason, or succeeds with no table, is named
 * for what it did: never "refused to start: success". */
static void test_refusal_message_says_what_happened(void **state) {
  (void)state;
  probe_result r;
  probe_mode("notable", "plant", "libmlo-plant.so",
             (const char *[]){"load", "plant", "platform", NULL}, &r);
  assert_probe_said(&r, "libmlo-plant.so returned no module table");
  assert_probe_silent_on(&r, "success");
  probe_mode("rcnomsg", "plant", "libmlo-plant.so",
             (const char *[]){"load", "plant", "platform", NULL}, &r);
  assert_probe_said(&r, "refused to start: device API error (MLO_EPLATFORM, no reason given)");
  probe_mode("rcunknown", "plant", "libmlo-plant.so",
             (const char *[]){"load", "plant", "platform", NULL}, &r);
  assert_probe_said(&r, "refused to start: unknown error (rc 12345, no reason given)");
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "probe")) return probe(argc, argv);
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (n <= 0) return 1;
  self_exe[n] = '\0';
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_empty_library_path_element_never_searched, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_relative_module_path_elements_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writable_by_others_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_beside_relative_libmlo, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fifo_is_refused_not_waited_on, setup, teardown),
      cmocka_unit_test_setup_teardown(test_module_without_ops, setup, teardown),
      cmocka_unit_test_setup_teardown(test_module_version_pointer_checked, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusal_remembered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusal_message_says_what_happened, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
