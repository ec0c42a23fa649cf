/* libburnstore's first example: list a checkpoint's tensors as `burnstore ls`
 * does, and print the first values of one. Any format burnstore reads, a
 * file, a directory (a shard set) or a URL.
 *     cc list_tensors.c $(pkg-config --cflags --libs burnstore) -o list_tensors
 *     ./list_tensors model.bpk              # KEY DTYPE SHAPE BYTES, one a line
 *     ./list_tensors model.bpk fc3.bias     # its first 8 values
 * The tests compile and run it against the installed library and the
 * build's (tests/package/check_examples.py). */
#include <burnstore.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* "[64,1,3,3]", as burnstore ls prints a shape. */
static void print_shape(const burnstore_tensor *t)
{
  const uint64_t *dims = burnstore_tensor_shape(t);
  printf("[");
  for (unsigned d = 0; d < burnstore_tensor_rank(t); d++)
    printf("%s%" PRIu64, d ? "," : "", dims[d]);
  printf("]");
}

/* The first 8 values of an F32 tensor, or its first 32 bytes in hex. */
static int print_values(const burnstore_tensor *t)
{
  unsigned char buf[32];
  size_t n;
  if (burnstore_tensor_read(t, 0, buf, sizeof buf, &n) != 0) {
    fprintf(stderr, "%s\n", burnstore_errmsg());
    return 1;
  }
  bool f32 = burnstore_tensor_dtype(t) == BURNSTORE_DT_F32;
  printf("%s:", burnstore_tensor_key(t));
  for (size_t i = 0; i + (f32 ? 4 : 1) <= n; i += f32 ? 4 : 1) {
    float f;
    if (f32) {
      memcpy(&f, buf + i, sizeof f); /* little-endian data, a little-endian host */
      printf(" %g", (double)f);
    } else {
      printf(" %02x", buf[i]);
    }
  }
  printf("\n");
  return 0;
}

int main(int argc, char **argv)
{
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s CHECKPOINT [TENSOR]\n", argv[0]);
    return 2;
  }
  if (burnstore_init(0) != 0) {
    fprintf(stderr, "%s\n", burnstore_errmsg());
    return 1;
  }
  int rc = 1;
  burnstore_checkpoint *ck = burnstore_open(argv[1], NULL); /* options: none */
  if (!ck) {
    fprintf(stderr, "%s\n", burnstore_errmsg()); /* "FILE: offset 0x..: what" */
  } else if (argc == 2) {
    for (size_t i = 0; i < burnstore_count(ck); i++) {
      const burnstore_tensor *t = burnstore_tensor_at(ck, i);
      const char *why = burnstore_tensor_unreadable(t);
      printf("%s\t%s\t", burnstore_tensor_key(t), burnstore_dtype_name(burnstore_tensor_dtype(t)));
      print_shape(t);
      printf("\t%" PRIu64 "%s%s\n", burnstore_tensor_nbytes(t), why ? "\tunsupported: " : "",
             why ? why : "");
    }
    rc = 0;
  } else {
    const burnstore_tensor *t = burnstore_find(ck, argv[2]);
    if (!t)
      fprintf(stderr, "%s\n", burnstore_errmsg());
    else
      rc = print_values(t);
  }
  burnstore_close(ck);
  burnstore_shutdown();
  return rc;
}
