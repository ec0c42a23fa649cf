/* hf:// and s3:// URLs into the http(s) URL the byte source asks (remote.h).
 *
 * hf://[datasets/|spaces/]ORG/REPO[@REVISION]/PATH is the Hub's resolve URL
 * {HF_ENDPOINT}/{[datasets/|spaces/]ORG/REPO}/resolve/{REVISION}/{PATH},
 * the way the Hub's own client builds it (a '/' in the revision encoded).
 * s3://BUCKET/KEY is {AWS_ENDPOINT_URL}/BUCKET/KEY (path style, what
 * S3-compatible stores serve), else AWS's virtual-hosted
 * https://BUCKET.s3.REGION.amazonaws.com/KEY (path style at
 * s3.REGION.amazonaws.com for a bucket with a '.', as AWS's CLI does). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/http_parse.h"
#include "core/remote.h"
#include "core/source.h"

enum { TOKEN_MAX = 4096 }; /* the token file's first line, at most */

void bs_remote_env_load(struct bs_remote_env *e)
{
  const char *v;
  e->hf_endpoint = getenv("HF_ENDPOINT");
  e->aws_region = (v = getenv("AWS_REGION")) && *v ? v : getenv("AWS_DEFAULT_REGION");
  e->aws_endpoint = (v = getenv("AWS_ENDPOINT_URL_S3")) && *v ? v : getenv("AWS_ENDPOINT_URL");
}

/* The strings given (up to a NULL) one after another, bs_malloc'd. */
static char *join(const char *first, ...)
{
  va_list ap;
  size_t n = 0;
  va_start(ap, first);
  for (const char *p = first; p; p = va_arg(ap, const char *))
    n += strlen(p);
  va_end(ap);
  char *out = bs_malloc(n + 1), *w = out;
  if (!out)
    return NULL;
  va_start(ap, first);
  for (const char *p = first; p; p = va_arg(ap, const char *)) {
    size_t k = strlen(p);
    memcpy(w, p, k);
    w += k;
  }
  va_end(ap);
  *w = '\0';
  return out;
}

char *bs_url_encode(const char *s, size_t n, bool keep_slash)
{
  static const char hex[] = "0123456789ABCDEF";
  char *out = bs_malloc(n * 3 + 1), *w = out; /* (n: a string's length, no overflow) */
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~' || (c == '/' && keep_slash)) {
      *w++ = (char)c;
    } else {
      *w++ = '%';
      *w++ = hex[c >> 4];
      *w++ = hex[c & 15];
    }
  }
  *w = '\0';
  return out;
}

static int hexval(char c)
{
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Whether the segment p[0..n) is a dot segment as a server or libcurl may
 * take it, '.' also written %2E: 1 ("."), 2 (".."), else 0. */
static int dots(const char *p, size_t n)
{
  int k = 0;
  for (size_t i = 0; i < n; k++) {
    if (p[i] == '.')
      i++;
    else if (n - i >= 3 && p[i] == '%' && p[i + 1] == '2' && (p[i + 2] == 'e' || p[i + 2] == 'E'))
      i += 3;
    else
      return 0;
  }
  return k <= 2 ? k : 0;
}

/* Whether a '/'-separated segment of s[0..n) is a dot segment. */
static bool has_dots(const char *s, size_t n)
{
  for (size_t i = 0; i <= n;) {
    size_t k = 0;
    while (i + k < n && s[i + k] != '/')
      k++;
    if (dots(s + i, k))
      return true;
    i += k + 1;
  }
  return false;
}

/* s[0..n) with %XX decoded (a revision written "feature%2Fx"), encoded again
 * whole: every '/' as %2F. */
static char *encode_rev(const char *s, size_t n)
{
  char *dec = bs_malloc(n + 1);
  if (!dec)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (s[i] == '%' && i + 2 < n && (hi = hexval(s[i + 1])) >= 0 && (lo = hexval(s[i + 2])) >= 0) {
      dec[k++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      dec[k++] = s[i];
    }
  }
  char *out = bs_url_encode(dec, k, false);
  bs_free(dec);
  return out;
}

/* A http(s) endpoint ("https://host[:port][/prefix]") without its trailing
 * slashes. */
static char *endpoint(const char *v, const char *dflt)
{
  if (!v || !*v)
    v = dflt;
  size_t n = strlen(v);
  while (n > 0 && v[n - 1] == '/')
    n--;
  return bs_strndup(v, n);
}

void bs_remote_free(struct bs_remote *r)
{
  if (r->url) {
    memset(r->url, 0, strlen(r->url));
    bs_free(r->url);
  }
  bs_free(r->name);
  bs_free(r->hf_pre);
  bs_free(r->hf_path);
  bs_free(r->hf_spec_pre);
  bs_free(r->hf_spec_path);
  memset(r, 0, sizeof *r);
}

static int fail(struct bs_remote *r, char *msg, size_t mn, const char *why)
{
  snprintf(msg, mn, "%s", why);
  bs_remote_free(r);
  return -1;
}

static int parse_hf(const char *spec, const struct bs_remote_env *env, struct bs_remote *r,
                    char *msg, size_t mn)
{
  static const char usage[] = "not a Hub URL: hf://[datasets/|spaces/]ORG/REPO[@REVISION]/PATH";
  const char *p = spec + 5, *kind = "";
  if (strncmp(p, "datasets/", 9) == 0) {
    kind = "datasets/";
    p += 9;
  } else if (strncmp(p, "spaces/", 7) == 0) {
    kind = "spaces/";
    p += 7;
  } else if (strncmp(p, "models/", 7) == 0) {
    p += 7;
  }
  /* ORG/REPO[@REVISION]/PATH: the revision is one segment, or refs/X/Y */
  size_t org = strcspn(p, "/@");
  if (org == 0 || p[org] != '/')
    return fail(r, msg, mn, usage);
  const char *repo = p + org + 1;
  size_t rn = strcspn(repo, "/@");
  if (rn == 0 || !repo[rn])
    return fail(r, msg, mn, usage);
  const char *rev = "main", *path;
  size_t vn = 4;
  if (repo[rn] == '@') {
    rev = repo + rn + 1;
    vn = strcspn(rev, "/");
    if (vn == 4 && strncmp(rev, "refs", 4) == 0 && rev[4] == '/') {
      size_t a = strcspn(rev + 5, "/");
      if (rev[5 + a] == '/')
        vn = 5 + a + 1 + strcspn(rev + 5 + a + 1, "/");
    }
    if (vn == 0 || !rev[vn])
      return fail(r, msg, mn, "hf:// URL: an empty revision after '@', or no PATH after it");
    path = rev + vn + 1;
  } else {
    path = repo + rn + 1;
  }
  if (!*path || path[strlen(path) - 1] == '/')
    return fail(r, msg, mn, "hf:// URL: no file PATH in the repository");
  /* libcurl (and servers) remove dot segments: the request, with the
   * token, would leave the repository (hf://org/repo/../../x). */
  if (dots(p, org) || dots(repo, rn) || has_dots(path, strlen(path)) || dots(rev, vn))
    return fail(r, msg, mn,
                "hf:// URL: a '.' or '..' segment (also as %2E) would leave the repository: "
                "refused");
  for (const char *s = path; *s; s++)
    if (*s == '?' || *s == '#')
      return fail(r, msg, mn, "hf:// URL: a '?' or '#' in the PATH");
  char *ep = endpoint(env->hf_endpoint, "https://huggingface.co");
  char *repo_id = bs_strndup(p, (size_t)(repo + rn - p));
  char *erev = encode_rev(rev, vn);
  char *epath = bs_url_encode(path, strlen(path), true);
  char *erepo = repo_id ? bs_url_encode(repo_id, strlen(repo_id), true) : NULL;
  if (ep && erepo && erev && epath) {
    r->hf_pre = join(ep, "/", kind, erepo, "/resolve/", NULL);
    r->hf_path = epath;
    epath = NULL;
    r->url = r->hf_pre ? join(r->hf_pre, erev, "/", r->hf_path, NULL) : NULL;
    r->name = bs_strdup(spec);
    r->hf_spec_pre = bs_strndup(spec, (size_t)(repo + rn - spec));
    r->hf_spec_path = bs_strdup(path);
  }
  bool http = ep && (strncasecmp(ep, "http://", 7) == 0 || strncasecmp(ep, "https://", 8) == 0);
  bs_free(ep);
  bs_free(repo_id);
  bs_free(erev);
  bs_free(epath);
  bs_free(erepo);
  if (!r->url || !r->name || !r->hf_spec_pre || !r->hf_spec_path)
    return fail(r, msg, mn, "out of memory");
  if (!http)
    return fail(r, msg, mn, "HF_ENDPOINT is no http:// or https:// URL");
  return 0;
}

static bool bucket_ok(const char *b, size_t n)
{
  if (n < 3 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
          b[i] == '.'))
      return false;
  return true;
}

static bool region_ok(const char *s)
{
  size_t n = strlen(s);
  if (n == 0 || n > 32)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
      return false;
  return true;
}

static int parse_s3(const char *spec, const struct bs_remote_env *env, struct bs_remote *r,
                    char *msg, size_t mn)
{
  const char *b = spec + 5;
  size_t bn = strcspn(b, "/");
  if (!b[bn] || !b[bn + 1] || b[strlen(b) - 1] == '/')
    return fail(r, msg, mn, "not an S3 object URL: s3://BUCKET/KEY");
  if (!bucket_ok(b, bn))
    return fail(r, msg, mn,
                "s3:// URL: the bucket name is not one (3 to 63 of a-z, 0-9, '.' and '-')");
  const char *key = b + bn + 1;
  if (has_dots(key, strlen(key)))
    return fail(r, msg, mn,
                "s3:// URL: a '.' or '..' segment in the key (also as %2E) would leave the key "
                "or the bucket (keys are sent as written): refused");
  const char *region = env->aws_region && *env->aws_region ? env->aws_region : "us-east-1";
  if (!region_ok(region))
    return fail(r, msg, mn, "AWS_REGION is not a region name (such as us-east-1)");
  snprintf(r->sigv4, sizeof r->sigv4, "aws:amz:%s:s3", region);
  char *ekey = bs_url_encode(key, strlen(key), true);
  char *bucket = bs_strndup(b, bn);
  bool http = true;
  if (ekey && bucket) {
    if (env->aws_endpoint && *env->aws_endpoint) {
      char *ep = endpoint(env->aws_endpoint, NULL);
      http = ep && (strncasecmp(ep, "http://", 7) == 0 || strncasecmp(ep, "https://", 8) == 0);
      r->url = ep ? join(ep, "/", bucket, "/", ekey, NULL) : NULL;
      bs_free(ep);
    } else if (strchr(bucket, '.')) { /* (a dotted bucket would not match the TLS name) */
      r->url = join("https://s3.", region, ".amazonaws.com/", bucket, "/", ekey, NULL);
    } else {
      r->url = join("https://", bucket, ".s3.", region, ".amazonaws.com/", ekey, NULL);
    }
    r->name = bs_strdup(spec);
  }
  bs_free(ekey);
  bs_free(bucket);
  if (!r->url || !r->name)
    return fail(r, msg, mn, "out of memory");
  if (!http)
    return fail(r, msg, mn, "AWS_ENDPOINT_URL is no http:// or https:// URL");
  return 0;
}

int bs_remote_parse(const char *spec, const struct bs_remote_env *env, struct bs_remote *r,
                    char *msg, size_t mn)
{
  memset(r, 0, sizeof *r);
  if (strncasecmp(spec, "hf://", 5) == 0) {
    r->kind = BS_REMOTE_HF;
    return parse_hf(spec, env, r, msg, mn);
  }
  if (strncasecmp(spec, "s3://", 5) == 0) {
    r->kind = BS_REMOTE_S3;
    return parse_s3(spec, env, r, msg, mn);
  }
  if (!bs_src_is_url(spec))
    return fail(r, msg, mn, "not an http://, https://, hf:// or s3:// URL");
  r->kind = BS_REMOTE_HTTP;
  r->url = bs_strdup(spec);
  r->name = bs_http_redact(spec);
  if (!r->url || !r->name)
    return fail(r, msg, mn, "out of memory");
  return 0;
}

int bs_remote_shard_check(const struct bs_remote *r, const char *rel, char *msg, size_t mn)
{
  const char *where = r->kind == BS_REMOTE_HF   ? "its repository and revision"
                      : r->kind == BS_REMOTE_S3 ? "its bucket"
                                                : "the index's directory on the server";
  if (!*rel)
    return snprintf(msg, mn, "the shard name is empty"), -1;
  if (rel[0] == '/' || rel[0] == '\\')
    return snprintf(msg, mn, "the shard name is absolute: it must stay in %s", where), -1;
  size_t seg0 = strcspn(rel, "/\\");
  if (memchr(rel, ':', seg0) || strstr(rel, "://"))
    return snprintf(msg, mn, "the shard name is a URL: it must stay in %s", where), -1;
  for (const char *p = rel; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return snprintf(msg, mn, "the shard name holds a control character"), -1;
  if (r->kind == BS_REMOTE_HTTP && strpbrk(rel, "?#"))
    return snprintf(msg, mn, "the shard name holds a '?' or '#' (it would change the URL)"), -1;
  /* %XX decoded (as a server may), then its segments (split at '/' and
   * '\\'): ".." may not climb above where it starts. */
  char *dec = bs_malloc(strlen(rel) + 1), *w = dec;
  if (!dec)
    return snprintf(msg, mn, "out of memory"), -1;
  bool ctl = false; /* a %XX that decodes to a control character (%00 too) */
  for (const char *p = rel; *p; p++) {
    int hi, lo;
    if (p[0] == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0) {
      *w = (char)(hi << 4 | lo);
      ctl |= (unsigned char)*w < 0x20 || *w == 0x7f;
      w++;
      p += 2;
    } else {
      *w++ = *p;
    }
  }
  *w = '\0';
  if (ctl) {
    bs_free(dec);
    return snprintf(msg, mn, "the shard name holds a control character (%%XX)"), -1;
  }
  long depth = 0;
  bool out = false;
  for (const char *p = dec; *p && !out;) {
    size_t n = strcspn(p, "/\\");
    if (n == 2 && p[0] == '.' && p[1] == '.')
      out = --depth < 0;
    else if (n > 0 && !(n == 1 && p[0] == '.'))
      depth++;
    p += n + (p[n] != '\0');
  }
  bs_free(dec);
  if (out)
    return snprintf(msg, mn, "the shard name climbs out of %s (..)", where), -1;
  return 0;
}

/* s up to and with its last '/' (all of it when none), then tail. */
static char *beside(const char *s, const char *tail)
{
  const char *slash = strrchr(s, '/');
  size_t n = slash ? (size_t)(slash - s) + 1 : 0;
  size_t tn = strlen(tail);
  char *out = bs_malloc(n + tn + 1);
  if (!out)
    return NULL;
  memcpy(out, s, n);
  memcpy(out + n, tail, tn + 1);
  return out;
}

/* rel (bs_remote_shard_check passed: it never climbs above its start)
 * without its dot segments: "." dropped, ".." taking the segment before it
 * along ("sub/../m" is "m"). bs_malloc'd; NULL: no memory. */
static char *no_dots(const char *rel)
{
  size_t n = strlen(rel), k = 0;
  char *out = bs_malloc(n + 1);
  if (!out)
    return NULL;
  for (size_t i = 0; i <= n;) {
    size_t m = strcspn(rel + i, "/");
    int d = dots(rel + i, m);
    if (d == 2) { /* back to before the last segment kept */
      while (k > 0 && out[k - 1] == '/')
        k--;
      while (k > 0 && out[k - 1] != '/')
        k--;
    } else if (d == 0) {
      memcpy(out + k, rel + i, m);
      k += m;
      if (rel[i + m] == '/')
        out[k++] = '/';
    }
    i += m + 1;
  }
  out[k] = '\0';
  return out;
}

int bs_remote_sibling(const struct bs_remote *r, const char *rel, struct bs_remote *out)
{
  memset(out, 0, sizeof *out);
  out->kind = r->kind;
  memcpy(out->sigv4, r->sigv4, sizeof out->sigv4);
  memcpy(out->commit, r->commit, sizeof out->commit);
  char *flat = NULL; /* (hf, s3: their URLs hold no dot segment, see parse) */
  if (r->kind == BS_REMOTE_HTTP) {
    out->url = bs_http_resolve(r->url, rel);
    out->name = out->url ? bs_http_redact(out->url) : NULL;
  } else if ((rel = flat = no_dots(rel))) {
    char *erel = bs_url_encode(rel, strlen(rel), true);
    out->url = erel ? beside(r->url, erel) : NULL;
    out->name = beside(r->name, rel);
    if (r->kind == BS_REMOTE_HF) {
      out->hf_pre = bs_strdup(r->hf_pre);
      out->hf_path = erel ? beside(r->hf_path, erel) : NULL;
      out->hf_spec_pre = bs_strdup(r->hf_spec_pre);
      out->hf_spec_path = beside(r->hf_spec_path, rel);
    }
    bs_free(erel);
  }
  bs_free(flat);
  if (!out->url || !out->name ||
      (r->kind == BS_REMOTE_HF &&
       (!out->hf_pre || !out->hf_path || !out->hf_spec_pre || !out->hf_spec_path))) {
    bs_remote_free(out);
    return -1;
  }
  return 0;
}

int bs_remote_hf_pin(struct bs_remote *r, const char *commit)
{
  size_t n = strlen(commit);
  if (r->kind != BS_REMOTE_HF || (n != 40 && n != 64))
    return -1;
  for (size_t i = 0; i < n; i++)
    if (hexval(commit[i]) < 0)
      return -1;
  char *url = join(r->hf_pre, commit, "/", r->hf_path, NULL);
  if (!url)
    return -1;
  memset(r->url, 0, strlen(r->url));
  bs_free(r->url);
  r->url = url;
  memcpy(r->commit, commit, n + 1);
  return 0;
}

char *bs_remote_reopen(const struct bs_remote *r)
{
  if (r->kind == BS_REMOTE_HF && r->commit[0])
    return join(r->hf_spec_pre, "@", r->commit, "/", r->hf_spec_path, NULL);
  if (r->kind != BS_REMOTE_HTTP)
    return bs_strdup(r->name);
  /* what redaction would change (user-info, a query) is a secret */
  char *shown = bs_http_redact(r->url);
  bool plain = shown && strcmp(shown, r->url) == 0;
  bs_free(shown);
  return plain ? bs_strdup(r->url) : NULL;
}

const char *bs_remote_redir_protocols(const char *url)
{
  return strncasecmp(url, "https://", 8) == 0 ? "https" : "http,https";
}

bool bs_remote_redir_refused(const char *from, const char *to, char *msg, size_t mn)
{
  if (!to || strncasecmp(from, "https://", 8) != 0 || strncasecmp(to, "http://", 7) != 0)
    return false;
  char *shown = bs_http_redact(to);
  snprintf(msg, mn,
           "a redirect to %s refused: the bytes would travel unencrypted (an https:// URL is read "
           "over https only)",
           shown ? shown : "an http:// URL");
  bs_free(shown);
  return true;
}

/* The first line of `path` without blanks at its ends, or NULL (none, no
 * regular file, or longer than TOKEN_MAX). Opened without blocking: a FIFO
 * there waits for no writer. */
static char *first_line(const char *path)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  struct stat st;
  if (fd < 0)
    return NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return NULL;
  }
  char buf[TOKEN_MAX + 2];
  size_t n = 0;
  while (n < sizeof buf - 1) {
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  size_t e = strcspn(buf, "\r\n");
  char *out = NULL;
  if (e <= TOKEN_MAX) {
    size_t b = 0;
    while (b < e && (buf[b] == ' ' || buf[b] == '\t'))
      b++;
    while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\t'))
      e--;
    out = e > b ? bs_strndup(buf + b, e - b) : NULL;
  }
  memset(buf, 0, sizeof buf);
  return out;
}

char *bs_hf_token(void)
{
  const char *v = getenv("HF_TOKEN");
  if (v && *v)
    return bs_strdup(v);
  const char *home = getenv("HF_HOME");
  char *path = NULL;
  if (home && *home) {
    path = join(home, "/token", NULL);
  } else {
    const char *h = getenv("HOME");
    if (!h || !*h)
      return NULL;
    path = join(h, "/.cache/huggingface/token", NULL);
  }
  if (!path)
    return NULL;
  char *tok = first_line(path);
  bs_free(path);
  return tok;
}
