/* The Burnpack (.bpk) writer: the layout current Burn (0.20+) writes and reads.
 *
 * Byte layout written:
 *  1. offset 0, 10 bytes: "NRUB", version u16 LE = 1, metadata_size M u32 LE
 *  2. offset 10, M bytes: CBOR exactly as Burn's serde + ciborium emit it: definite lengths,
 *     shortest integer heads, no tags; top-level keys "tensors" then "metadata" (left out when
 *     empty); descriptor keys dtype, shape, data_offsets, param_id (left out when absent);
 *     names and metadata keys sorted byte-wise (memcmp order, not length-first)
 *  3. zero bytes up to D = round_up(10 + M, 256)
 *  4. the tensors in plan order: start = round_up(cursor, 256) relative to D, gaps zero-filled,
 *     the file ends at the end of the last tensor (no trailing padding); with no tensors the
 *     file is padded to D
 * Offsets are relative to D and D depends on M, which depends on the offsets' encoded widths,
 * so the offsets are placed first, the CBOR serialized to memory, then D computed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/version.h"
#include "formats/burnpack_dtype.h"
#include "formats/burnpack_write.h"
#include "formats/write_common.h"

#define HDR_LEN 10u

/* ---- CBOR encoder (the subset Burn emits) ------------------------------------------------ */

struct enc {
  struct bs_buf b;
  bool oom; /* sticky: checked once at the end */
};

static void put(struct enc *e, const void *d, size_t n)
{
  if (!e->oom && bs_buf_put(&e->b, d, n) != 0)
    e->oom = true;
}

/* A head in its shortest form (RFC 8949 preferred serialization). */
static void head(struct enc *e, unsigned major, uint64_t v)
{
  uint8_t h[9];
  size_t n;
  uint8_t m = (uint8_t)(major << 5);
  if (v < 24) {
    h[0] = m | (uint8_t)v;
    n = 1;
  } else if (v <= UINT8_MAX) {
    h[0] = m | 24;
    h[1] = (uint8_t)v;
    n = 2;
  } else if (v <= UINT16_MAX) {
    h[0] = m | 25;
    n = 3;
  } else if (v <= UINT32_MAX) {
    h[0] = m | 26;
    n = 5;
  } else {
    h[0] = m | 27;
    n = 9;
  }
  for (size_t i = 1; n > 2 && i < n; i++)
    h[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
  put(e, h, n);
}

static void uint_(struct enc *e, uint64_t v)
{
  head(e, 0, v);
}

static void text(struct enc *e, const char *s)
{
  size_t n = strlen(s);
  head(e, 3, n);
  put(e, s, n);
}

static void dtype(struct enc *e, const struct bs_tensor *t)
{
  const char *s;
  if (t->dtype == BS_DT_QFLOAT) {
    put(e, t->x->dtype_raw, t->x->dtype_raw_len);
  } else if ((s = bs_dtype_bpk_bool(t->dtype))) {
    head(e, 5, 1);
    text(e, "Bool");
    text(e, s);
  } else {
    text(e, bs_dtype_bpk_name(t->dtype));
  }
}

/* ---- Plan: which tensors, where, and in which name order --------------------------------- */

struct wplan {
  size_t n;
  size_t *order;   /* catalog indices, data order */
  uint64_t *start; /* per plan position, relative to D */
  size_t *byname;  /* plan positions sorted by name */
  size_t *meta;    /* cat->meta indices sorted by key */
  uint64_t end;    /* end of the data relative to D */
  uint64_t biggest;
};

static void wplan_destroy(struct wplan *w)
{
  bs_free(w->order);
  bs_free(w->start);
  bs_free(w->byname);
  bs_free(w->meta);
}

struct sort_ctx {
  const struct bs_catalog *cat;
  const size_t *order;
};

static int cmp_byname(const void *a, const void *b, void *c)
{
  const struct sort_ctx *x = c;
  return strcmp(x->cat->tensors[x->order[*(const size_t *)a]].name,
                x->cat->tensors[x->order[*(const size_t *)b]].name);
}

static int cmp_meta(const void *a, const void *b, void *c)
{
  const struct bs_catalog *cat = c;
  return strcmp(cat->meta[*(const size_t *)a].key, cat->meta[*(const size_t *)b].key);
}

int bs_bpk_name_ok(const char *name, bs_err *err)
{
  return bs_writer_name_text(name, BS_MAX_KEY_LEN, true, "Burnpack names are CBOR text strings",
                             err);
}

int bs_bpk_can_write(const struct bs_tensor *t, bs_err *err)
{
  if (bs_bpk_name_ok(t->name, err) != 0)
    return -1;
  if (t->x->unsupported)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name, "its data cannot be read: %s",
                   t->x->unsupported);
  if (t->dtype == BS_DT_QFLOAT) {
    if (!t->x->dtype_raw || t->x->dtype_raw_len == 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                     "QFloat tensor has no encoded quantization scheme to write");
    return 0;
  }
  if (!bs_dtype_bpk_name(t->dtype) && !bs_dtype_bpk_bool(t->dtype))
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                   "Burnpack has no dtype for %s (Burn stores F64 F32 Flex32 F16 BF16, "
                   "I64..I8, U64..U8, Bool and QFloat)",
                   bs_dtype_name(t->dtype));
  return 0;
}

static int check_tensor(const struct bs_tensor *t, bs_err *err)
{
  if (bs_bpk_can_write(t, err) != 0)
    return -1;
  if (t->dtype == BS_DT_QFLOAT)
    return 0;
  uint64_t want;
  if (bs_dtype_nbytes(t->dtype, t->rank, t->shape, &want, t->name, BS_OFF_NONE, err) != 0)
    return -1;
  if (want != t->nbytes)
    return bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                   "holds %" PRIu64 " bytes but its shape and %s need %" PRIu64, t->nbytes,
                   bs_dtype_name(t->dtype), want);
  return 0;
}

static int make_plan(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, struct wplan *w,
                     bs_err *err)
{
  memset(w, 0, sizeof *w);
  size_t n = 0;
  if (plan) {
    n = plan->n;
  } else {
    for (size_t i = 0; i < cat->count; i++)
      n += !cat->tensors[i].hidden;
  }
  if (n > BS_BPK_MAX_TENSORS)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "%zu tensors exceed the %u a Burnpack reader accepts", n, BS_BPK_MAX_TENSORS);
  w->n = n;
  w->order = bs_malloc((n ? n : 1) * sizeof *w->order);
  w->start = bs_malloc((n ? n : 1) * sizeof *w->start);
  w->byname = bs_malloc((n ? n : 1) * sizeof *w->byname);
  w->meta = bs_malloc((cat->nmeta ? cat->nmeta : 1) * sizeof *w->meta);
  if (!w->order || !w->start || !w->byname || !w->meta)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (plan) {
    for (size_t i = 0; i < n; i++) {
      if (plan->order[i] >= cat->count)
        return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                       "write plan entry %zu is tensor %zu, but the catalog has %zu", i,
                       plan->order[i], cat->count);
      w->order[i] = plan->order[i];
    }
  } else {
    for (size_t i = 0, j = 0; i < cat->count; i++)
      if (!cat->tensors[i].hidden)
        w->order[j++] = i;
  }

  uint64_t cursor = 0;
  for (size_t i = 0; i < n; i++) {
    const struct bs_tensor *t = &cat->tensors[w->order[i]];
    if (check_tensor(t, err) != 0)
      return -1;
    if (!bs_align_up(cursor, BS_BPK_ALIGN, &w->start[i]) ||
        !bs_add_u64(w->start[i], t->nbytes, &cursor))
      return bs_fail(err, EFBIG, BS_OFF_NONE, t->name, "data offsets overflow 64 bits");
    if (t->nbytes > w->biggest)
      w->biggest = t->nbytes;
    w->byname[i] = i;
  }
  w->end = cursor;

  struct sort_ctx sc = {cat, w->order};
  qsort_r(w->byname, n, sizeof *w->byname, cmp_byname, &sc);
  for (size_t i = 1; i < n; i++) {
    const char *a = cat->tensors[w->order[w->byname[i - 1]]].name;
    if (strcmp(a, cat->tensors[w->order[w->byname[i]]].name) == 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, a,
                     "two tensors to write have this name; Burnpack names must be unique");
  }
  for (size_t i = 0; i < cat->nmeta; i++)
    w->meta[i] = i;
  qsort_r(w->meta, cat->nmeta, sizeof *w->meta, cmp_meta, (void *)cat);
  for (size_t i = 1; i < cat->nmeta; i++)
    if (strcmp(cat->meta[w->meta[i - 1]].key, cat->meta[w->meta[i]].key) == 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "metadata key '%.100s' appears twice",
                     cat->meta[w->meta[i]].key);
  return 0;
}

static int encode_meta(const struct bs_catalog *cat, const struct wplan *w, struct bs_buf *out,
                       bs_err *err)
{
  struct enc e = {0};
  head(&e, 5, cat->nmeta ? 2 : 1);
  text(&e, "tensors");
  head(&e, 5, w->n);
  for (size_t i = 0; i < w->n; i++) {
    size_t pos = w->byname[i];
    const struct bs_tensor *t = &cat->tensors[w->order[pos]];
    text(&e, t->name);
    head(&e, 5, t->has_param_id ? 4 : 3);
    text(&e, "dtype");
    dtype(&e, t);
    text(&e, "shape");
    head(&e, 4, t->rank);
    for (uint32_t d = 0; d < t->rank; d++)
      uint_(&e, t->shape[d]);
    text(&e, "data_offsets");
    head(&e, 4, 2);
    uint_(&e, w->start[pos]);
    uint_(&e, w->start[pos] + t->nbytes);
    if (t->has_param_id) {
      text(&e, "param_id");
      uint_(&e, t->x->param_id);
    }
  }
  if (cat->nmeta) {
    text(&e, "metadata");
    head(&e, 5, cat->nmeta);
    for (size_t i = 0; i < cat->nmeta; i++) {
      text(&e, cat->meta[w->meta[i]].key);
      text(&e, cat->meta[w->meta[i]].value);
    }
  }
  if (e.oom) {
    bs_buf_destroy(&e.b);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory encoding the metadata");
  }
  if (e.b.len > BS_BPK_MAX_META) {
    size_t len = e.b.len;
    bs_buf_destroy(&e.b);
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "metadata of %zu bytes exceeds the %u bytes a Burnpack reader accepts", len,
                   BS_BPK_MAX_META);
  }
  *out = e.b;
  return 0;
}

int bs_bpk_layout(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, struct bs_layout *l,
                  bs_err *err)
{
  struct wplan w;
  struct bs_buf meta = {0};
  int rc = -1;
  if (make_plan(cat, plan, &w, err) == 0 && encode_meta(cat, &w, &meta, err) == 0) {
    uint8_t h[HDR_LEN];
    memcpy(h, "NRUB", 4);
    bs_put_le16(h + 4, 1);
    bs_put_le32(h + 6, (uint32_t)meta.len);
    bs_layout_bytes(l, h, HDR_LEN);
    bs_layout_take(l, &meta);
    bs_layout_align(l, BS_BPK_ALIGN); /* D: the data's start */
    uint64_t data_start = l->size, cursor = 0;
    for (size_t i = 0; i < w.n; i++) {
      bs_layout_zeros(l, w.start[i] - cursor);
      bs_layout_tensor(l, cat, w.order[i]);
      cursor = w.start[i] + cat->tensors[w.order[i]].nbytes;
    }
    rc = bs_layout_done(l, err);
    if (rc == 0 && l->size != data_start + w.end)
      rc = bs_fail(err, EIO, BS_OFF_NONE, NULL, "internal: the plan's data is out of place");
  }
  bs_buf_destroy(&meta);
  wplan_destroy(&w);
  return rc;
}

/* The one serializer behind every sink: the plan, emitted. */
int bs_bpk_write(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, struct bs_sink *k,
                 bs_err *err)
{
  struct bs_layout l;
  bs_layout_init(&l);
  int rc = bs_bpk_layout(cat, plan, &l, err) == 0 ? bs_layout_emit(&l, cat, k, err) : -1;
  bs_layout_destroy(&l);
  return rc;
}

/* `out` is an out-parameter: it is overwritten, not freed, and stays empty on failure. */
int bs_bpk_write_mem(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                     struct bs_buf *out, bs_err *err)
{
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, NULL);
  memset(out, 0, sizeof *out);
  if (bs_bpk_write(cat, plan, &k, err) != 0) {
    bs_buf_destroy(&b);
    return -1;
  }
  *out = b;
  return 0;
}

int bs_bpk_write_fd(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, int fd,
                    bs_err *err)
{
  char name[32];
  struct bs_sink k;
  snprintf(name, sizeof name, "fd %d", fd);
  bs_sink_init_fd(&k, fd, name);
  return bs_bpk_write(cat, plan, &k, err);
}

int bs_bpk_write_file(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                      const char *path, bs_err *err)
{
  struct bs_atomic a;
  if (bs_atomic_open(&a, path, err) != 0)
    return -1;
  if (bs_bpk_write(cat, plan, &a.sink, err) != 0)
    return bs_atomic_fail(&a, err);
  return bs_atomic_commit(&a, err);
}

int bs_bpk_default_meta(struct bs_catalog *cat, bs_err *err)
{
  static const char *const defaults[][2] = {
      {"format", "burnpack"}, {"producer", "burnstore"}, {"version", BURNSTORE_VERSION}};
  for (size_t d = 0; d < sizeof defaults / sizeof defaults[0]; d++) {
    bool have = false;
    for (size_t i = 0; i < cat->nmeta && !have; i++)
      have = strcmp(cat->meta[i].key, defaults[d][0]) == 0;
    if (!have && bs_catalog_add_meta(cat, defaults[d][0], defaults[d][1], err) != 0)
      return -1;
  }
  return 0;
}
