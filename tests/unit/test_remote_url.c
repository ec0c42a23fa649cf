/* hf:// and s3:// URLs into the http(s) URL asked (core/remote.h): the
 * Hub's resolve URL at HF_ENDPOINT, datasets and spaces, revisions (a '/'
 * encoded, refs/pr/N), pinning to a commit, siblings in the same repository
 * and revision; S3's path style at AWS_ENDPOINT_URL and AWS's virtual-hosted
 * style, the SigV4 scope's region; the token file; malformed URLs refused
 * with one line. The requests themselves: e2e/test_remote_hub.py. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/remote.h"

static const struct bs_remote_env no_env = {0};

static void parses(const char *spec, const struct bs_remote_env *env, const char *url)
{
  struct bs_remote r;
  char msg[160] = "";
  cr_assert_eq(bs_remote_parse(spec, env, &r, msg, sizeof msg), 0, "%s: %s", spec, msg);
  cr_expect_str_eq(r.url, url, "%s", spec);
  cr_expect_str_eq(r.name, spec);
  bs_remote_free(&r);
}

static void refuses(const char *spec, const struct bs_remote_env *env, const char *why)
{
  struct bs_remote r;
  char msg[160] = "";
  cr_expect_neq(bs_remote_parse(spec, env, &r, msg, sizeof msg), 0, "%s", spec);
  cr_expect(strstr(msg, why) != NULL, "%s: %s", spec, msg);
  cr_expect_null(r.url);
}

Test(remote_url, hub)
{
  parses("hf://org/repo/model.safetensors", &no_env,
         "https://huggingface.co/org/repo/resolve/main/model.safetensors");
  parses("hf://org/repo@v1.0/sub dir/m.safetensors", &no_env,
         "https://huggingface.co/org/repo/resolve/v1.0/sub%20dir/m.safetensors");
  parses("hf://org/repo@feature%2Fx/m.gguf", &no_env,
         "https://huggingface.co/org/repo/resolve/feature%2Fx/m.gguf");
  parses("hf://org/repo@refs/pr/3/m.gguf", &no_env,
         "https://huggingface.co/org/repo/resolve/refs%2Fpr%2F3/m.gguf");
  parses("hf://datasets/org/data@main/a/b.safetensors", &no_env,
         "https://huggingface.co/datasets/org/data/resolve/main/a/b.safetensors");
  parses("hf://spaces/org/app/w.pth", &no_env,
         "https://huggingface.co/spaces/org/app/resolve/main/w.pth");
  struct bs_remote_env env = {.hf_endpoint = "http://127.0.0.1:8080/"};
  parses("hf://org/repo/m.st", &env, "http://127.0.0.1:8080/org/repo/resolve/main/m.st");
  refuses("hf://org", &no_env, "not a Hub URL");
  refuses("hf://org/repo", &no_env, "not a Hub URL");
  refuses("hf://org/repo/", &no_env, "no file PATH");
  refuses("hf://org/repo@/m.st", &no_env, "empty revision");
  refuses("hf://org/repo@main", &no_env, "empty revision");
  refuses("hf://org/repo/m.st?x=1", &no_env, "'?'");
  struct bs_remote_env bad = {.hf_endpoint = "ftp://h"};
  refuses("hf://org/repo/m.st", &bad, "HF_ENDPOINT");
}

Test(remote_url, hub_pin_and_siblings)
{
  struct bs_remote r, s;
  char msg[160];
  cr_assert_eq(bs_remote_parse("hf://org/repo@dev/d/model.safetensors.index.json", &no_env, &r, msg,
                               sizeof msg),
               0);
  cr_expect_neq(bs_remote_hf_pin(&r, "abc"), 0);
  cr_expect_neq(bs_remote_hf_pin(&r, "zz34567890123456789012345678901234567890"), 0);
  cr_expect_str_eq(r.url,
                   "https://huggingface.co/org/repo/resolve/dev/d/model.safetensors.index.json");
  const char *c = "0123456789abcdef0123456789abcdef01234567";
  cr_assert_eq(bs_remote_hf_pin(&r, c), 0);
  cr_expect_str_eq(r.url, "https://huggingface.co/org/repo/resolve/"
                          "0123456789abcdef0123456789abcdef01234567/d/"
                          "model.safetensors.index.json");
  cr_assert_eq(bs_remote_sibling(&r, "model 1.safetensors", &s), 0);
  cr_expect_str_eq(s.url, "https://huggingface.co/org/repo/resolve/"
                          "0123456789abcdef0123456789abcdef01234567/d/model%201.safetensors");
  cr_expect_str_eq(s.name, "hf://org/repo@dev/d/model 1.safetensors");
  /* a sibling pins again (its own answer's commit) on the same path */
  cr_assert_eq(bs_remote_hf_pin(&s, "89abcdef0123456789abcdef0123456789abcdef"), 0);
  cr_expect(strstr(s.url, "/89abcdef0123456789abcdef0123456789abcdef/d/model%201.safetensors"));
  bs_remote_free(&s);
  bs_remote_free(&r);
}

Test(remote_url, s3)
{
  parses("s3://my-bucket/models/m.safetensors", &no_env,
         "https://my-bucket.s3.us-east-1.amazonaws.com/models/m.safetensors");
  parses("s3://my.dotted.bucket/m.gguf", &no_env,
         "https://s3.us-east-1.amazonaws.com/my.dotted.bucket/m.gguf");
  struct bs_remote_env env = {.aws_region = "eu-west-3", .aws_endpoint = "http://127.0.0.1:9000/"};
  parses("s3://b.x/a b/m+1.gguf", &env, "http://127.0.0.1:9000/b.x/a%20b/m%2B1.gguf");
  struct bs_remote r, s;
  char msg[160];
  cr_assert_eq(bs_remote_parse("s3://bkt/d/i.json", &env, &r, msg, sizeof msg), 0);
  cr_expect_str_eq(r.sigv4, "aws:amz:eu-west-3:s3");
  cr_assert_eq(bs_remote_sibling(&r, "s1.safetensors", &s), 0);
  cr_expect_str_eq(s.url, "http://127.0.0.1:9000/bkt/d/s1.safetensors");
  cr_expect_str_eq(s.name, "s3://bkt/d/s1.safetensors");
  cr_expect_str_eq(s.sigv4, "aws:amz:eu-west-3:s3");
  cr_expect_neq(bs_remote_hf_pin(&s, "0123456789abcdef0123456789abcdef01234567"), 0);
  bs_remote_free(&s);
  bs_remote_free(&r);
  cr_assert_eq(bs_remote_parse("s3://bkt/k", &no_env, &r, msg, sizeof msg), 0);
  cr_expect_str_eq(r.sigv4, "aws:amz:us-east-1:s3");
  bs_remote_free(&r);
  refuses("s3://bucket", &no_env, "s3://BUCKET/KEY");
  refuses("s3://bucket/", &no_env, "s3://BUCKET/KEY");
  refuses("s3://Bad_Bucket/k", &no_env, "bucket name");
  refuses("s3://ab/k", &no_env, "bucket name");
  struct bs_remote_env reg = {.aws_region = "us-east-1\r\nX: y"};
  refuses("s3://bucket/k", &reg, "AWS_REGION");
  struct bs_remote_env ep = {.aws_endpoint = "file:///etc"};
  refuses("s3://bucket/k", &ep, "AWS_ENDPOINT_URL");
  refuses("gs://bucket/k", &no_env, "not an http");
}

Test(remote_url, http_kept)
{
  struct bs_remote r, s;
  char msg[160];
  cr_assert_eq(bs_remote_parse("http://u:p@h/d/i.json?sig=1", &no_env, &r, msg, sizeof msg), 0);
  cr_expect_str_eq(r.url, "http://u:p@h/d/i.json?sig=1");
  cr_expect_str_eq(r.name, "http://***@h/d/i.json?***");
  cr_assert_eq(bs_remote_sibling(&r, "s.st", &s), 0);
  cr_expect_str_eq(s.url, "http://u:p@h/d/s.st");
  cr_expect_str_eq(s.name, "http://***@h/d/s.st");
  bs_remote_free(&s);
  bs_remote_free(&r);
}

Test(remote_url, encode)
{
  char *e = bs_url_encode("a/b c%~é", strlen("a/b c%~é"), true);
  cr_expect_str_eq(e, "a/b%20c%25~%C3%A9");
  bs_free(e);
  e = bs_url_encode("a/b", 3, false);
  cr_expect_str_eq(e, "a%2Fb");
  bs_free(e);
}

Test(remote_url, hf_token)
{
  char dir[] = "/tmp/bs-hf-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/token", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("  hf_fromfile \nsecond line\n", f);
  fclose(f);
  unsetenv("HF_TOKEN");
  setenv("HF_HOME", dir, 1);
  char *t = bs_hf_token();
  cr_expect_str_eq(t, "hf_fromfile");
  bs_free(t);
  setenv("HF_TOKEN", "hf_fromenv", 1);
  t = bs_hf_token();
  cr_expect_str_eq(t, "hf_fromenv");
  bs_free(t);
  unsetenv("HF_TOKEN");
  unlink(path);
  cr_expect_null(bs_hf_token()); /* no file: no token */
  setenv("HF_HOME", "/nonexistent-bs", 1);
  cr_expect_null(bs_hf_token());
  unsetenv("HF_HOME");
  rmdir(dir);
}

/* $HF_HOME/token that is no regular file (a FIFO nobody writes, a
 * directory): no token, at once (a FIFO's open used to wait for a writer). */
Test(remote_url, hf_token_not_a_file, .timeout = 10)
{
  char dir[] = "/tmp/bs-hf-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/token", dir);
  cr_assert_eq(mkfifo(path, 0600), 0);
  unsetenv("HF_TOKEN");
  setenv("HF_HOME", dir, 1);
  cr_expect_null(bs_hf_token());
  unlink(path);
  cr_assert_eq(mkdir(path, 0700), 0);
  cr_expect_null(bs_hf_token());
  rmdir(path);
  unsetenv("HF_HOME");
  rmdir(dir);
}

static void reopens(const char *spec, const char *commit, const char *want)
{
  struct bs_remote r;
  char msg[160];
  cr_assert_eq(bs_remote_parse(spec, &no_env, &r, msg, sizeof msg), 0, "%s: %s", spec, msg);
  if (commit)
    cr_assert_eq(bs_remote_hf_pin(&r, commit), 0);
  char *got = bs_remote_reopen(&r);
  if (want)
    cr_expect_str_eq(got, want, "%s", spec);
  else
    cr_expect_null(got, "%s: %s", spec, got);
  bs_free(got);
  bs_remote_free(&r);
}

Test(remote_url, reopen)
{
  const char *c = "0123456789abcdef0123456789abcdef01234567";
  reopens("hf://org/repo/d/m.st", c,
          "hf://org/repo@0123456789abcdef0123456789abcdef01234567/d/m.st");
  reopens("hf://datasets/org/repo@dev/m.st", c,
          "hf://datasets/org/repo@0123456789abcdef0123456789abcdef01234567/m.st");
  reopens("hf://org/repo@dev/m.st", NULL, "hf://org/repo@dev/m.st"); /* no commit named */
  reopens("s3://bucket/k/m.st", NULL, "s3://bucket/k/m.st");
  reopens("https://h/m.st", NULL, "https://h/m.st");
  reopens("https://u:p@h/m.st", NULL, NULL); /* credentials: never written down */
  reopens("https://h/m.st?X-Amz-Signature=1", NULL, NULL);
  /* a sibling of a pinned file reopens at the same commit */
  struct bs_remote r, s;
  char msg[160];
  cr_assert_eq(bs_remote_parse("hf://org/repo/d/i.json", &no_env, &r, msg, sizeof msg), 0);
  cr_assert_eq(bs_remote_hf_pin(&r, c), 0);
  cr_assert_eq(bs_remote_sibling(&r, "s 1.st", &s), 0);
  char *got = bs_remote_reopen(&s);
  cr_expect_str_eq(got, "hf://org/repo@0123456789abcdef0123456789abcdef01234567/d/s 1.st");
  bs_free(got);
  bs_remote_free(&s);
  bs_remote_free(&r);
}

/* A shard's name in an index stays beside it: in the repository and
 * revision (hf), the bucket (s3), below the index's directory (http). */
static void shard(const char *url, const char *rel, bool ok, const char *why)
{
  struct bs_remote r;
  char msg[160] = "";
  struct bs_remote_env env = {.aws_endpoint = "http://127.0.0.1:9000"};
  cr_assert_eq(bs_remote_parse(url, &env, &r, msg, sizeof msg), 0, "%s", msg);
  msg[0] = '\0';
  int rc = bs_remote_shard_check(&r, rel, msg, sizeof msg);
  cr_expect_eq(rc, ok ? 0 : -1, "%s + %s: %d (%s)", url, rel, rc, msg);
  if (!ok)
    cr_expect(strstr(msg, why), "%s + %s: '%s' says '%s'", url, rel, msg, why);
  bs_remote_free(&r);
}

Test(remote_url, shard_names_stay_inside)
{
  const char *hf = "hf://org/repo@main/d/model.safetensors.index.json";
  const char *s3 = "s3://bkt/d/i.json";
  const char *web = "https://h.example/m/d/i.json";
  const char *urls[] = {hf, s3, web};
  for (size_t i = 0; i < 3; i++) {
    const char *u = urls[i];
    shard(u, "model-00001-of-00002.safetensors", true, NULL);
    shard(u, "sub/m.safetensors", true, NULL);
    shard(u, "sub/../m.safetensors", true, NULL); /* back to where it started */
    shard(u, "./m.safetensors", true, NULL);
    shard(u, "../../other/repo/resolve/main/m.safetensors", false, "climbs out");
    shard(u, "..", false, "climbs out");
    shard(u, "sub/../../m.safetensors", false, "climbs out");
    shard(u, "%2E%2E/%2e%2e/other/m.safetensors", false, "climbs out");
    shard(u, "..\\..\\other\\m.safetensors", false, "climbs out");
    shard(u, ".%2E/m.safetensors", false, "climbs out");
    shard(u, "/org/other/m.safetensors", false, "absolute");
    shard(u, "\\m.safetensors", false, "absolute");
    shard(u, "https://evil.example/m.safetensors", false, "URL");
    shard(u, "hf://org/other/m.safetensors", false, "URL");
    shard(u, "s3:other/m", false, "URL");
    shard(u, "", false, "empty");
    shard(u, "m\n.safetensors", false, "control");
    /* a %00 must not end the ".." check early: curl still removes the
     * dot segments after it */
    shard(u, "%00/../../../other/m.safetensors", false, "control");
    shard(u, "m%0D%0A.safetensors", false, "control");
  }
  shard(hf, "../../other", false, "its repository and revision");
  shard(s3, "../../other-bucket/k", false, "its bucket");
  shard(web, "m.safetensors?x=1", false, "'?'");
  shard(hf, "m #1.safetensors", true, NULL); /* (encoded: a name) */
}

/* Issue 31: a dot segment in a typed hf:// or s3:// URL would leave the
 * repository or bucket with its credentials (libcurl and servers remove
 * them: hf://org/repo/../../../api/m was asked as /api/m with the token,
 * s3://bkt/../../other/m as /other/m, signed): refused in one line. What
 * is not a dot segment is sent as written. */
Test(remote_url, dot_segments_refused)
{
  struct bs_remote_env s3env = {.aws_endpoint = "http://127.0.0.1:9000"};
  const char *hf_bad[] = {
      "hf://org/repo/../../../api/m.safetensors",
      "hf://org/repo/a/../m.st",
      "hf://org/repo/./m.st",
      "hf://org/repo/%2E%2E/%2e%2e/x/m.st",
      "hf://org/repo/.%2E/m.st",
      "hf://org/repo/a/%2e/m.st",
      "hf://../repo/m.st",
      "hf://org/../m.st/x",
      "hf://org/repo@../m.st",
      "hf://org/repo@%2E%2E/m.st",
      "hf://org/repo@./m.st",
      "hf://datasets/org/repo/d/../../m.st",
  };
  for (size_t i = 0; i < sizeof hf_bad / sizeof *hf_bad; i++)
    refuses(hf_bad[i], &no_env, "'..' segment");
  const char *s3_bad[] = {
      "s3://bkt/../../other/m",  "s3://bkt/a/../m",   "s3://bkt/./m",
      "s3://bkt/%2E%2E/other/m", "s3://bkt/a/.%2e/m", "s3://bkt/a/..",
  };
  for (size_t i = 0; i < sizeof s3_bad / sizeof *s3_bad; i++) {
    refuses(s3_bad[i], &s3env, "'..' segment");
    refuses(s3_bad[i], &no_env, "'..' segment");
  }
  /* dots that are no segment of their own: names */
  parses("hf://org/repo/..m/a..b/.x/m...st", &no_env,
         "https://huggingface.co/org/repo/resolve/main/..m/a..b/.x/m...st");
  parses("hf://org/repo@v1.0/m.st", &no_env, "https://huggingface.co/org/repo/resolve/v1.0/m.st");
  /* S3 keys as written: doubled slashes kept, '%', '+', spaces, UTF-8 and
   * '...' encoded once (as SigV4's canonical URI for S3 has them) */
  parses("s3://bkt/a//b/m.st", &s3env, "http://127.0.0.1:9000/bkt/a//b/m.st");
  parses("s3://bkt/100%/x+y z/é/.../m", &s3env,
         "http://127.0.0.1:9000/bkt/100%25/x%2By%20z/%C3%A9/.../m");
  parses("s3://bkt/%2E%2Ex/m", &s3env, "http://127.0.0.1:9000/bkt/%252E%252Ex/m");
}

/* A shard named with dot segments that stay inside (sub/../m) is asked
 * without them in hf:// and s3:// (their URLs hold none); http as curl
 * resolves it. */
Test(remote_url, sibling_without_dots)
{
  struct bs_remote_env env = {.aws_endpoint = "http://127.0.0.1:9000"};
  struct bs_remote r, s;
  char msg[160];
  cr_assert_eq(bs_remote_parse("s3://bkt/d/i.json", &env, &r, msg, sizeof msg), 0);
  cr_assert_eq(bs_remote_sibling(&r, "sub/../x/./s 1.st", &s), 0);
  cr_expect_str_eq(s.url, "http://127.0.0.1:9000/bkt/d/x/s%201.st");
  cr_expect_str_eq(s.name, "s3://bkt/d/x/s 1.st");
  bs_remote_free(&s);
  cr_assert_eq(bs_remote_sibling(&r, "a//b/%2E%2E/c.st", &s), 0);
  cr_expect_str_eq(s.url, "http://127.0.0.1:9000/bkt/d/a//c.st"); /* (as RFC 3986) */
  bs_remote_free(&s);
  bs_remote_free(&r);
  cr_assert_eq(bs_remote_parse("hf://org/repo/d/i.json", &no_env, &r, msg, sizeof msg), 0);
  cr_assert_eq(bs_remote_sibling(&r, "./a/../s.st", &s), 0);
  cr_expect_str_eq(s.url, "https://huggingface.co/org/repo/resolve/main/d/s.st");
  cr_expect_str_eq(s.name, "hf://org/repo/d/s.st");
  cr_expect_str_eq(s.hf_spec_path, "d/s.st");
  bs_remote_free(&s);
  bs_remote_free(&r);
}

/* Issue 31: an https:// URL is never redirected to http:// (libcurl is
 * told "https" only); the refusal names the target without credentials. */
Test(remote_url, redirect_protocols)
{
  cr_expect_str_eq(bs_remote_redir_protocols("https://h/m"), "https");
  cr_expect_str_eq(bs_remote_redir_protocols("HTTPS://h/m"), "https");
  cr_expect_str_eq(bs_remote_redir_protocols("http://h/m"), "http,https");
  char msg[200] = "";
  cr_expect(bs_remote_redir_refused("https://h/m", "http://u:pw@cdn/m?sig=1", msg, sizeof msg));
  cr_expect(strstr(msg, "http://***@cdn/m?***") && strstr(msg, "unencrypted"), "%s", msg);
  cr_expect(!strstr(msg, "pw") && !strstr(msg, "sig=1"), "%s", msg);
  cr_expect(!bs_remote_redir_refused("https://h/m", "https://cdn/m", msg, sizeof msg));
  cr_expect(!bs_remote_redir_refused("http://h/m", "http://cdn/m", msg, sizeof msg));
  cr_expect(!bs_remote_redir_refused("https://h/m", NULL, msg, sizeof msg));
}
