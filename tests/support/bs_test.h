/* Helpers shared by the unit and end-to-end tests. */
#ifndef BS_TEST_H
#define BS_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/edit.h"
#include "formats/formats.h"

/* Read a whole file into a bs_malloc'd buffer; aborts the test on failure. */
uint8_t *bs_test_slurp(const char *path, size_t *len);
/* A fresh directory under $TMPDIR (or /tmp); returns a malloc'd path. */
char *bs_test_tmpdir(const char *tag);
/* rm -rf of a test directory. */
void bs_test_rmrf(const char *path);
/* "dir/name" in one of 8 rotating static buffers (a test's paths, at most
 * eight alive in one expression). */
char *bs_test_at(const char *dir, const char *name);
/* Open a memory buffer as a catalog (cr_assert on nothing; returns rc). */
int bs_test_open_mem(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err);

/* Write a file (O_TRUNC, 0644); aborts the test on failure. */
void bs_test_put_file(const char *path, const void *data, size_t n);
/* The write-back tests' checkpoint: a SafeTensors file with a (F32 [4],
 * bytes 1..16) and b (U8 [4], bytes 17..20). */
void bs_test_write_ab_checkpoint(const char *path);
/* Open a checkpoint file into c (initialised here); aborts on failure. */
void bs_test_open_file(const char *path, struct bs_catalog *c);

/* A writable mount's core state without FUSE (test_writeback, test_journal):
 * a directory with the a/b checkpoint (bs_test_write_ab_checkpoint), its own
 * XDG_RUNTIME_DIR for target locks, the tree and editable catalog as a
 * writable mount has them, and a staging directory created and locked. */
struct bs_test_wb {
  char dir[64];
  char src_path[128]; /* DIR/m.safetensors */
  char stg[128];      /* the staging directory */
  int stg_fd, stg_lock;
  struct bs_catalog cat;
  struct bs_tree tree;
  struct bs_edit ed;
};
void bs_test_wb_setup(struct bs_test_wb *w);
/* Frees it all and removes the directory. */
void bs_test_wb_teardown(struct bs_test_wb *w);

/* A reader's signature (formats.h). */
typedef int (*bs_test_reader)(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                              bs_err *err);
/* The rollback of a reader, at every failure point: cat holds sources (src
 * among them); the sweep adds a tensor, a metadata pair and a note of its
 * own, then runs read with the Nth allocation failing, N = 0, 1, ..., until
 * it succeeds, and asserts after each failure that cat is as it was
 * (tensors, metadata, sources, notes, values). Returns the failing runs. */
size_t bs_test_rollback_sweep(struct bs_catalog *cat, uint32_t src, bs_test_reader read);
/* The same on a catalog of one memory source (buf, len, named name). */
size_t bs_test_rollback_sweep_mem(const void *buf, size_t len, const char *name,
                                  bs_test_reader read);

/* A catalog whose only source is `mem` (borrowed, named "mem"). */
void bs_test_mem_catalog(struct bs_catalog *cat, const void *mem, size_t n);
/* A catalog whose only source is `mem` (borrowed, named "fault") with a bad
 * range [bad0, bad1), as a disk with a bad sector: a read that starts in it
 * fails with EIO, one that runs into it returns the bytes before it (a
 * short read, as pread(2) does), the rest reads as mem. `changed`: the
 * source says its file changed (bs_src_changed) from the start. */
void bs_test_fault_catalog(struct bs_catalog *cat, const void *mem, size_t n, uint64_t bad0,
                           uint64_t bad1, bool changed);
/* Reads of t at every step-th offset, of lengths 1, 6, 11, ... (to 3 past
 * the end), equal the same slice of `whole` (t's bytes, t->nbytes). */
void bs_test_check_slices(const struct bs_catalog *cat, const struct bs_tensor *t,
                          const uint8_t *whole, uint64_t step);
/* bs_catalog_add of a tensor at `off` of source 0 (cr_assert on failure). */
struct bs_tensor *bs_test_add(struct bs_catalog *cat, const char *key, enum bs_dtype dt,
                              uint32_t rank, const uint64_t *shape, uint64_t off);

struct bs_sink;
/* write(cat, sink) with the Nth allocation failing, N = 0, 1, ...: ENOMEM
 * every time (no leak: ASan) until it succeeds, within 200 tries. */
void bs_test_write_survives_oom(int (*write)(const struct bs_catalog *, struct bs_sink *, bs_err *),
                                const struct bs_catalog *cat);
/* The writer of `out`'s extension refuses a tensor of dtype dt at check
 * and at write time, naming it, its message holding `words`. */
void bs_test_writer_refuses(const char *out, enum bs_dtype dt, const char *words);

#endif
