/* libburnstore's third example: convert a checkpoint, as `burnstore convert`
 * does: every tensor and the metadata of IN written to OUT in the format
 * OUT's extension names (.bpk, .safetensors, .safetensors.index.json, .gguf,
 * .pth), streamed (memory does not grow with the checkpoint), atomically.
 *     cc convert.c $(pkg-config --cflags --libs burnstore) -o convert
 *     ./convert model.pth model.safetensors
 *     ./convert -o as=BF16 model.safetensors model-bf16.safetensors
 *     ./convert -w max_shard_size=2GB model.gguf out/model.safetensors
 * -o: IN's options (key options, as=...), -w: OUT's (max_shard_size=).
 * The tests run it and compare IN and OUT with burnstore diff
 * (tests/package/check_examples.py). */
#include <burnstore.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
  const char *in_opts = NULL, *out_opts = NULL;
  int a = 1;
  for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
    if (strcmp(argv[a], "-o") == 0)
      in_opts = argv[a + 1];
    else if (strcmp(argv[a], "-w") == 0)
      out_opts = argv[a + 1];
    else
      break;
  }
  if (argc - a != 2) {
    fprintf(stderr, "usage: %s [-o IN_OPTIONS] [-w OUT_OPTIONS] IN OUT\n", argv[0]);
    return 2;
  }
  const char *in = argv[a], *out = argv[a + 1];
  if (burnstore_init(0) != 0) {
    fprintf(stderr, "%s\n", burnstore_errmsg());
    return 1;
  }
  int rc = 1;
  burnstore_checkpoint *ck = burnstore_open(in, in_opts);
  /* The writer is chosen by OUT's name; nothing is written before save. */
  burnstore_writer *w = ck ? burnstore_writer_new(out, out_opts) : NULL;
  if (!w || burnstore_writer_add_checkpoint(w, ck) != 0 || burnstore_writer_save(w) != 0)
    fprintf(stderr, "%s\n", burnstore_errmsg()); /* OUT is untouched */
  else {
    printf("%s: %zu tensors written as %s\n", out, burnstore_count(ck), burnstore_writer_format(w));
    rc = 0;
  }
  burnstore_writer_free(w);
  burnstore_close(ck);
  burnstore_shutdown();
  return rc;
}
