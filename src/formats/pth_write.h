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
/* Serialize every tensor that is not hidden, in catalog order, into k. The
 * archive prefix is k->name's base name without its last extension (as
 * torch.save names it), "archive" when that is empty or not plain ASCII.
 * cat->meta is not written (torch has no place for it). */
BS_NODISCARD int bs_pth_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);

#endif
