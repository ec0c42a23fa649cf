/* The unpickler's machine state and what its two halves share: pickle.c
 * (the generic stack machine: arena, input, stack, marks, memo, opcodes) and
 * torch_pickle.c (what GLOBAL names mean: torch's tensor rebuilds, storages
 * as persistent ids, OrderedDict, sets, ...). Not a public header. */
#ifndef BURNSTORE_PICKLE_VM_H
#define BURNSTORE_PICKLE_VM_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "formats/pickle.h"
#include "formats/torch_pickle.h"

#define MAX_NOTES 1000u
#define MAX_LINE 1024u         /* GLOBAL module/name, INT/LONG/FLOAT text lines */
#define MAX_REBUILD_NESTING 8u /* _rebuild_from_type_v2 wrapping another rebuild */
#define CHUNK_MIN 65536u

struct chunk {
  struct chunk *next;
  size_t used, cap;
  max_align_t data[];
};

/* The shared immutable values (pk_shared): None, False, True, (), then the
 * ints 0..255, as Python shares them. */
#define PK_SHARED_NONE 0
#define PK_SHARED_FALSE 1
#define PK_SHARED_TRUE 2
#define PK_SHARED_TUPLE 3
#define PK_SHARED_INT0 4
#define PK_SHARED_N (PK_SHARED_INT0 + 256)

struct bs_pickle {
  struct chunk *chunks;
  uint64_t total;     /* bytes handed out by the arena */
  uint64_t scratch;   /* bytes the stream being loaded holds besides (input window,
                         stack, marks, memo) */
  uint64_t budget;    /* total + scratch at most: bs_pickle_load sets it from the
                         file's size (BS_PICKLE_MEM_*) */
  uint64_t ops, work; /* opcodes run, and at most (BS_PICKLE_WORK_*) */
  uint64_t input;     /* the file's bytes the budgets were sized from */
  bool over_budget;   /* the arena refused an allocation for the budget */
  char **notes;       /* arena strings */
  size_t nnotes, notecap;
  uint64_t notes_dropped;
  struct bs_pv *shared[PK_SHARED_N];
};

/* Per-stream state. */
struct vm {
  struct bs_pickle *p;
  const struct bs_src *src;
  uint64_t start, end; /* source range of the stream */
  uint8_t *buf;        /* a window of the stream: its bytes [base, base + len) */
  size_t len, cap;
  size_t base, pos; /* pos: the next byte to read (>= base) */
  uint64_t op_pos;  /* position of the current opcode */
  uint8_t op;
  const struct bs_pickle_opts *opts;
  struct bs_pv **stack;
  size_t sp, stackcap;
  size_t *marks;
  size_t nmarks, markcap;
  struct bs_pv **memo;
  size_t memocap, memolen; /* memolen: entries set (Python's len(memo)) */
  uint64_t memo_limit;
  bs_err *err;
};

/* ---- the machine (pickle.c) ----------------------------------------------------------------- */

uint64_t pk_abs_off(const struct vm *v, uint64_t pos);

/* Every VM error names the opcode and its pickle offset. */
#define VFAIL(v, code, fmt, ...)                                                                   \
  bs_fail((v)->err, code, pk_abs_off(v, (v)->op_pos), NULL, "pickle offset %" PRIu64 ": " fmt,     \
          (v)->op_pos, __VA_ARGS__)

void *pk_alloc(struct bs_pickle *p, size_t n);           /* zeroed arena memory, in the budget */
struct bs_pv *pk_newv(struct vm *v, enum bs_pv_kind k);  /* NULL: error set */
struct bs_pv *pk_shared(struct vm *v, unsigned which);   /* PK_SHARED_*; NULL: error set */
struct bs_pv *pk_int(struct vm *v, int64_t i);           /* shared for 0..255 */
char *pk_strndup(struct vm *v, const char *s, size_t n); /* arena copy, NUL-terminated */
struct bs_pv *pk_new_str(struct vm *v, enum bs_pv_kind k, const void *s, size_t n);
int pk_seq_push(struct vm *v, struct bs_pv_seq *q, struct bs_pv *item);
int pk_oom(struct vm *v);
int pk_note(struct vm *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int pk_dict_set(struct vm *v, struct bs_pv *d, struct bs_pv *k, struct bs_pv *val);

/* ---- class semantics (torch_pickle.c) ------------------------------------------------------- */

void pk_resolve(struct bs_pv *g); /* set g->u.glob.kind (enum bs_pg) and dtype facts */
struct bs_pv *pk_call(struct vm *v, struct bs_pv *f, struct bs_pv *args,
                      unsigned nesting);                                        /* REDUCE */
struct bs_pv *pk_call_new(struct vm *v, struct bs_pv *cls, struct bs_pv *args); /* NEWOBJ */
int pk_build(struct vm *v, struct bs_pv *target, struct bs_pv *state);          /* BUILD */
struct bs_pv *pk_persistent_load(struct vm *v, const struct bs_pv *pid);        /* BINPERSID */

#endif
