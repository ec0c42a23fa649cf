/* The checkpoint CLI on the core, no FUSE: `burnstore ls|info|cat|diff|convert`,
 * `--finish`, `--list-staging`. burnstore's one main (src/main/main.c) hands
 * these subcommands here, in the FUSE build and in a core-only one. */
#ifndef BURNSTORE_CLI_H
#define BURNSTORE_CLI_H

#include <stdbool.h>

/* Is `name` one of the subcommands? */
bool bs_cli_is_command(const char *name);
/* Run a subcommand: argv[0] is its name. Returns the exit status. */
int bs_cli_main(int argc, char **argv);
/* The subcommands' usage lines, for the mount binary's --help. */
extern const char bs_cli_usage[];

#endif
