/* A restricted unpickler: it turns a pickle stream (protocols 2-5, plus the
 * protocol-1 opcodes old files use) into a small value tree. It never
 * imports or calls anything: known GLOBALs are interpreted by the class
 * layer (torch_pickle.h: torch's tensor rebuild functions, storage classes,
 * OrderedDict, ...), every other GLOBAL becomes an inert "opaque" class.
 * TENSOR and STORAGE values are what that layer makes of tensor rebuilds
 * and persistent ids. */
#ifndef BURNSTORE_PICKLE_H
#define BURNSTORE_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/err.h"
#include "core/source.h"
#include "formats/limits.h"

enum bs_pv_kind {
  BS_PV_NONE,
  BS_PV_BOOL,
  BS_PV_INT,
  BS_PV_BIGINT, /* does not fit int64: two's-complement LE bytes in .str */
  BS_PV_FLOAT,
  BS_PV_STR, /* UTF-8 as the file has it (unchecked), NUL-terminated, may hold NULs */
  BS_PV_BYTES,
  BS_PV_TUPLE,
  BS_PV_LIST,
  BS_PV_SET,    /* set and frozenset */
  BS_PV_DICT,   /* dict and OrderedDict, items in insertion order */
  BS_PV_GLOBAL, /* a class or function named by GLOBAL/STACK_GLOBAL */
  BS_PV_OBJECT, /* an instance of a class we did not call */
  BS_PV_TENSOR,
  BS_PV_STORAGE, /* the result of a persistent id ('storage', ...) */
  BS_PV_COUNT
};

struct bs_pv;

struct bs_pv_seq {
  struct bs_pv **items;
  size_t n, cap;
};

/* What an OBJECT got from APPEND(S) and SETITEM(S), allocated on the first
 * (most objects get none). */
struct bs_pv_objx {
  struct bs_pv_seq items;        /* APPEND(S) on the object */
  struct bs_pv_seq dkeys, dvals; /* SETITEM(S) on the object */
};

/* _rebuild_qtensor's quantizer: BS_TQ_* (decode.h); per tensor: scale, zp;
 * per channel: the tensors scales (double), zps (int64), axis. */
struct bs_pv_quant {
  unsigned scheme;
  double scale;
  int64_t zp, axis;
  struct bs_pv *scales, *zps;
};

/* A value: 80 bytes (a hostile pickle makes one of most 1-byte opcodes,
 * and the unpickler's memory budget is counted in them). */
struct bs_pv {
  uint8_t kind;                /* enum bs_pv_kind */
  bool walked;                 /* scratch for the flattening: subtree known to hold no tensor */
  bool walking;                /* scratch for the flattening: on the current path (cycles) */
  bool visited;                /* scratch for the flattening: reached before */
  bool shared;                 /* one of the unpickler's immutable singletons (None, True,
                                  False, (), small ints): never marked visited */
  uint32_t text_off, text_len; /* scratch for the flattening: this value's JSON text,
                                  when text_len > 0, is already at text_off in the values */
  union {
    bool b;
    int64_t i;
    double f;
    struct {
      char *s; /* NUL-terminated */
      size_t len;
    } str;                /* STR, BYTES, BIGINT */
    struct bs_pv_seq seq; /* TUPLE, LIST, SET */
    struct {
      struct bs_pv_seq keys, vals;
      struct bs_pv *attrs; /* BUILD state on an OrderedDict (e.g. _metadata), ignored */
      bool ordered;
    } dict;
    struct {
      const char *module, *name; /* after the Python 2 name mapping */
      unsigned kind;             /* what the name means: enum bs_pg (torch_pickle.h) */
      bool dtype_ok;             /* STORAGE / DTYPE: dtype known */
      enum bs_dtype dtype;
      unsigned esize; /* STORAGE: bytes per element, 0 if unknown */
    } glob;
    struct {
      struct bs_pv *cls;    /* a GLOBAL */
      struct bs_pv *args;   /* may be NULL */
      struct bs_pv *state;  /* BUILD state, may be NULL */
      struct bs_pv_objx *x; /* APPENDs and SETITEMs, NULL while none */
    } obj;
    struct {
      struct bs_pv *storage; /* a STORAGE, or NULL when unsupported */
      uint64_t offset;       /* in elements */
      uint64_t *shape;
      int64_t *stride;
      const char *unsupported; /* why it cannot be read, or NULL */
      struct bs_pv_quant *q;   /* _rebuild_qtensor's quantizer, or NULL */
      uint32_t rank;
      enum bs_dtype dtype;
      bool dtype_ok;
    } tensor;
    struct {
      const char *key;
      const char *cls; /* "torch.FloatStorage" */
      uint64_t numel;  /* whole storage, in elements (bytes for UntypedStorage) */
      const char *view_key;
      uint64_t view_off, view_numel;
      enum bs_dtype dtype;
      unsigned esize; /* 0: unknown storage class */
      bool dtype_ok;
      bool has_view; /* legacy view_metadata (view_key, offset, size) */
    } storage;
  } u;
};

/* An unpickler and the arena that owns every value it made. Values stay
 * valid until bs_pickle_free. Several streams may be loaded into one
 * bs_pickle (the legacy format's five pickles); each gets a fresh memo. */
struct bs_pickle;

struct bs_pickle *bs_pickle_new(void); /* NULL when out of memory */
void bs_pickle_free(struct bs_pickle *p);

struct bs_pickle_opts {
  bool strict;       /* an opaque GLOBAL is an error naming it */
  uint64_t base_off; /* absolute file offset of stream position 0, for errors
                        and notes; BS_OFF_NONE if the stream is not in the file */
  uint64_t input;    /* the size of the file the stream comes from (0: the
                        source's), which bounds the unpickler's memory and
                        work (BS_PICKLE_MEM_*, BS_PICKLE_WORK_*): pass the
                        checkpoint's when the source is an inflated copy */
};

/* Unpickle one stream from src bytes [off, end), reading lazily (only what
 * the pickle needs, up to BS_PICKLE_MAX_BYTES, through a window the size of
 * its largest opcode). Memory (values, stack, memo, window: the larger of
 * BS_PICKLE_MEM_FLOOR and BS_PICKLE_MEM_PER_BYTE x the file's size,
 * opts->input) and opcodes run are bounded: past either, EFBIG naming the
 * bound. Several streams loaded into one bs_pickle share the bounds of
 * the largest input. *out gets the value STOP
 * returned (borrowed from p); *stop_end, if not NULL, the source offset just
 * after STOP. Errors name the pickle offset and the opcode. */
BS_NODISCARD int bs_pickle_load(struct bs_pickle *p, const struct bs_src *src, uint64_t off,
                                uint64_t end, const struct bs_pickle_opts *opts, struct bs_pv **out,
                                uint64_t *stop_end, bs_err *err);

/* Charge n bytes that the caller keeps for what p's streams made (a
 * tensor's catalog entry and its key) to p's memory bound (the one
 * bs_pickle_load set): 0, or -1 with EFBIG naming the bound. */
BS_NODISCARD int bs_pickle_charge(struct bs_pickle *p, uint64_t n, const char *key, bs_err *err);

/* Notes about what was skipped ("skipped object of class os.system at
 * pickle offset N"), in order. Borrowed. */
size_t bs_pickle_nnotes(const struct bs_pickle *p);
const char *bs_pickle_note(const struct bs_pickle *p, size_t i);

const char *bs_pv_kind_name(enum bs_pv_kind k);

#endif
