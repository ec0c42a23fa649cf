/* Decoded views (decode_as.h): which tensors are shown decoded as a dtype,
 * and why the others stay as stored. */
#include "policy/decode_as.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "core/qfloat.h"
#include "formats/formats.h"

/* Why t stays as stored when presented as a dtype of osz bytes an element
 * (osz 0: whatever its size), or NULL when it is decoded. The reason is a
 * fixed text (notes group tensors by it); *detail, when not empty, says it
 * of this tensor. Decoding needs: a readable tensor, a decoder of its dtype
 * (a QFloat scheme its format reads as a layout, a torch quantizer its reader
 * kept),
 * units of one element when strided (ggml's blocks and F4's pairs run along
 * the last dimension, and no reader makes a strided view of them), a whole
 * number of units, and a decoded size a file can have (an off_t: stat and
 * every offset of the mount are one). On NULL, *ql holds a QFloat layout. */
static const char *keep_reason(const struct bs_tensor *t, uint32_t osz, struct bs_qfloat *ql,
                               uint64_t *nbytes, char *detail, size_t dn)
{
  uint32_t ue = 1, ub;
  uint64_t numel;
  const char *why = NULL;
  detail[0] = '\0';
  if (t->x->unsupported)
    return "it cannot be read at all (its note says why)";
  if (t->dtype == BS_DT_QFLOAT) {
    if (t->x->strides)
      return "a strided view of a QFloat tensor, whose values and scales are laid out for the "
             "whole tensor";
    if (!bs_qfloat_layout(t->x->dtype_raw, t->x->dtype_raw_len, t->rank, t->shape, t->nbytes, ql,
                          &why)) {
      snprintf(detail, dn, "%s", why ? why : "an unreadable scheme");
      return "burnstore does not decode this QFloat layout";
    }
  } else if (t->dtype == BS_DT_QI8 || t->dtype == BS_DT_QU8 || t->dtype == BS_DT_QI32) {
    if (!bs_tensor_stored_unit(t, t->dtype, &ue, &ub))
      return "its torch quantizer (scale and zero point) is not in the file, or its per-channel "
             "scales do not match the tensor's channels";
  } else if (!bs_tensor_stored_unit(t, t->dtype, &ue, &ub)) {
    if ((why = bs_decode_why_not(t->dtype)))
      return why;
    return "no decoder for this dtype yet";
  }
  if (t->x->strides && ue > 1) {
    snprintf(detail, dn, "units of %" PRIu32 " elements", ue);
    return "a strided view of a dtype whose units run along the last dimension";
  }
  if (bs_shape_numel(t->rank, t->shape, &numel) != 0)
    return "its element count overflows";
  if (numel % ue != 0) {
    snprintf(detail, dn, "'%.100s' has %" PRIu64 " elements, units of %" PRIu32, t->name, numel,
             ue);
    return "its elements are not a whole number of its dtype's units";
  }
  if (osz && (!bs_mul_u64(numel, osz, nbytes) || *nbytes > (uint64_t)INT64_MAX)) {
    snprintf(detail, dn, "'%.100s' is %" PRIu64 " elements of %" PRIu32 " bytes", t->name, numel,
             osz);
    return "its decoded size does not fit a file size (2^63 - 1 bytes)";
  }
  return NULL;
}

bool bs_tensor_decodable(const struct bs_tensor *t)
{
  struct bs_qfloat q;
  uint64_t nb;
  char d[8];
  return bs_dtype_is_float(t->dtype) && !keep_reason(t, 0, &q, &nb, d, sizeof d);
}

const char *bs_tensor_why_stored(const struct bs_tensor *t, enum bs_dtype as, char *buf, size_t n)
{
  struct bs_qfloat q;
  uint64_t nb;
  char detail[200];
  if (!bs_dtype_is_float(t->dtype) || t->dtype == as || t->decoded)
    return NULL;
  const char *why = keep_reason(t, bs_dtype_bits(as) / 8, &q, &nb, detail, sizeof detail);
  if (why && strncmp(why, "no decoder", 10) == 0)
    snprintf(buf, n, "no decoder for %s yet", bs_dtype_name(t->dtype));
  else if (why)
    snprintf(buf, n, "%s%s%s", why, detail[0] ? ": " : "", detail);
  return why ? buf : NULL;
}

/* The tensors bs_catalog_decode_as keeps as stored, grouped by dtype and
 * reason: one note each, with the first tensor's detail. */
struct kept {
  enum bs_dtype dt;
  const char *why;
  size_t n;
  char first[240];
};

int bs_catalog_decode_as(struct bs_catalog *cat, enum bs_dtype as, bs_err *err)
{
  if (!bs_encode_ok(as))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "as=%s: only F32, F16 or BF16",
                   bs_dtype_name(as));
  const uint32_t osz = bs_dtype_bits(as) / 8;
  struct kept *kept = NULL;
  size_t nkept = 0, keptcap = 0;
  int rc = 0;
  for (size_t i = 0; i < cat->count && rc == 0; i++) {
    struct bs_tensor *t = &cat->tensors[i];
    struct bs_qfloat ql;
    uint64_t nbytes = 0;
    if (t->decoded || t->dtype == as || !bs_dtype_is_float(t->dtype))
      continue;
    const bool qf = t->dtype == BS_DT_QFLOAT;
    char detail[200];
    const char *why = keep_reason(t, osz, &ql, &nbytes, detail, sizeof detail);
    if (why) {
      size_t g = 0;
      while (g < nkept && (kept[g].dt != t->dtype || kept[g].why != why))
        g++;
      if (g == nkept) {
        if (bs_grow((void **)&kept, &keptcap, nkept + 1, sizeof *kept) != 0) {
          rc = bs_fail(err, ENOMEM, BS_OFF_NONE, t->key, "out of memory");
          break;
        }
        kept[g] = (struct kept){t->dtype, why, 0, {0}};
        if (detail[0])
          snprintf(kept[g].first, sizeof kept[g].first, ": %s", detail);
        nkept++;
      }
      kept[g].n++;
      continue;
    }
    if (qf) { /* the layout replaces the scheme: reads use it (catalog.c) */
      struct bs_qfloat *q = bs_malloc(sizeof *q);
      if (!q) {
        rc = bs_fail(err, ENOMEM, BS_OFF_NONE, t->key, "out of memory");
        break;
      }
      *q = ql;
      bs_free(t->x->dtype_raw);
      t->x->dtype_raw = (uint8_t *)q;
      t->x->dtype_raw_len = sizeof *q;
      t->x->storage_bytes = t->nbytes; /* the stored length, for the reads */
    }
    t->stored_dtype = (uint8_t)t->dtype;
    t->dtype = as;
    t->nbytes = nbytes;
    t->decoded = true;
  }
  for (size_t g = 0; g < nkept && rc == 0; g++) {
    char line[600];
    const char *why = kept[g].why;
    char nodec[64];
    if (strncmp(why, "no decoder", 10) == 0) {
      snprintf(nodec, sizeof nodec, "no decoder for %s", bs_dtype_name(kept[g].dt));
      why = nodec;
    }
    snprintf(line, sizeof line, "as=%s: %zu %s tensor%s shown as stored (%s%s)", bs_dtype_name(as),
             kept[g].n, bs_dtype_name(kept[g].dt), kept[g].n == 1 ? "" : "s", why, kept[g].first);
    rc = bs_catalog_note(cat, line, err);
  }
  bs_free(kept);
  return rc;
}
