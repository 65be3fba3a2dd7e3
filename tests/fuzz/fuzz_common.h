/* fuzz_common.h: what every libFuzzer target here shares: the stderr that
 * -close_fd_mask leaves (duplicated before libFuzzer closes it), and a
 * failure that says what broke on it before aborting (libFuzzer then saves
 * the input). */
#ifndef FLEXC_FUZZ_COMMON_H
#define FLEXC_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *fuzz_err; /* stderr as it was before libFuzzer closed it */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  int fd = dup(2);
  fuzz_err = fd >= 0 ? fdopen(fd, "w") : NULL;
  return 0;
}

/* What broke, then abort. */
static void fuzz_die(const char *target, const char *what, const char *msg) {
  FILE *f = fuzz_err ? fuzz_err : stderr;
  fprintf(f, "%s: %s: %s\n", target, what, msg);
  fflush(f);
  abort();
}

#endif
