/* An answer as it comes, on the HTTP client's thread (http_client.h): its
 * headers parsed into the request's bs_http_xfer, its body written
 * straight into the request's blocks. */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/http_client.h"
#include "core/http_parse.h"

enum {
  ERR_BODY_MAX = 64 << 10, /* an error's body read at most (then the transfer ends) */
};

enum { SEEN_RANGE = 1, SEEN_LENGTH = 2, SEEN_ETAG = 4, SEEN_LASTMOD = 8 };

/* A header of x (bit) given: if it was already, with another value
 * (differs), its name goes in x->twice: the answer is refused, whichever
 * value is the true one. */
static void given(struct bs_http_xfer *x, unsigned bit, bool differs, const char *name)
{
  if ((x->seen & bit) && differs && !x->twice[0])
    snprintf(x->twice, sizeof x->twice, "%s", name);
  x->seen |= bit;
}

size_t bs_http_on_header(char *line, size_t size, size_t nitems, void *ud)
{
  struct bs_http_req *r = ud;
  struct bs_http_xfer *x = &r->x;
  size_t n = size * nitems;
  const char *v;
  size_t vn;
  if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) { /* a new answer (after a redirect) */
    char commit[sizeof x->commit];
    memcpy(commit, x->commit, sizeof commit);
    *x = (struct bs_http_xfer){.length = UINT64_MAX, .retry_ms = -1};
    memcpy(x->commit, commit, sizeof commit);
    r->started = r->err_cut = false;
    r->skip = 0;
    curl_off_t got = 0; /* (a redirect's body is counted from here) */
    curl_easy_getinfo(r->easy, CURLINFO_SIZE_DOWNLOAD_T, &got);
    r->body_base = (uint64_t)got;
  } else if (bs_http_header_is(line, n, "Content-Range", &v, &vn)) {
    uint64_t f = 0, l = 0, t = 0;
    bool ok = bs_http_content_range(v, vn, &f, &l, &t) == 0;
    if (!ok)
      f = l = t = 0;
    given(x, SEEN_RANGE, ok != x->have_range || f != x->first || l != x->last || t != x->total,
          "Content-Range");
    x->have_range = ok;
    x->first = f, x->last = l, x->total = t;
  } else if (bs_http_header_is(line, n, "Content-Length", &v, &vn)) {
    uint64_t len;
    if (!bs_http_number(v, vn, &len))
      len = UINT64_MAX;
    given(x, SEEN_LENGTH, len != x->length, "Content-Length");
    x->length = len;
  } else if (bs_http_header_is(line, n, "ETag", &v, &vn)) {
    given(x, SEEN_ETAG, vn != x->etag_n || (vn < sizeof x->etag && memcmp(x->etag, v, vn) != 0),
          "ETag");
    x->etag_n = vn;
    snprintf(x->etag, sizeof x->etag, "%.*s", vn < sizeof x->etag ? (int)vn : 0, v);
  } else if (bs_http_header_is(line, n, "Last-Modified", &v, &vn)) {
    given(x, SEEN_LASTMOD, strlen(x->lastmod) != vn || memcmp(x->lastmod, v, vn) != 0,
          "Last-Modified");
    snprintf(x->lastmod, sizeof x->lastmod, "%.*s", vn < sizeof x->lastmod ? (int)vn : 0, v);
  } else if (bs_http_header_is(line, n, "Content-Encoding", &v, &vn)) {
    if (!(vn == 8 && strncasecmp(v, "identity", 8) == 0) && vn)
      snprintf(x->encoding, sizeof x->encoding, "%.*s",
               (int)(vn < sizeof x->encoding ? vn : sizeof x->encoding - 1), v);
  } else if (bs_http_header_is(line, n, "X-Repo-Commit", &v, &vn)) {
    if (!x->commit[0]) /* (the Hub's answer, not its CDN's after the redirect) */
      snprintf(x->commit, sizeof x->commit, "%.*s",
               (int)(vn < sizeof x->commit ? vn : sizeof x->commit - 1), v);
  } else if (bs_http_header_is(line, n, "Retry-After", &v, &vn)) {
    x->retry_ms = bs_http_retry_after(v, vn, BS_HTTP_RETRY_CAP_MS);
  }
  return n;
}

/* Only a success's body is ours; an error's is read up to ERR_BODY_MAX
 * (then the transfer ends: an endless error body is not drained). A 200 to
 * a range request is the whole object: ours starts `first` bytes in,
 * skipped up to BS_HTTP_SKIP_MAX (beyond, the transfer stops: refused). A
 * body with a Content-Encoding is not the object's bytes: refused. */
size_t bs_http_on_body(char *data, size_t size, size_t nmemb, void *ud)
{
  struct bs_http_req *r = ud;
  struct bs_http_xfer *x = &r->x;
  size_t n = size * nmemb, used = 0;
  long code = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
  if (code != 200 && code != 206) {
    r->skip += n;
    if (r->skip <= ERR_BODY_MAX)
      return n;
    r->err_cut = true;
    return 0;
  }
  if (x->encoding[0])
    return 0;
  if (!r->started) {
    r->started = true;
    r->skip = 0;
    if (code == 200) {
      if (r->first > BS_HTTP_SKIP_MAX)
        return 0;
      r->skip = r->first;
    }
  }
  if (r->skip) {
    size_t k = r->skip < n ? (size_t)r->skip : n;
    r->skip -= k;
    used = k;
  }
  size_t room = r->n - x->got, k = n - used;
  if (k > room)
    k = room;
  for (size_t done = 0; done < k;) { /* straight into the blocks */
    size_t at = r->to.base + x->got, in = at % BS_HTTP_BLOCK, m = BS_HTTP_BLOCK - in;
    if (m > k - done)
      m = k - done;
    memcpy(r->to.seg[at / BS_HTTP_BLOCK] + in, data + used + done, m);
    done += m;
    x->got += m;
  }
  /* Our range is complete: stop a body that goes on (a 200 to a range). */
  return x->got == r->n && used + k < n ? 0 : n;
}

/* The body of a redirect libcurl follows never reaches bs_http_on_body:
 * libcurl reads it to the end on its own (a server's endless one for the
 * whole deadline). Past ERR_BODY_MAX the transfer ends, as an error's. */
int bs_http_on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                        curl_off_t ulnow)
{
  struct bs_http_req *r = ud;
  (void)dltotal, (void)ultotal, (void)ulnow;
  long code = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
  uint64_t now = dlnow > 0 ? (uint64_t)dlnow : 0;
  uint64_t body = now >= r->body_base ? now - r->body_base : now;
  if (code / 100 != 3 || body <= ERR_BODY_MAX)
    return 0;
  r->err_cut = true;
  return 1;
}
