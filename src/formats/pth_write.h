/* The PyTorch (.pt/.pth/.bin) writer: the zip layout torch.save writes, a
 * flat state dict (key -> tensor) that torch.load(weights_only=True) loads,
 * torch 1.13 included. Its row in the writers table is "pytorch". */
#ifndef BURNSTORE_PTH_WRITE_H
#define BURNSTORE_PTH_WRITE_H

#include "burnstore/catalog.h"
#include "burnstore/sink.h"

/* Data of every zip member starts at a multiple of this (torch's alignment,
 * so that torch.load(mmap=True) can map storages). */
#define BS_PTH_ALIGN 64u

/* Can a torch.save file store this tensor (a dtype with a storage class
 * torch 1.13 knows, a readable source, a UTF-8 name)? 0, or -1 with err. */
BS_NODISCARD int bs_pth_can_write(const struct bs_tensor *t, bs_err *err);
/* What a PyTorch file rewritten in place keeps besides its tensors: whether
 * its state dict was an OrderedDict, and the pickled state of its BUILD
 * (a module's `_metadata`), re-emitted as it was. */
struct bs_pth_keep {
  bool ordered;
  struct bs_buf state; /* empty: no BUILD */
};
void bs_pth_keep_destroy(struct bs_pth_keep *keep);
/* Can the PyTorch file in src be rewritten in place without losing anything?
 * Only a flat state dict can: a torch.save zip whose pickle is one dict of
 * string keys and tensors (a BUILD state of plain values kept). 0 and *keep,
 * or -1 with err naming the first value it cannot keep. */
BS_NODISCARD int bs_pth_keep_check(const struct bs_src *src, struct bs_pth_keep *keep, bs_err *err);

/* Serialize every tensor that is not hidden, in catalog order, into k. The
 * archive prefix is k->name's base name without its last extension (as
 * torch.save names it), "archive" when that is empty or not plain ASCII.
 * cat->meta is not written (torch has no place for it). When k->name is
 * the path of cat->srcs[0], a file (a rewrite in place, also by --finish),
 * that file must pass bs_pth_keep_check, and what it keeps is written. */
BS_NODISCARD int bs_pth_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);

#endif
