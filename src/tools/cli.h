/* The checkpoint CLI on the core, no FUSE: `burnstore ls|info|cat|diff|convert`.
 * Linked into the mount binary (fs_main.c hands these subcommands over) and,
 * in a core-only build, into a `burnstore` of its own (cli_main.c). */
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
