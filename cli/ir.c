/* flexc ir FILE [--kernel K] [--grad] [--after PASS]: print the IR of one
 * kernel after the whole pipeline, or after the named pass (flex_ir_text). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The command line of `flexc ir`. */
typedef struct IrArgs {
  const char *file;   /* the .score file */
  const char *kernel; /* --kernel, or NULL */
  const char *after;  /* --after, or NULL */
  bool grad;          /* --grad: also build the joint (backward) function */
} IrArgs;

/* Parse the arguments; returns 0 or the exit status of a usage error. */
static int parse_args(int argc, char **argv, IrArgs *o) {
  memset(o, 0, sizeof *o);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--grad")) {
      o->grad = true;
    } else if (!strcmp(a, "--kernel") || !strcmp(a, "--after")) {
      if (i + 1 >= argc) return cli_usage_error("%s needs a value", a);
      *(a[2] == 'k' ? &o->kernel : &o->after) = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("ir: unknown option '%s'", a);
    } else if (o->file) {
      return cli_usage_error("ir: one FILE only ('%s' and '%s')", o->file, a);
    } else {
      o->file = a;
    }
  }
  if (!o->file) return cli_usage_error("ir: no FILE given");
  return 0;
}

int cli_ir(int argc, char **argv) {
  IrArgs o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;
  char *text;
  if (flex_ir_text(&text, o.file, o.kernel, o.grad, o.after)) {
    const char *msg = flex_last_error();
    if (!strncmp(msg, "unknown pass", 12)) return cli_usage_error("ir: %s", msg);
    size_t n = strlen(msg);
    fprintf(stderr, "%s%s", msg, n && msg[n - 1] == '\n' ? "" : "\n");
    return 1;
  }
  fputs(text, stdout);
  flex_free(text);
  return 0;
}
