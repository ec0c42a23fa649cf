/* libburnstore's second example: read one tensor of a checkpoint, here a
 * GGUF on an HTTP server, as F32, whatever it is stored as (F16, BF16,
 * ggml's Q4_0, Q8_0, K-quants...: decoded as burnstore cat --as F32 does,
 * by range requests, without downloading the file).
 *     cc read_f32.c $(pkg-config --cflags --libs burnstore) -o read_f32
 *     ./read_f32 https://host/model.gguf blk.0.attn_q.weight
 *     ./read_f32 https://host/model.gguf blk.0.attn_q.weight out.f32
 * prints the tensor's stored dtype, shape, the first values and their sum;
 * with OUT, writes every value to it (little-endian float32).
 * The tests run it against a GGUF served by nginx
 * (tests/package/check_examples.py). */
#include <burnstore.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s CHECKPOINT TENSOR [OUT]\n", argv[0]);
    return 2;
  }
  if (burnstore_init(0) != 0) {
    fprintf(stderr, "%s\n", burnstore_errmsg());
    return 1;
  }
  int rc = 1;
  FILE *out = NULL;
  float *v = NULL;
  /* as=F32: every floating tensor is presented as F32, decoded as it is
   * read (a URL's options may add http_timeout=, http_cache=). */
  burnstore_checkpoint *ck = burnstore_open(argv[1], "as=F32");
  const burnstore_tensor *t = ck ? burnstore_find(ck, argv[2]) : NULL;
  if (!t) {
    fprintf(stderr, "%s\n", burnstore_errmsg());
    goto done;
  }
  if (burnstore_tensor_dtype(t) != BURNSTORE_DT_F32) { /* an integer tensor stays as it is */
    fprintf(stderr, "%s: %s is %s, not a floating tensor\n", argv[1], argv[2],
            burnstore_dtype_name(burnstore_tensor_dtype(t)));
    goto done;
  }
  uint64_t nbytes = burnstore_tensor_nbytes(t), n = nbytes / sizeof(float);
  if (nbytes > SIZE_MAX || !(v = malloc(nbytes ? (size_t)nbytes : 1))) {
    fprintf(stderr, "%s: %s: %" PRIu64 " bytes: out of memory\n", argv[1], argv[2], nbytes);
    goto done;
  }
  size_t got;
  if (burnstore_tensor_read(t, 0, v, (size_t)nbytes, &got) != 0) {
    fprintf(stderr, "%s\n", burnstore_errmsg()); /* a server's failure, a changed file */
    goto done;
  }
  printf("%s: %s as F32, shape [", argv[2], burnstore_dtype_name(burnstore_tensor_stored_dtype(t)));
  for (unsigned d = 0; d < burnstore_tensor_rank(t); d++)
    printf("%s%" PRIu64, d ? "," : "", burnstore_tensor_shape(t)[d]);
  printf("], %" PRIu64 " values:", n);
  double sum = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (i < 4)
      printf(" %.9g", (double)v[i]);
    sum += v[i];
  }
  printf("%s sum %.17g\n", n > 4 ? " ..." : "", sum);
  if (argc == 4) {
    if (!(out = fopen(argv[3], "wb")) || fwrite(v, 1, (size_t)nbytes, out) != nbytes) {
      perror(argv[3]);
      goto done;
    }
  }
  rc = 0;
done:
  if (out && fclose(out) != 0 && rc == 0) {
    perror(argv[3]);
    rc = 1;
  }
  free(v);
  burnstore_close(ck);
  burnstore_shutdown();
  return rc;
}
