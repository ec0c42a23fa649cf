/* Burnpack's dtypes as its CBOR spells them (burnpack_dtype.h): the plain
 * names and Bool storages, and the QFloat scheme map read as a layout
 * (core/qfloat.h), which the decoded views read through. Our own code from
 * the scheme map's description (/work/shared/docs/burnpack-format.md
 * section 4.2; cubecl crates/cubecl-common/src/quant/scheme.rs: QuantValue,
 * QuantStore, BlockSize::to_dim_vec, ue8m0_to_f32) and burn-std's byte
 * layout (crates/burn-std/src/tensor/quantization.rs: QuantizedBytes::new,
 * quantized_data_len, storage_elements). */
#include "formats/burnpack_dtype.h"

#include <cbor.h>
#include <stdbool.h>
#include <string.h>

#include "core/checked.h"
#include "core/qfloat.h"
#include "formats/cbor_item.h"
#include "formats/formats.h"

/* ---- Plain dtypes ---------------------------------------------------------------------------- */

static const struct {
  enum bs_dtype dt;
  const char *name;
} plain[] = {
    {BS_DT_F64, "F64"},       {BS_DT_F32, "F32"}, {BS_DT_F16, "F16"}, {BS_DT_BF16, "BF16"},
    {BS_DT_I64, "I64"},       {BS_DT_I32, "I32"}, {BS_DT_I16, "I16"}, {BS_DT_I8, "I8"},
    {BS_DT_U64, "U64"},       {BS_DT_U32, "U32"}, {BS_DT_U16, "U16"}, {BS_DT_U8, "U8"},
    {BS_DT_FLEX32, "Flex32"},
};

/* {"Bool": storage} */
static const struct {
  enum bs_dtype dt;
  const char *storage;
} bools[] = {{BS_DT_BOOL, "Native"}, {BS_DT_BOOL_U8, "U8"}, {BS_DT_BOOL_U32, "U32"}};

const char *bs_dtype_bpk_name(enum bs_dtype dt)
{
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
    if (plain[i].dt == dt)
      return plain[i].name;
  return NULL;
}

const char *bs_dtype_bpk_bool(enum bs_dtype dt)
{
  for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
    if (bools[i].dt == dt)
      return bools[i].storage;
  return NULL;
}

int bs_dtype_from_bpk_name(const char *name, enum bs_dtype *out)
{
  if (strcmp(name, "Bool") == 0) { /* bare "Bool": burn <= 0.20 */
    *out = BS_DT_BOOL;
    return 0;
  }
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
    if (strcmp(plain[i].name, name) == 0) {
      *out = plain[i].dt;
      return 0;
    }
  return -1;
}

int bs_dtype_from_bpk_bool(const char *storage, enum bs_dtype *out)
{
  for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
    if (strcmp(bools[i].storage, storage) == 0) {
      *out = bools[i].dt;
      return 0;
    }
  return -1;
}

/* ---- QFloat ---------------------------------------------------------------------------------- */

static bool text_is(const cbor_item_t *it, const char *s)
{
  it = bs_cbor_untag(it);
  return it && cbor_isa_string(it) && cbor_string_is_definite(it) &&
         cbor_string_length(it) == strlen(s) && memcmp(cbor_string_handle(it), s, strlen(s)) == 0;
}

/* The value of text key `k` in map m, or NULL. */
static const cbor_item_t *get(const cbor_item_t *m, const char *k)
{
  struct cbor_pair *p = cbor_map_handle(m);
  for (size_t i = 0; i < cbor_map_size(m); i++)
    if (text_is(p[i].key, k))
      return bs_cbor_untag(p[i].value);
  return NULL;
}

static enum bs_dtype scale_dtype(const cbor_item_t *it)
{
  if (text_is(it, "F32"))
    return BS_DT_F32;
  if (text_is(it, "F16"))
    return BS_DT_F16;
  if (text_is(it, "BF16"))
    return BS_DT_BF16;
  if (text_is(it, "UE8M0"))
    return BS_DT_F8_E8M0; /* ue8m0_to_f32: code 0 is 2^-127, 0xff NaN, else 2^(code - 127) */
  if (text_is(it, "UE4M3"))
    return BS_DT_F8_E4M3; /* cubecl's e4m3 type (OCP E4M3FN) */
  return BS_DT_COUNT;
}

static bool get_uint(const cbor_item_t *it, uint64_t *out)
{
  it = bs_cbor_untag(it);
  if (!it || !cbor_isa_uint(it))
    return false;
  *out = cbor_get_int(it);
  return true;
}

/* A BlockSize {"storage": [5 uints], "len": n} into dims[rank]: its first
 * len values, right-aligned, leading dims 1 (BlockSize::to_dim_vec). */
static bool block_size(const cbor_item_t *b, uint32_t rank, uint64_t *dims)
{
  b = bs_cbor_untag(b);
  if (!b || !cbor_isa_map(b) || !cbor_map_is_definite(b))
    return false;
  const cbor_item_t *st = get(b, "storage");
  uint64_t len;
  if (!st || !cbor_isa_array(st) || !cbor_array_is_definite(st) || cbor_array_size(st) != 5 ||
      !get_uint(get(b, "len"), &len) || len > 5)
    return false;
  uint64_t v[5];
  for (size_t i = 0; i < 5; i++)
    if (!get_uint(cbor_array_handle(st)[i], &v[i]) || v[i] == 0 || v[i] > 255)
      return false;
  for (uint32_t d = 0; d < rank; d++)
    dims[d] = 1;
  uint64_t n = len < rank ? len : rank;
  for (uint64_t i = 0; i < n; i++)
    dims[rank - n + i] = v[i];
  return true;
}

/* The value kind: bits and, for float codes, their dtype. */
static bool value_kind(const cbor_item_t *v, struct bs_qfloat *q, const char **why)
{
  static const struct {
    const char *name;
    unsigned bits;
    enum bs_dtype fdt;
  } vals[] = {{"Q8F", 8, BS_DT_I8},       {"Q8S", 8, BS_DT_I8},      {"Q4F", 4, BS_DT_I8},
              {"Q4S", 4, BS_DT_I8},       {"Q2F", 2, BS_DT_I8},      {"Q2S", 2, BS_DT_I8},
              {"E4M3", 8, BS_DT_F8_E4M3}, {"E5M2", 8, BS_DT_F8_E5M2}};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    if (text_is(v, vals[i].name)) {
      q->bits = vals[i].bits;
      q->fdt = vals[i].fdt;
      return true;
    }
  }
  *why = text_is(v, "E2M1") ? "E2M1 values (burn-std defines no byte order for two a byte)"
                            : "an unknown value type";
  return false;
}

/* The store: *packed (PackedU32 along the innermost dimension, or v0.19's
 * "U32") or a byte per value (Native, PackedNative of a value that packs
 * one a byte). */
static bool store_kind(const cbor_item_t *s, bool *packed, const char **why)
{
  s = bs_cbor_untag(s);
  if (text_is(s, "Native")) {
    *packed = false;
    return true;
  }
  if (text_is(s, "U32")) {
    *packed = true;
    return true;
  }
  uint64_t dim;
  if (s && cbor_isa_map(s) && cbor_map_is_definite(s) && cbor_map_size(s) == 1) {
    const cbor_item_t *k = cbor_map_handle(s)[0].key;
    bool u32 = text_is(k, "PackedU32"), native = text_is(k, "PackedNative");
    if ((u32 || native) && get_uint(cbor_map_handle(s)[0].value, &dim)) {
      if (u32 && dim != 0) {
        *why = "PackedU32 along an outer dimension";
        return false;
      }
      *packed = u32;
      return true;
    }
  }
  *why = "an unknown store";
  return false;
}

static bool mul(uint64_t a, uint64_t b, uint64_t *out)
{
  return !__builtin_mul_overflow(a, b, out);
}

static bool parse(const cbor_item_t *s, uint32_t rank, struct bs_qfloat *q, bool *packed,
                  const char **why)
{
  if (!text_is(get(s, "mode"), "Symmetric")) {
    *why = "the Lookup mode (its table is not in the file)";
    return false;
  }
  if (!value_kind(get(s, "value"), q, why) || !store_kind(get(s, "store"), packed, why))
    return false;
  if (q->fdt != BS_DT_I8 && *packed) {
    *why = "float values packed in u32 words";
    return false;
  }
  const cbor_item_t *block = get(s, "block"), *level = get(s, "level"), *tensor = get(s, "tensor");
  bool has_block = false;
  if (cbor_map_size(s) == 5 && block && !level && get(s, "tensor")) { /* current */
    bool tnull = cbor_is_null(tensor), bnull = cbor_is_null(block);
    if (!tnull && !bnull) {
      *why = "two-level scales";
      return false;
    }
    if (bnull) {
      q->scale_dt = tnull ? BS_DT_F32 : scale_dtype(tensor); /* no level: per tensor, F32 */
    } else {
      if (!cbor_isa_map(block) || !cbor_map_is_definite(block) || cbor_map_size(block) != 2 ||
          !block_size(get(block, "size"), rank, q->block)) {
        *why = "a malformed block";
        return false;
      }
      q->scale_dt = scale_dtype(get(block, "dtype"));
      has_block = true;
    }
  } else if (cbor_map_size(s) == 5 && level && !block && get(s, "param")) { /* v0.19-0.21 */
    q->scale_dt = scale_dtype(get(s, "param"));
    if (!text_is(level, "Tensor")) {
      const cbor_item_t *lb = NULL;
      if (cbor_isa_map(level) && cbor_map_is_definite(level) && cbor_map_size(level) == 1 &&
          text_is(cbor_map_handle(level)[0].key, "Block"))
        lb = cbor_map_handle(level)[0].value;
      if (!lb || !block_size(lb, rank, q->block)) {
        *why = "an unknown level";
        return false;
      }
      /* only blocks along the last dimension: with it a whole number of
       * blocks they are also runs of the flattened tensor, whichever way
       * that burn counted them */
      for (uint32_t d = 0; d + 1 < rank; d++)
        if (q->block[d] != 1) {
          *why = "a v0.19-0.21 block over more than the last dimension";
          return false;
        }
      has_block = true;
    }
  } else {
    *why = "an unknown scheme map";
    return false;
  }
  if (q->scale_dt == BS_DT_COUNT) {
    *why = "an unknown scale dtype";
    return false;
  }
  if (!has_block)
    for (uint32_t d = 0; d < rank; d++)
      q->block[d] = q->shape[d] ? q->shape[d] : 1; /* one block: the tensor */
  q->nscales = 1;
  for (uint32_t d = 0; d < rank; d++) {
    if (q->shape[d] % q->block[d] != 0) {
      *why = "blocks that do not divide the shape";
      return false;
    }
    q->grid[d] = q->shape[d] / q->block[d];
    if (!mul(q->nscales, q->grid[d], &q->nscales)) {
      *why = "too many blocks";
      return false;
    }
  }
  return true;
}

bool bs_qfloat_layout(const uint8_t *raw, size_t len, uint32_t rank, const uint64_t *shape,
                      uint64_t nbytes, struct bs_qfloat *q, const char **why)
{
  const char *dummy;
  if (!why)
    why = &dummy;
  *why = "not a QFloat scheme";
  memset(q, 0, sizeof *q);
  if (!raw || len == 0)
    return false;
  if (rank > BS_QF_MAX_RANK) {
    *why = "rank above 8";
    return false;
  }
  q->rank = rank ? rank : 1;
  q->numel = 1;
  for (uint32_t d = 0; d < q->rank; d++) {
    q->shape[d] = rank ? shape[d] : 1;
    if (!mul(q->numel, q->shape[d], &q->numel))
      return false;
  }
  q->inner = q->shape[q->rank - 1];
  struct cbor_load_result res;
  cbor_item_t *root = cbor_load(raw, len, &res);
  bool ok = false, packed = false;
  if (!root || res.error.code != CBOR_ERR_NONE || res.read != len)
    goto out;
  const cbor_item_t *v = bs_cbor_untag(root);
  if (!cbor_isa_map(v) || !cbor_map_is_definite(v) || cbor_map_size(v) != 1 ||
      !text_is(cbor_map_handle(v)[0].key, "QFloat"))
    goto out;
  const cbor_item_t *s = bs_cbor_untag(cbor_map_handle(v)[0].value);
  if (!s || !cbor_isa_map(s) || !cbor_map_is_definite(s) || !parse(s, q->rank, q, &packed, why))
    goto out;
  if (q->numel == 0) {
    *why = "no elements";
    goto out;
  }
  /* the values: quantized_data_len's value_bytes, no padding after them
   * (QuantizedBytes aligns the scales to 4 bytes; quantized_data_len counts
   * no padding) */
  const uint64_t ssz = bs_dtype_bits(q->scale_dt) / 8;
  uint64_t sbytes, rows_bytes = 0, flat_bytes = 0;
  if (!mul(q->nscales, ssz, &sbytes))
    goto out;
  if (!packed) {
    q->layout = BS_QF_BYTES;
    q->value_bytes = q->numel;
  } else {
    const uint64_t pw = 32 / q->bits, rows = q->numel / q->inner;
    q->words_per_row = q->inner / pw + (q->inner % pw != 0);
    if (q->words_per_row == 0)
      q->words_per_row = 1;
    if (!mul(rows, q->words_per_row, &rows_bytes) || !mul(rows_bytes, 4, &rows_bytes))
      goto out;
    flat_bytes = (q->numel / pw + (q->numel % pw != 0)) * 4;
    const bool same = rows == 1 || q->inner % pw == 0; /* the two layouts are one */
    const bool fits_rows = nbytes - sbytes == rows_bytes, fits_flat = nbytes - sbytes == flat_bytes;
    if (nbytes < sbytes || (!fits_rows && !fits_flat))
      q->layout = BS_QF_ROWS; /* the length check below refuses it */
    else if (same || !fits_flat)
      q->layout = BS_QF_ROWS;
    else if (!fits_rows)
      q->layout = BS_QF_FLAT;
    else {
      *why = "a length that fits both packings (rows padded to words, or flattened)";
      goto out;
    }
    q->value_bytes = q->layout == BS_QF_ROWS ? rows_bytes : flat_bytes;
  }
  if (q->value_bytes % 4 != 0 && sbytes != 0) {
    *why = "values whose length needs padding before the scales";
    goto out;
  }
  if (q->value_bytes > nbytes || nbytes - q->value_bytes != sbytes) {
    *why = "a length that is not values + scales";
    goto out;
  }
  ok = true;
out:
  if (root)
    cbor_decref(&root);
  return ok;
}
