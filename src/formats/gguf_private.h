/* GGUF (llama.cpp, ggml): what the reader (gguf.c) and the writer
 * (gguf_write.c) share. The parsed header keeps, for every key/value, the
 * GGUF value type and where the value's bytes are, so that the writer copies
 * unchanged values byte for byte and parses a changed one as its old type. */
#ifndef BURNSTORE_GGUF_PRIVATE_H
#define BURNSTORE_GGUF_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/sink.h"
#include "formats/formats.h"
#include "formats/write_common.h"

/* GGUF value types (docs/gguf.md, gguf_metadata_value_type). */
enum bs_gguf_vtype {
  BS_GG_U8,
  BS_GG_I8,
  BS_GG_U16,
  BS_GG_I16,
  BS_GG_U32,
  BS_GG_I32,
  BS_GG_F32,
  BS_GG_BOOL,
  BS_GG_STRING,
  BS_GG_ARRAY,
  BS_GG_U64,
  BS_GG_I64,
  BS_GG_F64,
  BS_GG_NTYPES
};
#define BS_GG_UNKNOWN 0xffu /* an element type nothing tells (inside an empty array) */

#define BS_GGUF_MAGIC "GGUF"
#define BS_GGUF_MAGIC_SWAPPED "FUGG" /* the magic as a big-endian writer's u32 */
#define BS_GGUF_DEFAULT_ALIGN 32u
#define BS_GGUF_MAX_DIMS 4u          /* GGML_MAX_DIMS */
#define BS_GGUF_MAX_NAME 63u         /* ggml's GGML_MAX_NAME (64) less the NUL: writer only */
#define BS_GGUF_MAX_DEPTH 8u         /* arrays of arrays nested this deep at most */
#define BS_GGUF_MAX_KEY 65535u       /* key length (the spec: up to 2^16 - 1 bytes) */
#define BS_GGUF_MAX_KV 1000000u      /* key/values in one file */
#define BS_GGUF_MAX_ALIGN (1u << 20) /* general.alignment we accept (ggml: any power of two) */
#define BS_GGUF_NTYPES 40u           /* ggml type ids 0..39 (MXFP4 = 39) */

struct bs_gguf_kv {
  char *key; /* owned */
  /* types[0]: the value's type; for an array, types[1] is its element type,
   * types[2] that of its first inner array (nested), and so on. */
  uint8_t types[BS_GGUF_MAX_DEPTH + 2];
  uint64_t off, len; /* the value's bytes in the file (after its type field) */
  uint64_t text_len; /* the length of its text (bs_gguf_parse; not made) */
};
_Static_assert(sizeof(((struct bs_meta_ref *)0)->types) == BS_GGUF_MAX_DEPTH + 2,
               "a catalog's metadata ref holds GGUF's types");

struct bs_gguf_ti {
  char *name; /* owned */
  uint32_t rank;
  uint64_t shape[BS_GGUF_MAX_DIMS]; /* row-major: GGUF's ne reversed */
  uint32_t gtype;                   /* ggml type id */
  enum bs_dtype dtype;
  uint64_t off;    /* relative to the data section */
  uint64_t nbytes; /* from the block table */
};

struct bs_gguf {
  uint32_t version;
  uint64_t alignment;
  uint64_t data_off; /* absolute start of the data section */
  struct bs_gguf_kv *kv;
  size_t nkv;
  struct bs_gguf_ti *ti;
  size_t nti;
};

/* Parse and validate the header of a GGUF file: key/values (types, byte
 * ranges, the length of their text: counted, not made), tensor infos,
 * alignment, every tensor's range. On failure *g is empty. */
BS_NODISCARD int bs_gguf_parse(const struct bs_src *s, struct bs_gguf *g, bs_err *err);
/* Whether s is a GGUF file of version 1 (32-bit sizes). */
BS_NODISCARD int bs_gguf_src_v1(const struct bs_src *s, bool *v1, bs_err *err);
/* Append value r of a version 1 file s to out as version 2 and 3 encode it
 * (its string and array lengths widened to u64). */
BS_NODISCARD int bs_gguf_widen(const struct bs_src *s, const struct bs_meta_ref *r,
                               struct bs_buf *out, bs_err *err);

/* Only the key/values' keys, types and byte ranges (a string value is
 * skipped, not read: its text length is 0), and no tensor infos: what the
 * metadata rules keep, in memory of the order of the keys, not the values. */
BS_NODISCARD int bs_gguf_parse_types(const struct bs_src *s, struct bs_gguf *g, bs_err *err);
void bs_gguf_free(struct bs_gguf *g);

/* ggml type id <-> dtype. -1 / false when there is none. */
int bs_gguf_dtype(uint32_t gtype, enum bs_dtype *out);
bool bs_gguf_type_of(enum bs_dtype dt, uint32_t *gtype);

/* The writer (gguf_write.c): its writers[] row. */
BS_NODISCARD int bs_gguf_can_write(const struct bs_tensor *t, bs_err *err);
/* GGUF tensor names: UTF-8 (the spec's strings), 1 to BS_GGUF_MAX_NAME bytes. */
BS_NODISCARD int bs_gguf_name_ok(const char *name, bs_err *err);
BS_NODISCARD int bs_gguf_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);
/* The file bs_gguf_write writes, as a plan (core/layout.h) appended to l
 * (empty): what the write emits and a -o view=gguf mount serves. A value
 * left in a GGUF source is a segment of that source, never copied here. */
struct bs_layout;
BS_NODISCARD int bs_gguf_layout(const struct bs_catalog *cat, struct bs_layout *l, bs_err *err);
/* The writers table's metadata columns. The rules: each key of the source's
 * GGUF header (srcs[0], if GGUF) with its type, parsed once (keys and types
 * only are kept). The check: a key is 1 to 65535 bytes of UTF-8; a key the
 * rules have must parse as its GGUF type (uint32 "7", JSON arrays of the
 * element type...; strings UTF-8); general.alignment must be a power of two;
 * any other key becomes a string (UTF-8). Without rules (a write) only the
 * key's length is checked: the writer checks changed values as it encodes
 * them, and copies unchanged ones. */
BS_NODISCARD int bs_gguf_meta_rules(const struct bs_catalog *src, struct bs_meta_rules **out,
                                    bs_err *err);
void bs_gguf_meta_rules_free(struct bs_meta_rules *rules);
BS_NODISCARD int bs_gguf_check_meta(const struct bs_meta_rules *rules, const char *key,
                                    const char *value, size_t len, bs_err *err);
/* Encode metadata text as a GGUF value of the given types (types[0] the
 * value's type): the value's bytes, appended to b. 0, or -1 with err
 * (EINVAL: the text is not a value of that type, or a string is not UTF-8). */
BS_NODISCARD int bs_gguf_encode_value(const char *key, const char *text, const uint8_t *types,
                                      struct bs_buf *b, bs_err *err);

#endif
