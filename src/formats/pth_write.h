/* The PyTorch (.pt/.pth/.bin) writer: the zip layout torch.save writes, a
 * flat state dict (key -> tensor) that torch.load(weights_only=True) loads,
 * torch 1.13 included unless a tensor has a dtype only torch 2.x has (F8,
 * U16-U64). Its row in the writers table is "pytorch". */
#ifndef BURNSTORE_PTH_WRITE_H
#define BURNSTORE_PTH_WRITE_H

#include "core/catalog.h"
#include "core/sink.h"

/* Data of every zip member starts at a multiple of this (torch's alignment,
 * so that torch.load(mmap=True) can map storages). */
#define BS_PTH_ALIGN 64u

/* Can a torch.save file store this tensor (a dtype torch.save writes, a
 * readable source, a UTF-8 name)? 0, or -1 with err. */
BS_NODISCARD int bs_pth_can_write(const struct bs_tensor *t, bs_err *err);
/* The names torch can load back: UTF-8 (pickled Python str), at most BS_MAX_KEY_LEN bytes. */
BS_NODISCARD int bs_pth_name_ok(const char *name, bs_err *err);
/* What a PyTorch file rewritten in place keeps besides its tensors: its
 * whole pickled value (dicts and their type, a module's `_metadata`, lists,
 * tuples, ints, floats, strings, bools, None), re-pickled with the new
 * tensors in place of the old ones. */
struct bs_pickle;
struct bs_pv;
struct bs_pth_keep {
  struct bs_pickle *p;      /* owns root */
  const struct bs_pv *root; /* the source's data.pkl value */
};
void bs_pth_keep_destroy(struct bs_pth_keep *keep); /* safe on a zeroed or failed keep */
/* Can the PyTorch file in src be rewritten in place without losing anything?
 * It can if it is a torch.save zip whose pickle is a dict holding only
 * tensors, plain values and lists, tuples and dicts of them, and the
 * reader names each tensor by its path (no shared tensor, no colliding
 * names). 0 and *keep, or -1 with err naming the first value it cannot keep. */
BS_NODISCARD int bs_pth_keep_check(const struct bs_src *src, struct bs_pth_keep *keep, bs_err *err);
/* The tensors of cat (a mount of keep's source, key options applied) that
 * a rewrite in place must keep where they are: the items of a list or
 * tuple, which have no key to leave them out by. Sets fixed[i] (cat->count
 * entries, zeroed by the caller) for each; 0, or -1 with err naming an
 * item that cat already leaves out or renames, or a value keep_check
 * would refuse. */
BS_NODISCARD int bs_pth_keep_fixed(const struct bs_pth_keep *keep, const struct bs_catalog *cat,
                                   bool *fixed, bs_err *err);

/* Serialize every tensor that is not hidden, in catalog order, into k. The
 * archive prefix is k->name's base name without its last extension (as
 * torch.save names it), "archive" when that is empty or not plain ASCII.
 * cat->meta is not written (torch has no place for it). When k->name is
 * the path of cat->srcs[0], a file (a rewrite in place, also by --finish),
 * that file must pass bs_pth_keep_check, and its pickle is written with
 * cat's tensors in place of its own: a tensor cat lacks is left out of its
 * dict, one its pickle lacks goes to the deepest dict whose path (dotted
 * keys) prefixes its name, after the dict's items. */
BS_NODISCARD int bs_pth_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);

/* bs_pth_write with what keep kept (from bs_pth_keep_check of the source),
 * or as a flat state dict when keep is NULL, whatever k names. */
BS_NODISCARD int bs_pth_write_kept(const struct bs_catalog *cat, const struct bs_pth_keep *keep,
                                   struct bs_sink *k, bs_err *err);

#endif
