/* What a conversion makes of an opened checkpoint before its writer runs,
 * once for `burnstore convert` and for a -o view= mount, so that the view's
 * bytes are the file convert writes: --as (as=), the output's format, the
 * writer's checks and default metadata; and what the output leaves out of
 * the source (its non-tensor values, metadata a format has no place for),
 * said in the same words by both. No FUSE. */
#ifndef BURNSTORE_POLICY_CONVERT_H
#define BURNSTORE_POLICY_CONVERT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/catalog.h"
#include "formats/writers.h"

/* Prepare cat (opened, key options and adapter applied) for writer w:
 * with as (not NULL), every floating tensor decoded as *as, one that cannot
 * be refused ("<opt> F16: why", opt "--as " or "as="); cat->format becomes
 * w's; bs_writer_check; the row's default metadata. 0, or -1 with err
 * (key: the tensor refused). */
BS_NODISCARD int bs_convert_prepare(struct bs_catalog *cat, const struct bs_writer *w,
                                    const enum bs_dtype *as, const char *opt, bs_err *err);

#define BS_LEFT_OUT_LINE 512 /* a line of bs_convert_left_out, its NUL included */

/* What writing cat with w leaves out of the source, one line a thing,
 * without a prefix or newline, each into lines[i]: the metadata a format
 * with no place for it drops, the tensors' parameter ids a format other
 * than Burnpack drops, and the non-tensor values of a pickle (epoch,
 * optimizer.* (11), ...). Returns the number of lines (0 to 3). */
#define BS_LEFT_OUT_MAX 3
size_t bs_convert_left_out(const struct bs_catalog *cat, const struct bs_writer *w,
                           char lines[BS_LEFT_OUT_MAX][BS_LEFT_OUT_LINE]);

#endif
