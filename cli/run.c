/* flexc run: not built yet (placeholder until its stage lands). */
#include <stdio.h>

#include "cli.h"

int cli_run(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "flexc: 'run' is not available in this build\n");
  return 2;
}
