/* Restricted unpickler. The stream is a sequence of opcodes, each one byte
 * followed by its argument:
 *   1. PROTO 0x80 u8 version (0..5), optional; FRAME 0x95 u64 length (skipped).
 *   2. Values: ints (BININT1 u8, BININT2 u16 LE, BININT i32 LE, LONG1 u8 n +
 *      n bytes two's complement LE, LONG4 i32 n + n bytes, INT/LONG decimal
 *      lines), BINFLOAT (f64 BIG-endian), strings (SHORT_BINUNICODE u8 len,
 *      BINUNICODE u32, BINUNICODE8 u64, SHORT_BINSTRING u8, BINSTRING i32),
 *      bytes (SHORT_BINBYTES u8, BINBYTES u32, BINBYTES8 u64).
 *   3. Containers built on a stack, with MARK delimiting variable-length
 *      groups (TUPLE, LIST, DICT, APPENDS, SETITEMS, FROZENSET, ADDITEMS).
 *   4. Memo: BINPUT u8 / LONG_BINPUT u32 / MEMOIZE store a REFERENCE to the
 *      top of the stack; BINGET u8 / LONG_BINGET u32 push it again.
 *   5. GLOBAL "module\nname\n" / STACK_GLOBAL name a class or function;
 *      REDUCE, NEWOBJ, NEWOBJ_EX "call" it; BUILD sets state; BINPERSID turns
 *      the tuple on top into a storage reference.
 *   6. STOP: the result is the top of the stack; more bytes may follow.
 * Nothing named by a GLOBAL is ever imported or called. This file is the
 * generic machine; what a name means (tensor rebuilds, OrderedDict, storages
 * as persistent ids) is torch_pickle.c, behind the pk_* calls of pickle_vm.h. */
#include "formats/pickle.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "pickle_vm.h"

/* ---- arena ---------------------------------------------------------------------------------- */

void *pk_alloc(struct bs_pickle *p, size_t n)
{
  n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
  if (n == 0)
    n = sizeof(max_align_t);
  if (n > p->budget || p->total + p->scratch > p->budget - n) {
    p->over_budget = true;
    return NULL;
  }
  struct chunk *c = p->chunks;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > CHUNK_MIN ? n : CHUNK_MIN;
    c = bs_malloc(sizeof *c + cap);
    if (!c)
      return NULL;
    c->next = p->chunks;
    c->used = 0;
    c->cap = cap;
    p->chunks = c;
  }
  void *r = (char *)c->data + c->used;
  c->used += n;
  p->total += n;
  memset(r, 0, n);
  return r;
}

struct bs_pickle *bs_pickle_new(void)
{
  return bs_calloc(1, sizeof(struct bs_pickle));
}

void bs_pickle_free(struct bs_pickle *p)
{
  if (!p)
    return;
  for (struct chunk *c = p->chunks, *n; c; c = n) {
    n = c->next;
    bs_free(c);
  }
  bs_free(p->notes);
  bs_free(p);
}

size_t bs_pickle_nnotes(const struct bs_pickle *p)
{
  return p->nnotes;
}
const char *bs_pickle_note(const struct bs_pickle *p, size_t i)
{
  return i < p->nnotes ? p->notes[i] : NULL;
}

static const char *const kind_names[] = {
    [BS_PV_NONE] = "None",      [BS_PV_BOOL] = "bool",     [BS_PV_INT] = "int",
    [BS_PV_BIGINT] = "big int", [BS_PV_FLOAT] = "float",   [BS_PV_STR] = "str",
    [BS_PV_BYTES] = "bytes",    [BS_PV_TUPLE] = "tuple",   [BS_PV_LIST] = "list",
    [BS_PV_SET] = "set",        [BS_PV_DICT] = "dict",     [BS_PV_GLOBAL] = "global",
    [BS_PV_OBJECT] = "object",  [BS_PV_TENSOR] = "tensor", [BS_PV_STORAGE] = "storage",
};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == BS_PV_COUNT, "kind names");
_Static_assert(sizeof(struct bs_pv) <= 80, "a value is 80 bytes at most");

const char *bs_pv_kind_name(enum bs_pv_kind k)
{
  return k < BS_PV_COUNT ? kind_names[k] : "?";
}

/* ---- errors --------------------------------------------------------------------------------- */

uint64_t pk_abs_off(const struct vm *v, uint64_t pos)
{
  if (v->opts->base_off == BS_OFF_NONE || pos > UINT64_MAX - v->opts->base_off)
    return BS_OFF_NONE;
  return v->opts->base_off + pos;
}

#define BOUND_FMT "the bound is the larger of %llu MiB and %u x the file's %" PRIu64 " bytes"
#define BOUND_ARGS(p) BS_PICKLE_MEM_FLOOR >> 20, BS_PICKLE_MEM_PER_BYTE, (p)->input

/* The memory bound passed: EFBIG naming it. */
static int over_budget(struct vm *v)
{
  const struct bs_pickle *p = v->p;
  return VFAIL(v, EFBIG,
               "the pickle needs more than %" PRIu64 " bytes of memory to load (" BOUND_FMT ")",
               p->budget, BOUND_ARGS(p));
}

int bs_pickle_charge(struct bs_pickle *p, uint64_t n, const char *key, bs_err *err)
{
  if (n > p->budget || p->total > p->budget - n)
    return bs_fail(err, EFBIG, BS_OFF_NONE, key,
                   "the pickle's values and the catalog of its tensors need more than %" PRIu64
                   " bytes of memory (" BOUND_FMT ")",
                   p->budget, BOUND_ARGS(p));
  p->total += n;
  return 0;
}

int pk_oom(struct vm *v)
{
  if (v->p->over_budget)
    return over_budget(v);
  return VFAIL(v, ENOMEM, "%s", "out of memory");
}

/* bs_grow of one of the stream's arrays, in the budget (p->scratch). */
static int vgrow(struct vm *v, void **arr, size_t *cap, size_t need, size_t elem)
{
  if (need <= *cap)
    return 0;
  size_t ncap = *cap ? *cap : 8;
  while (ncap < need && ncap <= SIZE_MAX / 2)
    ncap *= 2;
  uint64_t more;
  struct bs_pickle *p = v->p;
  if (ncap < need || !bs_mul_u64(ncap - *cap, elem, &more) || more > p->budget ||
      p->total + p->scratch > p->budget - more) {
    p->over_budget = true;
    return over_budget(v);
  }
  size_t old = *cap;
  if (bs_grow(arr, cap, need, elem) != 0)
    return VFAIL(v, ENOMEM, "%s", "out of memory");
  p->scratch += (uint64_t)(*cap - old) * elem;
  return 0;
}

int pk_note(struct vm *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int pk_note(struct vm *v, const char *fmt, ...)
{
  struct bs_pickle *p = v->p;
  if (p->nnotes >= MAX_NOTES) {
    p->notes_dropped++;
    return 0;
  }
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  size_t n = strlen(line);
  char *s = pk_alloc(p, n + 1);
  if (!s || bs_grow((void **)&p->notes, &p->notecap, p->nnotes + 1, sizeof *p->notes) != 0)
    return pk_oom(v);
  memcpy(s, line, n + 1);
  p->notes[p->nnotes++] = s;
  return 0;
}

/* ---- input ---------------------------------------------------------------------------------- */

/* The window's byte at stream position pos. */
static const uint8_t *at(const struct vm *v)
{
  return v->buf + (v->pos - v->base);
}

/* Make stream bytes [pos, pos + n) available in the window, reading more of
 * the source if needed. The window keeps only the current opcode's bytes
 * (from op_pos) when it moves on, so that it holds about the largest opcode
 * argument, never the stream; what it holds counts in the budget. */
static int need(struct vm *v, uint64_t n)
{
  uint64_t have = v->base + v->len - v->pos;
  if (n <= have)
    return 0;
  uint64_t avail = v->end - v->start;
  if (n > avail - v->pos)
    return VFAIL(v, EINVAL,
                 "truncated pickle: opcode 0x%02x needs %" PRIu64
                 " bytes but the stream has %" PRIu64 " left",
                 v->op, n, avail - v->pos);
  uint64_t want = v->pos + n;
  if (want > BS_PICKLE_MAX_BYTES)
    return VFAIL(v, EFBIG, "pickle stream longer than the limit of %u bytes",
                 (unsigned)BS_PICKLE_MAX_BYTES);
  size_t drop = (size_t)(v->op_pos - v->base); /* the opcodes before this one */
  if (drop) {
    memmove(v->buf, v->buf + drop, v->len - drop);
    v->base += drop;
    v->len -= drop;
  }
  uint64_t fill = want - v->base; /* the window's new length: read ahead a chunk */
  if (fill < CHUNK_MIN)
    fill = CHUNK_MIN;
  if (fill < v->cap)
    fill = v->cap;
  if (fill > avail - v->base)
    fill = avail - v->base;
  if (fill > v->cap) {
    struct bs_pickle *p = v->p;
    uint64_t more = fill - v->cap;
    if (more > p->budget || p->total + p->scratch > p->budget - more) {
      p->over_budget = true;
      return over_budget(v);
    }
    uint8_t *nb = bs_realloc(v->buf, (size_t)fill);
    if (!nb)
      return VFAIL(v, ENOMEM, "%s", "out of memory");
    v->buf = nb;
    p->scratch += more;
    v->cap = (size_t)fill;
  }
  if (bs_src_read(v->src, v->start + v->base + v->len, v->buf + v->len, (size_t)(fill - v->len),
                  v->err) != 0)
    return -1;
  v->len = (size_t)fill;
  return 0;
}

static int rd_u8(struct vm *v, uint8_t *out)
{
  if (need(v, 1) != 0)
    return -1;
  *out = *at(v);
  v->pos++;
  return 0;
}

/* n bytes, valid until the next read. */
static int rd_bytes(struct vm *v, uint64_t n, const uint8_t **out)
{
  if (need(v, n) != 0)
    return -1;
  *out = at(v);
  v->pos += (size_t)n;
  return 0;
}

/* A '\n'-terminated line (without the '\n'), at most MAX_LINE bytes; valid
 * until the next read. */
static int rd_line(struct vm *v, const char **out, size_t *len)
{
  for (size_t i = 0;; i++) {
    if (i > MAX_LINE)
      return VFAIL(v, EINVAL, "text argument of opcode 0x%02x longer than %u bytes", v->op,
                   MAX_LINE);
    if (need(v, i + 1) != 0)
      return -1;
    if (at(v)[i] == '\n') {
      *out = (const char *)at(v);
      *len = i;
      v->pos += i + 1;
      return 0;
    }
  }
}

/* ---- values --------------------------------------------------------------------------------- */

struct bs_pv *pk_newv(struct vm *v, enum bs_pv_kind k)
{
  struct bs_pv *x = pk_alloc(v->p, sizeof *x);
  if (!x) {
    pk_oom(v);
    return NULL;
  }
  x->kind = (uint8_t)k;
  return x;
}

struct bs_pv *pk_shared(struct vm *v, unsigned which)
{
  struct bs_pickle *p = v->p;
  if (p->shared[which])
    return p->shared[which];
  static const uint8_t kinds[PK_SHARED_INT0] = {BS_PV_NONE, BS_PV_BOOL, BS_PV_BOOL, BS_PV_TUPLE};
  struct bs_pv *x = pk_newv(v, which < PK_SHARED_INT0 ? kinds[which] : BS_PV_INT);
  if (!x)
    return NULL;
  if (which == PK_SHARED_TRUE)
    x->u.b = true;
  else if (which >= PK_SHARED_INT0)
    x->u.i = which - PK_SHARED_INT0;
  x->shared = true;
  return p->shared[which] = x;
}

struct bs_pv *pk_int(struct vm *v, int64_t i)
{
  if (i >= 0 && i < PK_SHARED_N - PK_SHARED_INT0)
    return pk_shared(v, PK_SHARED_INT0 + (unsigned)i);
  struct bs_pv *x = pk_newv(v, BS_PV_INT);
  if (x)
    x->u.i = i;
  return x;
}

char *pk_strndup(struct vm *v, const char *s, size_t n)
{
  char *r = pk_alloc(v->p, n + 1);
  if (!r) {
    pk_oom(v);
    return NULL;
  }
  memcpy(r, s, n);
  r[n] = '\0';
  return r;
}

struct bs_pv *pk_new_str(struct vm *v, enum bs_pv_kind k, const void *s, size_t n)
{
  struct bs_pv *x = pk_newv(v, k);
  if (!x || !(x->u.str.s = pk_strndup(v, s, n)))
    return NULL;
  x->u.str.len = n;
  return x;
}

int pk_seq_push(struct vm *v, struct bs_pv_seq *q, struct bs_pv *item)
{
  if (q->n == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 4;
    if (cap > SIZE_MAX / sizeof *q->items)
      return pk_oom(v);
    struct bs_pv **ni = pk_alloc(v->p, cap * sizeof *ni);
    if (!ni)
      return pk_oom(v);
    if (q->n)
      memcpy(ni, q->items, q->n * sizeof *ni);
    q->items = ni;
    q->cap = cap;
  }
  q->items[q->n++] = item;
  return 0;
}

/* A sequence of kind k holding items[0..n), its array exactly n long. */
static struct bs_pv *new_seq(struct vm *v, enum bs_pv_kind k, struct bs_pv **items, size_t n)
{
  struct bs_pv *x = pk_newv(v, k);
  if (!x || n == 0)
    return x;
  if (n > SIZE_MAX / sizeof *items || !(x->u.seq.items = pk_alloc(v->p, n * sizeof *items))) {
    pk_oom(v);
    return NULL;
  }
  memcpy(x->u.seq.items, items, n * sizeof *items);
  x->u.seq.n = x->u.seq.cap = n;
  return x;
}

/* ---- stack, marks, memo --------------------------------------------------------------------- */

static int push(struct vm *v, struct bs_pv *x)
{
  if (!x)
    return -1;
  if (v->sp >= BS_PICKLE_MAX_MEMO)
    return VFAIL(v, EFBIG, "pickle stack deeper than %u entries", (unsigned)BS_PICKLE_MAX_MEMO);
  if (vgrow(v, (void **)&v->stack, &v->stackcap, v->sp + 1, sizeof *v->stack) != 0)
    return -1;
  v->stack[v->sp++] = x;
  return 0;
}

static size_t floor_sp(const struct vm *v)
{
  return v->nmarks ? v->marks[v->nmarks - 1] : 0;
}

static struct bs_pv *pop(struct vm *v)
{
  if (v->sp <= floor_sp(v)) {
    VFAIL(v, EINVAL, "stack underflow at opcode 0x%02x ('%c')", v->op,
          v->op >= 0x20 && v->op < 0x7f ? v->op : '?');
    return NULL;
  }
  return v->stack[--v->sp];
}

static struct bs_pv *top(struct vm *v)
{
  if (v->sp <= floor_sp(v)) {
    VFAIL(v, EINVAL, "stack underflow at opcode 0x%02x ('%c')", v->op,
          v->op >= 0x20 && v->op < 0x7f ? v->op : '?');
    return NULL;
  }
  return v->stack[v->sp - 1];
}

/* Pop everything above the most recent MARK and the mark itself; the items
 * are v->stack[*first .. *first + *n) (still valid until the next push). */
static int pop_mark(struct vm *v, size_t *first, size_t *n)
{
  if (v->nmarks == 0)
    return VFAIL(v, EINVAL, "opcode 0x%02x needs a MARK but there is none", v->op);
  size_t m = v->marks[--v->nmarks];
  *first = m;
  *n = v->sp - m;
  v->sp = m;
  return 0;
}

/* The items pop_mark left at v->stack[first...]; the stack may still be
 * unallocated when nothing was ever pushed (MARK DICT). */
static struct bs_pv **marked(struct vm *v, size_t first)
{
  return v->stack ? v->stack + first : NULL;
}

static int memo_put(struct vm *v, uint64_t idx, struct bs_pv *x)
{
  if (!x)
    return -1;
  if (idx >= v->memo_limit)
    return VFAIL(v, EINVAL, "memo index %" PRIu64 " out of range (limit %" PRIu64 ")", idx,
                 v->memo_limit);
  if (idx >= v->memocap) {
    size_t old = v->memocap;
    if (vgrow(v, (void **)&v->memo, &v->memocap, (size_t)idx + 1, sizeof *v->memo) != 0)
      return -1;
    memset(v->memo + old, 0, (v->memocap - old) * sizeof *v->memo);
  }
  if (!v->memo[idx])
    v->memolen++;
  v->memo[idx] = x;
  return 0;
}

static struct bs_pv *memo_get(struct vm *v, uint64_t idx)
{
  if (idx >= v->memocap || !v->memo[idx]) {
    VFAIL(v, EINVAL, "memo index %" PRIu64 " was never stored (bad memo reference)", idx);
    return NULL;
  }
  return v->memo[idx];
}

static int do_global(struct vm *v, const char *mod, size_t mlen, const char *name, size_t nlen)
{
  if (memchr(mod, '\0', mlen) || memchr(name, '\0', nlen))
    return VFAIL(v, EINVAL, "%s", "GLOBAL name contains a NUL byte");
  /* Python 2 spellings, as Python 3's pickle writes them with fix_imports. */
  if (mlen == 11 && memcmp(mod, "__builtin__", 11) == 0) {
    mod = "builtins";
    mlen = 8;
  } else if (mlen == 8 && memcmp(mod, "copy_reg", 8) == 0) {
    mod = "copyreg";
    mlen = 7;
  } else if (mlen == 12 && memcmp(mod, "torch.tensor", 12) == 0) {
    mod = "torch._tensor";
    mlen = 13;
  }
  struct bs_pv *g = pk_newv(v, BS_PV_GLOBAL);
  if (!g || !(g->u.glob.module = pk_strndup(v, mod, mlen)) ||
      !(g->u.glob.name = pk_strndup(v, name, nlen)))
    return -1;
  pk_resolve(g);
  if (g->u.glob.kind == BS_PG_OPAQUE && v->opts->strict)
    return VFAIL(v, ENOTSUP,
                 "strict mode: the pickle names %s.%s, which is not a known tensor or "
                 "container type",
                 g->u.glob.module, g->u.glob.name);
  return push(v, g);
}

static bool is_hashable(const struct bs_pv *k)
{
  return k->kind != BS_PV_LIST && k->kind != BS_PV_DICT && k->kind != BS_PV_SET;
}

/* An object's APPENDs and SETITEMs, made on the first. */
static struct bs_pv_objx *objx(struct vm *v, struct bs_pv *o)
{
  if (!o->u.obj.x && !(o->u.obj.x = pk_alloc(v->p, sizeof *o->u.obj.x)))
    pk_oom(v);
  return o->u.obj.x;
}

int pk_dict_set(struct vm *v, struct bs_pv *d, struct bs_pv *k, struct bs_pv *val)
{
  if (!is_hashable(k))
    return VFAIL(v, EINVAL, "unhashable dict key (a %s)", bs_pv_kind_name(k->kind));
  if (d->kind == BS_PV_DICT)
    return pk_seq_push(v, &d->u.dict.keys, k) || pk_seq_push(v, &d->u.dict.vals, val) ? -1 : 0;
  struct bs_pv_objx *x = objx(v, d);
  return !x || pk_seq_push(v, &x->dkeys, k) || pk_seq_push(v, &x->dvals, val) ? -1 : 0;
}

static int append_to(struct vm *v, struct bs_pv *target, struct bs_pv **items, size_t n)
{
  struct bs_pv_seq *q;
  if (target->kind == BS_PV_LIST)
    q = &target->u.seq;
  else if (target->kind == BS_PV_OBJECT && objx(v, target))
    q = &target->u.obj.x->items;
  else if (target->kind == BS_PV_OBJECT)
    return -1;
  else
    return VFAIL(v, EINVAL, "APPEND to a %s", bs_pv_kind_name(target->kind));
  for (size_t i = 0; i < n; i++)
    if (pk_seq_push(v, q, items[i]) != 0)
      return -1;
  return 0;
}

static int setitems(struct vm *v, struct bs_pv *target, struct bs_pv **items, size_t n)
{
  if (target->kind != BS_PV_DICT && target->kind != BS_PV_OBJECT)
    return VFAIL(v, EINVAL, "SETITEM on a %s", bs_pv_kind_name(target->kind));
  if (n % 2)
    return VFAIL(v, EINVAL, "SETITEMS with an odd number (%zu) of items", n);
  for (size_t i = 0; i < n; i += 2)
    if (pk_dict_set(v, target, items[i], items[i + 1]) != 0)
      return -1;
  return 0;
}

/* ---- numbers -------------------------------------------------------------------------------- */

/* n bytes of two's complement, little-endian. */
static struct bs_pv *make_long(struct vm *v, const uint8_t *b, uint64_t n)
{
  bool neg = n > 0 && (b[n - 1] & 0x80);
  bool fits = true;
  for (uint64_t i = 8; i < n; i++)
    if (b[i] != (neg ? 0xFF : 0x00))
      fits = false;
  if (fits && n > 8 && ((b[7] & 0x80) != 0) != neg)
    fits = false;
  if (!fits) {
    if (n > 1024 * 1024) {
      VFAIL(v, ENOTSUP, "integer of %" PRIu64 " bytes", n);
      return NULL;
    }
    return pk_new_str(v, BS_PV_BIGINT, b, (size_t)n);
  }
  uint64_t u = neg ? UINT64_MAX : 0;
  for (uint64_t i = 0; i < n && i < 8; i++) {
    u &= ~((uint64_t)0xFF << (8 * i));
    u |= (uint64_t)b[i] << (8 * i);
  }
  return pk_int(v, (int64_t)u);
}

static int text_int(struct vm *v, bool is_long)
{
  const char *s = NULL;
  size_t n = 0;
  if (rd_line(v, &s, &n) != 0)
    return -1;
  if (!is_long && n == 2 && (memcmp(s, "00", 2) == 0 || memcmp(s, "01", 2) == 0))
    return push(v, pk_shared(v, s[1] == '1' ? PK_SHARED_TRUE : PK_SHARED_FALSE));
  if (is_long && n > 0 && s[n - 1] == 'L')
    n--;
  char tmp[MAX_LINE + 1];
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *endp;
  errno = 0;
  long long val = strtoll(tmp, &endp, 10);
  if (n == 0 || *endp != '\0' || errno == ERANGE)
    return VFAIL(v, EINVAL, "bad or too big decimal integer '%.40s'", tmp);
  return push(v, pk_int(v, val));
}

/* ---- the loop ------------------------------------------------------------------------------- */

static int str_op(struct vm *v, enum bs_pv_kind k, uint64_t n)
{
  const uint8_t *b;
  if (rd_bytes(v, n, &b) != 0)
    return -1;
  return push(v, pk_new_str(v, k, b, (size_t)n));
}

static int len_arg(struct vm *v, unsigned width, uint64_t *n)
{
  const uint8_t *b;
  if (rd_bytes(v, width, &b) != 0)
    return -1;
  if (width == 1)
    *n = b[0];
  else if (width == 4)
    *n = bs_le32(b);
  else
    *n = bs_le64(b);
  return 0;
}

static const char *opcode_name(uint8_t op)
{
  switch (op) {
  case 'P': return "PERSID";
  case 'S': return "STRING";
  case 'V': return "UNICODE";
  case 'i': return "INST";
  case 'o': return "OBJ";
  case 0x82: return "EXT1";
  case 0x83: return "EXT2";
  case 0x84: return "EXT4";
  case 0x96: return "BYTEARRAY8";
  case 0x97: return "NEXT_BUFFER";
  case 0x98: return "READONLY_BUFFER";
  default: return NULL;
  }
}

static int step(struct vm *v, bool *stop)
{
  uint8_t op;
  v->op_pos = v->pos;
  v->op = 0;
  if (++v->p->ops > v->p->work)
    return VFAIL(v, EFBIG,
                 "the pickle runs more than %" PRIu64 " opcodes (the bound is %llu + %u x the "
                 "file's %" PRIu64 " bytes)",
                 v->p->work, BS_PICKLE_WORK_FLOOR, BS_PICKLE_WORK_PER_BYTE, v->p->input);
  if (rd_u8(v, &op) != 0)
    return -1;
  v->op = op;
  const uint8_t *b = NULL;
  uint64_t n = 0;
  struct bs_pv *x, *y, *z;
  size_t first = 0, cnt = 0;
  switch (op) {
  case 0x80: /* PROTO */
    if (rd_bytes(v, 1, &b) != 0)
      return -1;
    if (b[0] > 5)
      return VFAIL(v, ENOTSUP, "pickle protocol %u is newer than 5", b[0]);
    return 0;
  case 0x95: /* FRAME: the length is only a hint */ return rd_bytes(v, 8, &b);
  case '.': /* STOP */ *stop = true; return 0;
  case '(': /* MARK */
    if (v->nmarks >= BS_PICKLE_MAX_DEPTH)
      return VFAIL(v, EINVAL, "MARKs nested deeper than %u", BS_PICKLE_MAX_DEPTH);
    if (vgrow(v, (void **)&v->marks, &v->markcap, v->nmarks + 1, sizeof *v->marks) != 0)
      return -1;
    v->marks[v->nmarks++] = v->sp;
    return 0;
  case 'N': return push(v, pk_shared(v, PK_SHARED_NONE));
  case 0x88: /* NEWTRUE */ return push(v, pk_shared(v, PK_SHARED_TRUE));
  case 0x89: /* NEWFALSE */ return push(v, pk_shared(v, PK_SHARED_FALSE));
  case 'K': /* BININT1 */
  case 'M': /* BININT2 */
  case 'J': /* BININT */
    if (rd_bytes(v, op == 'K' ? 1 : op == 'M' ? 2 : 4, &b) != 0)
      return -1;
    return push(v, pk_int(v, op == 'K' ? b[0] : op == 'M' ? bs_le16(b) : (int32_t)bs_le32(b)));
  case 0x8A: /* LONG1 */
  case 0x8B: /* LONG4 */
    if (len_arg(v, op == 0x8A ? 1 : 4, &n) != 0)
      return -1;
    if (op == 0x8B && n > INT32_MAX)
      return VFAIL(v, EINVAL, "%s", "LONG4 with a negative length");
    if (rd_bytes(v, n, &b) != 0)
      return -1;
    return push(v, make_long(v, b, n));
  case 'I': return text_int(v, false);
  case 'L': return text_int(v, true);
  case 'G': /* BINFLOAT, big-endian */
    if (rd_bytes(v, 8, &b) != 0)
      return -1;
    if ((x = pk_newv(v, BS_PV_FLOAT))) {
      uint64_t u = 0;
      for (int i = 0; i < 8; i++)
        u = (u << 8) | b[i];
      memcpy(&x->u.f, &u, sizeof u);
    }
    return push(v, x);
  case 'F': { /* FLOAT, text */
    const char *s = NULL;
    size_t len = 0;
    if (rd_line(v, &s, &len) != 0)
      return -1;
    char tmp[MAX_LINE + 1], *endp;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    double d = strtod(tmp, &endp);
    if (len == 0 || *endp != '\0')
      return VFAIL(v, EINVAL, "bad float '%.40s'", tmp);
    if ((x = pk_newv(v, BS_PV_FLOAT)))
      x->u.f = d;
    return push(v, x);
  }
  case 0x8C: /* SHORT_BINUNICODE */
  case 'X':  /* BINUNICODE */
  case 0x8D: /* BINUNICODE8 */
    if (len_arg(v, op == 0x8C ? 1 : op == 'X' ? 4 : 8, &n) != 0)
      return -1;
    return str_op(v, BS_PV_STR, n);
  case 'U': /* SHORT_BINSTRING */
  case 'T': /* BINSTRING */
    if (len_arg(v, op == 'U' ? 1 : 4, &n) != 0)
      return -1;
    if (op == 'T' && n > INT32_MAX)
      return VFAIL(v, EINVAL, "%s", "BINSTRING with a negative length");
    return str_op(v, BS_PV_STR, n);
  case 'C':  /* SHORT_BINBYTES */
  case 'B':  /* BINBYTES */
  case 0x8E: /* BINBYTES8 */
    if (len_arg(v, op == 'C' ? 1 : op == 'B' ? 4 : 8, &n) != 0)
      return -1;
    return str_op(v, BS_PV_BYTES, n);
  case ')': return push(v, pk_shared(v, PK_SHARED_TUPLE));
  case ']': return push(v, pk_newv(v, BS_PV_LIST));
  case '}': return push(v, pk_newv(v, BS_PV_DICT));
  case 0x8F: /* EMPTY_SET */ return push(v, pk_newv(v, BS_PV_SET));
  case 0x85: /* TUPLE1..3 */
  case 0x86:
  case 0x87:
    cnt = (size_t)(op - 0x84);
    if (v->sp - floor_sp(v) < cnt || v->sp < cnt)
      return VFAIL(v, EINVAL, "stack underflow: TUPLE%zu needs %zu items", cnt, cnt);
    if (!(x = new_seq(v, BS_PV_TUPLE, v->stack + v->sp - cnt, cnt)))
      return -1;
    v->sp -= cnt;
    return push(v, x);
  case 't':  /* TUPLE */
  case 'l':  /* LIST */
  case 0x91: /* FROZENSET */
    if (pop_mark(v, &first, &cnt) != 0)
      return -1;
    if (op == 't' && cnt == 0)
      return push(v, pk_shared(v, PK_SHARED_TUPLE));
    return push(v, new_seq(v,
                           op == 't'   ? BS_PV_TUPLE
                           : op == 'l' ? BS_PV_LIST
                                       : BS_PV_SET,
                           marked(v, first), cnt));
  case 'd': /* DICT */
    if (pop_mark(v, &first, &cnt) != 0)
      return -1;
    if (!(x = pk_newv(v, BS_PV_DICT)))
      return -1;
    if (setitems(v, x, marked(v, first), cnt) != 0)
      return -1;
    return push(v, x);
  case 'a': /* APPEND */
    if (!(y = pop(v)) || !(x = top(v)))
      return -1;
    return append_to(v, x, &y, 1);
  case 'e': /* APPENDS */
    if (pop_mark(v, &first, &cnt) != 0 || !(x = top(v)))
      return -1;
    return append_to(v, x, marked(v, first), cnt);
  case 0x90: /* ADDITEMS */
    if (pop_mark(v, &first, &cnt) != 0 || !(x = top(v)))
      return -1;
    if (x->kind != BS_PV_SET)
      return VFAIL(v, EINVAL, "ADDITEMS to a %s", bs_pv_kind_name(x->kind));
    for (size_t i = 0; i < cnt; i++)
      if (pk_seq_push(v, &x->u.seq, v->stack[first + i]) != 0)
        return -1;
    return 0;
  case 's': /* SETITEM */
    if (!(z = pop(v)) || !(y = pop(v)) || !(x = top(v)))
      return -1;
    {
      struct bs_pv *kv[2] = {y, z};
      return setitems(v, x, kv, 2);
    }
  case 'u': /* SETITEMS */
    if (pop_mark(v, &first, &cnt) != 0 || !(x = top(v)))
      return -1;
    return setitems(v, x, marked(v, first), cnt);
  case '0': /* POP */
    if (v->sp > floor_sp(v)) {
      v->sp--;
      return 0;
    }
    return pop_mark(v, &first, &cnt);
  case '1': /* POP_MARK */ return pop_mark(v, &first, &cnt);
  case '2': /* DUP */
    if (!(x = top(v)))
      return -1;
    return push(v, x);
  case 'q': /* BINPUT */
  case 'r': /* LONG_BINPUT */
    if (len_arg(v, op == 'q' ? 1 : 4, &n) != 0 || !(x = top(v)))
      return -1;
    return memo_put(v, n, x);
  case 0x94: /* MEMOIZE */
    if (!(x = top(v)))
      return -1;
    return memo_put(v, v->memolen, x);
  case 'p':   /* PUT, text */
  case 'g': { /* GET, text */
    const char *s = NULL;
    size_t len = 0;
    if (rd_line(v, &s, &len) != 0)
      return -1;
    n = 0;
    if (len == 0 || len > 19)
      return VFAIL(v, EINVAL, "%s", "bad memo index");
    for (size_t i = 0; i < len; i++) {
      if (s[i] < '0' || s[i] > '9')
        return VFAIL(v, EINVAL, "%s", "bad memo index");
      n = n * 10 + (uint64_t)(s[i] - '0');
    }
    if (op == 'g')
      return push(v, memo_get(v, n));
    if (!(x = top(v)))
      return -1;
    return memo_put(v, n, x);
  }
  case 'h': /* BINGET */
  case 'j': /* LONG_BINGET */
    if (len_arg(v, op == 'h' ? 1 : 4, &n) != 0)
      return -1;
    return push(v, memo_get(v, n));
  case 'c': { /* GLOBAL */
    const char *m = NULL, *nm = NULL;
    size_t ml = 0, nl = 0;
    if (rd_line(v, &m, &ml) != 0)
      return -1;
    size_t mpos = v->pos - ml - 1; /* the window may move (it keeps this opcode) */
    if (rd_line(v, &nm, &nl) != 0)
      return -1;
    m = (const char *)v->buf + (mpos - v->base);
    return do_global(v, m, ml, nm, nl);
  }
  case 0x93: /* STACK_GLOBAL */
    if (!(y = pop(v)) || !(x = pop(v)))
      return -1;
    if (x->kind != BS_PV_STR || y->kind != BS_PV_STR)
      return VFAIL(v, EINVAL, "STACK_GLOBAL needs two str, got %s and %s", bs_pv_kind_name(x->kind),
                   bs_pv_kind_name(y->kind));
    if (x->u.str.len > MAX_LINE || y->u.str.len > MAX_LINE)
      return VFAIL(v, EINVAL, "STACK_GLOBAL name longer than %u bytes", MAX_LINE);
    return do_global(v, x->u.str.s, x->u.str.len, y->u.str.s, y->u.str.len);
  case 'R': /* REDUCE */
    if (!(y = pop(v)) || !(x = pop(v)))
      return -1;
    return push(v, pk_call(v, x, y, 0));
  case 0x81: /* NEWOBJ */
    if (!(y = pop(v)) || !(x = pop(v)))
      return -1;
    if (y->kind != BS_PV_TUPLE)
      return VFAIL(v, EINVAL, "NEWOBJ arguments are a %s, expected a tuple",
                   bs_pv_kind_name(y->kind));
    return push(v, pk_call_new(v, x, y));
  case 0x92: /* NEWOBJ_EX: cls, args, kwargs (kwargs dropped) */
    if (!(z = pop(v)) || !(y = pop(v)) || !(x = pop(v)))
      return -1;
    if (y->kind != BS_PV_TUPLE)
      return VFAIL(v, EINVAL, "NEWOBJ_EX arguments are a %s, expected a tuple",
                   bs_pv_kind_name(y->kind));
    return push(v, pk_call_new(v, x, y));
  case 'b': /* BUILD */
    if (!(y = pop(v)) || !(x = top(v)))
      return -1;
    return pk_build(v, x, y);
  case 'Q': /* BINPERSID */
    if (!(x = pop(v)))
      return -1;
    return push(v, pk_persistent_load(v, x));
  default: {
    const char *name = opcode_name(op);
    if (name)
      return VFAIL(v, ENOTSUP, "unsupported pickle opcode 0x%02x (%s)", op, name);
    return VFAIL(v, EINVAL, "unknown pickle opcode 0x%02x: not a pickle stream, or corrupt", op);
  }
  }
}

int bs_pickle_load(struct bs_pickle *p, const struct bs_src *src, uint64_t off, uint64_t end,
                   const struct bs_pickle_opts *opts, struct bs_pv **out, uint64_t *stop_end,
                   bs_err *err)
{
  static const struct bs_pickle_opts defaults = {.strict = false, .base_off = 0};
  struct vm v;
  memset(&v, 0, sizeof v);
  v.p = p;
  v.src = src;
  v.start = off;
  v.end = end;
  v.opts = opts ? opts : &defaults;
  v.err = err;
  *out = NULL;
  if (off > end || end > src->size)
    return bs_fail(err, EINVAL, off, NULL,
                   "pickle range [%" PRIu64 ", %" PRIu64 ") outside the file", off, end);
  /* The bounds: from the largest file this unpickler read from. */
  uint64_t input = v.opts->input ? v.opts->input : src->size, mem, work;
  if (input > p->input || p->budget == 0) {
    if (!bs_mul_u64(input, BS_PICKLE_MEM_PER_BYTE, &mem) || mem > BS_PICKLE_MAX_ALLOC)
      mem = BS_PICKLE_MAX_ALLOC;
    if (mem < BS_PICKLE_MEM_FLOOR)
      mem = BS_PICKLE_MEM_FLOOR;
    if (!bs_mul_u64(input, BS_PICKLE_WORK_PER_BYTE, &work) ||
        !bs_add_u64(work, BS_PICKLE_WORK_FLOOR, &work))
      work = UINT64_MAX;
    p->input = input;
    p->budget = mem;
    p->work = work;
  }
  p->over_budget = false;
  p->scratch = 0;
  /* Real pickles number memo entries 0, 1, 2, ...: an index beyond the
   * stream length (plus slack) can only come from a hostile file. */
  v.memo_limit = end - off + 256;
  if (v.memo_limit > BS_PICKLE_MAX_MEMO)
    v.memo_limit = BS_PICKLE_MAX_MEMO;
  uint64_t dropped_before = p->notes_dropped;
  int rc = 0;
  bool stop = false;
  while (!stop) {
    if (v.pos == end - off) {
      rc = bs_fail(err, EINVAL, pk_abs_off(&v, v.pos), NULL,
                   "pickle offset %zu: truncated pickle: the stream ends without STOP", v.pos);
      break;
    }
    if ((rc = step(&v, &stop)) != 0)
      break;
  }
  if (rc == 0) {
    if (v.sp == 0)
      rc = VFAIL(&v, EINVAL, "%s", "STOP with an empty stack");
    else
      *out = v.stack[v.sp - 1];
  }
  if (rc == 0 && p->notes_dropped > dropped_before) {
    /* make room for the summary by reusing the last slot */
    char line[128];
    snprintf(line, sizeof line, "... and %" PRIu64 " more skipped objects",
             p->notes_dropped - dropped_before);
    char *s = pk_alloc(p, strlen(line) + 1);
    if (s && p->nnotes) {
      strcpy(s, line);
      p->notes[p->nnotes - 1] = s;
    }
  }
  if (rc == 0 && stop_end)
    *stop_end = off + v.pos;
  bs_free(v.buf);
  bs_free(v.stack);
  bs_free(v.marks);
  bs_free(v.memo);
  p->scratch = 0;
  return rc;
}
