/* flexc: the command-line driver. main() only dispatches; each subcommand
 * lives in its own file and is the whole pipeline for that job. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *usage;
} commands[] = {
    {"check", cli_check, "check FILE...                      report diagnostics only"},
    {"ir", cli_ir, "ir FILE [--kernel K] [--grad] [--after PASS]   print the IR"},
    {"run", cli_run, "run FILE --q Q.npy --k K.npy --v V.npy ... --out DIR   run attention"},
    {"emit", cli_emit, "emit FILE --target cuda|ptx|cubin --arch SM --head-dim E --dtype T   emit kernels"},
    {"mask", cli_mask, "mask FILE --shape B,H,Q_LEN,KV_LEN ...   block sparsity of a mask"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: flexc COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  flexc %s\n", commands[i].usage);
  fprintf(f, "\n  flexc --help       this text\n  flexc --version    the version\n"
             "\nexit status: 0 ok, 1 error in the input, 2 bad usage\n");
}

int cli_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flexc: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see flexc --help)\n");
  va_end(ap);
  return 2;
}

/* A value that is not what an option needs: an error in the input (status
 * 1), like a bad .npy file, rather than a misuse of the command. */
int cli_input_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flexc: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 1;
}

bool cli_make_dir(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return false;
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0777) && errno != EEXIST) return false;
      *p = '/';
    }
  return !mkdir(tmp, 0777) || errno == EEXIST;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("flexc %s\n", FLEXC_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  return cli_usage_error("unknown command '%s'", argv[1]);
}
