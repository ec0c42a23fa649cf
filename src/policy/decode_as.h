/* Decoded views: a tensor stored as one dtype presented as another (as=,
 * output_as=, convert --as), and why one stays as stored. The reads of a
 * decoded tensor are the core's (bs_tensor_read); what is decoded, and a
 * QFloat's layout from the scheme its file wrote (formats.h:
 * bs_qfloat_layout), are decided here. No FUSE. */
#ifndef BURNSTORE_POLICY_DECODE_AS_H
#define BURNSTORE_POLICY_DECODE_AS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/catalog.h"

/* Present every floating tensor whose dtype is not `as` as `as`, decoded
 * on read (decode.h): dtype becomes `as`, nbytes numel * 4 (F32) or * 2
 * (F16, BF16), decoded and stored_dtype are set, and bs_tensor_read
 * decodes the covering units of each range into a bounded buffer (to F32,
 * then narrowed to nearest even for F16 and BF16). `as` is F32, F16 or
 * BF16 (else EINVAL). Integer, bool and complex tensors stay as they are;
 * a floating dtype without a decoder stays as stored, with one note per
 * dtype in cat->notes. Writers see the decoded tensors (convert --as). */
BS_NODISCARD int bs_catalog_decode_as(struct bs_catalog *cat, enum bs_dtype as, bs_err *err);

/* True if bs_catalog_decode_as can decode t's stored dtype (F32 included:
 * narrowed), false for integers and floats without a decoder. */
bool bs_tensor_decodable(const struct bs_tensor *t);

/* Why bs_catalog_decode_as(as) shows floating tensor t as stored, written
 * into buf (n bytes): no decoder for its dtype (F6: why none), no torch
 * quantizer, a QFloat scheme not decoded, a strided view of units, or a
 * decoded size past what a file can hold (off_t); NULL when t is decoded,
 * or not floating. */
const char *bs_tensor_why_stored(const struct bs_tensor *t, enum bs_dtype as, char *buf, size_t n);

#endif
