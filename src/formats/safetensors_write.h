/* The SafeTensors writer: one serializer into a bs_sink, writing what the
 * reference writer (the `safetensors` crate, also behind safetensors.torch)
 * writes, so that a file it made comes back byte for byte:
 *  - tensors in data order sorted by dtype alignment, largest first (the
 *    crate's Dtype enum order, descending), ties by name (byte-wise), packed
 *    back to back with no gaps;
 *  - the header: compact JSON, "__metadata__" first (left out when the
 *    catalog has no metadata; its keys sorted byte-wise: the crate's order is
 *    a HashMap's, i.e. none), then the tensors in data order, each as
 *    {"dtype":..,"shape":[..],"data_offsets":[B,E]}, strings escaped as
 *    serde_json escapes them; padded with spaces to a multiple of 8.
 * Its row in the writers table (writers.h) is "safetensors", ".safetensors". */
#ifndef BURNSTORE_ST_WRITE_H
#define BURNSTORE_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include <stdbool.h>

#include "core/catalog.h"
#include "core/layout.h"
#include "core/sink.h"
#include "formats/limits.h"
#include "formats/write_common.h"

/* Can SafeTensors store this tensor (one of its 22 dtypes, a readable
 * source, not named __metadata__)? 0, or -1 with err naming the tensor and
 * why (with a hint where a same-bytes dtype exists: Flex32 -> F32). */
BS_NODISCARD int bs_st_can_write(const struct bs_tensor *t, bs_err *err);
/* SafeTensors names are JSON strings: UTF-8, at most BS_MAX_KEY_LEN bytes
 * (what our reader takes), never __metadata__. */
BS_NODISCARD int bs_st_name_ok(const char *name, bs_err *err);

/* Serialize the tensors `which` (catalog indices, any order; NULL: every
 * tensor that is not hidden) with cat->meta into k. */
BS_NODISCARD int bs_st_write_some(const struct bs_catalog *cat, const size_t *which, size_t n,
                                  struct bs_sink *k, bs_err *err);
BS_NODISCARD int bs_st_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);
/* The file bs_st_write_some writes, as a plan (core/layout.h) appended to
 * l: what the write emits and a -o view=safetensors mount serves. */
BS_NODISCARD int bs_st_layout(const struct bs_catalog *cat, const size_t *which, size_t n,
                              struct bs_layout *l, bs_err *err);
/* The bytes bs_st_write_some would write (header included), without writing. */
BS_NODISCARD int bs_st_size(const struct bs_catalog *cat, const size_t *which, size_t n,
                            uint64_t *size, bs_err *err);

/* Metadata a SafeTensors file gets: Burnpack's own marker format=burnpack
 * (which bs_bpk_default_meta adds) becomes format=pt, the value transformers
 * requires of a file with metadata. Nothing else is added or changed. */
BS_NODISCARD int bs_st_default_meta(struct bs_catalog *cat, bs_err *err);

/* A SafeTensors JSON string, escaped as serde_json does (", \, \b \f \n \r
 * \t, other controls as \u00xx, nothing else), quotes included, appended to
 * b. -1 on out of memory. Shared with the shard index writer. */
BS_NODISCARD int bs_st_json_string(struct bs_buf *b, const char *s);
/* The same for n bytes that may hold NUL (as \u0000): GGUF strings. */
BS_NODISCARD int bs_st_json_string_n(struct bs_buf *b, const char *s, size_t n);
/* The bytes bs_st_json_string_n appends for s[0..n), quotes included. */
size_t bs_st_json_len_n(const char *s, size_t n);

/* Would bs_st_write_some write exactly the file at `path`: the same header
 * bytes, and every tensor's bytes already in that file at the place they
 * would be written (read from it, unstrided)? *same gets the answer; a
 * missing or unreadable file, or one of another user's (not the caller's or
 * root's), is "no". -1 only for errors of the plan. */
BS_NODISCARD int bs_st_file_unchanged(const struct bs_catalog *cat, const size_t *which, size_t n,
                                      const char *path, bool *same, bs_err *err);

/* ---- Sharded output (safetensors_sharded_write.c) -------------------------------------
 *
 * NAME-00001-of-0000N.safetensors + NAME.safetensors.index.json beside `path`
 * (which ends in .safetensors.index.json or .safetensors; NAME is what comes
 * before). With o->max_shard_size, the tensors are split in catalog order into
 * shards of at most that many bytes (a bigger tensor gets a shard of its own),
 * as transformers' save_pretrained does. Without it, the shards the existing
 * index names are kept: each tensor goes back to its shard, new tensors to
 * the last one, and only the shards whose bytes would change are written.
 * The index is written as transformers writes it (indent 2, sorted keys,
 * ASCII): {"metadata": {..., "total_size": BYTES}, "weight_map": {...}}; each
 * shard's __metadata__ is the catalog's metadata without total_size, with
 * format=pt unless it has a format. The set commits through its journal
 * (core/set_journal.h): an interrupted earlier write is recovered first;
 * every changed file is written to a temp file and fsynced, then the commit
 * record, the shards' renames, the index's; shards of the old index that the
 * new one no longer names are removed after the new index is durable, and so
 * is a single file at `path` when it ends in .safetensors (the set replaces
 * it). An old index that names anything but a regular NAME.safetensors in
 * its own directory (the index itself, a subdirectory, "..", another kind of
 * file, a symlink) refuses the write up front, naming the entry (EACCES). */
BS_NODISCARD int bs_st_write_set(const struct bs_catalog *cat, const char *path,
                                 const struct bs_write_opts *o, bs_err *err);
/* Complete or roll back an interrupted write of the shard set whose target
 * is `path` (NAME.safetensors.index.json, or NAME.safetensors written as a
 * set): see core/set_journal.h. */
BS_NODISCARD int bs_st_set_recover(const char *path, bs_err *err);

#endif
