/* libburnstore: model checkpoints (Burnpack, SafeTensors and their shard
 * sets, PyTorch .pt/.pth, GGUF; local files, http(s)://, hf://, s3://) as
 * catalogs of tensors, read in place, and written in any of those formats.
 *
 * This header is the library's whole API: everything else in the library is
 * hidden (not exported, not installed). Handles are opaque; every value
 * crosses as a C type or a pointer to one. See docs/library.md.
 *
 *     cc prog.c $(pkg-config --cflags --libs burnstore)
 *
 * Conventions:
 *  - Call burnstore_init() once before anything else (burnstore_version()
 *    and the error getters excepted), and burnstore_shutdown() when done.
 *  - A function that can fail returns 0 or an error code (an errno value of
 *    <errno.h>: ENOENT, EINVAL, EIO, ENOMEM, ENOTSUP, EEXIST, ERANGE,
 *    ENODATA, ESTALE, EBUSY...), or a handle that is NULL on failure. The
 *    calling thread's last failure is kept: burnstore_errcode() gives its
 *    code and burnstore_errmsg() one line of text that says what, where
 *    (file, byte offset, tensor key) and why. Like errno, a success leaves
 *    them as they were.
 *  - Ownership: handles come from burnstore_open / burnstore_writer_new and
 *    go back through burnstore_close / burnstore_writer_free (NULL is a
 *    no-op). Strings and arrays the library returns are borrowed: valid as
 *    long as the handle they came from, never freed by the caller.
 *  - Text values are copied into caller buffers, getxattr-style: with
 *    size 0 (buf may be NULL) only *len, the value's length without the
 *    NUL, is set; a value of size bytes or more fails with ERANGE (*len
 *    set, buf untouched); else the value and a NUL are written.
 *  - Threads: a checkpoint may be read (accessors, burnstore_tensor_read)
 *    from several threads at once; burnstore_close must not race with them.
 *    A writer is used by one thread at a time. Error state is per thread.
 *
 * ABI: the library's SONAME is libburnstore.so.MAJOR.MINOR; while MAJOR is
 * 0, every MINOR may break the ABI and moves the SONAME (the Debian symbols
 * file records every exported function). */
#ifndef BURNSTORE_H
#define BURNSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BURNSTORE_API __attribute__((visibility("default")))

/* The release this header belongs to (CMake's project() version; the build
 * refuses a header that disagrees). */
#define BURNSTORE_VERSION_MAJOR 0
#define BURNSTORE_VERSION_MINOR 2
#define BURNSTORE_VERSION_PATCH 0
#define BURNSTORE_VERSION_NUM                                                                      \
  ((BURNSTORE_VERSION_MAJOR << 16) | (BURNSTORE_VERSION_MINOR << 8) | BURNSTORE_VERSION_PATCH)

/* ---- The library ---------------------------------------------------------------------------- */

/* Set up the process-wide state: libcurl's global init (as libcurl asks:
 * before the program starts threads that use it), jansson's allocator
 * (malloc-compatible, set once for the process) and the default log (lines
 * on stderr). Counted: every successful call needs one burnstore_shutdown.
 * flags: 0 (others are EINVAL). Returns 0 or an error code. Thread-safe. */
BURNSTORE_API int burnstore_init(unsigned flags);
/* Undo one burnstore_init. The last one (every handle must be closed by
 * then) restores the default log and releases libcurl's global state; the
 * HTTP layer's idle read-ahead threads, once started, stay until the process
 * exits. Afterwards only burnstore_init may be called again. */
BURNSTORE_API void burnstore_shutdown(void);

/* The library's version: "0.2.0", and BURNSTORE_VERSION_NUM's encoding of
 * it ((major << 16) | (minor << 8) | patch), which may differ from the
 * header's when a program runs against a newer library. */
BURNSTORE_API const char *burnstore_version(void);
BURNSTORE_API unsigned burnstore_version_num(void);

/* The calling thread's last failure: its code (0 if none yet) and its one
 * line of text ("" if none), valid until this thread's next failing call. */
BURNSTORE_API int burnstore_errcode(void);
BURNSTORE_API const char *burnstore_errmsg(void);

/* Where the library's log lines go: failures met where no caller gets an
 * error (a remote source's read-ahead failing, a retried request), at
 * syslog's levels. fn(ctx, level, line): one line without its newline,
 * control characters replaced by '?'; called from any thread, also the
 * library's own; it must not call back into the library. NULL (the
 * default): "burnstore: LINE" on stderr. Set it before opening anything. */
enum { BURNSTORE_LOG_ERR = 3, BURNSTORE_LOG_WARNING = 4, BURNSTORE_LOG_INFO = 6 };
typedef void (*burnstore_log_fn)(void *ctx, int level, const char *line);
BURNSTORE_API void burnstore_set_log(burnstore_log_fn fn, void *ctx);

/* ---- Element types ------------------------------------------------------------------------ */

/* The values are fixed (the ABI); a new type gets a new value at the end.
 * Names as burnstore_dtype_name spells them (SafeTensors' spelling where it
 * has one). Sub-byte, block and opaque types have no bytes per element:
 * burnstore_dtype_bits and burnstore_dtype_block say how their bytes go. */
typedef enum burnstore_dtype {
  BURNSTORE_DT_F64 = 0,
  BURNSTORE_DT_F32 = 1,
  BURNSTORE_DT_F16 = 2,
  BURNSTORE_DT_BF16 = 3,
  BURNSTORE_DT_I64 = 4,
  BURNSTORE_DT_I32 = 5,
  BURNSTORE_DT_I16 = 6,
  BURNSTORE_DT_I8 = 7,
  BURNSTORE_DT_U64 = 8,
  BURNSTORE_DT_U32 = 9,
  BURNSTORE_DT_U16 = 10,
  BURNSTORE_DT_U8 = 11,
  BURNSTORE_DT_BOOL = 12, /* one byte, 0 or 1 */
  BURNSTORE_DT_F8_E4M3 = 13,
  BURNSTORE_DT_F8_E5M2 = 14,
  BURNSTORE_DT_F8_E8M0 = 15,
  BURNSTORE_DT_F8_E4M3FNUZ = 16,
  BURNSTORE_DT_F8_E5M2FNUZ = 17,
  BURNSTORE_DT_F6_E2M3 = 18, /* 6 bits: 4 elements in 3 bytes */
  BURNSTORE_DT_F6_E3M2 = 19,
  BURNSTORE_DT_F4 = 20, /* 4 bits: 2 elements a byte, the first in the low bits */
  BURNSTORE_DT_C64 = 21,
  BURNSTORE_DT_C128 = 22,
  BURNSTORE_DT_FLEX32 = 23,   /* Burn's Flex32: stored as F32 */
  BURNSTORE_DT_BOOL_U8 = 24,  /* Burn's Bool(U8): one byte 0/1 */
  BURNSTORE_DT_BOOL_U32 = 25, /* Burn's Bool(U32): u32 0/1 */
  BURNSTORE_DT_QFLOAT = 26,   /* Burn's quantized tensors: opaque bytes */
  BURNSTORE_DT_QI8 = 27,      /* torch.qint8: the raw int8 values */
  BURNSTORE_DT_QU8 = 28,      /* torch.quint8 */
  BURNSTORE_DT_QI32 = 29,     /* torch.qint32 */
  /* ggml's quantized block types (GGUF): blocks of a fixed number of
   * elements and bytes (burnstore_dtype_block) along the last dimension. */
  BURNSTORE_DT_Q4_0 = 30,
  BURNSTORE_DT_Q4_1 = 31,
  BURNSTORE_DT_Q5_0 = 32,
  BURNSTORE_DT_Q5_1 = 33,
  BURNSTORE_DT_Q8_0 = 34,
  BURNSTORE_DT_Q8_1 = 35,
  BURNSTORE_DT_Q2_K = 36,
  BURNSTORE_DT_Q3_K = 37,
  BURNSTORE_DT_Q4_K = 38,
  BURNSTORE_DT_Q5_K = 39,
  BURNSTORE_DT_Q6_K = 40,
  BURNSTORE_DT_Q8_K = 41,
  BURNSTORE_DT_IQ2_XXS = 42,
  BURNSTORE_DT_IQ2_XS = 43,
  BURNSTORE_DT_IQ3_XXS = 44,
  BURNSTORE_DT_IQ1_S = 45,
  BURNSTORE_DT_IQ4_NL = 46,
  BURNSTORE_DT_IQ3_S = 47,
  BURNSTORE_DT_IQ2_S = 48,
  BURNSTORE_DT_IQ4_XS = 49,
  BURNSTORE_DT_IQ1_M = 50,
  BURNSTORE_DT_TQ1_0 = 51,
  BURNSTORE_DT_TQ2_0 = 52,
  BURNSTORE_DT_MXFP4 = 53,
  BURNSTORE_DTYPE_COUNT /* one past the last value of this version */
} burnstore_dtype;

/* "F32", "BF16", "Q4_0"...; NULL for a value out of range. */
BURNSTORE_API const char *burnstore_dtype_name(burnstore_dtype dt);
/* The dtype a name spells (as burnstore_dtype_name): 0, or EINVAL. */
BURNSTORE_API int burnstore_dtype_from_name(const char *name, burnstore_dtype *out);
/* Bits per element: 64, 32, 16, 8, 6, 4; 0 for the block types and QFLOAT. */
BURNSTORE_API unsigned burnstore_dtype_bits(burnstore_dtype dt);
/* A block type: true, with *elems elements in *bytes bytes a block (Q8_0:
 * 32 in 34); false for every other type (elems and bytes untouched). */
BURNSTORE_API bool burnstore_dtype_block(burnstore_dtype dt, uint32_t *elems, uint32_t *bytes);

/* ---- Opening a checkpoint ------------------------------------------------------------------- */

typedef struct burnstore_checkpoint burnstore_checkpoint;
typedef struct burnstore_tensor burnstore_tensor;

/* Open a checkpoint and read its header (no tensor data): source is a file
 * (the format is told from its bytes), a directory (the one
 * NAME.safetensors.index.json in it), or an http://, https://, hf://ORG/REPO/PATH
 * or s3://BUCKET/KEY URL (read by range requests; the environment variables
 * of burnstore(1) apply: BURNSTORE_HTTP_TOKEN, HF_TOKEN, AWS_*...). A shard
 * set a killed writer left half-committed is completed or rolled back
 * first, as the mount and the CLI do.
 *
 * options: NULL, or the mount's option string for what a reader sees
 * (comma-separated; "\," is a comma inside a value):
 *   include=REGEX, exclude=REGEX, remap=FROM=>TO, top_level_key=K,
 *   contiguous_indices       which tensors, under which keys (docs/key-options.md)
 *   adapter=pytorch, adapter_linear=REGEX, adapter_norm=REGEX
 *                            burn-store's PyTorchToBurnAdapter view
 *   as=F32|F16|BF16          floating tensors presented as that dtype,
 *                            decoded on read (BF16, F16, F8, ggml's
 *                            quantized types...)
 *   strict                   PyTorch: refuse unknown pickle classes
 *   http_cache=SIZE, http_timeout=SECONDS   a URL: its block cache (1M to
 *                            16G) and how long a read may block (1 to 3600)
 * Mount-only options (ro, rw, uid=, npy...) are EINVAL here.
 *
 * The checkpoint, or NULL (burnstore_errmsg: "model.pth: offset 0x1a2:
 * tensor 'enc.w': what was wrong"). A URL's user-info and query (secrets)
 * never appear in messages. */
BURNSTORE_API burnstore_checkpoint *burnstore_open(const char *source, const char *options);
/* Close ck and everything borrowed from it (NULL: no-op). */
BURNSTORE_API void burnstore_close(burnstore_checkpoint *ck);

/* What messages call ck: the file's absolute path (a directory's: its
 * index's), or the URL without user-info and query. */
BURNSTORE_API const char *burnstore_source(const burnstore_checkpoint *ck);
/* "burnpack", "safetensors", "safetensors-sharded", "pytorch" or "gguf". */
BURNSTORE_API const char *burnstore_format(const burnstore_checkpoint *ck);

/* The tensors the options keep, in the file's order: their number, the
 * i-th (NULL when i >= count), and the one whose key (after the options)
 * is key (NULL with ENOENT when none). A tensor is borrowed from ck. */
BURNSTORE_API size_t burnstore_count(const burnstore_checkpoint *ck);
BURNSTORE_API const burnstore_tensor *burnstore_tensor_at(const burnstore_checkpoint *ck, size_t i);
BURNSTORE_API const burnstore_tensor *burnstore_find(const burnstore_checkpoint *ck,
                                                     const char *key);

/* The checkpoint's metadata (Burnpack's metadata, SafeTensors'
 * __metadata__, an index's "metadata", GGUF's key/values as text), in the
 * file's order: the number of entries, the i-th key (NULL when i >= count),
 * and its value into buf (the buffer rule above; a GGUF value, a tokenizer
 * vocabulary say, is made text only when asked for): 0, ERANGE, EINVAL for
 * i out of range, EIO when the file changed. */
BURNSTORE_API size_t burnstore_meta_count(const burnstore_checkpoint *ck);
BURNSTORE_API const char *burnstore_meta_key(const burnstore_checkpoint *ck, size_t i);
BURNSTORE_API int burnstore_meta_value(const burnstore_checkpoint *ck, size_t i, char *buf,
                                       size_t size, size_t *len);

/* The checkpoint-level attributes a mount shows on its root as
 * user.burnstore.NAME: "format", "values" (a PyTorch file's non-tensor
 * values, as JSON), "notes" (what the reader skipped, a line each),
 * "meta.KEY". name: with or without the "user.burnstore." prefix. The value
 * into buf (the buffer rule): 0, ERANGE, ENODATA (none here: no notes, say),
 * E2BIG (a metadata value longer than an xattr can be: burnstore_meta_value
 * has it). The names there are, as a mount lists them: each followed by a
 * NUL, without the prefix, in buf as one value. */
BURNSTORE_API int burnstore_checkpoint_attr(const burnstore_checkpoint *ck, const char *name,
                                            char *buf, size_t size, size_t *len);
BURNSTORE_API int burnstore_checkpoint_attr_names(const burnstore_checkpoint *ck, char *buf,
                                                  size_t size, size_t *len);

/* ---- A tensor ------------------------------------------------------------------------------ */

/* Its key (after the options: a mount shows it as a path, dots as
 * directories). */
BURNSTORE_API const char *burnstore_tensor_key(const burnstore_tensor *t);
/* The dtype its bytes are read as; with as=, the decoded one (F32) for a
 * tensor stored otherwise, which burnstore_tensor_stored_dtype gives. */
BURNSTORE_API burnstore_dtype burnstore_tensor_dtype(const burnstore_tensor *t);
BURNSTORE_API burnstore_dtype burnstore_tensor_stored_dtype(const burnstore_tensor *t);
/* The shape: rank dimensions, row-major (the last varies fastest); NULL
 * for rank 0 (a scalar). */
BURNSTORE_API unsigned burnstore_tensor_rank(const burnstore_tensor *t);
BURNSTORE_API const uint64_t *burnstore_tensor_shape(const burnstore_tensor *t);
/* Bytes of its row-major little-endian data as read (a mount's file size). */
BURNSTORE_API uint64_t burnstore_tensor_nbytes(const burnstore_tensor *t);
/* Why its bytes cannot be read (a PyTorch storage type burnstore does not
 * know...), or NULL when they can. */
BURNSTORE_API const char *burnstore_tensor_unreadable(const burnstore_tensor *t);

/* The attributes a mount shows on the tensor's file as user.burnstore.NAME:
 * "dtype", "shape" ("[2,3]"), "key" (the key in the file, before the
 * options), "param_id" (Burnpack), "shard" (the file of a shard set it is
 * in), "stored_dtype" (as= decoded it). name with or without the prefix; the
 * buffer rule; 0, ERANGE, ENODATA (none on this tensor). The names it has,
 * NUL-separated as burnstore_checkpoint_attr_names. */
BURNSTORE_API int burnstore_tensor_attr(const burnstore_tensor *t, const char *name, char *buf,
                                        size_t size, size_t *len);
BURNSTORE_API int burnstore_tensor_attr_names(const burnstore_tensor *t, char *buf, size_t size,
                                              size_t *len);

/* Read bytes [off, off + n) of the tensor's row-major little-endian data
 * (as= decoded: the decoded bytes) into buf, clamped to its size: *nread
 * (may be NULL) gets the bytes read, n unless the range passes its end.
 * PyTorch's strided views are gathered, nothing is read twice. 0, or EIO
 * (the file changed since it was opened, a server failed: the message says
 * which), ENOTSUP (burnstore_tensor_unreadable). Thread-safe. */
BURNSTORE_API int burnstore_tensor_read(const burnstore_tensor *t, uint64_t off, void *buf,
                                        size_t n, size_t *nread);
/* When the tensor's bytes, as read, are one range of a local regular file
 * (not decoded, not a strided view, not a deflated zip member, not a URL):
 * 0 with *path (absolute, borrowed from ck) and *offset, where its
 * burnstore_tensor_nbytes bytes start, for a zero-copy mmap. ENOTSUP when
 * they are not (read them with burnstore_tensor_read). A map sees the file
 * as it is: if it changes, burnstore_tensor_read fails where a map would
 * not. */
BURNSTORE_API int burnstore_tensor_file_range(const burnstore_tensor *t, const char **path,
                                              uint64_t *offset);

/* ---- Writing a checkpoint ------------------------------------------------------------------ */

typedef struct burnstore_writer burnstore_writer;

/* A new checkpoint to be written at path, in the format its extension names:
 * .bpk (Burnpack), .safetensors, .safetensors.index.json (a shard set),
 * .gguf, .pth/.pt/.bin (torch.save's zip, a flat state dict). options:
 * NULL, or "max_shard_size=SIZE" (5GB, 500MB, 2GiB, bytes: SafeTensors
 * written as NAME-0000K-of-0000N.safetensors shards and their index).
 * Nothing is written before burnstore_writer_save. NULL on failure (no
 * writer has the extension: the message lists those there are). */
BURNSTORE_API burnstore_writer *burnstore_writer_new(const char *path, const char *options);
/* Free w (NULL: no-op); a writer not saved writes nothing. */
BURNSTORE_API void burnstore_writer_free(burnstore_writer *w);
/* The format it writes: "burnpack", "safetensors", "safetensors-sharded",
 * "gguf" or "pytorch". */
BURNSTORE_API const char *burnstore_writer_format(const burnstore_writer *w);

/* Add a tensor from memory: key, dtype, shape (rank dimensions, row-major;
 * NULL for rank 0) and its row-major little-endian bytes, len of them
 * (exactly what dtype and shape take). data is borrowed, not copied: it
 * must stay unchanged until burnstore_writer_save or _free returns. 0, or
 * EINVAL (a length that does not fit, a key the format cannot hold: the
 * message says which and why), ENOTSUP (a dtype the format cannot hold),
 * EEXIST (the key is there already). */
BURNSTORE_API int burnstore_writer_add(burnstore_writer *w, const char *key, burnstore_dtype dtype,
                                       unsigned rank, const uint64_t *shape, const void *data,
                                       uint64_t len);
/* Add tensor t of an open checkpoint under key (NULL: t's key): its bytes
 * are streamed from t's checkpoint at save time, as read (as= decoded),
 * never held. The checkpoint must stay open until save or free. 0, or
 * EINVAL, EEXIST, ENOTSUP (as burnstore_writer_add; or t is unreadable). */
BURNSTORE_API int burnstore_writer_add_tensor(burnstore_writer *w, const char *key,
                                              const burnstore_tensor *t);
/* Add every tensor of ck and its metadata, what `burnstore convert` does
 * (a GGUF's typed values carried to a GGUF as they are; a PyTorch output,
 * which has no place for metadata, drops it). A failure adds nothing. */
BURNSTORE_API int burnstore_writer_add_checkpoint(burnstore_writer *w,
                                                  const burnstore_checkpoint *ck);
/* Set metadata key to value (text; an earlier value of key is replaced).
 * 0, or EINVAL (a key the format cannot hold), ENOTSUP (the format has no
 * metadata: PyTorch). A value the format types (GGUF's general.alignment,
 * or a key a GGUF source gave a type) is checked by burnstore_writer_save. */
BURNSTORE_API int burnstore_writer_set_meta(burnstore_writer *w, const char *key,
                                            const char *value);
/* Write the checkpoint atomically (a temp file beside the target, fsync,
 * rename; a shard set through its journal): the target is complete or
 * untouched. Holds the target lock every burnstore writer takes (a mount
 * writing the same file is refused, EBUSY, naming it). A new target gets
 * the bits its sources' files grant (0666 for memory) less the umask; an
 * existing one keeps its own. 0, or the error; a writer saves once
 * (EINVAL after). */
BURNSTORE_API int burnstore_writer_save(burnstore_writer *w);

#ifdef __cplusplus
}
#endif

#endif
