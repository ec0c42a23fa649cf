/* Sharded checkpoints: the index parser on memory, the sniff, and the reader
 * on shard files in a temp directory (union, in-place reads, errors). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "formats/formats.h"
#include "formats/safetensors_sharded.h"
#include "st_fixture.h"

static int parse(const char *s, struct bs_st_index *ix, bs_err *err)
{
  bs_err_clear(err);
  return bs_st_index_parse((const uint8_t *)s, strlen(s), ix, err);
}

static void parse_fails(const char *s, int code, const char *words)
{
  struct bs_st_index ix;
  bs_err err;
  cr_assert_eq(parse(s, &ix, &err), -1, "%s", s);
  cr_assert_eq(err.code, code, "%s: %s", s, err.msg);
  cr_assert(strstr(err.msg, words), "%s: '%s' in '%s'", s, words, err.msg);
  cr_assert_eq(ix.nmap, 0);
  cr_assert_null(ix.shards);
}

Test(st_index, parses_the_hugging_face_layout)
{
  const char *s = "{\n  \"metadata\": {\n    \"total_size\": 344,\n    \"note\": \"x\"\n  },\n"
                  "  \"weight_map\": {\n"
                  "    \"lm_head.weight\": \"model-00002-of-00002.safetensors\",\n"
                  "    \"model.embed.weight\": \"model-00001-of-00002.safetensors\",\n"
                  "    \"model.norm.weight\": \"model-00002-of-00002.safetensors\"\n  }\n}\n";
  struct bs_st_index ix;
  bs_err err;
  cr_assert_eq(parse(s, &ix, &err), 0, "%s", err.msg);
  cr_assert_eq(ix.nshards, 2);
  cr_assert_str_eq(ix.shards[0], "model-00001-of-00002.safetensors");
  cr_assert_str_eq(ix.shards[1], "model-00002-of-00002.safetensors");
  cr_assert_eq(ix.nmap, 3);
  cr_assert_str_eq(ix.map[0].key, "lm_head.weight");
  cr_assert_eq(ix.map[0].shard, 1);
  cr_assert_eq(ix.map[1].shard, 0);
  cr_assert_eq(ix.nmeta, 2);
  cr_assert_str_eq(ix.meta[0].key, "total_size");
  cr_assert_str_eq(ix.meta[0].value, "344", "numbers become their JSON text");
  cr_assert_str_eq(ix.meta[1].value, "x");
  bs_st_index_destroy(&ix);
  bs_st_index_destroy(&ix);
}

Test(st_index, refuses_what_is_not_an_index_or_leaves_the_directory)
{
  parse_fails("[1]", EINVAL, "not a JSON object");
  parse_fails("{\"weight_map\":{\"a\":\"x\"}", EINVAL, "not valid JSON");
  parse_fails("{\"metadata\":{}}", EINVAL, "no \"weight_map\"");
  parse_fails("{\"weight_map\":[\"a\"]}", EINVAL, "not an object");
  parse_fails("{\"weight_map\":{},\"metadata\":[1]}", EINVAL, "\"metadata\" is not an object");
  parse_fails("{\"weight_map\":{\"a\":1}}", EINVAL, "not a shard file name");
  parse_fails("{\"weight_map\":{\"a\":\"s\",\"a\":\"t\"}}", EINVAL, "duplicate");
  parse_fails("{\"weight_map\":{\"a\":\"\"}}", EINVAL, "empty shard path");
  parse_fails("{\"weight_map\":{\"a\":\"/etc/passwd\"}}", EACCES, "absolute");
  parse_fails("{\"weight_map\":{\"a\":\"../m.safetensors\"}}", EACCES, "leaves the index's");
  parse_fails("{\"weight_map\":{\"a\":\"d/../../m\"}}", EACCES, "leaves");
  parse_fails("{\"weight_map\":{\"a\":\"d/..\"}}", EACCES, "leaves");
  struct bs_st_index ix;
  bs_err err;
  cr_assert_eq(parse("{\"weight_map\":{\"a\":\"sub/x..y/..z.safetensors\"}}", &ix, &err), 0,
               "'..' only as a whole segment: %s", err.msg);
  bs_st_index_destroy(&ix);
  cr_assert_eq(parse("{\"weight_map\":{},\"metadata\":null}", &ix, &err), 0, "%s", err.msg);
  cr_assert_eq(ix.nmap, 0);
  bs_st_index_destroy(&ix);
}

Test(st_index, out_of_memory_anywhere_fails_cleanly)
{
  const char *s = "{\"metadata\":{\"total_size\":3,\"x\":{\"a\":[1]}},\"weight_map\":{\"a\":"
                  "\"s1\",\"b\":\"s2\",\"c\":\"s1\"}}";
  bool ok = false;
  for (long n = 0; n < 400 && !ok; n++) {
    struct bs_st_index ix;
    bs_err err;
    bs_alloc_fail_after(n);
    int rc = parse(s, &ix, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0) {
      ok = true;
      cr_assert_eq(ix.nshards, 2);
    } else {
      cr_assert_eq(err.code, ENOMEM, "n=%ld: %s", n, err.msg);
    }
    bs_st_index_destroy(&ix);
  }
  cr_assert(ok);
}

Test(st_index, sniff)
{
  const char *yes = "  {\"metadata\":{\"total_size\":1},\"weight_map\":{}}";
  cr_assert_eq(bs_st_index_sniff((const uint8_t *)yes, strlen(yes), strlen(yes)), BS_SNIFF_YES);
  const char *no = "{\"metadata\":{\"float\":\"f32\"},\"item\":{}}";
  cr_assert_eq(bs_st_index_sniff((const uint8_t *)no, strlen(no), strlen(no)), BS_SNIFF_NO);
  const char *arr = "[\"weight_map\"]";
  cr_assert_eq(bs_st_index_sniff((const uint8_t *)arr, strlen(arr), strlen(arr)), BS_SNIFF_NO);
}

/* ---- The reader, on files ------------------------------------------------------------------ */

static void put_file(const char *dir, const char *name, const void *d, size_t n)
{
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f, "%s", p);
  cr_assert_eq(fwrite(d, 1, n, f), n);
  fclose(f);
}

static void put_st(const char *dir, const char *name, const char *header, size_t dlen)
{
  size_t len;
  uint8_t *b = st_build(header, dlen, &len);
  put_file(dir, name, b, len);
  bs_free(b);
}

static int open_index(const char *dir, const char *index, struct bs_catalog *cat, bs_err *err)
{
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, index);
  struct bs_src s;
  bs_catalog_init(cat);
  bs_err_clear(err);
  if (bs_src_open(&s, p, err) != 0)
    return -1;
  return bs_open_any(cat, &s, NULL, err);
}

#define S1                                                                                         \
  "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[" \
  "0,4]}}"
#define S2                                                                                         \
  "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"c\":{\"dtype\":\"U8\","       \
  "\"shape\":[2],\"data_offsets\":[8,10]}}"

Test(st_index, reads_the_union_in_place_from_each_shard)
{
  char *dir = bs_test_tmpdir("stidx");
  put_st(dir, "m-1.safetensors", S1, 4);
  put_st(dir, "m-2.safetensors", S2, 10);
  const char *idx = "{\"metadata\":{\"total_size\":14},\"weight_map\":{\"a\":\"m-1.safetensors\","
                    "\"b\":\"m-2.safetensors\",\"c\":\"m-2.safetensors\"}}";
  put_file(dir, "m.safetensors.index.json", idx, strlen(idx));
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_index(dir, "m.safetensors.index.json", &cat, &err), 0, "%s", err.msg);
  cr_assert_eq(cat.format, BS_FMT_ST_SHARDED);
  cr_assert_eq(cat.count, 3);
  cr_assert_eq(cat.nsrcs, 3, "the index and one source per shard");
  cr_assert_eq(cat.nmeta, 1, "the index's metadata only");
  cr_assert_str_eq(cat.meta[0].key, "total_size");
  cr_assert_str_eq(cat.meta[0].value, "14");
  long c = bs_catalog_find(&cat, "c");
  cr_assert_geq(c, 0);
  const struct bs_tensor *t = &cat.tensors[c];
  cr_assert_str_eq(bs_st_index_shard_of(&cat, t), "m-2.safetensors");
  cr_assert_str_eq(bs_st_index_shard_of(&cat, &cat.tensors[bs_catalog_find(&cat, "a")]),
                   "m-1.safetensors");
  uint8_t got[2];
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 2), 2);
  cr_assert_eq(got[0], st_data_byte(8));
  cr_assert_eq(got[1], st_data_byte(9));
  int fd;
  uint64_t off;
  cr_assert(bs_tensor_fd_range(&cat, t, &fd, &off), "served from the shard's fd");
  bs_catalog_destroy(&cat);

  char *found;
  cr_assert_eq(bs_st_index_find(dir, &found, &err), 0, "%s", err.msg);
  cr_assert(strstr(found, "/m.safetensors.index.json"));
  bs_free(found);
  put_file(dir, "n.safetensors.index.json", idx, strlen(idx));
  bs_err_clear(&err);
  cr_assert_eq(bs_st_index_find(dir, &found, &err), -1);
  cr_assert(strstr(err.msg, "more than one"), "%s", err.msg);
  bs_test_rmrf(dir);
  free(dir);
}

static void reader_fails(const char *idx, const char *key, const char *words)
{
  char *dir = bs_test_tmpdir("stidxbad");
  put_st(dir, "m-1.safetensors", S1, 4);
  put_st(dir, "m-2.safetensors", S2, 10);
  put_file(dir, "m.safetensors.index.json", idx, strlen(idx));
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_index(dir, "m.safetensors.index.json", &cat, &err), -1, "%s", idx);
  cr_assert(strstr(err.msg, words), "'%s' in '%s'", words, err.msg);
  if (key)
    cr_assert_str_eq(err.key, key);
  cr_assert_eq(cat.count, 0);
  bs_catalog_destroy(&cat);
  bs_test_rmrf(dir);
  free(dir);
}

Test(st_index, errors_name_the_shard_and_the_tensor)
{
  reader_fails("{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-3.safetensors\"}}", NULL,
               "shard m-3.safetensors: cannot open it");
  reader_fails("{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\",\"z\":\"m-2."
               "safetensors\"}}",
               "z", "puts it in shard m-2.safetensors, which does not hold it");
  reader_fails("{\"weight_map\":{\"a\":\"m-2.safetensors\",\"b\":\"m-1.safetensors\"}}", "a",
               "but it is in m-1.safetensors");
  reader_fails("{\"weight_map\":{\"a\":\"m.safetensors.index.json\"}}", NULL,
               "shard m.safetensors.index.json:");
}

Test(st_index, a_tensor_in_two_shards_is_refused_and_unmapped_ones_noted)
{
  char *dir = bs_test_tmpdir("stidx2");
  put_st(dir, "m-1.safetensors", S1, 4);
  put_st(dir, "m-2.safetensors", S1, 4);
  const char *idx = "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\"}}";
  put_file(dir, "m.safetensors.index.json", idx, strlen(idx));
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_index(dir, "m.safetensors.index.json", &cat, &err), -1);
  cr_assert_str_eq(err.key, "a");
  cr_assert(strstr(err.msg, "two shards, m-1.safetensors and m-2.safetensors"), "%s", err.msg);
  bs_catalog_destroy(&cat);

  put_st(dir, "m-2.safetensors", S2, 10);
  idx = "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\"}}";
  put_file(dir, "m.safetensors.index.json", idx, strlen(idx));
  cr_assert_eq(open_index(dir, "m.safetensors.index.json", &cat, &err), 0, "%s", err.msg);
  cr_assert_eq(cat.count, 3);
  cr_assert(cat.notes && strstr(cat.notes, "tensor 'c' of shard m-2.safetensors is not in the "
                                           "weight_map"),
            "%s", cat.notes);
  bs_catalog_destroy(&cat);
  bs_test_rmrf(dir);
  free(dir);
}

/* Every allocation that fails leaves the catalog as it was: the shards it
 * opened and the note of the unmapped tensor go too (they were left). */
Test(st_index, a_failing_read_at_any_allocation_leaves_the_catalog_as_it_was)
{
  char *dir = bs_test_tmpdir("stidx");
  put_st(dir, "m-1.safetensors", S1, 4);
  put_st(dir, "m-2.safetensors", S2, 10);
  const char *idx = "{\"metadata\":{\"total_size\":14},\"weight_map\":{\"a\":\"m-1.safetensors\","
                    "\"b\":\"m-2.safetensors\"}}";
  put_file(dir, "m.safetensors.index.json", idx, strlen(idx));
  char p[4200];
  snprintf(p, sizeof p, "%s/m.safetensors.index.json", dir);
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  struct bs_src s;
  bs_err err;
  bs_err_clear(&err);
  uint32_t i;
  cr_assert_eq(bs_src_open(&s, p, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &i, &err), 0);
  cr_assert_gt(bs_test_rollback_sweep(&cat, i, bs_st_index_read), 0);
  cr_assert_eq(cat.nsrcs, 3);
  cr_assert(strstr(cat.notes, "tensor 'c' of shard m-2.safetensors is not in the weight_map"), "%s",
            cat.notes);
  bs_catalog_destroy(&cat);
  bs_test_rmrf(dir);
  free(dir);
}
