/* The output formats burnstore writes: one row per format. A new output
 * format is one writer file in src/formats/ plus one row in writers.c; the
 * format of an output is chosen from its file name's extension. */
#ifndef BURNSTORE_WRITERS_H
#define BURNSTORE_WRITERS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/catalog.h"
#include "core/layout.h"
#include "core/sink.h"
#include "formats/formats.h"      /* enum bs_format */
#include "formats/write_common.h" /* struct bs_write_opts, the rows' shared rules */

#pragma GCC visibility push(hidden) /* internal (err.h) */

struct bs_writer {
  const char *name;              /* "burnpack" (as bs_format_name spells it) */
  enum bs_format format;         /* what a reader reports for the output */
  const char *const *extensions; /* NULL-terminated, lower case, with the dot: ".bpk" */
  /* Can the format store tensor t (dtype, encoding)? 0, or -1 with err
   * naming the tensor and why. Sizes are checked by write(). */
  int (*can_write)(const struct bs_tensor *t, bs_err *err);
  /* Can the format hold `name` as a tensor name (what its readers accept:
   * UTF-8 text, length, reserved names)? 0, or -1 with err (EINVAL) naming
   * it (non-UTF-8 bytes shown as \xNN) and why. can_write applies it too. */
  int (*name_ok)(const char *name, bs_err *err);
  /* Add the metadata every file of the format carries, unless the catalog
   * has those keys (format, producer...). NULL: none. */
  int (*default_meta)(struct bs_catalog *cat, bs_err *err);
  /* Serialize every tensor that is not hidden, with cat->meta, into k. */
  int (*write)(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);
  /* A format of several files (shards + index): writes the whole set for
   * target `path`, atomically as a set. NULL: one file, through write(). */
  int (*write_set)(const struct bs_catalog *cat, const char *path, const struct bs_write_opts *o,
                   bs_err *err);
  /* The format's rules for one metadata entry: may `key` = value (len bytes,
   * NUL-free text) be written? 0, or -1 with err (EINVAL) saying what rule
   * it breaks. rules: from meta_rules, or NULL (no source known: only the
   * rules that need none; write() checks the rest). NULL column: any text. */
  int (*check_meta)(const struct bs_meta_rules *rules, const char *key, const char *value,
                    size_t len, bs_err *err);
  /* Prepare the rules from the source catalog (*out NULL: none needed), and
   * free them. NULL columns: the format needs no source to check. */
  int (*meta_rules)(const struct bs_catalog *src, struct bs_meta_rules **out, bs_err *err);
  void (*meta_rules_free)(struct bs_meta_rules *rules);
  /* May source catalog cat (key options applied) be rewritten in place by
   * this writer without losing what it holds (a .pth's non-tensor values)?
   * 0, or -1 with err naming what would be lost. fixed: NULL, or cat->count
   * flags, zeroed, where the row marks the tensors the rewrite must keep
   * where the source has them, neither removed nor renamed (a .pth's items
   * of a list): bs_name_check_fixed refuses that when it is asked. NULL
   * column: always, nothing fixed. */
  int (*in_place_ok)(const struct bs_catalog *cat, bool *fixed, bs_err *err);
  /* The format has no place for file metadata: a write drops cat->meta
   * (the CLI and the write-back report say so). */
  bool drops_meta;
  /* The format keeps a tensor's parameter id (has_param_id); the others
   * drop it (convert and -o view= say so). */
  bool param_ids;
  /* Before reading or rewriting `path`, a target of this row: complete or
   * roll back a write of it that a kill interrupted (a shard set's
   * journal). 0, or -1 with err. NULL: the format's writes need none (a
   * single file's dead temp files are never read). */
  int (*recover)(const char *path, bs_err *err);
  /* The one file write() writes, as a plan (core/layout.h) appended to an
   * empty l: write() emits it, and a -o view= mount serves it. NULL: the
   * format has no such plan (several files; a zip of pickles). */
  int (*layout)(const struct bs_catalog *cat, struct bs_layout *l, bs_err *err);
  /* A format of several files (write_set): true with the name of the one
   * file the set replaces (NAME.safetensors) in out (n bytes) when `base`
   * (a base name) is one of the set's names (its index, a member): every
   * writer of any of them takes the one target lock of that name
   * (bs_writer_lock). NULL: a file is its own target. */
  bool (*set_name)(const char *base, char *out, size_t n);
  /* write() takes metadata left in a source (struct bs_meta_ref) and copies
   * it (GGUF, of GGUF values); false: bs_writer_write_file gives it the
   * text instead, made for the write. */
  bool meta_refs;
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

/* can_write on every tensor that is not hidden: the first it refuses fails,
 * with a hint to leave the tensor out (exclude=). */
BS_NODISCARD int bs_writer_check(const struct bs_writer *w, const struct bs_catalog *cat,
                                 bs_err *err);
/* The metadata rules of w for a mount of `src` (*out may be NULL: none
 * needed); free them with bs_writer_meta_rules_free (NULL is a no-op). */
BS_NODISCARD int bs_writer_meta_rules(const struct bs_writer *w, const struct bs_catalog *src,
                                      struct bs_meta_rules **out, bs_err *err);
void bs_writer_meta_rules_free(const struct bs_writer *w, struct bs_meta_rules *rules);
/* Would w write metadata `key` = value (len bytes)? The edge's check (a
 * setxattr on a writable mount), with rules from bs_writer_meta_rules: the
 * text is NUL-free (the catalog's metadata is C text: a NUL is refused,
 * never cut) and the row's check_meta accepts it. 0, or -1 with err
 * (EINVAL) naming the key. */
BS_NODISCARD int bs_writer_check_meta(const struct bs_writer *w, const struct bs_meta_rules *rules,
                                      const char *key, const char *value, size_t len, bs_err *err);

/* write() into an atomic file at path (see sink.h): on failure `path` is
 * untouched, no temp file is left, and err names path. The last guard:
 * every name that is not hidden passes name_ok before anything is opened. */
BS_NODISCARD int bs_writer_write_file(const struct bs_writer *w, const struct bs_catalog *cat,
                                      const char *path, bs_err *err);
/* The same with options (o may be NULL); a row with write_set writes its set.
 * Every metadata entry is first checked (bs_writer_check_meta without
 * rules): what the format's reader would refuse is never written. */
BS_NODISCARD int bs_writer_write_file_opts(const struct bs_writer *w, const struct bs_catalog *cat,
                                           const char *path, const struct bs_write_opts *o,
                                           bs_err *err);

/* The plan of the file bs_writer_write_file(w, cat, ...) writes (w has a
 * layout column), into l (bs_layout_init'd, empty), after the same checks
 * and the same metadata made text: a -o view= mount serves these bytes.
 * `name` names the output in messages. 0, or -1 with err. */
BS_NODISCARD int bs_writer_layout(const struct bs_writer *w, const struct bs_catalog *cat,
                                  const char *name, struct bs_layout *l, bs_err *err);

/* The target lock (core/target.h) of a write of `path` for `holder`, with
 * the sets' names of the table (the set_name column): two writers of one
 * set, through any of its names, never race. The lock's fd, or -1 with err
 * (EBUSY naming the holder). */
BS_NODISCARD int bs_writer_lock(const char *path, const char *holder, bs_err *err);
/* The set_name of the first row that knows base (a bs_target_name_fn). */
bool bs_writer_target_name(const char *base, char *out, size_t n);

/* Before reading or rewriting `path`: complete or roll back a write of it
 * that a kill interrupted (docs/robustness.md), through the recover column
 * of the row its extension names; 0 when that row has none. */
BS_NODISCARD int bs_writer_recover(const char *path, bs_err *err);

#pragma GCC visibility pop

#endif
