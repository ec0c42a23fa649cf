"""Remote checkpoints over HTTPS (issue 20): Debian's nginx on a free port
of 127.0.0.1 serving TLS with a certificate signed by a CA the test makes
with openssl (tests/support/httpfault.py, Nginx(tls=True)).
- trusted the way curl users do it (CURL_CA_BUNDLE, SSL_CERT_FILE,
  SSL_CERT_DIR): every
  tensor read through a mount of the https:// URL equals the local mount's
  bytes, and `burnstore ls` lists it;
- without them (the system's CAs, which do not hold the test's CA) the open
  fails in one line naming the URL and the certificate problem, exit 1;
- an https:// URL that redirects to http:// on the same host and port
  (nginx's answer to plain HTTP on its TLS port is served by error_page
  497) is refused in one line naming both URLs (issue 31: it was followed,
  every byte then travelling in clear), by a mount and by `ls`: nginx logs
  every request's scheme and Authorization header, and no plain request
  was made at all (so none carried the token); a redirect to https on the
  same server is still followed, with the token.
Everything runs under a deadline; nginx is stopped and every mount
unmounted also on failure."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../support"))
from bsmount import (BIN, Mount, check, force_unmount, is_mounted, run, run_tests,  # noqa: E402
                     write_safetensors)
from httpfault import NGINX, Nginx  # noqa: E402
from test_remote import Env  # noqa: E402

TOKEN = "tls-t0ken-n3ver-in-clear"


def model():
    return {"a": os.urandom(3 << 20), "b": os.urandom(100), "c": os.urandom((1 << 20) + 3)}


def env_with(**kw):
    env = {k: v for k, v in os.environ.items()
           if k not in ("CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "BURNSTORE_HTTP_TOKEN")}
    env.update(kw)
    return env


def read_tree(m, names):
    return {k: open(os.path.join(m, k), "rb").read() for k in names}


def trusted(tmp):
    with Nginx(tmp, tls=True) as ng:
        want = model()
        write_safetensors(ng.path("m.safetensors"), want)
        url = ng.url("m.safetensors")
        check(url.startswith("https://"), "the server is https: %s" % url)
        with Env(env_with(CURL_CA_BUNDLE=ng.ca)):
            with Mount(url, os.path.join(tmp, "mnt-tls")) as m:
                check(read_tree(m, want) == want, "CURL_CA_BUNDLE: every tensor over https")
        r = run([BIN, "ls", url], env=env_with(SSL_CERT_FILE=ng.ca))
        check(r.returncode == 0 and "a" in r.stdout.split(),
              "SSL_CERT_FILE: ls over https: %d %r" % (r.returncode, r.stderr))
        # SSL_CERT_DIR: a directory of CA certificates by subject hash
        certs = os.path.join(tmp, "certs")
        os.makedirs(certs, exist_ok=True)
        h = run(["openssl", "x509", "-hash", "-noout", "-in", ng.ca]).stdout.strip()
        os.symlink(ng.ca, os.path.join(certs, h + ".0"))
        r = run([BIN, "ls", url], env=env_with(SSL_CERT_DIR=certs))
        check(r.returncode == 0 and "a" in r.stdout.split(),
              "SSL_CERT_DIR: ls over https: %d %r" % (r.returncode, r.stderr))
        reqs = ng.requests()
        check(len(reqs) >= 4, "nginx served them (%d requests)" % len(reqs))

        # the system's CAs only: refused in one line, the URL and the reason named
        r = run([BIN, "ls", url], env=env_with())
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and url in lines[0]
              and "certificate" in lines[0].lower(),
              "an untrusted certificate fails in one line: %d %r" % (r.returncode, lines))
        # another CA's file: the same
        other = Nginx(tmp, tls=True)
        other._certs()
        r = run([BIN, "ls", url], env=env_with(CURL_CA_BUNDLE=other.ca))
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and "certificate" in lines[0].lower(),
              "a certificate of another CA fails in one line: %d %r" % (r.returncode, lines))


def no_token_over_http(tmp):
    authlog = os.path.join(tmp, "auth-%d.log" % os.getpid())
    extra = """
    access_log %(log)s authlog;
    error_page 497 = @plain;
    location @plain { }
    location = /m.safetensors {
      if ($http_authorization != "Bearer %(tok)s") { return 401; }
      return 302 http://127.0.0.1:$server_port/cdn/m.safetensors;
    }
    location = /tls.safetensors {
      if ($http_authorization != "Bearer %(tok)s") { return 401; }
      return 302 https://127.0.0.1:$server_port/cdn/m.safetensors;
    }
    """ % {"log": authlog, "tok": TOKEN}
    with Nginx(tmp, extra=extra, tls=True) as ng:
        want = model()
        os.makedirs(ng.path("cdn"))
        write_safetensors(ng.path("cdn/m.safetensors"), want)
        url = ng.url("m.safetensors")
        target = "http://127.0.0.1:%d/cdn/m.safetensors" % ng.port
        env = env_with(CURL_CA_BUNDLE=ng.ca, BURNSTORE_HTTP_TOKEN=TOKEN)
        mnt = os.path.join(tmp, "mnt-redir")
        os.makedirs(mnt)
        for what, cmd in (("mount", [BIN, url, mnt]), ("ls", [BIN, "ls", url])):
            r = run(cmd, env=env)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 1 and len(lines) == 1 and url in lines[0] and target in lines[0]
                  and "unencrypted" in lines[0] and TOKEN not in r.stderr,
                  "%s: an https -> http redirect is refused in one line naming both URLs: %d %r"
                  % (what, r.returncode, lines))
        check(not is_mounted(mnt), "nothing mounted")
        force_unmount(mnt)
        # https -> https on the same server: followed, the token kept
        with Env(env):
            with Mount(ng.url("tls.safetensors"), os.path.join(tmp, "mnt-tls-redir")) as m:
                got = read_tree(m, want)
        check(got == want, "https -> https redirect: every tensor")
        log = open(authlog).read().splitlines()
        plain = [x for x in log if x.startswith("http ")]
        tls = [x for x in log if x.startswith("https ")]
        check(not plain, "no plain http request at all (%d): %r" % (len(plain), plain[:2]))
        asked = [x for x in tls if "/m.safetensors" in x or "/tls.safetensors" in x]
        check(asked and all(TOKEN in x for x in asked), "the token went to the https URLs: %r"
              % asked[:2])
        check(any("/cdn/m.safetensors" in x for x in tls), "the https target was read: %r" % tls[:4])


def main():
    if not os.path.exists(NGINX):
        print("SKIP: no nginx (Debian's nginx-light; .ci/install-deps installs it)")
        sys.exit(77)
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(300)
    run_tests("test_remote_tls", [trusted, no_token_over_http], "rtls")


if __name__ == "__main__":
    main()
