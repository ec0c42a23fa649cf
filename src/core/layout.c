/* A file as a plan of segments (layout.h). */
#include "core/layout.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"

#define SIZE_MAX_FILE ((uint64_t)1 << 62) /* what a file may be (off_t, with room) */

void bs_layout_init(struct bs_layout *l)
{
  memset(l, 0, sizeof *l);
}

void bs_layout_destroy(struct bs_layout *l)
{
  bs_buf_destroy(&l->bytes);
  bs_free(l->seg);
  memset(l, 0, sizeof *l);
}

/* Grow the file by n bytes; false (sticky) past the cap. */
static bool grow(struct bs_layout *l, uint64_t n)
{
  uint64_t end;
  if (l->oom || l->big)
    return false;
  if (!bs_add_u64(l->size, n, &end) || end > SIZE_MAX_FILE) {
    l->big = true;
    return false;
  }
  l->size = end;
  return true;
}

static struct bs_seg *push(struct bs_layout *l)
{
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    struct bs_seg *s = cap > SIZE_MAX / sizeof *s ? NULL : bs_realloc(l->seg, cap * sizeof *s);
    if (!s) {
      l->oom = true;
      return NULL;
    }
    l->seg = s;
    l->cap = cap;
  }
  return &l->seg[l->n++];
}

void bs_layout_bytes(struct bs_layout *l, const void *d, size_t n)
{
  if (l->oom || l->big || n == 0)
    return;
  struct bs_seg *last = l->n ? &l->seg[l->n - 1] : NULL;
  uint64_t at = l->bytes.len, off = l->size;
  if (!grow(l, n))
    return;
  if (bs_buf_put(&l->bytes, d, n) != 0) {
    l->oom = true;
    return;
  }
  if (last && last->kind == BS_SEG_BYTES && last->off + last->len == off &&
      last->at + last->len == at) {
    last->len += n; /* one run of built bytes */
    return;
  }
  struct bs_seg *s = push(l);
  if (s)
    *s = (struct bs_seg){.off = off, .len = n, .at = at, .kind = BS_SEG_BYTES};
}

void bs_layout_take(struct bs_layout *l, struct bs_buf *b)
{
  size_t have = l->bytes.len;
  if (l->oom || l->big || b->len == 0 || have > 64 || b->cap - b->len < have) {
    bs_layout_bytes(l, b->data, b->len); /* (a copy: the plan's bytes are long already) */
    return;
  }
  /* b's buffer becomes the plan's, its bytes after the plan's few */
  size_t n = b->len;
  if (!grow(l, n))
    return;
  memmove(b->data + have, b->data, n);
  memcpy(b->data, l->bytes.data, have);
  struct bs_buf old = l->bytes;
  l->bytes = *b;
  l->bytes.len = have + n;
  *b = old; /* the caller frees it */
  b->len = 0;
  struct bs_seg *last = l->n ? &l->seg[l->n - 1] : NULL;
  if (last && last->kind == BS_SEG_BYTES && last->off + last->len == l->size - n &&
      last->at + last->len == have) {
    last->len += n;
    return;
  }
  struct bs_seg *s = push(l);
  if (s)
    *s = (struct bs_seg){.off = l->size - n, .len = n, .at = have, .kind = BS_SEG_BYTES};
}

static void add(struct bs_layout *l, uint32_t kind, uint32_t idx, uint64_t at, uint64_t len)
{
  if (l->oom || len == 0)
    return;
  uint64_t off = l->size;
  if (!grow(l, len))
    return;
  struct bs_seg *s = push(l);
  if (!s)
    return;
  *s = (struct bs_seg){.off = off, .len = len, .at = at, .idx = idx, .kind = kind};
  if (len > l->biggest)
    l->biggest = len;
}

void bs_layout_src(struct bs_layout *l, uint32_t src, uint64_t off, uint64_t len)
{
  add(l, BS_SEG_SRC, src, off, len);
}

void bs_layout_tensor(struct bs_layout *l, const struct bs_catalog *cat, size_t tensor)
{
  if (tensor > UINT32_MAX) {
    l->oom = true;
    return;
  }
  add(l, BS_SEG_TENSOR, (uint32_t)tensor, 0, cat->tensors[tensor].nbytes);
}

void bs_layout_zeros(struct bs_layout *l, uint64_t n)
{
  (void)grow(l, n);
}

void bs_layout_align(struct bs_layout *l, uint64_t align)
{
  uint64_t to;
  if (!bs_align_up(l->size, align, &to)) {
    l->big = true;
    return;
  }
  bs_layout_zeros(l, to - l->size);
}

int bs_layout_done(struct bs_layout *l, bs_err *err)
{
  if (l->big)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "the file would pass 2^62 bytes");
  if (l->oom)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory planning the file");
  if (l->n && l->n < l->cap) {
    struct bs_seg *s = bs_realloc(l->seg, l->n * sizeof *s);
    if (s) {
      l->seg = s;
      l->cap = l->n;
    }
  }
  return 0;
}

size_t bs_layout_find(const struct bs_layout *l, uint64_t off)
{
  size_t lo = 0, hi = l->n; /* the first segment starting after off */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (l->seg[mid].off <= off)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo ? lo - 1 : SIZE_MAX;
}

/* Up to n bytes of segment s at rel (< s->len) into buf: bytes, or -errno. */
static long seg_read(const struct bs_layout *l, const struct bs_catalog *cat,
                     const struct bs_seg *s, uint64_t rel, uint8_t *buf, size_t n)
{
  if (n > s->len - rel)
    n = (size_t)(s->len - rel);
  switch (s->kind) {
  case BS_SEG_BYTES: memcpy(buf, l->bytes.data + s->at + rel, n); return (long)n;
  case BS_SEG_SRC: {
    if (s->idx >= cat->nsrcs)
      return -EIO;
    /* checked after reading, as a tensor's bytes are (bs_tensor_read): a
     * source changed since the plan was made is never served */
    const struct bs_src *src = &cat->srcs[s->idx];
    long r = bs_src_pread(src, s->at + rel, buf, n);
    return r > 0 && bs_src_changed(src, NULL, 0) ? -EIO : r;
  }
  default:
    return s->idx < cat->count ? bs_tensor_read(cat, &cat->tensors[s->idx], rel, buf, n) : -EIO;
  }
}

long bs_layout_read(const struct bs_layout *l, const struct bs_catalog *cat, uint64_t off,
                    void *buf, size_t n)
{
  uint8_t *p = buf;
  if (off >= l->size)
    return 0;
  if (n > l->size - off)
    n = (size_t)(l->size - off);
  if (n > (size_t)LONG_MAX)
    n = (size_t)LONG_MAX;
  size_t i = bs_layout_find(l, off), done = 0;
  if (i == SIZE_MAX)
    i = 0; /* off is before the first segment: zeros, then segment 0 */
  while (done < n) {
    uint64_t at = off + done;
    const struct bs_seg *s = i < l->n ? &l->seg[i] : NULL;
    if (s && at >= s->off + s->len) {
      i++;
      continue;
    }
    if (!s || at < s->off) { /* zeros up to the next segment, or the end */
      uint64_t z = (s ? s->off : l->size) - at;
      size_t k = z < n - done ? (size_t)z : n - done;
      memset(p + done, 0, k);
      done += k;
      continue;
    }
    long r = seg_read(l, cat, s, at - s->off, p + done, n - done);
    if (r < 0)
      return r;
    if (r == 0)
      return -EIO; /* a source shorter than its plan */
    done += (size_t)r;
  }
  return (long)done;
}

int bs_layout_emit(const struct bs_layout *l, const struct bs_catalog *cat, struct bs_sink *k,
                   bs_err *err)
{
  uint8_t *chunk = NULL;
  size_t cap;
  if (bs_sink_reserve(k, l->size, err) != 0 || !(chunk = bs_sink_chunk(l->biggest, &cap, err)))
    return -1;
  uint64_t pos = 0;
  int rc = 0;
  for (size_t i = 0; i < l->n && rc == 0; i++) {
    const struct bs_seg *s = &l->seg[i];
    rc = bs_sink_zeros(k, s->off - pos, err);
    if (rc != 0)
      break;
    if (s->kind == BS_SEG_BYTES) {
      rc = bs_sink_put(k, l->bytes.data + s->at, (size_t)s->len, err);
    } else if (s->kind == BS_SEG_TENSOR) {
      rc = s->idx < cat->count
               ? bs_sink_put_tensor(cat, &cat->tensors[s->idx], chunk, cap, k, err)
               : bs_fail(err, EIO, BS_OFF_NONE, NULL, "internal: a plan's tensor %u", s->idx);
    } else {
      for (uint64_t done = 0; rc == 0 && done < s->len;) {
        size_t m = s->len - done < cap ? (size_t)(s->len - done) : cap;
        const struct bs_src *src = s->idx < cat->nsrcs ? &cat->srcs[s->idx] : NULL;
        char why[300];
        rc = src && bs_src_read(src, s->at + done, chunk, m, err) == 0 ? 0 : -1;
        if (rc == 0 && bs_src_changed(src, NULL, 0)) /* (as a tensor's bytes are checked) */
          rc = bs_fail(err, EIO, BS_OFF_NONE, NULL, "%s", bs_src_why(src, EIO, why, sizeof why));
        if (rc == 0)
          rc = bs_sink_put(k, chunk, m, err);
        if (rc != 0 && !err->code)
          bs_fail(err, EIO, BS_OFF_NONE, NULL, "internal: a plan's source %u", s->idx);
        done += m;
      }
    }
    pos = s->off + s->len;
  }
  if (rc == 0)
    rc = bs_sink_zeros(k, l->size - pos, err);
  bs_free(chunk);
  return rc;
}
