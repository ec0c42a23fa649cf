/* Burnpack test fixtures built in memory: a valid small file, or the same file with exactly
 * one corruption injected, plus a spec-driven builder for layouts the tests need (0.19
 * unaligned, bare "Bool", QFloat, ...). Its CBOR encoder is separate from the writer's, so
 * the tests do not check the writer against itself. Memory comes from malloc, not bs_malloc,
 * so allocation-failure tests only hit the code under test. */
#ifndef BPK_FIXTURE_H
#define BPK_FIXTURE_H

#include "core/catalog.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum bpk_fix {
  BPK_FIX_NONE,
  BPK_FIX_SHORT_FILE,       /* 9 bytes */
  BPK_FIX_BAD_MAGIC,        /* "BURN" */
  BPK_FIX_BAD_VERSION,      /* version 2 */
  BPK_FIX_META_TOO_BIG,     /* metadata_size 100 MiB + 1 */
  BPK_FIX_META_PAST_EOF,    /* metadata_size = file size */
  BPK_FIX_BAD_CBOR,         /* a reserved CBOR head (0x1c) where enc.bias's descriptor starts */
  BPK_FIX_CBOR_TRUNCATED,   /* metadata_size 5 bytes short: the last text is cut */
  BPK_FIX_DEEP_NESTING,     /* an unknown top-level key holding 200 nested arrays */
  BPK_FIX_NOT_A_MAP,        /* the top-level item is an array */
  BPK_FIX_NO_TENSORS,       /* "tensors" renamed to "tensorz" */
  BPK_FIX_KEY_NOT_TEXT,     /* an integer key in the top-level map */
  BPK_FIX_DTYPE_UNKNOWN,    /* enc.bias dtype "F128" */
  BPK_FIX_SHAPE_NOT_ARRAY,  /* enc.bias shape 3 */
  BPK_FIX_SHAPE_NEGATIVE,   /* enc.bias shape [-3] */
  BPK_FIX_RANK_TOO_BIG,     /* enc.bias shape of 65 ones */
  BPK_FIX_OFFSETS_NOT_PAIR, /* enc.bias data_offsets [256, 268, 0] */
  BPK_FIX_END_BEFORE_START, /* enc.bias data_offsets [268, 256] */
  BPK_FIX_SIZE_MISMATCH,    /* enc.bias data_offsets [256, 266]: 10 bytes for 12 */
  BPK_FIX_OVERLAP,          /* enc.bias data_offsets [16, 28] overlaps enc.weight [0, 24) */
  BPK_FIX_DUP_NAME,         /* a second "enc.bias" at [768, 780) */
  BPK_FIX_TRUNCATED_DATA,   /* the file's last byte removed */
  BPK_FIX_OFFSET_OVERFLOW,  /* step data_offsets [2^64-16, 2^64-8]: D + end overflows */
  BPK_FIX_TOO_MANY_TENSORS, /* 100001 empty tensors */
  BPK_FIX_COUNT
};

#define BPK_FIX_MAX_RANK 80

/* One tensor of a spec. Raw CBOR overrides replace the encoded value when non-NULL. */
struct bpk_fix_tensor {
  const char *name;
  const uint8_t *dtype_raw; /* default: "F32" */
  size_t dtype_len;
  uint32_t rank;
  uint64_t shape[BPK_FIX_MAX_RANK];
  const uint8_t *shape_raw;
  size_t shape_len;
  uint64_t start, end; /* relative to the data section */
  const uint8_t *offsets_raw;
  size_t offsets_len;
  bool has_pid;
  uint64_t pid;
  const uint8_t *bytes; /* end - start bytes; default: byte i of the data section is i*7+1;
                           gaps between tensors are zero */
};

struct bpk_fix_spec {
  const struct bpk_fix_tensor *t; /* any order; emitted sorted by name (stable) */
  size_t n;
  const char *const (*meta)[2]; /* metadata pairs, emitted in the order given */
  size_t nmeta;
  const uint8_t *extra; /* raw CBOR key/value pairs appended to the top-level map */
  size_t extra_len, extra_pairs;
  bool unaligned;    /* 0.19 layout: the data starts at 10 + M */
  bool set_data_len; /* use data_len as the data section length instead of max(end) */
  uint64_t data_len;
  uint64_t trailing; /* extra zero bytes at the end */
};

struct bpk_fixture {
  uint8_t *data; /* malloc'd file bytes */
  size_t len;
  uint32_t meta_len;
  uint64_t data_start;  /* absolute start of the data section */
  uint64_t desc_off[8]; /* absolute offset of the first 8 descriptors, in emitted order */
  uint64_t extra_off;   /* absolute offset of spec->extra */
  uint64_t bad_off;     /* where the reader must point for the injected fault */
  const char *bad_key;  /* the tensor the error must name, or NULL */
};

/* The valid fixture (fault NONE) holds, in data order:
 *   enc.weight F32 [2,3] [0,24)   param_id 300   values 1..6
 *   enc.bias   F32 [3]   [256,268)               values 0.5 -1 2
 *   step       I64 []    [512,520) param_id 2^40 value -7
 * and metadata {"producer": "fixture"}; names in the CBOR are enc.bias, enc.weight, step. */
void bpk_fixture_build(enum bpk_fix fault, struct bpk_fixture *f);
void bpk_fixture_custom(const struct bpk_fix_spec *spec, struct bpk_fixture *f);
/* The 520 bytes of burnpack-format.md section 11 (fc.weight, fc.bias), built from its hex. */
void bpk_fixture_example11(struct bpk_fixture *f);
void bpk_fixture_free(struct bpk_fixture *f);

/* Read buf (a Burnpack named "test.bpk") into a fresh catalog with
 * bs_bpk_read; returns its result. */
int bpk_fixture_read(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err);

#endif
