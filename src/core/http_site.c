/* A site of the HTTP client (http_client.h): what a source and its
 * siblings share, the block cache, the credentials (the Hub's token, S3's
 * keys, a bearer token), the CAs TLS trusts and the tunables. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/http_client.h"
#include "core/http_parse.h"

enum {
  TIMEOUT_S = 60, /* a read blocks at most this long (BURNSTORE_HTTP_TIMEOUT) */
};
#define CACHE_DEFAULT ((uint64_t)64 << 20)

void bs_http_site_unref(struct bs_http_site *sh)
{
  if (!sh)
    return;
  pthread_mutex_lock(&sh->lock);
  bool last = --sh->refs == 0;
  pthread_mutex_unlock(&sh->lock);
  if (!last)
    return;
  bs_http_cache_destroy(&sh->cache);
  bs_free(sh->cainfo);
  bs_free(sh->capath);
  char *secrets[] = {sh->auth, sh->aws_id, sh->aws_secret, sh->aws_token};
  for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++)
    if (secrets[i]) {
      memset(secrets[i], 0, strlen(secrets[i]));
      bs_free(secrets[i]);
    }
  pthread_mutex_destroy(&sh->lock);
  bs_free(sh);
}

/* The credentials of rm's kind: the Hub's token, S3's keys (from the
 * environment), an HTTP server's BURNSTORE_HTTP_TOKEN. false: no memory. */
static bool site_creds(struct bs_http_site *sh, const struct bs_http_opts *o,
                       const struct bs_remote *rm)
{
  char *tok = NULL;
  sh->deny_hint = "a token: BURNSTORE_HTTP_TOKEN";
  if (o && o->bearer) {
    tok = bs_strdup(o->bearer);
  } else if (rm->kind == BS_REMOTE_HF) {
    tok = bs_hf_token();
    sh->deny_hint = "a gated or private repository needs a token: HF_TOKEN, or $HF_HOME/token";
  } else if (rm->kind == BS_REMOTE_HTTP && getenv("BURNSTORE_HTTP_TOKEN")) {
    tok = bs_strdup(getenv("BURNSTORE_HTTP_TOKEN"));
  }
  bool want = tok && *tok;
  if (want) {
    size_t n = strlen(tok) + 32;
    if ((sh->auth = bs_malloc(n)))
      snprintf(sh->auth, n, "Authorization: Bearer %s", tok);
  }
  if (tok) {
    memset(tok, 0, strlen(tok));
    bs_free(tok);
  }
  if (want && !sh->auth)
    return false;
  if (rm->kind != BS_REMOTE_S3)
    return true;
  sh->deny_hint = "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and "
                  "AWS_REGION";
  const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
  const char *session = getenv("AWS_SESSION_TOKEN");
  if (!id || !*id) /* unsigned requests: a public bucket */
    return true;
  memcpy(sh->sigv4, rm->sigv4, sizeof sh->sigv4);
  if (!(sh->aws_id = bs_strdup(id)) || !(sh->aws_secret = bs_strdup(secret ? secret : "")))
    return false;
  if (session && *session) {
    size_t n = strlen(session) + 32;
    if (!(sh->aws_token = bs_malloc(n)))
      return false;
    snprintf(sh->aws_token, n, "x-amz-security-token: %s", session);
  }
  return true;
}

/* The cache size, the read timeout and whether a server without a strong
 * ETag is read: opts', else $BURNSTORE_HTTP_CACHE's, $BURNSTORE_HTTP_TIMEOUT's
 * and $BURNSTORE_HTTP_UNVALIDATED's, else the defaults. A variable that is
 * set to something else is an error naming it (it was taken as the
 * default). */
static int tunables(const struct bs_http_opts *o, uint64_t *cache, long *timeout_s,
                    bool *unvalidated, bs_err *err)
{
  const char *v;
  *unvalidated = o && o->unvalidated;
  if (!*unvalidated && (v = getenv("BURNSTORE_HTTP_UNVALIDATED")) && *v) {
    if (strcmp(v, "1") != 0 && strcmp(v, "0") != 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "BURNSTORE_HTTP_UNVALIDATED='%.40s' is not 1 (read a server without a "
                     "strong ETag) or 0",
                     v);
    *unvalidated = strcmp(v, "1") == 0;
  }
  *cache = CACHE_DEFAULT;
  *timeout_s = TIMEOUT_S;
  if (o && o->cache_bytes)
    *cache = o->cache_bytes;
  else if ((v = getenv("BURNSTORE_HTTP_CACHE")) && bs_http_parse_cache(v, cache) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "BURNSTORE_HTTP_CACHE='%.40s' is not a cache size (1M to 16G; K, M, G "
                   "binary, e.g. 256M)",
                   v);
  if (o && o->timeout_s)
    *timeout_s = o->timeout_s;
  else if ((v = getenv("BURNSTORE_HTTP_TIMEOUT")) && bs_http_parse_timeout(v, timeout_s) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "BURNSTORE_HTTP_TIMEOUT='%.40s' is not whole seconds from 1 to %d", v,
                   BS_HTTP_TIMEOUT_MAX_S);
  return 0;
}

static struct bs_http_site *site_new(const struct bs_http_opts *o, const struct bs_remote *rm,
                                     uint64_t cache, long timeout_s)
{
  struct bs_http_site *sh = bs_calloc(1, sizeof *sh);
  if (!sh)
    return NULL;
  if (pthread_mutex_init(&sh->lock, NULL) != 0) {
    bs_free(sh);
    return NULL;
  }
  sh->refs = 1;
  sh->timeout_s = timeout_s;
  sh->as_is = rm->kind != BS_REMOTE_HTTP;
  const char *bundle = getenv("CURL_CA_BUNDLE"), *dir = getenv("SSL_CERT_DIR");
  const char *file = getenv("SSL_CERT_FILE");
  if ((bundle && *bundle && !(sh->cainfo = bs_strdup(bundle))) ||
      (!bundle && dir && *dir && !(sh->capath = bs_strdup(dir))) ||
      (!bundle && file && *file && !(sh->cainfo = bs_strdup(file)))) {
    bs_http_site_unref(sh);
    return NULL;
  }
  if (bs_http_cache_init(&sh->cache, BS_HTTP_BLOCK, cache)) {
    bs_http_site_unref(sh);
    return NULL;
  }
  if (!site_creds(sh, o, rm)) {
    bs_http_site_unref(sh);
    return NULL;
  }
  return sh;
}

void bs_http_site_ref(struct bs_http_site *sh)
{
  pthread_mutex_lock(&sh->lock);
  sh->refs++;
  pthread_mutex_unlock(&sh->lock);
}

int bs_http_site_open(const struct bs_http_opts *o, const struct bs_remote *rm,
                      struct bs_http_site **out, bs_err *err)
{
  *out = NULL;
  if (bs_http_client_init(err) != 0)
    return -1;
  uint64_t cache;
  long timeout_s;
  bool unvalidated;
  if (tunables(o, &cache, &timeout_s, &unvalidated, err) != 0)
    return -1;
  if (!(*out = site_new(o, rm, cache, timeout_s)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  (*out)->unvalidated = unvalidated;
  return 0;
}
