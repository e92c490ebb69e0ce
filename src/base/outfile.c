/*
 * outfile.c — writing an output file without harming what is at its path.
 *
 * The rule (docs/reliability.md, "Outputs"): a regular file is replaced
 * atomically — a temporary with an unpredictable name is created O_EXCL
 * beside it, written, fsync'ed and renamed over it, so a reader sees the old
 * file or the new one, never half of either; a symlink is followed and its
 * target replaced the same way (the link stays); anything else — a device
 * node such as /dev/null, a FIFO, a socket, a folder — is refused with a
 * message, never replaced.  Run as root, a rename over /dev/null would turn
 * it into a regular file and break the machine; that is what this prevents.
 */
#define _GNU_SOURCE /* statx */
#include "base/log.h"
#include "base/sysio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The file an output to path replaces (symlinks resolved), or path itself
 * when nothing is there yet; *exists says which.  Refuses what is not a
 * regular file. */
static int resolve_target(const char *path, char **target, bool *exists, struct stat *st, char *err,
                          size_t errlen) {
  *target = NULL;
  *exists = false;
  if (!path || !*path) return mlo_errf(err, errlen, MLO_EINVAL, "an output path is empty");
  struct stat lst;
  if (lstat(path, &lst) != 0) {
    if (errno != ENOENT)
      return mlo_errf(err, errlen, MLO_EIO, "%s: cannot write: %s", path, strerror(errno));
    *target = mlo_strdup(path);
    return *target ? MLO_OK : mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", path);
  }
  if (S_ISLNK(lst.st_mode) && stat(path, st) != 0)
    return mlo_errf(err, errlen, MLO_EIO,
                    "%s: is a symlink to nothing (%s); not writing through it", path,
                    strerror(errno));
  if (!S_ISLNK(lst.st_mode)) *st = lst;
  if (!S_ISREG(st->st_mode))
    return mlo_errf(err, errlen, MLO_EIO,
                    "%s: is %s; outputs are written only to regular files (refusing to replace it)",
                    path, mlo_file_kind(st->st_mode));
  char *real = realpath(path, NULL);
  if (!real) return mlo_errf(err, errlen, MLO_EIO, "%s: cannot resolve: %s", path, strerror(errno));
  *target = mlo_strdup(real);
  free(real);
  if (!*target) return mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", path);
  *exists = true;
  return MLO_OK;
}

/* The inode flags a rename runs into (statx: no open, no read permission
 * needed), 0 where the file system does not say. */
static uint64_t rename_flags(const char *path) {
  struct statx sx;
  if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) != 0) return 0;
  return sx.stx_attributes & sx.stx_attributes_mask & (STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND);
}

/* Whether target can be put in place by a rename: it is not immutable or
 * append-only (chattr +i, +a: even root's rename fails), nor is its folder
 * (an append-only folder takes new files but lets none be renamed or
 * removed), and an existing target is not someone else's in a sticky
 * folder (unless we are root or own the folder).  Checked before any work,
 * so an unwritable output is refused at once instead of after the run it
 * was to hold. */
static int check_replaceable(const char *target, bool exists, const struct stat *st, char *err,
                             size_t errlen) {
  uint64_t f = exists ? rename_flags(target) : 0;
  if (f)
    return mlo_errf(err, errlen, MLO_EIO,
                    "%s: is %s (chattr %s): it cannot be replaced; clear the flag or write "
                    "elsewhere",
                    target, f & STATX_ATTR_IMMUTABLE ? "immutable" : "append-only",
                    f & STATX_ATTR_IMMUTABLE ? "+i" : "+a");
  const char *slash = strrchr(target, '/');
  char dir[PATH_MAX];
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == target)
    snprintf(dir, sizeof dir, "/");
  else
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - target), target);
  if ((f = rename_flags(dir)))
    return mlo_errf(err, errlen, MLO_EIO,
                    "%s: its folder %s is %s (chattr %s): no file in it can be replaced; write "
                    "elsewhere",
                    target, dir, f & STATX_ATTR_IMMUTABLE ? "immutable" : "append-only",
                    f & STATX_ATTR_IMMUTABLE ? "+i" : "+a");
  struct stat dst;
  uid_t me = geteuid();
  if (exists && stat(dir, &dst) == 0 && (dst.st_mode & S_ISVTX) && me != 0 && st->st_uid != me &&
      dst.st_uid != me)
    return mlo_errf(err, errlen, MLO_EIO,
                    "%s: belongs to another user in a sticky folder: it cannot be replaced",
                    target);
  return MLO_OK;
}

/* "dir/.base.XXXXXX" beside target. */
static char *temp_template(const char *target) {
  const char *slash = strrchr(target, '/');
  size_t dlen = slash ? (size_t)(slash - target) + 1 : 0;
  const char *base = slash ? slash + 1 : target;
  size_t n = dlen + strlen(base) + 16;
  char *tmp = mlo_malloc(n);
  if (tmp) snprintf(tmp, n, "%.*s.%s.XXXXXX", (int)dlen, target, base);
  return tmp;
}

int mlo_out_begin(mlo_outfile *o, const char *path, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  o->fd = -1;
  bool exists;
  struct stat st;
  int rc = resolve_target(path, &o->target, &exists, &st, err, errlen);
  if (!rc) rc = check_replaceable(o->target, exists, &st, err, errlen);
  if (rc) goto fail;
  if (!(o->tmp = temp_template(o->target))) {
    rc = mlo_errf(err, errlen, MLO_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  o->fd = mkstemp(o->tmp); /* O_EXCL, mode 0600, unpredictable name */
  if (o->fd >= 0) fcntl(o->fd, F_SETFD, FD_CLOEXEC);
  if (o->fd < 0) {
    int e = errno;
    struct stat dst;
    char *slash = strrchr(o->tmp, '/');
    if (slash) *slash = '\0';
    /* ENOENT for a folder that is there: one that takes no new files (/proc,
     * /sys), which strerror alone would call missing */
    if (e == ENOENT && stat(slash ? o->tmp : ".", &dst) == 0 && S_ISDIR(dst.st_mode))
      rc = mlo_errf(err, errlen, MLO_EIO,
                    "%s: cannot write here: its folder %s takes no new files (a virtual file "
                    "system such as /proc or /sys?); outputs are written beside their target "
                    "and renamed into place",
                    path, slash ? o->tmp : ".");
    else
      rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot write here: %s", path, strerror(e));
    free(o->tmp);
    o->tmp = NULL;
    goto fail;
  }
  if (exists) {
    o->mode = st.st_mode & 07777;
  } else {
    mode_t mask = umask(022); /* read the mask: umask has no getter */
    umask(mask);
    o->mode = 0666 & ~mask;
  }
  return MLO_OK;
fail:
  free(o->target);
  o->target = NULL;
  return rc;
}

void mlo_out_abort(mlo_outfile *o) {
  if (o->fd >= 0) close(o->fd);
  if (o->tmp) unlink(o->tmp);
  free(o->tmp);
  free(o->target);
  memset(o, 0, sizeof *o);
  o->fd = -1;
}

int mlo_out_commit(mlo_outfile *o, char *err, size_t errlen) {
  int rc = MLO_OK;
  if (fchmod(o->fd, o->mode) != 0 || fsync(o->fd) != 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot write: %s", o->target, strerror(errno));
    goto out_abort;
  }
  int fd = o->fd;
  o->fd = -1;
  if (close(fd) != 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot write: %s", o->target, strerror(errno));
    goto out_abort;
  }
  /* What is at the target may have changed since begin: never rename over
   * anything but a regular file. */
  struct stat st;
  if (lstat(o->target, &st) == 0 && !S_ISREG(st.st_mode)) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: became %s while writing; not replacing it", o->target,
                  mlo_file_kind(st.st_mode));
    goto out_abort;
  }
  if (rename(o->tmp, o->target) != 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot rename into place: %s", o->target,
                  strerror(errno));
    goto out_abort;
  }
  free(o->tmp);
  o->tmp = NULL; /* renamed: nothing to remove */
out_abort:
  mlo_out_abort(o);
  return rc;
}

int mlo_out_write_all(const char *path, const void *data, size_t len, char *err, size_t errlen) {
  mlo_outfile o;
  int rc = mlo_out_begin(&o, path, err, errlen);
  if (rc) return rc;
  if (mlo_write_full(o.fd, data, len) != 0) {
    rc = mlo_errf(err, errlen, MLO_EIO, "%s: cannot write: %s", path, strerror(errno));
    mlo_out_abort(&o);
    return rc;
  }
  return mlo_out_commit(&o, err, errlen);
}

int mlo_out_check(const char *path, char *err, size_t errlen) {
  mlo_outfile o;
  int rc = mlo_out_begin(&o, path, err, errlen); /* proves the folder takes a file */
  if (rc == MLO_OK) mlo_out_abort(&o);
  return rc;
}
