/* flexc check FILE...: parse and check each file, report diagnostics on
 * stderr. Exit status 1 when any file has an error, else 0 (silently). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "frontend/frontend.h"
#include "ir/ir.h"

/* The kernel a run would pick must exist: each kernel block by name, or the
 * implicit `default` kernel (which fails with several scores or masks). */
static void pick_all(Arena *a, Program *p, Diags *d) {
  int n = p->ndecls, kernels = 0;
  for (int i = 0; i < n; i++)
    if (p->decls[i]->kind == D_KERNEL) {
      kernels++;
      fe_pick_kernel(a, p, p->decls[i]->id, d);
    }
  if (!kernels) fe_pick_kernel(a, p, NULL, d);
}

/* Check one file; returns its error count (or 1 if unreadable). */
static int check_file(const char *path) {
  char *text;
  size_t len;
  int err = base_read_file(path, &text, &len);
  if (err) {
    fprintf(stderr, "flexc: error: cannot read '%s': %s\n", path, strerror(err));
    return 1;
  }
  Source src = {.path = path, .text = text, .len = len};
  Diags d = {.src = &src};
  Arena a = {0};
  Program *p = fe_parse(&a, &src, &d);
  if (!d.errors && !fe_check(&a, p, &d)) {
    /* value checks of every declaration, used by a kernel or not */
    if (!ir_lower_check_all(&a, p, &d)) pick_all(&a, p, &d);
  }
  if (d.text.len) fputs(d.text.data, stderr);
  int errors = d.errors;
  diag_free(&d);
  arena_free(&a);
  base_free(text);
  return errors;
}

int cli_check(int argc, char **argv) {
  if (argc < 2) return cli_usage_error("'check' needs at least one FILE");
  int bad = 0;
  for (int i = 1; i < argc; i++)
    if (check_file(argv[i])) bad = 1;
  return bad;
}
