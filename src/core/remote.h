/* Remote sources by scheme: hf://ORG/REPO[@REVISION]/PATH (the Hugging
 * Face Hub) and s3://BUCKET/KEY turned into the http(s) URL the byte source
 * asks, and what each needs besides (the Hub's token, S3's Signature V4).
 * Pure pieces (no network), for the unit tests; the environment is passed
 * in, never read here, except by bs_remote_env_load and bs_hf_token. */
#ifndef BURNSTORE_CORE_REMOTE_H
#define BURNSTORE_CORE_REMOTE_H

#include <stdbool.h>
#include <stddef.h>

enum bs_remote_kind { BS_REMOTE_HTTP, BS_REMOTE_HF, BS_REMOTE_S3 };

/* The variables that shape a URL (NULL or "": unset). */
struct bs_remote_env {
  const char *hf_endpoint;  /* HF_ENDPOINT */
  const char *aws_region;   /* AWS_REGION, else AWS_DEFAULT_REGION */
  const char *aws_endpoint; /* AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL */
};
void bs_remote_env_load(struct bs_remote_env *e);

struct bs_remote {
  enum bs_remote_kind kind;
  char *url;  /* the http(s) URL asked (may hold user-info: never shown) */
  char *name; /* what messages, the mount table and xattrs show */
  /* hf: url is hf_pre + revision + "/" + hf_path (both URL-encoded), so
   * the revision can be pinned to the commit the first answer names. */
  char *hf_pre, *hf_path;
  /* hf: the URL as typed up to the repository ("hf://[datasets/]ORG/REPO")
   * and the PATH in it (not encoded), for the URL at the pinned commit. */
  char *hf_spec_pre, *hf_spec_path;
  char commit[72]; /* hf: the pinned commit, "" until then */
  char sigv4[96];  /* s3: "aws:amz:REGION:s3" */
};

/* Parse spec (an http(s)://, hf:// or s3:// URL) into r. 0, or -1 with a
 * one-line reason in msg (no credentials: the spec holds none but an
 * http URL's user-info, which is not repeated). r is freed on failure. */
int bs_remote_parse(const char *spec, const struct bs_remote_env *env, struct bs_remote *r,
                    char *msg, size_t mn);
/* Whether `rel`, a shard's name in an index at r, stays beside it: in the
 * same repository and revision (hf), bucket (s3), or the server's
 * directory tree below the index (http). 0; -1 with the reason in msg
 * when it is empty, absolute, a URL (a scheme), climbs out with ".."
 * (also written %2E%2E, or with '\\'), holds a control character (also
 * %-encoded: a %00 would end the ".." check early), or (http) a '?' or
 * '#' (another query). */
int bs_remote_shard_check(const struct bs_remote *r, const char *rel, char *msg, size_t mn);
/* `rel` (bs_remote_shard_check passed) beside r's file, in the same
 * repository and revision (hf) or bucket (s3). 0 or -1 (no memory). */
int bs_remote_sibling(const struct bs_remote *r, const char *rel, struct bs_remote *out);
/* hf: ask at `commit` from now on (what X-Repo-Commit named). 0; -1 when
 * commit is no commit hash (40 or 64 hex digits) or no memory. */
int bs_remote_hf_pin(struct bs_remote *r, const char *commit);
void bs_remote_free(struct bs_remote *r);
/* The URL that opens r's file again, the same bytes (what a staging INDEX
 * records for --finish): hf:// at the pinned commit, s3:// as given, an
 * http(s) URL as given unless it holds user-info or a query (a password, a
 * signature: NULL then, never written to disk). bs_malloc'd; NULL also when
 * out of memory. */
char *bs_remote_reopen(const struct bs_remote *r);
/* s into a bs_malloc'd string with every byte but A-Z a-z 0-9 - . _ ~ (and
 * '/' when keep_slash) as %XX. NULL: no memory. */
char *bs_url_encode(const char *s, size_t n, bool keep_slash);
/* What a redirect of a request to `url` may lead to (libcurl's
 * CURLOPT_REDIR_PROTOCOLS_STR): from an https:// URL "https" only (to
 * http:// every byte would travel in clear, and what the server learned
 * from the request: a redirect is refused), else "http,https". */
const char *bs_remote_redir_protocols(const char *url);
/* Why the redirect from `from` to `to` was refused, one line into msg
 * naming `to` without credentials (the caller's line names `from`); false
 * when it is no https -> http redirect. */
bool bs_remote_redir_refused(const char *from, const char *to, char *msg, size_t mn);
/* The Hub's token: $HF_TOKEN, else the first line of $HF_HOME/token
 * (HF_HOME: ~/.cache/huggingface). bs_malloc'd, NULL when there is none. */
char *bs_hf_token(void);

#endif
