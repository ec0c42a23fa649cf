/* Shared by the fuzz harnesses: open a catalog from memory and check what a
 * reader claims (sizes, ranges, views), reading every tensor through
 * bs_tensor_read. Any broken invariant traps, so libFuzzer reports it. */
#ifndef BS_FUZZ_COMMON_H
#define BS_FUZZ_COMMON_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "formats/formats.h"

#define FUZZ_CHECK(c)                                                                              \
  do {                                                                                             \
    if (!(c))                                                                                      \
      __builtin_trap();                                                                            \
  } while (0)

/* A strided view may broadcast (stride 0) a tiny storage into a huge tensor;
 * read at most this much of each tensor, from its start and from its end. */
#define FUZZ_READ_CAP (256u * 1024)

static __attribute__((unused)) uint8_t fuzz_buf[64 * 1024];

static inline void fuzz_read_range(const struct bs_catalog *cat, const struct bs_tensor *t,
                                   uint64_t off, uint64_t len)
{
  while (len > 0) {
    size_t n = len < sizeof fuzz_buf ? (size_t)len : sizeof fuzz_buf;
    long r = bs_tensor_read(cat, t, off, fuzz_buf, n);
    FUZZ_CHECK(r == (long)n);
    off += n;
    len -= n;
  }
}

/* Check one tensor of an opened catalog and read all (or both ends) of it. */
static inline void fuzz_check_tensor(const struct bs_catalog *cat, const struct bs_tensor *t)
{
  FUZZ_CHECK(t->key && t->name);
  FUZZ_CHECK(t->dtype < BS_DT_COUNT);
  FUZZ_CHECK(t->rank <= BS_MAX_RANK);
  FUZZ_CHECK(t->rank == 0 || t->shape);
  FUZZ_CHECK(t->src < cat->nsrcs);
  FUZZ_CHECK(t->nbytes <= BS_MAX_TENSOR_BYTES);
  if (t->x->unsupported) {
    if (t->nbytes > 0)
      FUZZ_CHECK(bs_tensor_read(cat, t, 0, fuzz_buf, 1) == -ENOTSUP);
    return;
  }
  const struct bs_src *s = &cat->srcs[t->src];
  if (t->dtype != BS_DT_QFLOAT) {
    uint64_t nb = 0;
    bs_err e = {0};
    FUZZ_CHECK(bs_dtype_nbytes(t->dtype, t->rank, t->shape, &nb, t->key, 0, &e) == 0);
    FUZZ_CHECK(nb == t->nbytes);
  }
  if (t->x->strides) {
    bs_err e = {0};
    FUZZ_CHECK(bs_tensor_check_view(t, 0, &e) == 0);
    FUZZ_CHECK(bs_range_ok(t->off, t->x->storage_bytes, s->size));
  } else {
    FUZZ_CHECK(bs_range_ok(t->off, t->nbytes, s->size));
  }
  if (t->nbytes <= 2 * FUZZ_READ_CAP) {
    fuzz_read_range(cat, t, 0, t->nbytes);
  } else {
    fuzz_read_range(cat, t, 0, FUZZ_READ_CAP);
    fuzz_read_range(cat, t, t->nbytes - FUZZ_READ_CAP, FUZZ_READ_CAP);
  }
  FUZZ_CHECK(bs_tensor_read(cat, t, t->nbytes, fuzz_buf, 1) == 0);
}

static inline void fuzz_check_catalog(const struct bs_catalog *cat)
{
  FUZZ_CHECK(cat->count <= BS_MAX_TENSORS);
  for (size_t i = 0; i < cat->count; i++)
    fuzz_check_tensor(cat, &cat->tensors[i]);
  for (size_t i = 0; i < cat->nmeta; i++) /* text, or a value left in a source of cat */
    FUZZ_CHECK(cat->meta[i].key &&
               (cat->meta[i].value ? !cat->meta[i].ref
                                   : cat->meta[i].ref && cat->meta[i].ref->src < cat->nsrcs));
}

/* Open data as a checkpoint in memory. Returns 0 and fills cat, or -1 (cat
 * is then empty). The error must be set on failure and clear on success. */
static inline int fuzz_open(struct bs_catalog *cat, const uint8_t *data, size_t size, bool strict)
{
  struct bs_src src;
  bs_err err = {0};
  bs_catalog_init(cat);
  if (bs_src_init_mem(&src, data, size, "fuzz", &err) != 0)
    __builtin_trap();
  struct bs_open_opts opts = {.strict = strict};
  int rc = bs_open_any(cat, &src, &opts, &err);
  if (rc != 0) {
    FUZZ_CHECK(err.code != 0 && err.msg[0] != '\0');
    FUZZ_CHECK(cat->count == 0 && cat->nsrcs == 0);
    return -1;
  }
  FUZZ_CHECK(err.code == 0);
  return 0;
}

#endif
