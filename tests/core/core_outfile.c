/*
 * core_outfile.c — outputs never harm what is at their path
 * (src/base/outfile.c): a regular file is replaced atomically with its mode
 * kept, a symlink is followed and its target replaced, and a FIFO, a device
 * node, a socket, a folder or a dangling link is refused with a message and
 * left as it was.  Everything lives in a temporary folder made here; the
 * device node is one this test creates inside it (as root), never a real
 * one under /dev.
 */
#include "testutil.h"

#include "base/sysio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

static char dir[64];

static const char *at(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ & 3];
  snprintf(p, 256, "%s/%s", dir, name);
  return p;
}

static void read_back(const char *path, const char *want) {
  char got[64] = "";
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(got, 1, sizeof got - 1, f);
  fclose(f);
  got[n] = '\0';
  assert_string_equal(got, want);
}

/* Refused with a message naming path and kind; the thing is unchanged. */
static void refused(const char *path, const char *kind, mode_t type) {
  char err[512] = "";
  assert_status(mlo_out_check(path, err, sizeof err), MLO_EIO);
  assert_status(mlo_out_write_all(path, "x", 1, err, sizeof err), MLO_EIO);
  if (!strstr(err, path) || !strstr(err, kind)) fail_msg("message \"%s\" (want %s)", err, kind);
  struct stat st;
  assert_int_equal(lstat(path, &st), 0);
  assert_int_equal(st.st_mode & S_IFMT, type);
}

/* Nothing but the outputs themselves is left in the folder. */
static void no_temporaries(unsigned expected_entries) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq %u", dir, expected_entries);
  assert_int_equal(system(cmd), 0);
}

static void test_regular_files(void **state) {
  (void)state;
  char err[512];
  assert_ok(mlo_out_write_all(at("new.json"), "one", 3, err, sizeof err));
  read_back(at("new.json"), "one");
  assert_int_equal(chmod(at("new.json"), 0640), 0);
  assert_ok(mlo_out_write_all(at("new.json"), "two", 3, err, sizeof err));
  read_back(at("new.json"), "two");
  struct stat st;
  assert_int_equal(stat(at("new.json"), &st), 0);
  assert_int_equal(st.st_mode & 07777, 0640); /* the replaced file keeps its mode */
  /* an aborted write leaves the old file and no temporary */
  mlo_outfile o;
  assert_ok(mlo_out_begin(&o, at("new.json"), err, sizeof err));
  assert_int_equal(write(o.fd, "partial", 7), 7);
  mlo_out_abort(&o);
  read_back(at("new.json"), "two");
  no_temporaries(1);
}

static void test_symlink_followed(void **state) {
  (void)state;
  char err[512];
  assert_ok(mlo_out_write_all(at("target.json"), "old", 3, err, sizeof err));
  assert_int_equal(symlink("target.json", at("link.json")), 0);
  assert_ok(mlo_out_write_all(at("link.json"), "new", 3, err, sizeof err));
  struct stat st;
  assert_int_equal(lstat(at("link.json"), &st), 0);
  assert_true(S_ISLNK(st.st_mode)); /* the link stays a link */
  read_back(at("target.json"), "new");
  assert_int_equal(symlink("nothing-here", at("dangling")), 0);
  assert_status(mlo_out_write_all(at("dangling"), "x", 1, err, sizeof err), MLO_EIO);
  assert_non_null(strstr(err, "symlink to nothing"));
}

static void test_special_files_refused(void **state) {
  (void)state;
  assert_int_equal(mkfifo(at("fifo"), 0600), 0);
  refused(at("fifo"), "a FIFO", S_IFIFO);
  assert_int_equal(mkdir(at("folder"), 0700), 0);
  refused(at("folder"), "a folder", S_IFDIR);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", at("sock"));
  assert_int_equal(bind(s, (struct sockaddr *)&addr, sizeof addr), 0);
  refused(at("sock"), "a socket", S_IFSOCK);
  close(s);
  /* A character device like /dev/null, made here (root only: CI is root). */
  if (mknod(at("null"), S_IFCHR | 0600, makedev(1, 3)) == 0) {
    refused(at("null"), "a character device", S_IFCHR);
    assert_int_equal(symlink("null", at("link-to-null")), 0); /* through a link: the same */
    refused(at("link-to-null"), "a character device", S_IFLNK);
  } else {
    assert_int_equal(errno, EPERM); /* not root: the one case that cannot be set up */
  }
}

static void test_unwritable_places(void **state) {
  (void)state;
  char err[512];
  assert_ok(mlo_out_write_all(at("plain"), "x", 1, err, sizeof err));
  assert_status(mlo_out_check(at("plain/below"), err, sizeof err), MLO_EIO);
  assert_status(mlo_out_check(at("no/such/dir/file"), err, sizeof err), MLO_EIO);
  assert_non_null(strstr(err, "no/such/dir/file"));
  assert_status(mlo_out_check("", err, sizeof err), MLO_EINVAL);
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/mlo_outfile_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_regular_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_symlink_followed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_special_files_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unwritable_places, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
