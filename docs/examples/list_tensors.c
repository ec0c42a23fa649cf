/* libburnstore's example: list a checkpoint's tensors (as `burnstore ls`
 * does) and print the first values of one. Any format burnstore reads.
 *     cc list_tensors.c $(pkg-config --cflags --libs burnstore) -o list_tensors
 *     ./list_tensors model.bpk              # KEY DTYPE SHAPE BYTES, one a line
 *     ./list_tensors model.bpk fc3.bias     # its first 8 values
 * tests/package/check_library.sh compiles and runs it against an installed
 * library. */
#include <burnstore/formats.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The first 8 values of an F32 tensor, or the first 32 bytes in hex. */
static int print_values(const struct bs_catalog *cat, const struct bs_tensor *t)
{
  unsigned char buf[32];
  /* Bytes [0, n) of the tensor's row-major data, read from the file
   * (strided PyTorch views are gathered); -errno on failure. */
  long n = bs_tensor_read(cat, t, 0, buf, sizeof buf);
  if (n < 0) {
    fprintf(stderr, "%s: cannot read (%s)\n", t->key, strerror((int)-n));
    return 1;
  }
  printf("%s:", t->key);
  for (long i = 0; i < n; i += t->dtype == BS_DT_F32 ? 4 : 1) {
    float f;
    if (t->dtype != BS_DT_F32) {
      printf(" %02x", buf[i]);
    } else if (i + 4 <= n) {
      memcpy(&f, buf + i, sizeof f); /* a little-endian host */
      printf(" %g", (double)f);
    }
  }
  printf("\n");
  return 0;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: %s CHECKPOINT [TENSOR]\n", argv[0]);
    return 2;
  }
  bs_err err = {0};
  struct bs_src src;
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  /* bs_open_any takes the source (also on failure): only the catalog is
   * destroyed. */
  if (bs_src_open(&src, argv[1], &err) != 0 || bs_open_any(&cat, &src, NULL, &err) != 0) {
    char line[512];
    fprintf(stderr, "%s\n", bs_err_format(&err, argv[1], line, sizeof line));
    bs_catalog_destroy(&cat);
    return 1;
  }
  int rc = 0;
  if (argc == 2) {
    for (size_t i = 0; i < cat.count; i++) {
      const struct bs_tensor *t = &cat.tensors[i];
      char shape[512];
      bs_shape_format(shape, sizeof shape, t->rank, t->shape);
      printf("%s\t%s\t%s\t%" PRIu64 "\n", t->key, bs_dtype_name(t->dtype), shape, t->nbytes);
    }
  } else {
    long i = bs_catalog_find(&cat, argv[2]);
    if (i < 0) {
      fprintf(stderr, "%s: no tensor '%s'\n", argv[1], argv[2]);
      rc = 1;
    } else {
      rc = print_values(&cat, &cat.tensors[i]);
    }
  }
  bs_catalog_destroy(&cat);
  return rc;
}
