/* The HTTP source through libcurl, without a server: what is no URL, and
 * nothing listening, are refused at open in one line. Requests against
 * real and hostile servers: e2e/test_remote*.py. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/source.h"

Test(src_http, not_a_url_refused)
{
  struct bs_src s;
  bs_err err;
  bs_err_clear(&err);
  cr_expect_neq(bs_src_init_http(&s, "/tmp/x.safetensors", NULL, &err), 0);
  cr_expect_null(s.ops);
  bs_err_clear(&err);
  /* nothing listens on port 1: a connection error, retried, then one line */
  cr_expect_neq(bs_src_init_http(&s, "http://127.0.0.1:1/x.safetensors", NULL, &err), 0);
  cr_expect_null(s.ops);
  cr_expect(strstr(err.msg, "127.0.0.1") || strstr(err.msg, "onnect"), "%s", err.msg);
}
