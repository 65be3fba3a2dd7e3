/* flexc emit: not built yet (placeholder until its stage lands). */
#include <stdio.h>

#include "cli.h"

int cli_emit(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "flexc: 'emit' is not available in this build\n");
  return 2;
}
