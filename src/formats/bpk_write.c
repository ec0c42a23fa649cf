/* PLACEHOLDER until the Burnpack writer lands. */
#include <errno.h>
#include "burnstore/alloc.h"
#include "burnstore/bpk_write.h"
void bs_buf_destroy(struct bs_buf *b) { bs_free(b->data); b->data = NULL; b->len = b->cap = 0; }
int bs_bpk_write_mem(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, struct bs_buf *out, bs_err *err)
{ (void)cat; (void)plan; (void)out; return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "writer not built yet"); }
int bs_bpk_write_fd(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, int fd, bs_err *err)
{ (void)cat; (void)plan; (void)fd; return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "writer not built yet"); }
int bs_bpk_write_file(const struct bs_catalog *cat, const struct bs_bpk_plan *plan, const char *path, bs_err *err)
{ (void)cat; (void)plan; (void)path; return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "writer not built yet"); }
int bs_bpk_default_meta(struct bs_catalog *cat, bs_err *err)
{ (void)cat; return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "writer not built yet"); }
