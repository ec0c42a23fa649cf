/* torch.save's zip container (torch >= 1.6). Stored records are read in place
 * from the file; a deflated record (a re-zipped checkpoint) is inflated once,
 * at open, into an unlinked temporary file on disk ($TMPDIR, else /var/tmp),
 * never into memory, and only if its declared size fits the free space of
 * that file system (and deflate's ratio limit, checked by bs_zip_extract).
 * All deflated storages share one such file (one descriptor). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "pth_private.h"

static const struct bs_zip_entry *zfind(struct pth_ctx *c, const char *rel)
{
  char name[BS_MAX_KEY_LEN + 512];
  int n = snprintf(name, sizeof name, "%s/%s", c->prefix, rel);
  if (n < 0 || (size_t)n >= sizeof name)
    return NULL;
  return bs_zip_find(&c->zip, name);
}

static const char *temp_dir(void)
{
  const char *dir = getenv("TMPDIR");
  return dir && *dir ? dir : "/var/tmp";
}

/* An unlinked file in the temporary directory. */
static int temp_fd(bs_err *err, const char *dir)
{
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/.burnstore-member-XXXXXX", dir);
    if (n > 0 && (size_t)n < sizeof path && (fd = mkostemp(path, O_CLOEXEC)) >= 0)
      unlink(path);
  }
  if (fd < 0)
    return bs_fail(err, errno, BS_OFF_NONE, NULL,
                   "cannot create a temporary file in %s (set TMPDIR): %s", dir, strerror(errno));
  return fd;
}

struct fd_sink {
  int fd;
  uint64_t off;
  const char *name, *dir;
};

static int write_sink(void *ctx, const uint8_t *buf, size_t n, bs_err *err)
{
  struct fd_sink *s = ctx;
  while (n) {
    ssize_t k = pwrite(s->fd, buf, n, (off_t)s->off);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return bs_fail(err, k < 0 ? errno : EIO, BS_OFF_NONE, NULL,
                     "writing the decompressed copy of '%.100s' in %s: %s", s->name, s->dir,
                     k < 0 ? strerror(errno) : "short write");
    buf += k;
    n -= (size_t)k;
    s->off += (uint64_t)k;
  }
  return 0;
}

/* Refuse member e when it cannot fit the file system of fd. */
static int check_room(bs_err *err, int fd, const struct bs_zip_entry *e, const char *dir)
{
  struct statvfs vs;
  if (fstatvfs(fd, &vs) != 0)
    return 0; /* unknown: the writes will tell */
  uint64_t avail;
  if (!bs_mul_u64((uint64_t)vs.f_bavail, (uint64_t)vs.f_frsize, &avail))
    avail = UINT64_MAX;
  if (e->usize > avail)
    return bs_fail(err, ENOSPC, e->lho, NULL,
                   "zip member '%.100s' would decompress to %" PRIu64
                   " bytes but %s has only %" PRIu64
                   " bytes free (set TMPDIR to a larger file system)",
                   e->name, e->usize, dir, avail);
  return 0;
}

/* Inflate member e of src into a new unlinked temporary file; returns its fd or -1. */
static int inflate_to_temp(const struct bs_src *src, const struct bs_zip_entry *e, bs_err *err)
{
  const char *dir = temp_dir();
  int fd = temp_fd(err, dir);
  if (fd < 0)
    return -1;
  struct fd_sink s = {fd, 0, e->name, dir};
  if (check_room(err, fd, e, dir) != 0 || bs_zip_extract(src, e, write_sink, &s, err) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Inflate member e to the end of the reader's temporary source (created on
 * first use), so that a checkpoint of many deflated storages holds one file
 * descriptor, not one per storage. *src and *off say where the bytes are. */
static int inflate_append(struct pth_ctx *c, const struct bs_zip_entry *e, uint32_t *src,
                          uint64_t *off)
{
  const char *dir = temp_dir();
  if (!c->has_tmp) {
    int fd = temp_fd(c->err, dir);
    if (fd < 0)
      return -1;
    int wfd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* ours to write; the source's to read */
    if (wfd < 0) {
      int e2 = errno;
      close(fd);
      return bs_fail(c->err, e2, BS_OFF_NONE, NULL, "cannot duplicate a temporary file: %s",
                     strerror(e2));
    }
    struct bs_src ts;
    char nm[256];
    snprintf(nm, sizeof nm, "%s (decompressed members)", pth_src(c)->name);
    /* Unlinked, and written only here (it grows below): no change to watch. */
    if (bs_src_init_fd(&ts, fd, BS_SRC_OWN_FD | BS_SRC_UNWATCHED, nm, c->err) != 0 ||
        bs_catalog_add_src(c->cat, &ts, &c->tmp_src, c->err) != 0) {
      close(wfd);
      return -1;
    }
    c->tmp_fd = wfd;
    c->has_tmp = true;
  }
  struct bs_src *ts = &c->cat->srcs[c->tmp_src];
  uint64_t end;
  if (!bs_add_u64(ts->size, e->usize, &end))
    return bs_fail(c->err, EFBIG, e->lho, NULL, "decompressed members overflow");
  struct fd_sink s = {c->tmp_fd, ts->size, e->name, dir};
  if (check_room(c->err, c->tmp_fd, e, dir) != 0 ||
      bs_zip_extract(pth_src(c), e, write_sink, &s, c->err) != 0) {
    if (ftruncate(c->tmp_fd, (off_t)ts->size) != 0) /* drop the partial copy */
      return -1;                                    /* (the first error stays) */
    return -1;
  }
  *src = c->tmp_src;
  *off = ts->size;
  ts->size = end;
  return 0;
}

/* Locate storage `key` of a zip: data/<key> in place, or a decompressed copy. */
static int zip_locate(struct pth_ctx *c, struct pth_rec *r, const char *tkey)
{
  char rel[BS_MAX_KEY_LEN + 16];
  snprintf(rel, sizeof rel, "data/%s", r->key);
  const struct bs_zip_entry *z = zfind(c, rel);
  if (!z)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, tkey,
                   "storage '%.64s' has no record '%.64s/data/%.64s' in the archive", r->key,
                   c->prefix, r->key);
  if (z->method == BS_ZIP_STORED) {
    if (z->csize != z->usize)
      return bs_fail(c->err, EINVAL, z->lho, tkey,
                     "corrupt zip: stored entry '%.100s' has compressed size %" PRIu64
                     " != size %" PRIu64,
                     z->name, z->csize, z->usize);
    if (bs_zip_data_off(pth_src(c), z, &r->off, c->err) != 0)
      return -1;
    r->src = c->src;
    r->len = z->usize;
  } else {
    if (z->usize > BS_MAX_TENSOR_BYTES)
      return bs_fail(c->err, EFBIG, z->lho, tkey,
                     "compressed entry '%.100s' expands to %" PRIu64 " bytes", z->name, z->usize);
    if (inflate_append(c, z, &r->src, &r->off) != 0)
      return -1;
    r->len = z->usize;
  }
  r->located = true;
  return 0;
}

static int check_byteorder(struct pth_ctx *c)
{
  const struct bs_zip_entry *bo = zfind(c, "byteorder");
  if (!bo)
    return 0;
  uint8_t *b;
  if (bs_zip_extract_mem(pth_src(c), bo, 64, &b, c->err) != 0)
    return -1;
  bool big = bo->usize == 3 && memcmp(b, "big", 3) == 0;
  bool little = bo->usize == 6 && memcmp(b, "little", 6) == 0;
  bs_free(b);
  if (big)
    return bs_fail(c->err, ENOTSUP, bo->lho, NULL,
                   "big-endian checkpoint (byteorder record says 'big'): not supported");
  if (!little)
    return bs_fail(c->err, EINVAL, bo->lho, NULL, "byteorder record is neither 'little' nor 'big'");
  return 0;
}

int pth_zip_load_pickle(const struct bs_src *src, const struct bs_zip_entry *pk,
                        struct bs_pickle *p, bool strict, struct bs_pv **root, bs_err *err)
{
  /* bounded by the checkpoint's size, not by what a deflated pickle inflates to */
  struct bs_pickle_opts po = {.strict = strict, .input = src->size};
  if (pk->method == BS_ZIP_STORED && pk->csize == pk->usize) {
    uint64_t d;
    if (bs_zip_data_off(src, pk, &d, err) != 0)
      return -1;
    po.base_off = d;
    return bs_pickle_load(p, src, d, d + pk->csize, &po, root, NULL, err);
  }
  if (pk->usize > BS_PICKLE_MAX_BYTES)
    return bs_fail(err, EFBIG, pk->lho, NULL, "'%.100s' is %" PRIu64 " bytes, over the limit of %u",
                   pk->name, pk->usize, (unsigned)BS_PICKLE_MAX_BYTES);
  int fd = inflate_to_temp(src, pk, err);
  if (fd < 0)
    return -1;
  struct bs_src ms;
  po.base_off = BS_OFF_NONE;
  int rc = bs_src_init_fd(&ms, fd, BS_SRC_OWN_FD, pk->name, err); /* closes fd on failure */
  if (rc == 0) /* values are copies: nothing points into the stream */
    rc = bs_pickle_load(p, &ms, 0, pk->usize, &po, root, NULL, err);
  bs_src_destroy(&ms);
  return rc;
}

int pth_read_zip(struct pth_ctx *c)
{
  if (bs_zip_open(&c->zip, pth_src(c), c->err) != 0)
    return -1;
  const char *first = c->zip.ents[0].name, *slash = strchr(first, '/');
  if (!slash || slash == first)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "zip entry '%.100s' is not inside a directory: not a torch.save archive", first);
  if (!(c->prefix = bs_strndup(first, (size_t)(slash - first))))
    return pth_nomem(c);
  size_t plen = strlen(c->prefix);
  bool script = zfind(c, "constants.pkl") != NULL;
  for (size_t i = 0; i < c->zip.n && !script; i++)
    script = strncmp(c->zip.ents[i].name, c->prefix, plen) == 0 &&
             strncmp(c->zip.ents[i].name + plen, "/code/", 6) == 0;
  if (script)
    return bs_fail(c->err, ENOTSUP, BS_OFF_NONE, NULL,
                   "this is a TorchScript archive (torch.jit.save), not a torch.save checkpoint; "
                   "load it in Python and save model.state_dict() with torch.save");
  if (check_byteorder(c) != 0)
    return -1;
  const struct bs_zip_entry *pk = zfind(c, "data.pkl");
  if (!pk)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "no '%.100s/data.pkl' in the zip: not a torch.save checkpoint", c->prefix);
  struct bs_pv *root;
  if (pth_zip_load_pickle(pth_src(c), pk, c->p, c->opts->strict, &root, c->err) != 0 ||
      pth_flatten(c, root) != 0)
    return -1;
  return pth_conclude(c, zip_locate);
}
