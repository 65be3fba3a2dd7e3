/* flexc mask: not built yet (placeholder until its stage lands). */
#include <stdio.h>

#include "cli.h"

int cli_mask(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "flexc: 'mask' is not available in this build\n");
  return 2;
}
