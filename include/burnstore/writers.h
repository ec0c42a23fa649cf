/* The output formats burnstore writes: one row per format. A new output
 * format is one writer file in src/formats/ plus one row in writers.c; the
 * format of an output is chosen from its file name's extension. */
#ifndef BURNSTORE_WRITERS_H
#define BURNSTORE_WRITERS_H

#include <stddef.h>

#include "burnstore/catalog.h"
#include "burnstore/sink.h"

/* Options of one write-back (recorded in the staging INDEX). */
struct bs_write_opts {
  uint64_t max_shard_size; /* sharded SafeTensors: bytes per shard; 0: keep the target's shards */
};

struct bs_writer {
  const char *name;              /* "burnpack" (as bs_format_name spells it) */
  enum bs_format format;         /* what a reader reports for the output */
  const char *const *extensions; /* NULL-terminated, lower case, with the dot: ".bpk" */
  /* Can the format store tensor t (dtype, encoding)? 0, or -1 with err
   * naming the tensor and why. Sizes are checked by write(). */
  int (*can_write)(const struct bs_tensor *t, bs_err *err);
  /* Add the metadata every file of the format carries, unless the catalog
   * has those keys (format, producer...). NULL: none. */
  int (*default_meta)(struct bs_catalog *cat, bs_err *err);
  /* Serialize every tensor that is not hidden, with cat->meta, into k. */
  int (*write)(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);
  /* A format of several files (shards + index): writes the whole set for
   * target `path`, atomically as a set. NULL: one file, through write(). */
  int (*write_set)(const struct bs_catalog *cat, const char *path, const struct bs_write_opts *o,
                   bs_err *err);
};

/* The table, and its length. Rows are static: pointers to them stay valid. */
extern const struct bs_writer bs_writers[];
extern const size_t bs_nwriters;

/* The writer whose extension ends the base name of `path` (case-insensitive;
 * a base name that is only the extension, ".bpk", has none), or NULL. */
const struct bs_writer *bs_writer_for_path(const char *path);
/* The writer of a format, or NULL if burnstore cannot write it. */
const struct bs_writer *bs_writer_for_format(enum bs_format f);
/* The extension of `path`'s base name as the user wrote it (".pth", from
 * the last dot; "" for none). Borrowed from path. */
const char *bs_path_extension(const char *path);
/* ".bpk (burnpack)" for every writer, ", "-separated, for messages. Returns buf. */
const char *bs_writer_list(char *buf, size_t n);

/* For a refusal: how to write a Burn dtype whose bytes are those of a
 * common one ("; its bytes are F32: set user.burnstore.dtype to F32 to write
 * them" for FLEX32, the same with BOOL for BOOL_U8), "" for any other. */
const char *bs_writer_alias_hint(enum bs_dtype dt);

/* can_write on every tensor that is not hidden: the first it refuses fails,
 * with a hint to leave the tensor out (exclude=). */
BS_NODISCARD int bs_writer_check(const struct bs_writer *w, const struct bs_catalog *cat,
                                 bs_err *err);
/* write() into an atomic file at path (see sink.h): on failure `path` is
 * untouched, no temp file is left, and err names path. */
BS_NODISCARD int bs_writer_write_file(const struct bs_writer *w, const struct bs_catalog *cat,
                                      const char *path, bs_err *err);
/* The same with options (o may be NULL); a row with write_set writes its set. */
BS_NODISCARD int bs_writer_write_file_opts(const struct bs_writer *w, const struct bs_catalog *cat,
                                           const char *path, const struct bs_write_opts *o,
                                           bs_err *err);

#endif
