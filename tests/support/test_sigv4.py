"""The SigV4 verifying proxy's signer (sigv4_proxy.py) against AWS's
published Signature Version 4 vectors, so the proxy that checks burnstore's
S3 requests is itself right:
- aws-sig-v4-test-suite (docs.aws.amazon.com/general/latest/gr/
  signature-v4-test-suite.html; also awslabs/aws-c-auth tests/aws-sig-v4-
  test-suite): get-vanilla, get-vanilla-query-order-key-case, get-utf8,
  post-vanilla (key AKIDEXAMPLE, region us-east-1, service "service",
  20150830T123600Z);
- the S3 API reference's "GET Object" example (docs.aws.amazon.com/AmazonS3/
  latest/API/sig-v4-header-based-auth.html: examplebucket, test.txt,
  Range bytes=0-9, 20130524T000000Z).
Then verify(): what sign() makes passes; a wrong secret, a changed Range, an
unsigned x-amz-* header, another region, a stale date, a missing
x-amz-content-sha256 fail."""
import datetime
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from sigv4_proxy import canonical_request, sign, signature, verify  # noqa: E402

FAILS = []
EMPTY = hashlib.sha256(b"").hexdigest()
SUITE_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SUITE_DATE = "20150830T123600Z"
HOST = ("Host", "example.amazonaws.com")
STAMP = ("X-Amz-Date", SUITE_DATE)


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILS.append(what)


def suite(name, method, path, query, want, want_creq_hash=None):
    creq = canonical_request(method, path, query, [HOST, STAMP], ["host", "x-amz-date"], EMPTY)
    if want_creq_hash:
        check(hashlib.sha256(creq.encode()).hexdigest() == want_creq_hash,
              "%s: the canonical request" % name)
    check(signature(SUITE_SECRET, SUITE_DATE, "us-east-1", "service", creq) == want, name)


suite("get-vanilla", "GET", "/", "",
      "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
      "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63")
suite("get-vanilla-query-order-key-case", "GET", "/", "Param2=value2&Param1=value1",
      "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500")
suite("get-utf8", "GET", "/%E1%88%B4", "",
      "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85")
suite("post-vanilla", "POST", "/", "",
      "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b")

# The S3 reference's GET Object example, through sign() (what the tests' uploads use).
S3_ID, S3_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
at = datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)
h = sign("GET", "https://examplebucket.s3.amazonaws.com/test.txt", S3_ID, S3_SECRET, "us-east-1",
         {"Range": "bytes=0-9"}, payload_hash=EMPTY, now=at)
check(h["Authorization"].endswith(
    "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
    "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
    "S3 GET Object example: %s" % h["Authorization"])

# verify() on requests as burnstore sends them.
url = "http://127.0.0.1:9/models/a%20b/m.safetensors"
target = "/models/a%20b/m.safetensors"
good = sign("GET", url, "KEY", "SECRET", "eu-west-3",
            {"Range": "bytes=0-0", "x-amz-security-token": "TOK", "If-Match": '"e"'})
check(verify("GET", target, list(good.items()), "KEY", "SECRET", "eu-west-3") is None,
      "a signed request passes")
check(verify("GET", target, list(good.items()), "KEY", "OTHER", "eu-west-3")
      == "SignatureDoesNotMatch", "a wrong secret is refused")
check(verify("GET", target, list(good.items()), "KEY2", "SECRET", "eu-west-3") is not None,
      "an unknown key id is refused")
check(verify("GET", target, list(good.items()), "KEY", "SECRET", "us-east-1") is not None,
      "another region is refused")
check(verify("GET", target + "x", list(good.items()), "KEY", "SECRET", "eu-west-3")
      == "SignatureDoesNotMatch", "another path is refused")
tampered = dict(good, Range="bytes=0-99")
check(verify("GET", target, list(tampered.items()), "KEY", "SECRET", "eu-west-3")
      == "SignatureDoesNotMatch", "a changed Range is refused")
extra = list(good.items()) + [("x-amz-extra", "1")]
check(verify("GET", target, extra, "KEY", "SECRET", "eu-west-3") is not None,
      "an unsigned x-amz-* header is refused")
old = sign("GET", url, "KEY", "SECRET", "eu-west-3",
           now=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=20))
check(verify("GET", target, list(old.items()), "KEY", "SECRET", "eu-west-3") is not None,
      "a request 20 minutes old is refused")
nohash = {k: v for k, v in good.items() if k != "x-amz-content-sha256"}
check(verify("GET", target, list(nohash.items()), "KEY", "SECRET", "eu-west-3") is not None,
      "no x-amz-content-sha256: refused")
check(verify("GET", target, [("Host", "h")], "KEY", "SECRET", "eu-west-3") is not None,
      "no Authorization: refused")

if FAILS:
    print("test_sigv4: %d failed" % len(FAILS))
    sys.exit(1)
print("test_sigv4: all expectations met")
