/* The names a writable mount lets users create: checked when a file or
 * directory is created or renamed, so that what the write-back writes is
 * what the output format's readers take back (the writer's name_ok), and
 * two files never stand for one key. */
#ifndef BURNSTORE_NAMES_H
#define BURNSTORE_NAMES_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "core/tree.h"
#include "formats/writers.h"

/* May `name` be created in directory `parent` (or node `moving`, 0 for a
 * new one, be renamed to it)? 0, or -1 with err naming the key and why:
 *   ENAMETOOLONG  over BS_NAME_MAX bytes;
 *   EINVAL        not a valid escape, an escape spelled another way than
 *                 bs_escape_component spells it ("%41" for "A", "a%2Eb":
 *                 two names for one key), or a key w cannot hold
 *                 (w->name_ok; a NAME.npy file is checked as NAME);
 *   EEXIST        another file already has that key ("a.b" beside a/b);
 *   ENOMEM.
 * Hidden names (".x", temporaries of rsync, editors, mkstemp) and %% pass:
 * they are renamed before they matter, and the write-back refuses one that
 * is still there. w may be NULL (no output: only the escape is checked).
 * Only reads the tree (the caller holds its lock). */
BS_NODISCARD int bs_name_check(const struct bs_tree *t, bool flat, const struct bs_writer *w,
                               uint64_t parent, const char *name, bool is_dir, uint64_t moving,
                               bs_err *err);

/* May node `ino` (a file, or a directory and everything under it) be
 * removed, renamed, or replaced by a rename onto its name? fixed: per
 * catalog tensor of cat, the tensors a rewrite in place keeps where they
 * are (bs_writer.in_place_ok); NULL: all may. 0, or -1 with err (EPERM)
 * naming the first fixed tensor under ino and why. Only reads the tree
 * (the caller holds its lock). */
BS_NODISCARD int bs_name_check_fixed(const struct bs_tree *t, const struct bs_catalog *cat,
                                     const bool *fixed, uint64_t ino, bs_err *err);

#endif
