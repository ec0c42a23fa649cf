/* Sharded SafeTensors checkpoints: NAME.safetensors.index.json, as Hugging
 * Face tools write it, beside its shards:
 *   {"metadata": {"total_size": 123, ...}, "weight_map": {"<key>": "<shard file>", ...}}
 * Mounted as one model: the union of the shards the weight_map names, each
 * tensor read in place from its shard (one bs_src per shard in the catalog). */
#ifndef BURNSTORE_ST_INDEX_H
#define BURNSTORE_ST_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "formats/formats.h"

/* The names of a set: its index NAME.safetensors.index.json, its shards
 * (members, core/set_journal.h) NAME-0000K-of-0000N.safetensors. */
#define BS_ST_INDEX_SUFFIX ".safetensors.index.json"
#define BS_ST_SHARD_SUFFIX ".safetensors"

struct bs_st_index_entry {
  char *key;      /* owned */
  uint32_t shard; /* index into shards */
};

/* A parsed index. Strings are owned. */
struct bs_st_index {
  char **shards; /* distinct shard paths, relative to the index's directory, sorted byte-wise */
  size_t nshards;
  struct bs_st_index_entry *map; /* the weight_map, in file order */
  size_t nmap;
  struct bs_kv *meta; /* "metadata": strings as they are, other values as compact JSON */
  size_t nmeta;
};

/* Parse and validate an index held in memory: a JSON object (duplicate keys
 * refused) with an object "weight_map" of strings and an optional object
 * "metadata"; every shard path relative, with no ".." segment (it may not
 * leave the index's directory), at most BS_ST_MAX_SHARDS of them. On
 * failure ix is empty. */
BS_NODISCARD int bs_st_index_parse(const uint8_t *buf, size_t n, struct bs_st_index *ix,
                                   bs_err *err);
void bs_st_index_destroy(struct bs_st_index *ix); /* safe on a zeroed or destroyed index */

/* The registry row (formats.h): YES for '{' (after whitespace) and a
 * "weight_map" key within the first 512 bytes, else NO. */
enum bs_sniff bs_st_index_sniff(const uint8_t *head, size_t n, uint64_t size);
/* "shards": how many shard files the index names. */
void bs_st_index_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx);
/* Read cat->srcs[src] (a file: its name is its path) as an index, then
 * every shard's header with the SafeTensors reader. Errors: a shard missing
 * or unreadable, a tensor the map names but its shard lacks (or holds in
 * another shard), a tensor in two shards. A shard tensor the map does not
 * name is mounted, with a note. The shards' own __metadata__ is not kept;
 * the index's metadata is the catalog's. */
BS_NODISCARD int bs_st_index_read(struct bs_catalog *cat, uint32_t src,
                                  const struct bs_open_opts *opts, bs_err *err);

/* The one *.safetensors.index.json in directory `dir`: *path gets
 * "dir/NAME" (bs_malloc'd). Fails when there is none or more than one. */
BS_NODISCARD int bs_st_index_find(const char *dir, char **path, bs_err *err);

/* The writers table's set_name: NAME.safetensors for a base name that is
 * NAME.safetensors.index.json or NAME-<digits>-of-<digits>.safetensors
 * (ASCII case ignored in the suffixes). */
bool bs_st_set_name(const char *base, char *out, size_t n);

/* The shard a tensor of a sharded catalog is read from, relative to the
 * index's directory (borrowed from the catalog), or NULL when cat is not a
 * sharded checkpoint. */
const char *bs_st_index_shard_of(const struct bs_catalog *cat, const struct bs_tensor *t);

#endif
