#include "bpk_fixture.h"
#include "formats/formats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fbuf {
  uint8_t *p;
  size_t len, cap;
};

static void fput(struct fbuf *b, const void *d, size_t n)
{
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
      cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p)
      abort();
    b->cap = cap;
  }
  if (n)
    memcpy(b->p + b->len, d, n);
  b->len += n;
}

static void fhead(struct fbuf *b, unsigned major, uint64_t v)
{
  uint8_t h[9];
  size_t n = v < 24 ? 1 : v <= 0xff ? 2 : v <= 0xffff ? 3 : v <= 0xffffffffu ? 5 : 9;
  static const uint8_t ai[10] = {0, 0, 24, 25, 0, 26, 0, 0, 0, 27};
  h[0] = (uint8_t)((major << 5) | (n == 1 ? v : ai[n]));
  for (size_t i = 1; i < n; i++)
    h[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
  fput(b, h, n);
}

static void ftext(struct fbuf *b, const char *s)
{
  fhead(b, 3, strlen(s));
  fput(b, s, strlen(s));
}

/* Stable sort of indices by name (merge sort: the 100001-tensor fixture must be fast). */
static void msort(size_t *a, size_t *tmp, size_t n, const struct bpk_fix_tensor *t)
{
  if (n < 2)
    return;
  size_t h = n / 2;
  msort(a, tmp, h, t);
  msort(a + h, tmp, n - h, t);
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n)
    tmp[k++] = strcmp(t[a[j]].name, t[a[i]].name) < 0 ? a[j++] : a[i++];
  while (i < h)
    tmp[k++] = a[i++];
  while (j < n)
    tmp[k++] = a[j++];
  memcpy(a, tmp, n * sizeof *a);
}

void bpk_fixture_custom(const struct bpk_fix_spec *s, struct bpk_fixture *f)
{
  memset(f, 0, sizeof *f);
  size_t *idx = malloc((s->n + 1) * sizeof *idx), *tmp = malloc((s->n + 1) * sizeof *tmp);
  if (!idx || !tmp)
    abort();
  for (size_t i = 0; i < s->n; i++)
    idx[i] = i;
  msort(idx, tmp, s->n, s->t);

  struct fbuf c = {0};
  fhead(&c, 5, 1 + (s->nmeta > 0) + s->extra_pairs);
  ftext(&c, "tensors");
  fhead(&c, 5, s->n);
  uint64_t E = 0;
  for (size_t k = 0; k < s->n; k++) {
    const struct bpk_fix_tensor *t = &s->t[idx[k]];
    if (t->end > E)
      E = t->end;
    ftext(&c, t->name);
    if (k < 8)
      f->desc_off[k] = 10 + c.len;
    fhead(&c, 5, t->has_pid ? 4 : 3);
    ftext(&c, "dtype");
    if (t->dtype_raw)
      fput(&c, t->dtype_raw, t->dtype_len);
    else
      ftext(&c, "F32");
    ftext(&c, "shape");
    if (t->shape_raw) {
      fput(&c, t->shape_raw, t->shape_len);
    } else {
      fhead(&c, 4, t->rank);
      for (uint32_t d = 0; d < t->rank; d++)
        fhead(&c, 0, t->shape[d]);
    }
    ftext(&c, "data_offsets");
    if (t->offsets_raw) {
      fput(&c, t->offsets_raw, t->offsets_len);
    } else {
      fhead(&c, 4, 2);
      fhead(&c, 0, t->start);
      fhead(&c, 0, t->end);
    }
    if (t->has_pid) {
      ftext(&c, "param_id");
      fhead(&c, 0, t->pid);
    }
  }
  if (s->nmeta) {
    ftext(&c, "metadata");
    fhead(&c, 5, s->nmeta);
    for (size_t i = 0; i < s->nmeta; i++) {
      ftext(&c, s->meta[i][0]);
      ftext(&c, s->meta[i][1]);
    }
  }
  f->extra_off = 10 + c.len;
  fput(&c, s->extra, s->extra_len);

  f->meta_len = (uint32_t)c.len;
  uint64_t meta_end = 10 + c.len;
  f->data_start = s->unaligned ? meta_end : (meta_end + 255) / 256 * 256;
  uint64_t dlen = s->set_data_len ? s->data_len : E;
  f->len = (size_t)(f->data_start + dlen + s->trailing);
  f->data = calloc(f->len ? f->len : 1, 1);
  if (!f->data)
    abort();
  memcpy(f->data, "NRUB\x01\x00", 6);
  for (int i = 0; i < 4; i++)
    f->data[6 + i] = (uint8_t)(c.len >> (8 * i));
  memcpy(f->data + 10, c.p, c.len);
  for (size_t i = 0; i < s->n; i++) {
    const struct bpk_fix_tensor *t = &s->t[i];
    if (t->end < t->start || t->end > dlen)
      continue;
    if (t->bytes)
      memcpy(f->data + f->data_start + t->start, t->bytes, (size_t)(t->end - t->start));
    else
      for (uint64_t j = t->start; j < t->end; j++)
        f->data[f->data_start + j] = (uint8_t)(j * 7 + 1);
  }
  free(c.p);
  free(idx);
  free(tmp);
}

static void put_f32(uint8_t *p, float v)
{
  uint32_t u;
  memcpy(&u, &v, 4);
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(u >> (8 * i));
}

void bpk_fixture_build(enum bpk_fix fault, struct bpk_fixture *f)
{
  static uint8_t w[24], b[12], st[8];
  static const float wv[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {0.5f, -1.0f, 2.0f};
  for (int i = 0; i < 6; i++)
    put_f32(w + 4 * i, wv[i]);
  for (int i = 0; i < 3; i++)
    put_f32(b + 4 * i, bv[i]);
  for (int i = 0; i < 8; i++)
    st[i] = (uint8_t)((uint64_t)-7 >> (8 * i));
  static const uint8_t i64[] = {0x63, 'I', '6', '4'};
  static const char *const meta[][2] = {{"producer", "fixture"}};

  struct bpk_fix_tensor t[4] = {
      {.name = "enc.weight",
       .rank = 2,
       .shape = {2, 3},
       .start = 0,
       .end = 24,
       .has_pid = true,
       .pid = 300,
       .bytes = w},
      {.name = "enc.bias", .rank = 1, .shape = {3}, .start = 256, .end = 268, .bytes = b},
      {.name = "step",
       .dtype_raw = i64,
       .dtype_len = sizeof i64,
       .rank = 0,
       .start = 512,
       .end = 520,
       .has_pid = true,
       .pid = 1ull << 40,
       .bytes = st},
      {0},
  };
  struct bpk_fix_spec s = {.t = t, .n = 3, .meta = meta, .nmeta = 1};
  struct bpk_fix_tensor *bias = &t[1];

  static const uint8_t f128[] = {0x64, 'F', '1', '2', '8'};
  static const uint8_t three[] = {0x03};
  static const uint8_t neg[] = {0x81, 0x22};
  static uint8_t rank65[2 + 65];
  static const uint8_t triple[] = {0x83, 0x19, 0x01, 0x00, 0x19, 0x01, 0x0c, 0x00};
  static const uint8_t backwards[] = {0x82, 0x19, 0x01, 0x0c, 0x19, 0x01, 0x00};
  static const uint8_t short10[] = {0x82, 0x19, 0x01, 0x00, 0x19, 0x01, 0x0a};
  static const uint8_t overflow[] = {0x82, 0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0,
                                     0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf8};
  static const uint8_t int_key[] = {0x01, 0x00};
  static uint8_t deep[2 + 200 + 1];
  struct bpk_fix_tensor *many = NULL;
  char(*names)[8] = NULL;

  f->bad_key = NULL;
  switch (fault) {
  case BPK_FIX_DTYPE_UNKNOWN: bias->dtype_raw = f128, bias->dtype_len = sizeof f128; break;
  case BPK_FIX_SHAPE_NOT_ARRAY: bias->shape_raw = three, bias->shape_len = sizeof three; break;
  case BPK_FIX_SHAPE_NEGATIVE: bias->shape_raw = neg, bias->shape_len = sizeof neg; break;
  case BPK_FIX_RANK_TOO_BIG:
    rank65[0] = 0x98, rank65[1] = 65;
    memset(rank65 + 2, 0x01, 65);
    bias->shape_raw = rank65, bias->shape_len = sizeof rank65;
    break;
  case BPK_FIX_OFFSETS_NOT_PAIR:
    bias->offsets_raw = triple, bias->offsets_len = sizeof triple;
    break;
  case BPK_FIX_END_BEFORE_START:
    bias->offsets_raw = backwards, bias->offsets_len = sizeof backwards;
    break;
  case BPK_FIX_SIZE_MISMATCH:
    bias->offsets_raw = short10, bias->offsets_len = sizeof short10;
    break;
  case BPK_FIX_OVERLAP: bias->start = 16, bias->end = 28; break;
  case BPK_FIX_DUP_NAME:
    t[3] = *bias;
    t[3].start = 768, t[3].end = 780;
    s.n = 4;
    break;
  case BPK_FIX_OFFSET_OVERFLOW:
    t[2].offsets_raw = overflow, t[2].offsets_len = sizeof overflow;
    break;
  case BPK_FIX_KEY_NOT_TEXT:
    s.extra = int_key, s.extra_len = sizeof int_key, s.extra_pairs = 1;
    break;
  case BPK_FIX_DEEP_NESTING:
    deep[0] = 0x61, deep[1] = 'x';
    memset(deep + 2, 0x81, 200);
    deep[202] = 0x00;
    s.extra = deep, s.extra_len = sizeof deep, s.extra_pairs = 1;
    break;
  case BPK_FIX_TOO_MANY_TENSORS:
    many = calloc(100001, sizeof *many);
    names = calloc(100001, sizeof *names);
    if (!many || !names)
      abort();
    for (size_t i = 0; i < 100001; i++) {
      snprintf(names[i], sizeof names[i], "t%06zu", i);
      many[i].name = names[i];
      many[i].rank = 1; /* shape [0], data_offsets [0, 0] */
    }
    s.t = many, s.n = 100001, s.set_data_len = true, s.data_len = 0;
    break;
  default: break;
  }
  bpk_fixture_custom(&s, f);
  free(many);
  free(names);

  /* enc.bias is emitted first (names sorted), step third. */
  switch (fault) {
  case BPK_FIX_SHORT_FILE:
    f->len = 9;
    f->bad_off = 0;
    break;
  case BPK_FIX_BAD_MAGIC:
    memcpy(f->data, "BURN", 4);
    f->bad_off = 0;
    break;
  case BPK_FIX_BAD_VERSION:
    f->data[4] = 2;
    f->bad_off = 4;
    break;
  case BPK_FIX_META_TOO_BIG: {
    uint32_t m = 100u * 1024 * 1024 + 1;
    for (int i = 0; i < 4; i++)
      f->data[6 + i] = (uint8_t)(m >> (8 * i));
    f->bad_off = 6;
    break;
  }
  case BPK_FIX_META_PAST_EOF:
    for (int i = 0; i < 4; i++)
      f->data[6 + i] = (uint8_t)(f->len >> (8 * i));
    f->bad_off = 6;
    break;
  case BPK_FIX_BAD_CBOR:
    f->data[f->desc_off[0]] = 0x1c;
    f->bad_off = f->desc_off[0];
    break;
  case BPK_FIX_CBOR_TRUNCATED: {
    /* The metadata ends with the text "fixture" (8 bytes with its head); cut 5 of them. */
    uint32_t m = f->meta_len - 5;
    for (int i = 0; i < 4; i++)
      f->data[6 + i] = (uint8_t)(m >> (8 * i));
    f->bad_off = 10 + f->meta_len - 8;
    break;
  }
  case BPK_FIX_DEEP_NESTING:
    /* The top map is level 1; the array at level 129 is the 128th one. */
    f->bad_off = f->extra_off + 2 + 127;
    break;
  case BPK_FIX_NOT_A_MAP:
    f->data[10] = 0x82;
    f->bad_off = 10;
    break;
  case BPK_FIX_NO_TENSORS:
    f->data[10 + 1 + 7] = 'z';
    f->bad_off = 10;
    break;
  case BPK_FIX_KEY_NOT_TEXT:
  case BPK_FIX_TOO_MANY_TENSORS: f->bad_off = 10; break;
  case BPK_FIX_DTYPE_UNKNOWN:
  case BPK_FIX_SHAPE_NOT_ARRAY:
  case BPK_FIX_SHAPE_NEGATIVE:
  case BPK_FIX_RANK_TOO_BIG:
  case BPK_FIX_OFFSETS_NOT_PAIR:
  case BPK_FIX_END_BEFORE_START:
  case BPK_FIX_SIZE_MISMATCH:
    f->bad_off = f->desc_off[0];
    f->bad_key = "enc.bias";
    break;
  case BPK_FIX_OVERLAP:
    f->bad_off = f->data_start + 16;
    f->bad_key = "enc.bias";
    break;
  case BPK_FIX_DUP_NAME:
    f->bad_off = f->desc_off[1]; /* the second enc.bias */
    f->bad_key = "enc.bias";
    break;
  case BPK_FIX_TRUNCATED_DATA:
    f->len -= 1;
    f->bad_off = f->len;
    f->bad_key = "step";
    break;
  case BPK_FIX_OFFSET_OVERFLOW:
    f->bad_off = f->desc_off[2];
    f->bad_key = "step";
    break;
  default: break;
  }
}

void bpk_fixture_free(struct bpk_fixture *f)
{
  free(f->data);
  memset(f, 0, sizeof *f);
}

/* The first 0xb8 bytes of the example in burnpack-format.md section 11, as printed there. */
static const char example11_hex[] =
    "4e525542 0100ae00 0000a267 74656e73 6f7273a2 6766632e 62696173 a3656474"
    "79706563 46333265 73686170 6581026c 64617461 5f6f6666 73657473 82190100"
    "19010869 66632e77 65696768 74a46564 74797065 63463332 65736861 70658202"
    "026c6461 74615f6f 66667365 74738200 10687061 72616d5f 69640768 6d657461"
    "64617461 a366666f 726d6174 68627572 6e706163 6b687072 6f647563 65726462"
    "75726e67 76657273 696f6e6c 302e3232 2e302d70 72652e32";

void bpk_fixture_example11(struct bpk_fixture *f)
{
  memset(f, 0, sizeof *f);
  f->len = 520;
  f->data = calloc(520, 1);
  if (!f->data)
    abort();
  size_t n = 0;
  for (const char *p = example11_hex; *p;) {
    if (*p == ' ') {
      p++;
      continue;
    }
    unsigned v;
    if (sscanf(p, "%2x", &v) != 1)
      abort();
    f->data[n++] = (uint8_t)v;
    p += 2;
  }
  if (n != 0xb8)
    abort();
  static const float w[4] = {1, 2, 3, 4}, b[2] = {0.5f, -1.0f};
  for (int i = 0; i < 4; i++)
    put_f32(f->data + 256 + 4 * i, w[i]);
  for (int i = 0; i < 2; i++)
    put_f32(f->data + 512 + 4 * i, b[i]);
  f->meta_len = 174;
  f->data_start = 256;
  f->desc_off[0] = 0x1c; /* fc.bias */
  f->desc_off[1] = 0x4d; /* fc.weight */
}

int bpk_fixture_read(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err)
{
  struct bs_src src;
  uint32_t idx;
  bs_catalog_init(cat);
  bs_err_clear(err);
  if (bs_src_init_mem(&src, buf, len, "test.bpk", err) != 0 ||
      bs_catalog_add_src(cat, &src, &idx, err) != 0)
    return -1;
  return bs_bpk_read(cat, idx, NULL, err);
}
