/* The writers' plans (core/layout.h) on in-memory catalogs: the segments'
 * lookup, reads at every offset agreeing with the emitted file, and each
 * writer row's plan emitting what its write() writes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/layout.h"
#include "core/sink.h"
#include "formats/writers.h"

/* A catalog over `mem` (a memory source) with tensors a (F32 [n0], at 0),
 * b (I8 [n1], after a) and c (F16 [n2], after b). */
static void make_cat(struct bs_catalog *cat, const uint8_t *mem, size_t len, uint64_t n0,
                     uint64_t n1, uint64_t n2)
{
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(cat);
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, mem, len, "mem", &err), 0);
  cr_assert_eq(bs_catalog_add_src(cat, &s, &idx, &err), 0);
  const struct {
    const char *k;
    enum bs_dtype dt;
    uint64_t n, off;
  } ts[] = {
      {"a", BS_DT_F32, n0, 0}, {"b", BS_DT_I8, n1, 4 * n0}, {"c", BS_DT_F16, n2, 4 * n0 + n1}};
  for (size_t i = 0; i < 3; i++) {
    struct bs_tensor *t = bs_catalog_add(cat, ts[i].k, ts[i].dt, 1, &ts[i].n, ts[i].off, &err);
    cr_assert_not_null(t, "%s", err.msg);
    t->src = idx;
    t->off = ts[i].off;
  }
  cr_assert_eq(bs_catalog_add_meta(cat, "format", "test", &err), 0);
}

Test(layout, find_and_read_over_segments_and_zeros)
{
  uint8_t mem[64];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)(i + 1);
  struct bs_catalog cat;
  make_cat(&cat, mem, sizeof mem, 2, 3, 4); /* a: 8 bytes, b: 3, c: 8 */
  struct bs_layout l;
  bs_layout_init(&l);
  bs_err err;
  bs_err_clear(&err);
  bs_layout_zeros(&l, 2);        /* [0,2) zeros */
  bs_layout_bytes(&l, "HD", 2);  /* [2,4) */
  bs_layout_bytes(&l, "R", 1);   /* [4,5): one run with HD */
  bs_layout_tensor(&l, &cat, 1); /* [5,8) b */
  bs_layout_align(&l, 8);        /* [8,8) */
  bs_layout_src(&l, 0, 60, 4);   /* [8,12) mem[60..64) */
  bs_layout_zeros(&l, 3);        /* [12,15) */
  bs_layout_tensor(&l, &cat, 0); /* [15,23) a */
  bs_layout_align(&l, 32);       /* [23,32) zeros */
  cr_assert_eq(bs_layout_done(&l, &err), 0, "%s", err.msg);
  cr_assert_eq(l.size, 32);
  cr_assert_eq(l.n, 4, "built bytes appended back to back are one segment (%zu)", l.n);
  cr_assert_eq(bs_layout_find(&l, 0), SIZE_MAX);
  cr_assert_eq(bs_layout_find(&l, 2), 0);
  cr_assert_eq(bs_layout_find(&l, 4), 0);
  cr_assert_eq(bs_layout_find(&l, 5), 1);
  cr_assert_eq(bs_layout_find(&l, 13), 2, "in the zeros after segment 2");
  cr_assert_eq(bs_layout_find(&l, 31), 3);
  uint8_t want[32] = {0, 0, 'H', 'D', 'R', 9, 10, 11, 61, 62, 63, 64, 0, 0, 0};
  for (int i = 0; i < 8; i++)
    want[15 + i] = (uint8_t)(i + 1);
  /* The emitted file, and a read of every range of it. */
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  cr_assert_eq(bs_layout_emit(&l, &cat, &k, &err), 0, "%s", err.msg);
  cr_assert_eq(b.len, 32);
  cr_assert_eq(memcmp(b.data, want, 32), 0);
  for (uint64_t off = 0; off <= 33; off++)
    for (size_t n = 1; n <= 34; n++) {
      uint8_t got[40];
      long r = bs_layout_read(&l, &cat, off, got, n);
      size_t expect = off >= 32 ? 0 : (32 - off < n ? 32 - off : n);
      cr_assert_eq(r, (long)expect, "read %zu at %lu: %ld", n, (unsigned long)off, r);
      cr_assert_eq(memcmp(got, want + off, expect), 0, "read %zu at %lu", n, (unsigned long)off);
    }
  bs_buf_destroy(&b);
  bs_layout_destroy(&l);
  bs_layout_destroy(&l); /* twice: safe */
  bs_catalog_destroy(&cat);
}

Test(layout, a_source_shorter_than_its_plan_is_eio)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  make_cat(&cat, mem, 0, 0, 0, 0);
  struct bs_layout l;
  bs_layout_init(&l);
  bs_err err;
  bs_err_clear(&err);
  bs_layout_src(&l, 0, 4, 8); /* past the empty source */
  cr_assert_eq(bs_layout_done(&l, &err), 0);
  uint8_t got[8];
  cr_assert_lt(bs_layout_read(&l, &cat, 0, got, 8), 0);
  cr_assert_eq(bs_layout_read(&l, &cat, 8, got, 8), 0, "at the end: 0 bytes");
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  cr_assert_neq(bs_layout_emit(&l, &cat, &k, &err), 0);
  bs_buf_destroy(&b);
  bs_layout_destroy(&l);
  bs_catalog_destroy(&cat);
}

Test(layout, a_size_past_the_cap_is_efbig)
{
  struct bs_layout l;
  bs_layout_init(&l);
  bs_err err;
  bs_err_clear(&err);
  bs_layout_zeros(&l, (uint64_t)1 << 62);
  bs_layout_zeros(&l, 1);
  bs_layout_bytes(&l, "x", 1);
  cr_assert_neq(bs_layout_done(&l, &err), 0);
  cr_assert_eq(err.code, EFBIG);
  bs_layout_destroy(&l);
}

/* A source's bytes in a plan (a GGUF view's long metadata values) are
 * checked after reading, as a tensor's are: a file rewritten in place
 * since it was opened (same size, other bytes) is EIO (read) or an error
 * saying so (emit: convert), never its new bytes. */
Test(layout, a_source_changed_since_opened_is_eio)
{
  char path[] = "/tmp/bs-layout-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "old bytes", 9), 9);
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_open(&s, path, &err), 0, "%s", err.msg);
  unlink(path); /* (both fds stay on the file; nothing left behind if an assertion fails) */
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &idx, &err), 0);
  struct bs_layout l;
  bs_layout_init(&l);
  bs_layout_bytes(&l, "H", 1);
  bs_layout_src(&l, idx, 0, 9);
  cr_assert_eq(bs_layout_done(&l, &err), 0);
  char got[10] = {0};
  cr_assert_eq(bs_layout_read(&l, &cat, 0, got, 10), 10);
  cr_assert(memcmp(got, "Hold bytes", 10) == 0);
  cr_assert_eq(pwrite(fd, "new", 3, 0), 3);
  struct timespec t[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 1}}; /* an mtime surely other */
  cr_assert_eq(futimens(fd, t), 0);
  cr_assert_eq(bs_layout_read(&l, &cat, 0, got, 10), -EIO, "the changed bytes are not served");
  cr_assert_eq(bs_layout_read(&l, &cat, 0, got, 1), 1, "the plan's own bytes still are");
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  cr_assert_neq(bs_layout_emit(&l, &cat, &k, &err), 0, "emitted: refused, not the new bytes");
  cr_assert_eq(err.code, EIO);
  cr_assert(strstr(err.msg, "changed since it was opened"), "%s", err.msg);
  bs_buf_destroy(&b);
  bs_layout_destroy(&l);
  bs_catalog_destroy(&cat);
  close(fd);
}

/* Every row with a plan: bs_writer_layout, emitted and read at every
 * offset, gives the bytes the row's write() writes; a plan is one segment
 * a tensor (and a few for the header). */
Test(layout, every_plan_is_what_its_writer_writes)
{
  uint8_t mem[4096];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)(i * 7 + 3);
  size_t rows = 0;
  for (size_t r = 0; r < bs_nwriters; r++) {
    const struct bs_writer *w = &bs_writers[r];
    if (!w->layout)
      continue;
    rows++;
    struct bs_catalog cat;
    make_cat(&cat, mem, sizeof mem, 100, 37, 300);
    bs_err err;
    bs_err_clear(&err);
    struct bs_buf wrote = {0}, emitted = {0};
    struct bs_sink k;
    bs_sink_init_mem(&k, &wrote, "mem");
    cr_assert_eq(w->write(&cat, &k, &err), 0, "%s: %s", w->name, err.msg);
    struct bs_layout l;
    bs_layout_init(&l);
    cr_assert_eq(bs_writer_layout(w, &cat, "view", &l, &err), 0, "%s: %s", w->name, err.msg);
    cr_assert_eq(l.size, wrote.len, "%s: size", w->name);
    cr_assert_leq(l.n, 3 + 3, "%s: %zu segments for 3 tensors", w->name, l.n);
    bs_sink_init_mem(&k, &emitted, "mem");
    cr_assert_eq(bs_layout_emit(&l, &cat, &k, &err), 0);
    cr_assert_eq(emitted.len, wrote.len);
    cr_assert_eq(memcmp(emitted.data, wrote.data, wrote.len), 0, "%s: emitted", w->name);
    uint8_t *got = bs_malloc(wrote.len);
    for (size_t step = 1; step < 700; step += 97)
      for (uint64_t off = 0; off < wrote.len; off += step) {
        long n = bs_layout_read(&l, &cat, off, got, step);
        cr_assert_gt(n, 0);
        cr_assert_eq(memcmp(got, wrote.data + off, (size_t)n), 0, "%s: read %zu at %lu", w->name,
                     step, (unsigned long)off);
      }
    bs_free(got);
    bs_buf_destroy(&wrote);
    bs_buf_destroy(&emitted);
    bs_layout_destroy(&l);
    bs_catalog_destroy(&cat);
  }
  cr_assert_eq(rows, 3, "burnpack, safetensors and gguf have plans");
}
