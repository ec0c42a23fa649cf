/* PyTorch checkpoints, three containers:
 *
 * ZIP (torch >= 1.6, first bytes "PK\3\4"):
 *   1. Local file header per record: u32 sig 0x04034b50, ..., u16 name_len at 26,
 *      u16 extra_len at 28, name, extra (torch pads data to 64 with a 0x4246
 *      extra that exists ONLY in the local header), then the data (STORED).
 *   2. Central directory: per entry u32 sig 0x02014b50, u16 method at 10,
 *      u32 csize at 20, u32 usize at 24, u16 name_len at 28, u16 extra_len at 30,
 *      u16 comment_len at 32, u32 local header offset at 42, name at 46; a zip64
 *      extra (id 1) carries the 64-bit usize/csize/offset that are 0xFFFFFFFF.
 *   3. Zip64 EOCD (sig 0x06064b50: u64 entries at 32, u64 cd size at 40, u64 cd
 *      offset at 48) + locator (sig 0x07064b50, u64 zip64 EOCD offset at 8) +
 *      EOCD (sig 0x06054b50: u16 entries at 10, u32 cd size at 12, u32 cd
 *      offset at 16, u16 comment length at 20).
 *   Records: <prefix>/data.pkl (the pickle), <prefix>/data/<key> (one storage,
 *   raw LE bytes), <prefix>/byteorder ("little"/"big"), version, ... where
 *   <prefix> is the first central entry's name up to '/'.
 * LEGACY (torch < 1.6): five pickles back to back (magic 0x1950a86a20f9469cfc6c,
 *   protocol 1001, sys_info dict, the object, list of storage keys), then per
 *   key in list order: u64 LE element count + count * element size bytes.
 * TAR (torch 0.1-era): ustar members sys_info (pickle), pickle (the object,
 *   storages given as ('storage', cls, key, location, numel) tuples) and
 *   storages (pickled count, then per storage a pickled (key, location, cls)
 *   + u64 LE element count + bytes).
 * Tensors are _rebuild_tensor_v2(storage, offset, size, stride, ...): the
 * bytes stay where they are in the file; strided views are gathered on read. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zip.h>

#include "burnstore/alloc.h"
#include "burnstore/checked.h"
#include "burnstore/formats.h"
#include "burnstore/pickle.h"

#define WALK_BUDGET 4000000u /* nodes visited while flattening (shared-reference bombs) */
#define MAX_VALUES 1000000u  /* non-tensor entries in values_json */
#define TAR_BLOCK 512u

/* ---- a small string -> index map ------------------------------------------------------------ */

struct smap {
  const char **keys; /* borrowed */
  size_t *vals;
  size_t cap, n;
};

static uint64_t hash_str(const char *s)
{
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void smap_destroy(struct smap *m)
{
  bs_free(m->keys);
  bs_free(m->vals);
  memset(m, 0, sizeof *m);
}

static bool smap_get(const struct smap *m, const char *k, size_t *val)
{
  if (!m->cap)
    return false;
  for (size_t i = hash_str(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i])
      return false;
    if (strcmp(m->keys[i], k) == 0) {
      *val = m->vals[i];
      return true;
    }
  }
}

/* Insert k (borrowed). Returns 0, 1 if k was present (val untouched), -1 on OOM. */
static int smap_put(struct smap *m, const char *k, size_t val)
{
  if ((m->n + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    const char **nk = bs_calloc(cap, sizeof *nk);
    size_t *nv = bs_calloc(cap, sizeof *nv);
    if (!nk || !nv) {
      bs_free(nk);
      bs_free(nv);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i])
        continue;
      size_t j = hash_str(m->keys[i]) & (cap - 1);
      while (nk[j])
        j = (j + 1) & (cap - 1);
      nk[j] = m->keys[i];
      nv[j] = m->vals[i];
    }
    bs_free(m->keys);
    bs_free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = cap;
  }
  size_t i = hash_str(k) & (m->cap - 1);
  for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
    if (strcmp(m->keys[i], k) == 0)
      return 1;
  m->keys[i] = k;
  m->vals[i] = val;
  m->n++;
  return 0;
}

/* ---- reader state --------------------------------------------------------------------------- */

struct zent {
  char *name;
  uint16_t method, flags;
  uint64_t csize, usize, lho;
};

/* Where a storage's bytes are. */
struct rec {
  char *key;
  uint32_t src;
  uint64_t off, len;
  unsigned esize; /* legacy/tar: from the storage class */
  bool located;
};

struct found {
  char *key;
  struct bs_pv *t;
};

struct ctx {
  struct bs_catalog *cat;
  uint32_t src;
  const struct bs_open_opts *opts;
  bs_err *err;
  struct bs_pickle *p;
  /* zip */
  struct zent *ents;
  size_t nents;
  struct smap names;
  char *prefix;
  zip_t *za;
  /* storages */
  struct rec *recs;
  size_t nrecs, reccap;
  struct smap recmap;
  /* flattening */
  struct found *found;
  size_t nfound, foundcap;
  struct smap keys;  /* every emitted key, to catch collisions */
  char **owned_keys; /* JSON keys kept alive for the map */
  size_t nowned, ownedcap;
  json_t *values;
  size_t nvalues;
  char *path;
  size_t pathcap;
  uint64_t budget;
};

static const struct bs_src *S(const struct ctx *c)
{
  return &c->cat->srcs[c->src];
}

static void ctx_destroy(struct ctx *c)
{
  for (size_t i = 0; i < c->nents; i++)
    bs_free(c->ents[i].name);
  bs_free(c->ents);
  smap_destroy(&c->names);
  bs_free(c->prefix);
  if (c->za)
    zip_discard(c->za);
  for (size_t i = 0; i < c->nrecs; i++)
    bs_free(c->recs[i].key);
  bs_free(c->recs);
  smap_destroy(&c->recmap);
  for (size_t i = 0; i < c->nfound; i++)
    bs_free(c->found[i].key);
  bs_free(c->found);
  smap_destroy(&c->keys);
  for (size_t i = 0; i < c->nowned; i++)
    bs_free(c->owned_keys[i]);
  bs_free(c->owned_keys);
  if (c->values)
    json_decref(c->values);
  bs_free(c->path);
  bs_pickle_free(c->p);
}

static int nomem(struct ctx *c)
{
  return bs_fail(c->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
}

/* The record for storage `key`, created unlocated if new. */
static struct rec *rec_get(struct ctx *c, const char *key)
{
  size_t idx;
  if (smap_get(&c->recmap, key, &idx))
    return &c->recs[idx];
  if (bs_grow((void **)&c->recs, &c->reccap, c->nrecs + 1, sizeof *c->recs) != 0) {
    nomem(c);
    return NULL;
  }
  struct rec *r = &c->recs[c->nrecs];
  memset(r, 0, sizeof *r);
  if (!(r->key = bs_strdup(key))) {
    nomem(c);
    return NULL;
  }
  if (smap_put(&c->recmap, r->key, c->nrecs) < 0) {
    bs_free(r->key);
    nomem(c);
    return NULL;
  }
  c->nrecs++;
  return r;
}

/* ---- zip ------------------------------------------------------------------------------------ */

static int zip_fail(struct ctx *c, uint64_t off, const char *what)
{
  return bs_fail(c->err, EINVAL, off, NULL, "corrupt zip: %s", what);
}

static int zip_parse(struct ctx *c)
{
  const struct bs_src *s = S(c);
  uint64_t size = s->size;
  if (size < 22)
    return zip_fail(c, 0, "the file is too short for an end-of-central-directory record");
  uint64_t tlen = size < 22 + 65535 ? size : 22 + 65535, tstart = size - tlen;
  uint8_t *tail;
  if (bs_src_read_alloc(s, tstart, tlen, &tail, c->err) != 0)
    return -1;
  uint64_t eocd = UINT64_MAX;
  for (uint64_t i = tlen - 22 + 1; i-- > 0;) {
    if (bs_le32(tail + i) == 0x06054b50 && i + 22 + bs_le16(tail + i + 20) <= tlen) {
      eocd = i;
      break;
    }
  }
  if (eocd == UINT64_MAX) {
    bs_free(tail);
    return zip_fail(c, size, "no end-of-central-directory record (truncated file?)");
  }
  const uint8_t *e = tail + eocd;
  uint64_t entries = bs_le16(e + 10), cdsize = bs_le32(e + 12), cdoff = bs_le32(e + 16);
  uint64_t eocd_abs = tstart + eocd;
  bs_free(tail);
  if (eocd_abs >= 20) {
    uint8_t loc[20];
    if (bs_src_read(s, eocd_abs - 20, loc, 20, c->err) != 0)
      return -1;
    if (bs_le32(loc) == 0x07064b50) {
      uint64_t z = bs_le64(loc + 8);
      uint8_t z64[56];
      if (!bs_range_ok(z, 56, eocd_abs))
        return zip_fail(c, eocd_abs - 20, "zip64 locator points outside the file");
      if (bs_src_read(s, z, z64, 56, c->err) != 0)
        return -1;
      if (bs_le32(z64) != 0x06064b50)
        return zip_fail(c, z, "bad zip64 end-of-central-directory signature");
      entries = bs_le64(z64 + 32);
      cdsize = bs_le64(z64 + 40);
      cdoff = bs_le64(z64 + 48);
    }
  }
  if (!bs_range_ok(cdoff, cdsize, eocd_abs))
    return bs_fail(c->err, EINVAL, eocd_abs, NULL,
                   "corrupt zip: central directory [%" PRIu64 ", +%" PRIu64
                   ") does not end before the end record at %" PRIu64,
                   cdoff, cdsize, eocd_abs);
  if (cdsize > BS_PICKLE_MAX_BYTES)
    return bs_fail(c->err, EFBIG, cdoff, NULL,
                   "zip central directory of %" PRIu64 " bytes exceeds the limit of %u", cdsize,
                   (unsigned)BS_PICKLE_MAX_BYTES);
  if (entries == 0)
    return zip_fail(c, eocd_abs, "the archive has no entries");
  if (entries > cdsize / 46)
    return bs_fail(c->err, EINVAL, eocd_abs, NULL,
                   "corrupt zip: %" PRIu64 " entries cannot fit in a %" PRIu64
                   "-byte central directory",
                   entries, cdsize);
  uint8_t *cd;
  if (bs_src_read_alloc(s, cdoff, cdsize, &cd, c->err) != 0)
    return -1;
  c->ents = bs_calloc((size_t)entries, sizeof *c->ents);
  if (!c->ents) {
    bs_free(cd);
    return nomem(c);
  }
  uint64_t p = 0;
  int rc = 0;
  for (uint64_t i = 0; i < entries && rc == 0; i++) {
    uint64_t at = cdoff + p;
    if (cdsize - p < 46 || bs_le32(cd + p) != 0x02014b50) {
      rc = zip_fail(c, at, "bad central directory entry");
      break;
    }
    const uint8_t *h = cd + p;
    struct zent *z = &c->ents[i];
    z->flags = bs_le16(h + 8);
    z->method = bs_le16(h + 10);
    z->csize = bs_le32(h + 20);
    z->usize = bs_le32(h + 24);
    z->lho = bs_le32(h + 42);
    uint64_t nl = bs_le16(h + 28), xl = bs_le16(h + 30), cl = bs_le16(h + 32);
    if (cdsize - p - 46 < nl + xl + cl) {
      rc = zip_fail(c, at, "central directory entry runs past the directory");
      break;
    }
    if (memchr(h + 46, '\0', nl)) {
      rc = zip_fail(c, at, "entry name contains a NUL byte");
      break;
    }
    if (!(z->name = bs_strndup((const char *)h + 46, nl))) {
      rc = nomem(c);
      break;
    }
    c->nents++;
    /* zip64 extra: 64-bit fields present only for those that are 0xFFFFFFFF */
    const uint8_t *x = h + 46 + nl, *xe = x + xl;
    while (xe - x >= 4) {
      uint16_t id = bs_le16(x), len = bs_le16(x + 2);
      if (len > xe - x - 4)
        break;
      if (id == 1) {
        const uint8_t *f = x + 4, *fe = f + len;
        uint64_t *fields[3] = {&z->usize, &z->csize, &z->lho};
        for (int k = 0; k < 3; k++) {
          if (*fields[k] != 0xFFFFFFFFu)
            continue;
          if (fe - f < 8) {
            rc = zip_fail(c, at, "zip64 extra field too short");
            break;
          }
          *fields[k] = bs_le64(f);
          f += 8;
        }
      }
      x += 4 + len;
    }
    if (rc == 0 && (z->flags & 1))
      rc = bs_fail(c->err, ENOTSUP, at, NULL, "zip entry '%.100s' is encrypted", z->name);
    p += 46 + nl + xl + cl;
  }
  bs_free(cd);
  if (rc != 0)
    return -1;
  for (size_t i = 0; i < c->nents; i++)
    if (smap_put(&c->names, c->ents[i].name, i) < 0)
      return nomem(c);
  return 0;
}

static struct zent *zfind(struct ctx *c, const char *rel)
{
  char name[BS_MAX_KEY_LEN + 512];
  int n = snprintf(name, sizeof name, "%s/%s", c->prefix, rel);
  if (n < 0 || (size_t)n >= sizeof name)
    return NULL;
  size_t idx;
  return smap_get(&c->names, name, &idx) ? &c->ents[idx] : NULL;
}

/* Absolute offset of a STORED entry's data, checked against the file. */
static int zdata_off(struct ctx *c, const struct zent *z, uint64_t *out)
{
  uint8_t h[30];
  if (!bs_range_ok(z->lho, 30, S(c)->size))
    return bs_fail(c->err, EINVAL, z->lho, NULL,
                   "corrupt zip: local header of '%.100s' at %" PRIu64 " is outside the file",
                   z->name, z->lho);
  if (bs_src_read(S(c), z->lho, h, 30, c->err) != 0)
    return -1;
  if (bs_le32(h) != 0x04034b50)
    return bs_fail(c->err, EINVAL, z->lho, NULL,
                   "corrupt zip: bad local header signature for '%.100s'", z->name);
  uint64_t d = z->lho + 30 + bs_le16(h + 26) + bs_le16(h + 28);
  if (!bs_range_ok(d, z->csize, S(c)->size))
    return bs_fail(c->err, EINVAL, d, NULL,
                   "truncated zip: '%.100s' needs %" PRIu64 " bytes at %" PRIu64
                   " but the file has %" PRIu64,
                   z->name, z->csize, d, S(c)->size);
  *out = d;
  return 0;
}

static int zlib_open(struct ctx *c)
{
  if (c->za)
    return 0;
  const struct bs_src *s = S(c);
  int zerr = 0;
  if (s->fd >= 0) {
    int fd = dup(s->fd); /* zip_fdopen takes ownership on success */
    if (fd < 0)
      return bs_fail(c->err, errno, BS_OFF_NONE, NULL, "dup: %s", strerror(errno));
    c->za = zip_fdopen(fd, 0, &zerr);
    if (!c->za)
      close(fd);
  } else {
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *zs = zip_source_buffer_create(s->mem, s->size, 0, &ze);
    if (zs) {
      c->za = zip_open_from_source(zs, ZIP_RDONLY, &ze);
      if (!c->za)
        zip_source_free(zs);
    }
    zerr = zip_error_code_zip(&ze);
    zip_error_fini(&ze);
  }
  if (!c->za) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, zerr);
    bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL, "libzip cannot open the archive: %s",
            zip_error_strerror(&ze));
    zip_error_fini(&ze);
    return -1;
  }
  return 0;
}

/* Decompress entry z: to `buf` (when buf != NULL, capacity z->usize) or to fd. */
static int zinflate(struct ctx *c, const struct zent *z, uint8_t *buf, int fd)
{
  if (zlib_open(c) != 0)
    return -1;
  size_t idx = (size_t)(z - c->ents);
  const char *name = zip_get_name(c->za, idx, ZIP_FL_ENC_RAW);
  zip_stat_t st;
  if (!name || strcmp(name, z->name) != 0 || zip_stat_index(c->za, idx, 0, &st) != 0 ||
      !(st.valid & ZIP_STAT_SIZE) || st.size != z->usize)
    return bs_fail(c->err, EINVAL, z->lho, NULL,
                   "libzip disagrees about entry %zu ('%.100s'): corrupt central directory?", idx,
                   z->name);
  zip_file_t *zf = zip_fopen_index(c->za, idx, 0);
  if (!zf)
    return bs_fail(c->err, ENOTSUP, z->lho, NULL, "cannot decompress '%.100s' (method %u): %s",
                   z->name, z->method, zip_strerror(c->za));
  static uint8_t dummy;
  uint8_t *tmp = buf ? NULL : bs_malloc(1u << 20);
  if (!buf && !tmp) {
    zip_fclose(zf);
    return nomem(c);
  }
  uint64_t done = 0;
  int rc = 0;
  /* never ask for more than usize: a read past the end triggers libzip's CRC check */
  while (done < z->usize) {
    uint64_t want = z->usize - done;
    if (!buf && want > (1u << 20))
      want = 1u << 20;
    if (want > (1u << 30))
      want = 1u << 30;
    uint8_t *dst = buf ? buf + done : tmp;
    zip_int64_t r = zip_fread(zf, dst ? dst : &dummy, want);
    if (r <= 0) {
      rc = bs_fail(c->err, EINVAL, z->lho, NULL,
                   "decompressing '%.100s' failed after %" PRIu64 " of %" PRIu64 " bytes: %s",
                   z->name, done, z->usize, r < 0 ? zip_file_strerror(zf) : "short data");
      break;
    }
    if (!buf) {
      for (zip_int64_t w = 0; w < r;) {
        ssize_t k = write(fd, tmp + w, (size_t)(r - w));
        if (k < 0 && errno == EINTR)
          continue;
        if (k <= 0) {
          rc = bs_fail(c->err, EIO, BS_OFF_NONE, NULL,
                       "writing the decompressed copy of '%.100s': %s", z->name, strerror(errno));
          break;
        }
        w += k;
      }
      if (rc)
        break;
    }
    done += (uint64_t)r;
  }
  bs_free(tmp);
  zip_fclose(zf);
  return rc;
}

static int temp_fd(struct ctx *c)
{
  int fd = memfd_create("burnstore-member", MFD_CLOEXEC);
  if (fd >= 0)
    return fd;
  const char *dir = getenv("TMPDIR");
  fd = open(dir && *dir ? dir : "/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    bs_fail(c->err, errno, BS_OFF_NONE, NULL, "cannot create a temporary file: %s",
            strerror(errno));
  return fd;
}

/* Locate storage `key` of a zip: data/<key> in place, or a decompressed copy. */
static int zip_locate(struct ctx *c, struct rec *r, const char *tkey)
{
  char rel[BS_MAX_KEY_LEN + 16];
  snprintf(rel, sizeof rel, "data/%s", r->key);
  const struct zent *z = zfind(c, rel);
  if (!z)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, tkey,
                   "storage '%.64s' has no record '%.64s/data/%.64s' in the archive", r->key,
                   c->prefix, r->key);
  if (z->method == 0) {
    if (z->csize != z->usize)
      return bs_fail(c->err, EINVAL, z->lho, tkey,
                     "corrupt zip: stored entry '%.100s' has compressed size %" PRIu64
                     " != size %" PRIu64,
                     z->name, z->csize, z->usize);
    if (zdata_off(c, z, &r->off) != 0)
      return -1;
    r->src = c->src;
    r->len = z->usize;
  } else {
    if (z->usize > BS_MAX_TENSOR_BYTES)
      return bs_fail(c->err, EFBIG, z->lho, tkey,
                     "compressed entry '%.100s' expands to %" PRIu64 " bytes", z->name, z->usize);
    int fd = temp_fd(c);
    if (fd < 0)
      return -1;
    if (zinflate(c, z, NULL, fd) != 0) {
      close(fd);
      return -1;
    }
    struct bs_src ns;
    char nm[256];
    snprintf(nm, sizeof nm, "%s (decompressed %s)", S(c)->name, z->name);
    if (bs_src_init_fd(&ns, fd, true, nm, c->err) != 0 ||
        bs_catalog_add_src(c->cat, &ns, &r->src, c->err) != 0)
      return -1;
    r->off = 0;
    r->len = z->usize;
  }
  r->located = true;
  return 0;
}

/* A small or pickle record read whole into memory (bs_malloc'd). The size in
 * the directory is only a claim until the bytes exist: a stored entry must
 * lie in the file, a compressed one is inflated to a temporary file first,
 * so a tiny entry that claims 1 GiB allocates nothing. */
static int zip_slurp(struct ctx *c, const struct zent *z, uint64_t max, uint8_t **out)
{
  *out = NULL;
  if (z->usize > max)
    return bs_fail(c->err, EFBIG, z->lho, NULL,
                   "'%.100s' is %" PRIu64 " bytes, over the limit of %" PRIu64, z->name, z->usize,
                   max);
  struct bs_src tmp = {.fd = -1};
  const struct bs_src *from = S(c);
  uint64_t d = 0;
  if (z->method == 0) {
    if (zdata_off(c, z, &d) != 0)
      return -1;
    if (!bs_range_ok(d, z->usize, from->size))
      return bs_fail(c->err, EINVAL, d, NULL,
                     "truncated zip: '%.100s' needs %" PRIu64 " bytes at %" PRIu64
                     " but the file has %" PRIu64,
                     z->name, z->usize, d, from->size);
  } else {
    int fd = temp_fd(c);
    if (fd < 0)
      return -1;
    if (zinflate(c, z, NULL, fd) != 0) {
      close(fd);
      return -1;
    }
    if (bs_src_init_fd(&tmp, fd, true, z->name, c->err) != 0)
      return -1;
    from = &tmp;
  }
  uint8_t *b;
  int rc = bs_src_read_alloc(from, d, z->usize, &b, c->err);
  bs_src_destroy(&tmp);
  if (rc != 0)
    return -1;
  *out = b;
  return 0;
}

/* ---- flattening ----------------------------------------------------------------------------- */

static int path_set(struct ctx *c, size_t plen, const char *seg, size_t *newlen)
{
  size_t sl = strlen(seg), need = plen + (plen ? 1 : 0) + sl + 1;
  if (need > BS_MAX_KEY_LEN + 1)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL, "flattened key longer than %u bytes",
                   BS_MAX_KEY_LEN);
  if (need > c->pathcap) {
    char *np = bs_realloc(c->path, need * 2);
    if (!np)
      return nomem(c);
    c->path = np;
    c->pathcap = need * 2;
  }
  if (plen)
    c->path[plen++] = '.';
  memcpy(c->path + plen, seg, sl + 1);
  *newlen = plen + sl;
  return 0;
}

/* Python str() of a dict key, as far as it matters for names. */
static int key_str(struct ctx *c, const struct bs_pv *k, char *out, size_t n)
{
  switch (k->kind) {
  case BS_PV_STR:
    if (strlen(k->u.str.s) != k->u.str.len)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL, "a dict key contains a NUL byte");
    snprintf(out, n, "%s", k->u.str.s);
    if (k->u.str.len >= n)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL, "dict key longer than %zu bytes", n - 1);
    return 0;
  case BS_PV_INT: snprintf(out, n, "%" PRId64, k->u.i); return 0;
  case BS_PV_BOOL: snprintf(out, n, "%s", k->u.b ? "True" : "False"); return 0;
  case BS_PV_NONE: snprintf(out, n, "None"); return 0;
  case BS_PV_FLOAT:
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(out, n, "%.*g", prec, k->u.f);
      if (strtod(out, NULL) == k->u.f)
        break;
    }
    return 0;
  case BS_PV_GLOBAL: snprintf(out, n, "%s.%s", k->u.glob.module, k->u.glob.name); return 0;
  default: snprintf(out, n, "<%s>", bs_pv_kind_name(k->kind)); return 0;
  }
}

static bool is_scalar(const struct bs_pv *x)
{
  switch (x->kind) {
  case BS_PV_NONE:
  case BS_PV_BOOL:
  case BS_PV_INT:
  case BS_PV_BIGINT:
  case BS_PV_FLOAT:
  case BS_PV_STR: return true;
  case BS_PV_GLOBAL: return x->u.glob.kind == BS_PG_DTYPE;
  default: return false;
  }
}

/* Two's-complement LE bytes -> decimal text. */
static json_t *bigint_json(const struct bs_pv *x)
{
  size_t n = x->u.str.len;
  if (n == 0 || n > 256)
    return json_null();
  uint8_t mag[256];
  memcpy(mag, x->u.str.s, n);
  bool neg = mag[n - 1] & 0x80;
  if (neg) { /* negate */
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) {
      unsigned v = (uint8_t)~mag[i] + carry;
      mag[i] = (uint8_t)v;
      carry = v >> 8;
    }
  }
  char digits[800];
  size_t nd = 0;
  for (;;) {
    bool zero = true;
    unsigned rem = 0;
    for (size_t i = n; i-- > 0;) {
      unsigned cur = (rem << 8) | mag[i];
      mag[i] = (uint8_t)(cur / 10);
      rem = cur % 10;
      if (mag[i])
        zero = false;
    }
    digits[nd++] = (char)('0' + rem);
    if (zero || nd >= sizeof digits - 2)
      break;
  }
  char out[802];
  size_t o = 0;
  if (neg)
    out[o++] = '-';
  while (nd)
    out[o++] = digits[--nd];
  out[o] = '\0';
  return json_string(out);
}

static json_t *scalar_json(const struct bs_pv *x)
{
  switch (x->kind) {
  case BS_PV_NONE: return json_null();
  case BS_PV_BOOL: return json_boolean(x->u.b);
  case BS_PV_INT: return json_integer(x->u.i);
  case BS_PV_BIGINT: return bigint_json(x);
  case BS_PV_FLOAT: return isfinite(x->u.f) ? json_real(x->u.f) : json_null();
  case BS_PV_STR: {
    json_t *j = json_stringn(x->u.str.s, x->u.str.len);
    return j ? j : json_null(); /* not valid UTF-8 */
  }
  case BS_PV_GLOBAL: {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.%s", x->u.glob.module, x->u.glob.name);
    json_t *j = json_string(tmp);
    return j ? j : json_null();
  }
  default: return json_null();
  }
}

static int claim_key(struct ctx *c, const char *key, char **kept)
{
  char *k = bs_strdup(key);
  if (!k ||
      bs_grow((void **)&c->owned_keys, &c->ownedcap, c->nowned + 1, sizeof *c->owned_keys) != 0) {
    bs_free(k);
    return nomem(c);
  }
  c->owned_keys[c->nowned++] = k;
  int r = smap_put(&c->keys, k, 0);
  if (r < 0)
    return nomem(c);
  if (r > 0)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, key,
                   "two entries of the pickle flatten to the same key '%.100s'", key);
  if (kept)
    *kept = k;
  return 0;
}

static int emit_value(struct ctx *c, size_t plen, json_t *j)
{
  if (!j)
    return nomem(c);
  if (++c->nvalues > MAX_VALUES) {
    json_decref(j);
    return bs_fail(c->err, EFBIG, BS_OFF_NONE, NULL, "more than %u non-tensor values in the pickle",
                   MAX_VALUES);
  }
  const char *key = plen ? c->path : "value";
  if (claim_key(c, key, NULL) != 0) {
    json_decref(j);
    return -1;
  }
  /* json_object_set_new takes the reference even when it fails */
  return json_object_set_new(c->values, key, j) != 0 ? nomem(c) : 0;
}

static int walk(struct ctx *c, struct bs_pv *x, size_t plen, unsigned depth, bool values);

static int walk_child(struct ctx *c, struct bs_pv *x, size_t plen, const char *seg, unsigned depth,
                      bool values)
{
  size_t nl = 0;
  if (path_set(c, plen, seg, &nl) != 0)
    return -1;
  return walk(c, x, nl, depth + 1, values);
}

static int walk_dict(struct ctx *c, struct bs_pv_seq *keys, struct bs_pv_seq *vals, size_t plen,
                     unsigned depth, bool values)
{
  char seg[BS_MAX_KEY_LEN + 1];
  for (size_t i = 0; i < keys->n; i++) {
    if (key_str(c, keys->items[i], seg, sizeof seg) != 0)
      return -1;
    if (walk_child(c, vals->items[i], plen, seg, depth, values) != 0)
      return -1;
  }
  return 0;
}

static int walk_seq(struct ctx *c, struct bs_pv_seq *q, size_t plen, unsigned depth, bool values,
                    const char *prefix)
{
  char seg[64];
  for (size_t i = 0; i < q->n; i++) {
    snprintf(seg, sizeof seg, "%s%zu", prefix, i);
    if (walk_child(c, q->items[i], plen, seg, depth, values) != 0)
      return -1;
  }
  return 0;
}

static int walk(struct ctx *c, struct bs_pv *x, size_t plen, unsigned depth, bool values)
{
  if (c->budget-- == 0)
    return bs_fail(c->err, EFBIG, BS_OFF_NONE, NULL,
                   "the pickled object graph has more than %u nodes when flattened (shared "
                   "references multiply it)",
                   WALK_BUDGET);
  if (depth > BS_PICKLE_MAX_DEPTH)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "pickled values nested deeper than %u (or a reference cycle) at '%.80s'",
                   BS_PICKLE_MAX_DEPTH, plen ? c->path : "");
  c->path[plen] = '\0';
  switch (x->kind) {
  case BS_PV_TENSOR: {
    const char *key = plen ? c->path : "tensor";
    char *kept;
    if (claim_key(c, key, &kept) != 0)
      return -1;
    if (bs_grow((void **)&c->found, &c->foundcap, c->nfound + 1, sizeof *c->found) != 0)
      return nomem(c);
    if (!(c->found[c->nfound].key = bs_strdup(kept)))
      return nomem(c);
    c->found[c->nfound++].t = x;
    return 0;
  }
  case BS_PV_DICT:
    if (x->u.dict.keys.n == 0)
      return values && plen ? emit_value(c, plen, json_object()) : 0;
    return walk_dict(c, &x->u.dict.keys, &x->u.dict.vals, plen, depth, values);
  case BS_PV_LIST:
  case BS_PV_TUPLE:
  case BS_PV_SET: {
    bool all = true;
    for (size_t i = 0; i < x->u.seq.n && all; i++)
      all = is_scalar(x->u.seq.items[i]);
    if (all) {
      if (!values)
        return 0;
      json_t *a = json_array();
      if (!a)
        return nomem(c);
      for (size_t i = 0; i < x->u.seq.n; i++) {
        if (json_array_append_new(a, scalar_json(x->u.seq.items[i])) != 0) {
          json_decref(a);
          return nomem(c);
        }
      }
      return emit_value(c, plen, a);
    }
    return walk_seq(c, &x->u.seq, plen, depth, values, "");
  }
  case BS_PV_OBJECT: {
    /* Only known, harmless classes (argparse.Namespace) contribute values;
     * opaque objects are searched for tensors only. */
    const struct bs_pv *cls = x->u.obj.cls;
    bool known = cls->kind == BS_PV_GLOBAL && cls->u.glob.kind == BS_PG_NAMESPACE;
    bool vals = values && known;
    struct bs_pv *st = x->u.obj.state;
    if (st && st->kind == BS_PV_DICT) {
      if (walk_dict(c, &st->u.dict.keys, &st->u.dict.vals, plen, depth, vals) != 0)
        return -1;
    } else if (st && walk_child(c, st, plen, "_state", depth, vals) != 0) {
      return -1;
    }
    if (!known && x->u.obj.args && walk_child(c, x->u.obj.args, plen, "_args", depth, false) != 0)
      return -1;
    if (walk_seq(c, &x->u.obj.items, plen, depth, vals, "") != 0)
      return -1;
    return walk_dict(c, &x->u.obj.dkeys, &x->u.obj.dvals, plen, depth, vals);
  }
  case BS_PV_STORAGE: {
    char line[300];
    snprintf(line, sizeof line, "skipped a bare storage (not a tensor) at key '%.200s'",
             plen ? c->path : "");
    return bs_catalog_note(c->cat, line, c->err);
  }
  case BS_PV_BYTES: return 0;
  default:
    if (!values || (x->kind == BS_PV_GLOBAL && !is_scalar(x)))
      return 0;
    return emit_value(c, plen, scalar_json(x));
  }
}

/* ---- tensors -------------------------------------------------------------------------------- */

static bool row_major(const struct bs_pv *t)
{
  uint64_t expect = 1;
  for (uint32_t d = t->u.tensor.rank; d-- > 0;) {
    uint64_t n = t->u.tensor.shape[d];
    if (n == 0)
      return true; /* empty: any strides */
    if (n != 1 && (t->u.tensor.stride[d] < 0 || (uint64_t)t->u.tensor.stride[d] != expect))
      return false;
    if (!bs_mul_u64(expect, n, &expect))
      return false;
  }
  return true;
}

typedef int (*locate_fn)(struct ctx *c, struct rec *r, const char *tkey);

static int add_tensor(struct ctx *c, const struct found *f, locate_fn locate)
{
  const struct bs_pv *t = f->t;
  const char *key = f->key;
  if (t->u.tensor.unsupported) {
    struct bs_tensor *bt = bs_catalog_add(c->cat, key, BS_DT_U8, t->u.tensor.rank,
                                          t->u.tensor.shape, BS_OFF_NONE, c->err);
    if (!bt)
      return -1;
    bt->src = c->src;
    bt->nbytes = 0;
    if (!(bt->unsupported = bs_strdup(t->u.tensor.unsupported)))
      return nomem(c);
    return 0;
  }
  const struct bs_pv *st = t->u.tensor.storage;
  struct rec *r = rec_get(c, st->u.storage.key);
  if (!r)
    return -1;
  if (!r->located) {
    if (!locate)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, key,
                     "storage '%.64s' is not in the file's storage list", st->u.storage.key);
    if (locate(c, r, key) != 0)
      return -1;
  }
  uint64_t want;
  if (!bs_mul_u64(st->u.storage.numel, st->u.storage.esize, &want) || want != r->len)
    return bs_fail(c->err, EINVAL, r->off, key,
                   "storage '%.64s' has %" PRIu64 " bytes but its persistent id declares %" PRIu64
                   " elements of %u bytes",
                   r->key, r->len, st->u.storage.numel, st->u.storage.esize);
  uint64_t base = r->off, slen = r->len;
  if (st->u.storage.has_view) { /* legacy: a slice of the root storage, in elements */
    uint64_t vo, vl, vend;
    if (!bs_add_u64(st->u.storage.view_off, st->u.storage.view_numel, &vend) ||
        vend > st->u.storage.numel ||
        !bs_mul_u64(st->u.storage.view_off, st->u.storage.esize, &vo) ||
        !bs_mul_u64(st->u.storage.view_numel, st->u.storage.esize, &vl))
      return bs_fail(c->err, EINVAL, r->off, key,
                     "storage view [%" PRIu64 ", +%" PRIu64
                     ") is outside storage '%.64s' of %" PRIu64 " elements",
                     st->u.storage.view_off, st->u.storage.view_numel, r->key, st->u.storage.numel);
    base += vo;
    slen = vl;
  }
  enum bs_dtype dt = t->u.tensor.dtype;
  uint64_t esize = bs_dtype_bits(dt) / 8;
  struct bs_tensor *bt =
      bs_catalog_add(c->cat, key, dt, t->u.tensor.rank, t->u.tensor.shape, base, c->err);
  if (!bt)
    return -1;
  bt->src = r->src;
  if (row_major(t)) {
    uint64_t doff;
    if (bt->nbytes == 0) {
      bt->off = base;
      return 0;
    }
    if (!bs_mul_u64(t->u.tensor.offset, esize, &doff) || doff > slen || bt->nbytes > slen - doff)
      return bs_fail(c->err, EINVAL, base, key,
                     "tensor needs bytes [%" PRIu64 " x %" PRIu64 ", +%" PRIu64
                     ") but storage '%.64s' has %" PRIu64,
                     t->u.tensor.offset, esize, bt->nbytes, r->key, slen);
    bt->off = base + doff;
    return 0;
  }
  bt->strides = bs_malloc(t->u.tensor.rank * sizeof *bt->strides);
  if (!bt->strides)
    return nomem(c);
  memcpy(bt->strides, t->u.tensor.stride, t->u.tensor.rank * sizeof *bt->strides);
  bt->storage_off = t->u.tensor.offset;
  bt->storage_bytes = slen;
  bt->off = base;
  return bs_tensor_check_view(bt, base, c->err);
}

static int flatten(struct ctx *c, struct bs_pv *root)
{
  c->values = json_object();
  c->pathcap = 256;
  c->path = bs_malloc(c->pathcap);
  if (!c->values || !c->path)
    return nomem(c);
  c->budget = WALK_BUDGET;
  return walk(c, root, 0, 0, true);
}

/* Add every tensor found by flatten; storages are located by `locate` (zip)
 * or were located beforehand (legacy, tar). Then notes and values. */
static int conclude(struct ctx *c, locate_fn locate)
{
  for (size_t i = 0; i < c->nfound; i++)
    if (add_tensor(c, &c->found[i], locate) != 0)
      return -1;
  for (size_t i = 0; i < bs_pickle_nnotes(c->p); i++)
    if (bs_catalog_note(c->cat, bs_pickle_note(c->p, i), c->err) != 0)
      return -1;
  if (json_object_size(c->values) > 0) {
    char *s = json_dumps(c->values, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s)
      return nomem(c);
    c->cat->values_json = bs_strdup(s);
    free(s);
    if (!c->cat->values_json)
      return nomem(c);
  }
  return 0;
}

static int finish(struct ctx *c, struct bs_pv *root, locate_fn locate)
{
  return flatten(c, root) != 0 ? -1 : conclude(c, locate);
}

/* ---- the three containers ------------------------------------------------------------------- */

static int read_zip(struct ctx *c)
{
  if (zip_parse(c) != 0)
    return -1;
  const char *first = c->ents[0].name, *slash = strchr(first, '/');
  if (!slash || slash == first)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "zip entry '%.100s' is not inside a directory: not a torch.save archive", first);
  if (!(c->prefix = bs_strndup(first, (size_t)(slash - first))))
    return nomem(c);
  size_t plen = strlen(c->prefix);
  bool script = zfind(c, "constants.pkl") != NULL;
  for (size_t i = 0; i < c->nents && !script; i++)
    script = strncmp(c->ents[i].name, c->prefix, plen) == 0 &&
             strncmp(c->ents[i].name + plen, "/code/", 6) == 0;
  if (script)
    return bs_fail(c->err, ENOTSUP, BS_OFF_NONE, NULL,
                   "this is a TorchScript archive (torch.jit.save), not a torch.save checkpoint; "
                   "load it in Python and save model.state_dict() with torch.save");
  const struct zent *bo = zfind(c, "byteorder");
  if (bo) {
    uint8_t *b;
    if (zip_slurp(c, bo, 64, &b) != 0)
      return -1;
    bool big = bo->usize == 3 && memcmp(b, "big", 3) == 0;
    bool little = bo->usize == 6 && memcmp(b, "little", 6) == 0;
    bs_free(b);
    if (big)
      return bs_fail(c->err, ENOTSUP, bo->lho, NULL,
                     "big-endian checkpoint (byteorder record says 'big'): not supported");
    if (!little)
      return bs_fail(c->err, EINVAL, bo->lho, NULL,
                     "byteorder record is neither 'little' nor 'big'");
  }
  const struct zent *pk = zfind(c, "data.pkl");
  if (!pk)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "no '%.100s/data.pkl' in the zip: not a torch.save checkpoint", c->prefix);
  struct bs_pv *root;
  struct bs_pickle_opts po = {.strict = c->opts->strict};
  if (pk->method == 0) {
    uint64_t d;
    if (zdata_off(c, pk, &d) != 0)
      return -1;
    po.base_off = d;
    if (bs_pickle_load(c->p, S(c), d, d + pk->csize, &po, &root, NULL, c->err) != 0)
      return -1;
  } else {
    uint8_t *b;
    if (zip_slurp(c, pk, BS_PICKLE_MAX_BYTES, &b) != 0)
      return -1;
    struct bs_src ms;
    po.base_off = BS_OFF_NONE;
    int rc = bs_src_init_mem(&ms, b, (size_t)pk->usize, "data.pkl", c->err);
    if (rc == 0)
      rc = bs_pickle_load(c->p, &ms, 0, pk->usize, &po, &root, NULL, c->err);
    bs_src_destroy(&ms);
    bs_free(b); /* values are copies: nothing points into b */
    if (rc != 0)
      return -1;
  }
  return finish(c, root, zip_locate);
}

static const struct bs_pv *dict_get(const struct bs_pv *d, const char *key)
{
  if (d->kind != BS_PV_DICT)
    return NULL;
  for (size_t i = 0; i < d->u.dict.keys.n; i++) {
    const struct bs_pv *k = d->u.dict.keys.items[i];
    if (k->kind == BS_PV_STR && strcmp(k->u.str.s, key) == 0)
      return d->u.dict.vals.items[i];
  }
  return NULL;
}

static int check_sys_info(struct ctx *c, const struct bs_pv *si, uint64_t off)
{
  const struct bs_pv *le = dict_get(si, "little_endian");
  if (le && le->kind == BS_PV_BOOL && !le->u.b)
    return bs_fail(c->err, ENOTSUP, off, NULL,
                   "big-endian checkpoint (sys_info little_endian is False): not supported");
  return 0;
}

/* Element sizes of the storages the tensors use, from their storage classes. */
static int learn_esizes(struct ctx *c)
{
  for (size_t i = 0; i < c->nfound; i++) {
    const struct bs_pv *t = c->found[i].t;
    if (!t->u.tensor.storage) /* unsupported tensors still size their storage if they can */
      continue;
    const struct bs_pv *st = t->u.tensor.storage;
    struct rec *r = rec_get(c, st->u.storage.key);
    if (!r)
      return -1;
    if (r->esize && st->u.storage.esize && r->esize != st->u.storage.esize)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, c->found[i].key,
                     "storage '%.64s' is used with element sizes %u and %u", r->key, r->esize,
                     st->u.storage.esize);
    if (st->u.storage.esize)
      r->esize = st->u.storage.esize;
  }
  return 0;
}

/* One blob: u64 LE element count, then the bytes. */
static int blob(struct ctx *c, struct rec *r, uint64_t *pos, uint64_t limit)
{
  uint8_t h[8];
  if (!bs_range_ok(*pos, 8, limit))
    return bs_fail(c->err, EINVAL, *pos, NULL,
                   "truncated: storage '%.64s' header at %" PRIu64 " is past the end (%" PRIu64 ")",
                   r->key, *pos, limit);
  if (bs_src_read(S(c), *pos, h, 8, c->err) != 0)
    return -1;
  uint64_t n = bs_le64(h), len;
  if (!bs_mul_u64(n, r->esize, &len) || !bs_range_ok(*pos + 8, len, limit))
    return bs_fail(c->err, EINVAL, *pos, NULL,
                   "truncated: storage '%.64s' declares %" PRIu64
                   " elements of %u bytes but only %" PRIu64 " bytes follow",
                   r->key, n, r->esize, limit - *pos - 8);
  r->src = c->src;
  r->off = *pos + 8;
  r->len = len;
  r->located = true;
  *pos += 8 + len;
  return 0;
}

static int read_legacy(struct ctx *c)
{
  const struct bs_src *s = S(c);
  struct bs_pickle_opts po = {.strict = false};
  struct bs_pv *v[5];
  uint64_t pos = 0;
  for (int i = 0; i < 5; i++) {
    po.base_off = pos;
    po.strict = i == 3 && c->opts->strict;
    uint64_t start = pos;
    if (bs_pickle_load(c->p, s, pos, s->size, &po, &v[i], &pos, c->err) != 0)
      return -1;
    if (i == 0 && (v[0]->kind != BS_PV_BIGINT || v[0]->u.str.len != 10 ||
                   memcmp(v[0]->u.str.s, bs_pth_legacy_magic, 10) != 0))
      return bs_fail(c->err, EINVAL, 0, NULL,
                     "not a PyTorch checkpoint: the first pickle is not torch's magic number");
    if (i == 1 && (v[1]->kind != BS_PV_INT || v[1]->u.i != 1001))
      return bs_fail(c->err, ENOTSUP, start, NULL,
                     "legacy checkpoint protocol version is not 1001");
    if (i == 2 && check_sys_info(c, v[2], start) != 0)
      return -1;
    if (i == 4 && v[4]->kind != BS_PV_LIST)
      return bs_fail(c->err, EINVAL, start, NULL, "the storage key list is a %s, not a list",
                     bs_pv_kind_name(v[4]->kind));
  }
  if (flatten(c, v[3]) != 0 || learn_esizes(c) != 0)
    return -1;
  const struct bs_pv *keys = v[4];
  for (size_t i = 0; i < keys->u.seq.n; i++) {
    const struct bs_pv *k = keys->u.seq.items[i];
    char kb[64];
    const char *key = k->kind == BS_PV_STR ? k->u.str.s : NULL;
    if (k->kind == BS_PV_INT) {
      snprintf(kb, sizeof kb, "%" PRId64, k->u.i);
      key = kb;
    }
    if (!key)
      return bs_fail(c->err, EINVAL, pos, NULL, "storage key %zu is a %s", i,
                     bs_pv_kind_name(k->kind));
    struct rec *r = rec_get(c, key);
    if (!r)
      return -1;
    if (r->esize == 0)
      return bs_fail(c->err, ENOTSUP, pos, NULL,
                     "storage '%.64s' is listed but no readable tensor uses it, so its element "
                     "size (and where the next storage starts) is unknown",
                     key);
    if (r->located)
      return bs_fail(c->err, EINVAL, pos, NULL, "storage '%.64s' is listed twice", key);
    if (blob(c, r, &pos, s->size) != 0)
      return -1;
  }
  return conclude(c, NULL);
}

struct tar_member {
  bool present;
  uint64_t off, size;
};

static int tar_size(const uint8_t *f, uint64_t *out)
{
  uint64_t v = 0;
  if (f[0] & 0x80) { /* GNU base-256 */
    for (int i = 1; i < 12; i++) {
      if (v >> 56)
        return -1;
      v = (v << 8) | f[i];
    }
    *out = v;
    return 0;
  }
  int i = 0;
  while (i < 12 && f[i] == ' ')
    i++;
  for (; i < 12 && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v >> 60)
      return -1;
    v = v * 8 + (uint64_t)(f[i] - '0');
  }
  *out = v;
  return 0;
}

static int read_tar(struct ctx *c)
{
  const struct bs_src *s = S(c);
  struct tar_member sys = {0}, pkl = {0}, sto = {0};
  bool tensors = false;
  uint8_t h[TAR_BLOCK];
  for (uint64_t off = 0; bs_range_ok(off, TAR_BLOCK, s->size);) {
    if (bs_src_read(s, off, h, TAR_BLOCK, c->err) != 0)
      return -1;
    bool zero = true;
    for (unsigned i = 0; i < TAR_BLOCK && zero; i++)
      zero = h[i] == 0;
    if (zero)
      break;
    uint64_t size, padded;
    if (tar_size(h + 124, &size) != 0 || !bs_align_up(size, TAR_BLOCK, &padded) ||
        !bs_range_ok(off + TAR_BLOCK, size, s->size))
      return bs_fail(c->err, EINVAL, off, NULL, "corrupt tar header: member size out of range");
    char name[101];
    memcpy(name, h, 100);
    name[100] = '\0';
    const char *n = strncmp(name, "./", 2) == 0 ? name + 2 : name;
    if (h[156] == '0' || h[156] == '\0') {
      struct tar_member m = {true, off + TAR_BLOCK, size};
      if (strcmp(n, "sys_info") == 0)
        sys = m;
      else if (strcmp(n, "pickle") == 0)
        pkl = m;
      else if (strcmp(n, "storages") == 0)
        sto = m;
      else if (strcmp(n, "tensors") == 0)
        tensors = true;
    }
    if (!bs_add_u64(off + TAR_BLOCK, padded, &off))
      break;
  }
  if (tensors)
    return bs_fail(c->err, ENOTSUP, BS_OFF_NONE, NULL,
                   "tar checkpoint with a 'tensors' member (torch 0.1/0.2): not supported; load "
                   "it with an old torch and save it again");
  if (!pkl.present || !sto.present)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "tar file without 'pickle' and 'storages' members: not a PyTorch checkpoint");
  struct bs_pickle_opts po = {.strict = false};
  struct bs_pv *v;
  if (sys.present) {
    po.base_off = sys.off;
    if (bs_pickle_load(c->p, s, sys.off, sys.off + sys.size, &po, &v, NULL, c->err) != 0 ||
        check_sys_info(c, v, sys.off) != 0)
      return -1;
  }
  /* storages: count, then per storage (key, location, class) + u64 count + bytes */
  uint64_t pos = sto.off, end = sto.off + sto.size;
  po.base_off = pos;
  if (bs_pickle_load(c->p, s, pos, end, &po, &v, &pos, c->err) != 0)
    return -1;
  if (v->kind != BS_PV_INT || v->u.i < 0 || (uint64_t)v->u.i > sto.size / 8)
    return bs_fail(c->err, EINVAL, sto.off, NULL, "tar 'storages': bad storage count");
  int64_t count = v->u.i;
  for (int64_t i = 0; i < count; i++) {
    uint64_t at = pos;
    po.base_off = pos;
    if (bs_pickle_load(c->p, s, pos, end, &po, &v, &pos, c->err) != 0)
      return -1;
    if (v->kind != BS_PV_TUPLE || v->u.seq.n != 3 || v->u.seq.items[0]->kind != BS_PV_STR ||
        v->u.seq.items[2]->kind != BS_PV_GLOBAL)
      return bs_fail(c->err, EINVAL, at, NULL,
                     "tar 'storages': entry %" PRId64 " is not (key, location, storage class)", i);
    const struct bs_pv *cls = v->u.seq.items[2];
    struct rec *r = rec_get(c, v->u.seq.items[0]->u.str.s);
    if (!r)
      return -1;
    if (r->located)
      return bs_fail(c->err, EINVAL, at, NULL, "tar 'storages': storage '%.64s' appears twice",
                     r->key);
    r->esize = cls->u.glob.kind == BS_PG_STORAGE ? cls->u.glob.esize : 0;
    if (!r->esize)
      return bs_fail(c->err, ENOTSUP, at, NULL, "tar 'storages': unknown storage class %s.%s",
                     cls->u.glob.module, cls->u.glob.name);
    if (blob(c, r, &pos, end) != 0)
      return -1;
  }
  po.base_off = pkl.off;
  po.strict = c->opts->strict;
  if (bs_pickle_load(c->p, s, pkl.off, pkl.off + pkl.size, &po, &v, NULL, c->err) != 0)
    return -1;
  return finish(c, v, NULL);
}

int bs_pth_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts, bs_err *err)
{
  static const struct bs_open_opts defaults = {0};
  struct ctx c;
  memset(&c, 0, sizeof c);
  c.cat = cat;
  c.src = src;
  c.opts = opts ? opts : &defaults;
  c.err = err;
  enum bs_pth_container kind;
  bs_formats_init();
  if (src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no source %u", src);
  if (bs_pth_container(&cat->srcs[src], &kind, err) != 0)
    return -1;
  if (!(c.p = bs_pickle_new()))
    return nomem(&c);
  int rc;
  switch (kind) {
  case BS_PTH_ZIP: rc = read_zip(&c); break;
  case BS_PTH_LEGACY: rc = read_legacy(&c); break;
  case BS_PTH_TAR: rc = read_tar(&c); break;
  default: rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "not a PyTorch container"); break;
  }
  ctx_destroy(&c);
  return rc;
}
