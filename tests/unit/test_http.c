/* The HTTP source's pieces that need no network: URLs (siblings beside a
 * file, credentials kept out of what is shown), the headers it parses and
 * the bounds of its block cache. The requests themselves are tested against
 * a real server (e2e/test_remote.py). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/http_cache.h"
#include "core/http_parse.h"
#include "core/source.h" /* (bs_src_is_url, bs_http_redact: http_parse.c) */

static void resolves(const char *base, const char *rel, const char *want)
{
  char *got = bs_http_resolve(base, rel);
  cr_assert_not_null(got, "%s + %s", base, rel);
  cr_expect_str_eq(got, want, "%s + %s", base, rel);
  bs_free(got);
}

Test(http, sibling_urls)
{
  resolves("https://h/m/model.safetensors.index.json", "model-00001-of-00002.safetensors",
           "https://h/m/model-00001-of-00002.safetensors");
  resolves("http://h:8080/a/b/i.json?x=1#f", "s/1.st", "http://h:8080/a/b/s/1.st");
  resolves("http://h/i.json", "s.st", "http://h/s.st");
  resolves("http://h", "s.st", "http://h/s.st");
  resolves("http://u:p@h/d/i.json", "s.st", "http://u:p@h/d/s.st");
  resolves("http://h/d/", "s.st", "http://h/d/s.st");
  cr_expect_null(bs_http_resolve("/local/i.json", "s.st"));
  cr_expect_null(bs_http_resolve("ftp://h/i.json", "s.st"));
}

static void redacts(const char *url, const char *want)
{
  char *got = bs_http_redact(url);
  cr_assert_not_null(got);
  cr_expect_str_eq(got, want, "%s", url);
  bs_free(got);
}

Test(http, credentials_never_shown)
{
  redacts("https://user:secret@h/m.st", "https://***@h/m.st");
  redacts("https://tok@h:1/m.st?X-Amz-Signature=abc", "https://***@h:1/m.st?***");
  redacts("http://h/m.st", "http://h/m.st");
  redacts("http://h/a@b.st", "http://h/a@b.st");  /* an @ in the path is no userinfo */
  redacts("http://h/m.st#frag", "http://h/m.st"); /* (a fragment is never sent) */
  /* hf:// and s3:// as well: what such a URL holds before its first '/' and
   * after a '?' is kept out of the error that names it */
  redacts("s3://AKIA:s3cr3t@bucket/k.gguf", "s3://***@bucket/k.gguf");
  redacts("s3://bucket/k.gguf?X-Amz-Signature=abc", "s3://bucket/k.gguf?***");
  redacts("hf://user:hf_tok@org/repo/m.st", "hf://***@org/repo/m.st");
  redacts("hf://org/repo@v1.0/m.st", "hf://org/repo@v1.0/m.st"); /* a revision is no userinfo */
  cr_expect(bs_src_is_url("HTTPS://h/x"));
  cr_expect(!bs_src_is_url("./http://x"));
  cr_expect(bs_src_is_url("s3://b/k"));
  cr_expect(bs_src_is_url("hf://o/r/f"));
  cr_expect(!bs_src_is_url("ftp://h/x"));
}

static int crange(const char *s, uint64_t *a, uint64_t *b, uint64_t *t)
{
  return bs_http_content_range(s, strlen(s), a, b, t);
}

static long retry_after(const char *s)
{
  return bs_http_retry_after(s, strlen(s), 10000);
}

Test(http, content_range)
{
  uint64_t a, b, t;
  cr_assert_eq(crange("bytes 0-0/1234", &a, &b, &t), 0);
  cr_expect(a == 0 && b == 0 && t == 1234);
  cr_assert_eq(crange(" bytes 5-9/*\r\n", &a, &b, &t), 0);
  cr_expect(a == 5 && b == 9 && t == UINT64_MAX);
  cr_expect_eq(crange("bytes 9-5/100", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes 0-100/100", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes */100", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes 0-1/99999999999999999999999", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes 0-1/18446744073709551616", &a, &b, &t), -1); /* 2^64 */
  cr_assert_eq(crange("bytes 0-1/18446744073709551614", &a, &b, &t),
               0); /* (the caller bounds it) */
  cr_expect_eq(crange("items 0-1/2", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes 0-1/2 junk", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes 0-", &a, &b, &t), -1);
  cr_expect_eq(crange("bytes", &a, &b, &t), -1);
  /* of any length: 150 characters (it was cut at 127, and refused) */
  char longer[200];
  snprintf(longer, sizeof longer, "bytes %0130d-65535/3146000", 0);
  cr_assert_eq(crange(longer, &a, &b, &t), 0, "%s", longer);
  cr_expect(a == 0 && b == 65535 && t == 3146000);
  /* the value's length is what counts, not a NUL: "bytes 0-1/2" of "bytes 0-1/23" */
  cr_assert_eq(bs_http_content_range("bytes 0-1/23", 11, &a, &b, &t), 0);
  cr_expect_eq(t, 2);
}

Test(http, retry_after_and_headers)
{
  cr_expect_eq(retry_after("2"), 2000);
  cr_expect_eq(retry_after(" 3600 "), 10000); /* bounded */
  cr_expect_eq(retry_after("99999999999999999999999"), -1);
  cr_expect_eq(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), -1);
  uint64_t x;
  cr_expect(bs_http_number(" 42\r\n", 5, &x) && x == 42);
  cr_expect(!bs_http_number("4 2", 3, &x));
  cr_expect(!bs_http_number("", 0, &x));
  cr_expect(!bs_http_number("18446744073709551616", 20, &x));
  const char *v;
  size_t n;
  const char line[] = "etag:  \"abc\" \r\n";
  cr_assert(bs_http_header_is(line, strlen(line), "ETag", &v, &n));
  cr_expect(n == 5 && memcmp(v, "\"abc\"", 5) == 0);
  cr_expect(!bs_http_header_is(line, strlen(line), "ETagX", &v, &n));
  cr_expect(!bs_http_header_is("ETag", 4, "ETag", &v, &n));
}

static bool strong(const char *s)
{
  return bs_http_etag_strong(s, strlen(s));
}

Test(http, strong_etags)
{
  cr_expect(strong("\"abc\""));
  cr_expect(strong("\"\""));
  cr_expect(strong("\"d41d8cd98f00b204e9800998ecf8427e-12\""));
  cr_expect(!strong("W/\"abc\""));      /* weak */
  cr_expect(!strong("abc"));            /* unquoted */
  cr_expect(!strong("\"a\"b\""));       /* a quote inside */
  cr_expect(!strong("\"a\x1b[31mb\"")); /* a control character (a terminal escape) */
  cr_expect(!strong("\"a b\""));
  cr_expect(!strong("\""));
}

Test(http, cache_stays_within_its_bound)
{
  struct bs_http_cache c;
  enum { B = 4096 };
  cr_assert_eq(bs_http_cache_init(&c, B, 4 * B + 100), 0);
  cr_expect_eq(c.nmax, 4);
  static uint8_t blk[B], out[B];
  for (uint64_t i = 0; i < 50; i++) {
    memset(blk, (int)i, sizeof blk);
    cr_assert(bs_http_cache_put(&c, 1 + i % 2, i, blk, i == 49 ? 10 : B));
    cr_assert_leq(bs_http_cache_bytes(&c), 4 * B);
    /* the block just put is there, with its bytes */
    cr_assert_eq(bs_http_cache_get(&c, 1 + i % 2, i, 0, out, B), i == 49 ? 10 : B);
    cr_assert_eq(out[0], (uint8_t)i);
  }
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 0, out, B), -1);  /* evicted */
  cr_expect_eq(bs_http_cache_get(&c, 2, 48, 0, out, B), -1); /* another source's id */
  /* least recently used goes first: touch 46, then put two more */
  cr_assert_eq(bs_http_cache_get(&c, 1, 46, 100, out, 8), 8);
  cr_assert(bs_http_cache_put(&c, 3, 0, blk, B));
  cr_assert(bs_http_cache_put(&c, 3, 1, blk, B));
  cr_expect_eq(bs_http_cache_get(&c, 1, 46, 0, out, 1), 1);
  cr_expect_eq(bs_http_cache_get(&c, 2, 47, 0, out, 1), -1);
  /* a short last block: reads past its end give what it has */
  cr_expect_eq(bs_http_cache_get(&c, 2, 49, 8, out, B), 2);
  cr_expect(!bs_http_cache_put(&c, 4, 0, blk, B + 1)); /* larger than a block */
  bs_http_cache_destroy(&c);
  /* a size below one block still caches one; a huge one is bounded */
  cr_assert_eq(bs_http_cache_init(&c, B, 10), 0);
  cr_expect_eq(c.nmax, 1);
  bs_http_cache_destroy(&c);
  cr_assert_eq(bs_http_cache_init(&c, 1 << 20, UINT64_MAX), 0);
  cr_expect_eq(c.nmax, BS_HTTP_CACHE_BLOCKS_MAX);
  bs_http_cache_destroy(&c);
}

Test(http, cache_prefix_blocks)
{
  struct bs_http_cache c;
  enum { B = 4096 };
  cr_assert_eq(bs_http_cache_init(&c, B, 4 * B), 0);
  static uint8_t blk[B], out[B];
  for (size_t i = 0; i < B; i++)
    blk[i] = (uint8_t)(i * 7);
  /* a block's first 100 bytes: a get within them hits, past them misses */
  cr_assert(bs_http_cache_put(&c, 1, 0, blk, 100));
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 90, out, B), 10);
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 100, out, B), 0);
  cr_expect(bs_http_cache_has(&c, 1, 0, 100));
  cr_expect(!bs_http_cache_has(&c, 1, 0, 101));
  cr_expect(!bs_http_cache_has(&c, 1, 1, 1));
  /* the prefix, copied out: at most what is held, at most max */
  memset(out, 0, sizeof out);
  cr_expect_eq(bs_http_cache_prefix(&c, 1, 0, out, B), 100);
  cr_expect_eq(memcmp(out, blk, 100), 0);
  cr_expect_eq(bs_http_cache_prefix(&c, 1, 0, out, 10), 10);
  cr_expect_eq(bs_http_cache_prefix(&c, 1, 5, out, B), 0);
  /* a longer block replaces it; a shorter one does not replace a longer */
  uint8_t *whole = bs_malloc(B);
  cr_assert_not_null(whole);
  memcpy(whole, blk, B);
  bs_http_cache_put_owned(&c, 1, 0, whole, B);
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 100, out, B), B - 100);
  cr_expect_eq(memcmp(out, blk + 100, B - 100), 0);
  cr_assert(bs_http_cache_put(&c, 1, 0, blk, 50));
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 0, out, B), B);
  cr_expect_eq(bs_http_cache_bytes(&c), B);
  /* an owned block larger than a block is freed, not kept (ASan: no leak) */
  uint8_t *big = bs_malloc(B + 1);
  cr_assert_not_null(big);
  bs_http_cache_put_owned(&c, 2, 0, big, B + 1);
  cr_expect_eq(bs_http_cache_get(&c, 2, 0, 0, out, 1), -1);
  bs_http_cache_destroy(&c);
}

Test(http, cache_reuses_evicted_buffers)
{
  struct bs_http_cache c;
  enum { B = 4096 };
  cr_assert_eq(bs_http_cache_init(&c, B, 2 * B), 0);
  uint8_t *a = bs_http_cache_block(&c), *b = bs_http_cache_block(&c);
  uint8_t *d = bs_http_cache_block(&c);
  cr_assert(a && b && d);
  memset(a, 1, B);
  memset(b, 2, B);
  memset(d, 3, B);
  bs_http_cache_put_owned(&c, 1, 0, a, B);
  bs_http_cache_put_owned(&c, 1, 1, b, B);
  bs_http_cache_put_owned(&c, 1, 2, d, B); /* evicts block 0: its buffer is kept */
  cr_expect_eq(c.nspare, 1);
  uint8_t *e = bs_http_cache_block(&c);
  cr_expect_eq(e, a, "the evicted block's buffer is handed out again");
  cr_expect_eq(c.nspare, 0);
  /* a short block is not kept as a spare; an unused whole one is */
  uint8_t *f = bs_malloc(10);
  cr_assert_not_null(f);
  bs_http_cache_unused(&c, f, 10);
  cr_expect_eq(c.nspare, 0);
  bs_http_cache_unused(&c, e, B);
  cr_expect_eq(c.nspare, 1);
  /* the bytes held are still right */
  uint8_t out[B];
  cr_expect_eq(bs_http_cache_get(&c, 1, 2, 0, out, B), B);
  cr_expect_eq(out[B - 1], 3);
  bs_http_cache_destroy(&c); /* frees the spares (ASan: no leak) */
}

Test(http, cache_blocks_from_its_arena)
{
  /* Whole blocks come from one mapping of twice the cache, aligned for
   * huge pages, and go back to it (never to free(): ASan would say so),
   * whatever length they were put with; past it, bs_malloc'd ones, freed
   * when given back. */
  struct bs_http_cache c;
  enum { B = 4096 };
  cr_assert_eq(bs_http_cache_init(&c, B, 2 * B), 0);
  cr_assert_not_null(c.arena);
  cr_expect_eq(c.narena, 4);
  cr_expect_eq((uintptr_t)c.arena % (2u << 20), 0, "aligned for a huge page");
  uint8_t *b[5];
  for (int i = 0; i < 5; i++)
    cr_assert_not_null(b[i] = bs_http_cache_block(&c));
  for (int i = 0; i < 4; i++)
    cr_expect_eq(b[i], c.arena + (size_t)i * B);
  cr_expect(b[4] < c.arena || b[4] >= c.arena + 4 * B, "past the arena: its own allocation");
  memset(b[4], 5, B);
  bs_http_cache_unused(&c, b[4], B); /* freed, not kept */
  cr_expect_eq(c.nspare, 0);
  bs_http_cache_put_owned(&c, 1, 0, b[0], 100); /* a prefix */
  bs_http_cache_put_owned(&c, 1, 1, b[1], B);
  bs_http_cache_put_owned(&c, 1, 2, b[2], B);     /* evicts block 0: back to the spares */
  bs_http_cache_put_owned(&c, 1, 3, b[3], B + 1); /* too long: not kept, back too */
  cr_expect_eq(c.nspare, 2);
  uint8_t *again[2] = {bs_http_cache_block(&c), bs_http_cache_block(&c)};
  cr_expect((again[0] == b[0] && again[1] == b[3]) || (again[0] == b[3] && again[1] == b[0]));
  bs_http_cache_unused(&c, again[0], 10);
  bs_http_cache_unused(&c, again[1], B);
  cr_expect_eq(c.nspare, 2);
  bs_http_cache_destroy(&c);
}

Test(http, cache_pinned_blocks_stay)
{
  /* A block lent to a reply (pinned) is neither evicted nor replaced until
   * unpinned: its bytes stay the same under eviction pressure, the cache
   * stays within its bound (a new block is then not kept), and unpinned it
   * goes first again. */
  struct bs_http_cache c;
  enum { B = 4096 };
  cr_assert_eq(bs_http_cache_init(&c, B, 2 * B), 0);
  static uint8_t blk[B], out[B];
  memset(blk, 'a', B);
  cr_assert(bs_http_cache_put(&c, 1, 0, blk, 100)); /* a prefix */
  memset(blk, 'b', B);
  cr_assert(bs_http_cache_put(&c, 1, 1, blk, B));
  const uint8_t *p0, *p1, *p;
  cr_expect(!bs_http_cache_pin(&c, 1, 0, 50, 51, &p)); /* past the prefix: a miss */
  cr_expect(!bs_http_cache_pin(&c, 1, 2, 0, 1, &p));   /* not held */
  cr_assert(bs_http_cache_pin(&c, 1, 0, 10, 90, &p0));
  cr_assert(bs_http_cache_pin(&c, 1, 1, 0, B, &p1));
  cr_assert(bs_http_cache_pin(&c, 1, 1, B - 1, 1, &p)); /* twice */
  cr_expect_eq(p, p1 + B - 1);
  for (uint64_t i = 2; i < 20; i++) { /* pressure: none of them is kept */
    memset(blk, (int)i, B);
    cr_assert(bs_http_cache_put(&c, 2, i, blk, B));
    cr_assert_leq(bs_http_cache_bytes(&c), 2 * B);
  }
  memset(blk, 'z', B);
  cr_assert(bs_http_cache_put(&c, 1, 0, blk, B)); /* longer, but block 0 is pinned */
  cr_expect_eq(p0[0], 'a');
  cr_expect_eq(p0[89], 'a');
  cr_expect_eq(p1[0], 'b');
  cr_expect_eq(p1[B - 1], 'b');
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 0, out, B), 100);
  cr_expect_eq(bs_http_cache_get(&c, 2, 19, 0, out, B), -1);
  bs_http_cache_unpin(&c, 1, 0);
  bs_http_cache_unpin(&c, 1, 1);
  cr_assert(bs_http_cache_put(&c, 2, 30, blk, B)); /* evicts block 0 (least recent) */
  cr_expect_eq(bs_http_cache_get(&c, 1, 0, 0, out, B), -1);
  cr_expect_eq(bs_http_cache_get(&c, 1, 1, 0, out, 1), 1); /* still pinned once */
  cr_assert(bs_http_cache_put(&c, 2, 31, blk, B));
  cr_expect_eq(bs_http_cache_get(&c, 1, 1, 0, out, 1), 1);
  cr_expect_eq(bs_http_cache_get(&c, 2, 31, 0, out, 1), 1);
  bs_http_cache_unpin(&c, 1, 1);
  cr_assert(bs_http_cache_put(&c, 2, 32, blk, B));
  cr_assert(bs_http_cache_put(&c, 2, 33, blk, B));
  cr_expect_eq(bs_http_cache_get(&c, 1, 1, 0, out, 1), -1); /* unpinned: evicted */
  bs_http_cache_destroy(&c);
}

Test(http, cache_lookups_do_not_scan)
{
  /* 16,384 slots (the most a cache has), 200,000 blocks of 100 sources put
   * and read back: each lookup and eviction takes a few steps (a hash and a
   * recency list). A scan of every slot under the lock, as before, took
   * seconds here (and held every reader of the mount meanwhile). */
  struct bs_http_cache c;
  enum { B = 64 };
  cr_assert_eq(bs_http_cache_init(&c, B, (uint64_t)BS_HTTP_CACHE_BLOCKS_MAX * B), 0);
  static uint8_t blk[B], out[B];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint64_t i = 0; i < 200000; i++) {
    memset(blk, (int)(i & 0xff), B);
    cr_assert(bs_http_cache_put(&c, i % 100, i / 100, blk, B));
    cr_assert_eq(bs_http_cache_get(&c, i % 100, i / 100, 0, out, B), B);
    cr_assert_eq(out[B - 1], (uint8_t)(i & 0xff));
    if (i >= BS_HTTP_CACHE_BLOCKS_MAX) { /* the oldest is gone, the one after it stays */
      uint64_t j = i - BS_HTTP_CACHE_BLOCKS_MAX;
      cr_assert_eq(bs_http_cache_get(&c, j % 100, j / 100, 0, out, 1), -1);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  cr_expect_lt(s, 2.0, "200,000 puts and gets took %.2f s", s);
  cr_expect_eq(bs_http_cache_bytes(&c), (size_t)BS_HTTP_CACHE_BLOCKS_MAX * B);
  bs_http_cache_destroy(&c);
}
