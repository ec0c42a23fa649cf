/* Replays seed files through a fuzz harness without libFuzzer: linked with
 * one fuzz_<name>.c, it feeds LLVMFuzzerTestOneInput every regular file of
 * every directory (sorted) or file given on the command line. Each input sits
 * in a heap buffer of exactly its size, so ASan sees a read past its end. A
 * harness that finds a broken invariant traps, which fails the ctest. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || st.st_size > (64 << 20)) {
    fprintf(stderr, "%s: cannot size it (or larger than 64 MiB)\n", path);
    fclose(f);
    return -1;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *data = malloc(size ? size : 1);
  if (!data || fread(data, 1, size, f) != size) {
    fprintf(stderr, "%s: short read\n", path);
    free(data);
    fclose(f);
    return -1;
  }
  fclose(f);
  printf("replay %s (%zu bytes)\n", path, size);
  fflush(stdout);
  LLVMFuzzerTestOneInput(data, size);
  free(data);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int replay_dir(const char *dir, int *count)
{
  struct dirent **ents;
  int n = scandir(dir, &ents, NULL, by_name);
  if (n < 0) {
    perror(dir);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    if (ents[i]->d_name[0] != '.' &&
        snprintf(path, sizeof path, "%s/%s", dir, ents[i]->d_name) < (int)sizeof path &&
        stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      if (replay_file(path) != 0)
        rc = -1;
      else
        (*count)++;
    }
    free(ents[i]);
  }
  free(ents);
  return rc;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  int count = 0, rc = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      rc = 1;
    } else if (S_ISDIR(st.st_mode)) {
      if (replay_dir(argv[i], &count) != 0)
        rc = 1;
    } else if (replay_file(argv[i]) != 0) {
      rc = 1;
    } else {
      count++;
    }
  }
  if (count == 0) {
    fprintf(stderr, "%s: no input replayed\n", argv[0]);
    return 1;
  }
  printf("%d input(s) replayed\n", count);
  return rc;
}
