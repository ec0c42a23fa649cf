/* bs-ls: the core used without FUSE. Lists the tensors of a checkpoint
 * (key, dtype, shape, bytes) or writes one tensor's bytes to stdout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "burnstore/alloc.h"
#include "burnstore/checked.h"
#include "burnstore/formats.h"
#include "burnstore/version.h"

static void usage(FILE *f)
{
  fprintf(f, "usage: bs-ls [-m] FILE          list tensors: key dtype shape bytes\n"
             "       bs-ls -x KEY FILE       write the tensor's bytes to stdout\n"
             "  -m  also print metadata, non-tensor values and reader notes\n");
}

static int dump(const struct bs_catalog *cat, const char *key)
{
  long i = bs_catalog_find(cat, key);
  if (i < 0) {
    fprintf(stderr, "bs-ls: no tensor '%s'\n", key);
    return 1;
  }
  const struct bs_tensor *t = &cat->tensors[i];
  static char buf[1 << 20];
  for (uint64_t off = 0; off < t->nbytes;) {
    long r = bs_tensor_read(cat, t, off, buf, sizeof buf);
    if (r <= 0) {
      fprintf(stderr, "bs-ls: %s: read failed: %s\n", key, strerror(r ? (int)-r : EIO));
      return 1;
    }
    if (fwrite(buf, 1, (size_t)r, stdout) != (size_t)r)
      return 1;
    off += (uint64_t)r;
  }
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
  const char *extract = NULL;
  int meta = 0, opt;
  while ((opt = getopt(argc, argv, "x:mhV")) != -1) {
    switch (opt) {
    case 'x': extract = optarg; break;
    case 'm': meta = 1; break;
    case 'V': printf("bs-ls %s\n", BURNSTORE_VERSION); return 0;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind + 1 != argc) {
    usage(stderr);
    return 2;
  }
  const char *path = argv[optind];
  bs_err err;
  bs_err_clear(&err);
  struct bs_src src;
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  if (bs_src_open(&src, path, &err) != 0 || bs_open_any(&cat, &src, NULL, &err) != 0) {
    char line[600];
    fprintf(stderr, "bs-ls: %s\n", bs_err_format(&err, path, line, sizeof line));
    return 1;
  }
  int rc = 0;
  if (extract) {
    rc = dump(&cat, extract);
  } else {
    for (size_t i = 0; i < cat.count; i++) {
      const struct bs_tensor *t = &cat.tensors[i];
      char shape[BS_MAX_RANK * 21 + 3];
      bs_shape_format(shape, sizeof shape, t->rank, t->shape);
      printf("%s\t%s\t%s\t%llu%s%s\n", t->key, bs_dtype_name(t->dtype), shape,
             (unsigned long long)t->nbytes, t->unsupported ? "\tunsupported: " : "",
             t->unsupported ? t->unsupported : "");
    }
    if (meta) {
      printf("# format %s\n", bs_format_name(cat.format));
      for (size_t i = 0; i < cat.nmeta; i++)
        printf("# meta %s=%s\n", cat.meta[i].key, cat.meta[i].value);
      if (cat.values_json)
        printf("# values %s\n", cat.values_json);
      if (cat.notes)
        printf("# notes\n%s", cat.notes);
    }
  }
  bs_catalog_destroy(&cat);
  return rc;
}
