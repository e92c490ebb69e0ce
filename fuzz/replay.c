/*
 * replay.c — runs the fuzz target over every file of the given directories
 * with the normal compiler, so the checked-in corpus (valid seeds and the
 * hostile files) is exercised by the default test suite even where
 * libFuzzer is not built.  Under -DMLO_SANITIZE=ON it is an ASan/UBSan run.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return 0; /* not a file: nothing to replay */
  }
  size_t n = (size_t)st.st_size;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf || fread(buf, 1, n, f) != n) {
    free(buf);
    fclose(f);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 1;
}

int main(int argc, char **argv) {
  size_t files = 0;
  for (int i = 1; i < argc; i++) {
    DIR *d = opendir(argv[i]);
    if (!d) {
      fprintf(stderr, "replay: cannot open directory %s\n", argv[i]);
      return 1;
    }
    char path[4096];
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      int rc = replay_file(path);
      if (rc < 0) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        closedir(d);
        return 1;
      }
      files += (size_t)rc;
    }
    closedir(d);
  }
  printf("replay: %zu inputs, no crash\n", files);
  return files > 0 ? 0 : 1; /* an empty corpus would prove nothing */
}
