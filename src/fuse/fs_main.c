/* PLACEHOLDER: the FUSE daemon lands in the next commit. */
#include <stdio.h>
int main(void) { fputs("burnstore: not built yet\n", stderr); return 1; }
