/* Sharded checkpoint index (NAME.safetensors.index.json): bs_st_index_parse
 * on memory. A success must be self-consistent: every map entry's shard in
 * range, shards distinct, sorted, relative and inside the directory, every
 * metadata value a string; a failure leaves nothing and says why. */
#include "formats/safetensors_sharded.h"
#include "fuzz_common.h"

static bool inside(const char *p)
{
  if (!*p || *p == '/')
    return false;
  for (const char *s = p; *s;) {
    const char *e = strchr(s, '/');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len == 2 && s[0] == '.' && s[1] == '.')
      return false;
    s += len + (e != NULL);
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct bs_st_index ix;
  bs_err err = {0};
  if (bs_st_index_parse(data, size, &ix, &err) != 0) {
    FUZZ_CHECK(err.code != 0 && err.msg[0] != '\0');
    FUZZ_CHECK(ix.nshards == 0 && ix.nmap == 0 && ix.nmeta == 0 && !ix.shards && !ix.map);
    return 0;
  }
  FUZZ_CHECK(err.code == 0);
  FUZZ_CHECK(ix.nshards <= ix.nmap && (ix.nmap == 0) == (ix.nshards == 0));
  for (size_t i = 0; i < ix.nshards; i++) {
    FUZZ_CHECK(inside(ix.shards[i]));
    FUZZ_CHECK(i == 0 || strcmp(ix.shards[i - 1], ix.shards[i]) < 0);
  }
  for (size_t i = 0; i < ix.nmap; i++)
    FUZZ_CHECK(ix.map[i].key && ix.map[i].shard < ix.nshards);
  for (size_t i = 0; i < ix.nmeta; i++)
    FUZZ_CHECK(ix.meta[i].key && ix.meta[i].value);
  (void)bs_st_index_sniff(data, size < BS_SNIFF_HEAD ? size : BS_SNIFF_HEAD, size);
  bs_st_index_destroy(&ix);
  return 0;
}
