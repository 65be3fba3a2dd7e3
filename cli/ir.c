/* flexc ir FILE [--kernel K] [--grad] [--after PASS]: print the IR of one
 * kernel after the whole pipeline, or after the named pass. The pipeline:
 * read, parse, check, pick the kernel, lower, compile, print. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ir/ir.h"

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

/* Whether `name` is one of the passes --after accepts. */
static bool known_pass(const char *name) {
  size_t n = strlen(name);
  for (const char *s = ir_pass_names(); *s;) {
    size_t k = strcspn(s, ",");
    if (k == n && !strncmp(s, name, n)) return true;
    s += k;
    while (*s == ',' || *s == ' ') s++;
  }
  return false;
}

/* Everything after reading the file; returns the exit status. */
static int compile_and_print(Arena *arena, const Source *src, const IrArgs *o, Diags *d) {
  Program *p = fe_parse(arena, src, d);
  if (d->errors || fe_check(arena, p, d) || ir_lower_check_all(arena, p, d)) return 1;
  Decl *k = fe_pick_kernel(arena, p, o->kernel, d);
  if (!k) return 1;
  IrModule *m = ir_lower(arena, p, k, d);
  if (!m) return 1;
  ir_compile(m, o->grad, o->after);
  Buf out = {0};
  ir_print(&out, m);
  fputs(out.data ? out.data : "", stdout);
  buf_free(&out);
  return 0;
}

int cli_ir(int argc, char **argv) {
  IrArgs o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;
  if (o.after && !known_pass(o.after))
    return cli_usage_error("ir: unknown pass '%s' for --after (passes: %s)", o.after, ir_pass_names());
  char *text;
  size_t len;
  int err = base_read_file(o.file, &text, &len);
  if (err) {
    fprintf(stderr, "flexc: error: cannot read '%s': %s\n", o.file, strerror(err));
    return 1;
  }
  Source src = {o.file, text, len};
  Diags d;
  memset(&d, 0, sizeof d);
  d.src = &src;
  Arena arena = {0};
  rc = compile_and_print(&arena, &src, &o, &d);
  if (d.text.data) fputs(d.text.data, stderr);
  diag_free(&d);
  arena_free(&arena);
  base_free(text);
  return rc;
}
