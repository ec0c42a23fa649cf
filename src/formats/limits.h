/* The formats' hard caps: every allocation a reader or writer makes from a
 * file's numbers is bounded by one of these (or by its parser's private
 * header: zip.h BS_ZIP_*, gguf_private.h BS_GGUF_*); the catalog's own are
 * in core/checked.h. */
#ifndef BURNSTORE_FORMATS_LIMITS_H
#define BURNSTORE_FORMATS_LIMITS_H

#define BS_BPK_MAX_META (100u * 1024 * 1024) /* burn's metadata_size limit */
#define BS_BPK_MAX_TENSORS 100000u           /* burn's tensor count limit */
#define BS_BPK_ALIGN 256u
#define BS_CBOR_MAX_DEPTH 128u
#define BS_CBOR_MAX_ITEMS (1u << 24) /* CBOR heads in one metadata block */
#define BS_ST_MAX_HEADER 100000000u  /* safetensors' header limit */
#define BS_ST_INDEX_MAX 100000000u   /* bytes of a sharded checkpoint's index.json */
#define BS_ST_MAX_SHARDS 100000u     /* shards one index may name */
#define BS_PICKLE_MAX_DEPTH 1000u    /* nesting of pickled containers */
#define BS_PICKLE_MAX_MEMO 10000000u
#define BS_PICKLE_MAX_BYTES (1u << 30)       /* pickle stream we are willing to load */
#define BS_PTH_REPICKLE_MAX_NODES (1u << 22) /* values re-pickled by a .pth rewrite in place */
#define BS_PICKLE_MAX_ALLOC (4ull << 30)     /* bytes of values one unpickler may build */
/* What one unpickler may use, scaled by the bytes of the file its streams
 * come from (a deflated zip member inflates up to 1032:1; one opcode byte
 * can make a value): memory the larger of FLOOR and PER_BYTE x the file
 * (its values, stack, memo and input window, and what its caller keeps of
 * them: the catalog entries of the tensors found, bs_pickle_charge), and
 * WORK_FLOOR + WORK_PER_BYTE x the file opcodes. A .pth under 2 MiB may use
 * 48 MiB (a re-zipped torch.save of 30,000 views, 770 KB, needs 45: its
 * peak is 54 MB), and any costs under 64 MiB whatever its pickle does. */
#define BS_PICKLE_MEM_FLOOR (48ull << 20)
#define BS_PICKLE_MEM_PER_BYTE 24u
#define BS_PICKLE_WORK_FLOOR (1ull << 20)
#define BS_PICKLE_WORK_PER_BYTE 32u
#define BS_META_TEXT_MAX (48u << 20) /* metadata made text for a writer that wants text */

#endif
