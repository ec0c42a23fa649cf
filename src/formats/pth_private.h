/* What the PyTorch reader's files share (pth.c, pth_zip.c, pth_legacy.c,
 * pth_tar.c, pth_values.c). Not a public header. */
#ifndef BURNSTORE_PTH_PRIVATE_H
#define BURNSTORE_PTH_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/strmap.h"
#include "formats/formats.h"
#include "formats/pickle.h"
#include "formats/torch_pickle.h"
#include "formats/zip.h"

/* Flattening bounds (bytes and work, not counts). */
#define PTH_VALUES_BUDGET (16u << 20) /* bytes of user.burnstore.values text (+ per-value cost) */
#define PTH_VALUES_WORK 1000000u      /* nodes visited while values are still collected */
#define PTH_WALK_BUDGET 4000000u      /* nodes reached again (shared references multiplied) */
#define PTH_TENSOR_SHARING 16u        /* keys per distinct tensor, on average, past the first */
#define PTH_TENSOR_SLACK 4096u        /* 4096 keys of the others */
#define PTH_WALK_NOTES 100u           /* notes the walk writes (cycles, bare storages) */
/* What a tensor's key costs while the reader runs, charged to the
 * unpickler's memory bound (bs_pickle_charge): its catalog entry, found
 * entry and key maps, plus 16 bytes a dimension, plus the key's copies (the
 * key map's, the catalog's; growth of the arrays of both). */
#define PTH_KEY_COST 224u
#define PTH_KEY_COPIES 2u
/* Per-channel quantizers kept (scales and zero points, 16 bytes a channel,
 * one copy per key): at most this many times the file's size, plus the
 * slack below. Each key of a shared tensor holds its own copy, so a small
 * file naming one large quantizer under thousands of keys would otherwise
 * cost gigabytes. */
#define PTH_QPARAM_RATIO 4u
#define PTH_QPARAM_SLACK (16u << 20)

/* Unpickle zip member pk (data.pkl) of src into p: in place when stored,
 * else from a copy inflated once into an unlinked file in $TMPDIR (never
 * into memory; refused when it cannot fit there), the unpickler's bounds
 * sized from src's size. The reader's, and the writer's rewrite in place. */
BS_NODISCARD int pth_zip_load_pickle(const struct bs_src *src, const struct bs_zip_entry *pk,
                                     struct bs_pickle *p, bool strict, struct bs_pv **root,
                                     bs_err *err);

/* Where a storage's bytes are. */
struct pth_rec {
  char *key;
  uint32_t src;
  uint64_t off, len;
  unsigned esize; /* legacy/tar: from the storage class */
  bool located;
};

struct pth_found {
  char *key; /* borrowed from owned_keys */
  struct bs_pv *t;
};

struct pth_ctx {
  struct bs_catalog *cat;
  uint32_t src;
  const struct bs_open_opts *opts;
  bs_err *err;
  struct bs_pickle *p;
  /* zip */
  struct bs_zip zip;
  char *prefix;
  bool has_tmp;     /* deflated storages are inflated, one after another, into */
  uint32_t tmp_src; /* this catalog source: one unlinked temporary file */
  int tmp_fd;       /* (when has_tmp) our own fd of it, to write with */
  /* storages */
  struct pth_rec *recs;
  size_t nrecs, reccap;
  struct bs_strmap recmap;
  /* flattening (pth_values.c) */
  struct pth_found *found;
  size_t nfound, foundcap;
  struct bs_strmap keys; /* every emitted key, to catch collisions */
  char **owned_keys;     /* keys kept alive for the map */
  size_t nowned, ownedcap;
  char *values; /* JSON object text being built, without the closing brace */
  size_t vlen, vcap, nvalues;
  bool values_off;   /* a budget was reached: no more values */
  uint64_t visits;   /* nodes visited */
  uint64_t revisits; /* visits of nodes reached before */
  uint64_t tensors;  /* distinct tensor values found (nfound counts their keys) */
  unsigned walk_notes;
  uint64_t vbytes; /* values budget spent */
  uint64_t qbytes; /* per-channel quantizer bytes kept (PTH_QPARAM_RATIO) */
  char *path;      /* BS_MAX_KEY_LEN + 2 bytes */
  struct pth_frame *stack;
  size_t depth, stackcap;
};

/* Locate a storage record (zip: in place or a decompressed copy). */
typedef int (*pth_locate_fn)(struct pth_ctx *c, struct pth_rec *r, const char *tkey);

static inline const struct bs_src *pth_src(const struct pth_ctx *c)
{
  return &c->cat->srcs[c->src];
}

int pth_nomem(struct pth_ctx *c);
/* The record for storage `key`, created unlocated if new. */
struct pth_rec *pth_rec_get(struct pth_ctx *c, const char *key);

/* pth_values.c: walk the unpickled object; tensors go to c->found, other
 * values to c->values (bounded by PTH_VALUES_BUDGET/PTH_VALUES_WORK). */
BS_NODISCARD int pth_flatten(struct pth_ctx *c, struct bs_pv *root);
/* The values as one JSON object (bs_malloc'd), or NULL with *none set when empty. */
BS_NODISCARD int pth_values_json(struct pth_ctx *c, char **out);

/* pth.c: add the found tensors to the catalog (locating storages with
 * `locate` when not located yet), the pickle's notes and the values. */
BS_NODISCARD int pth_conclude(struct pth_ctx *c, pth_locate_fn locate);

/* pth_legacy.c, shared with pth_tar.c */
BS_NODISCARD int pth_check_sys_info(struct pth_ctx *c, const struct bs_pv *si, uint64_t off);
BS_NODISCARD int pth_blob(struct pth_ctx *c, struct pth_rec *r, uint64_t *pos, uint64_t limit);

BS_NODISCARD int pth_read_zip(struct pth_ctx *c);
BS_NODISCARD int pth_read_legacy(struct pth_ctx *c);
BS_NODISCARD int pth_read_tar(struct pth_ctx *c);

#endif
