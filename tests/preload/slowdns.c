/* A resolver that hangs (LD_PRELOAD, e2e tests only: never linked into
 * anything): getaddrinfo of a name starting with "slowdns" sleeps
 * BS_SLOWDNS_S seconds (default 20), then resolves 127.0.0.1, as a
 * resolver whose server does not answer takes its timeouts. Other names go
 * to the real one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
  gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
  if (!real)
    return EAI_FAIL;
  if (node && strncmp(node, "slowdns", 7) == 0) {
    const char *s = getenv("BS_SLOWDNS_S");
    sleep(s ? (unsigned)atoi(s) : 20);
    node = "127.0.0.1";
  }
  return real(node, service, hints, res);
}
