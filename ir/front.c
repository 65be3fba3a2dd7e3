/* front.c: the front half of the pipeline, written once for the runtime
 * (flex_kernel_load), every command and the benchmarks:
 *
 *   parse -> check (names and types: fe_check; values: ir_check_values)
 *         -> pick the kernel -> lower -> compile
 *
 * Every user error is a diagnostic in `d`; nothing here prints.
 */
#include "ir.h"

/* The kernel a run would pick must exist: each kernel block by name, or the
 * implicit `default` kernel (which fails with several scores or masks). */
static void pick_all(Arena *a, Program *p, Diags *d) {
  int kernels = 0;
  for (int i = 0; i < p->ndecls; i++)
    if (p->decls[i]->kind == D_KERNEL) {
      kernels++;
      fe_pick_kernel(a, p, p->decls[i]->id, d);
    }
  if (!kernels) fe_pick_kernel(a, p, NULL, d);
}

/* Parse and check the whole file, every declaration used by a kernel or
 * not, so that every command rejects the same files. NULL on errors. */
static Program *checked(Arena *a, const Source *src, Diags *d) {
  Program *p = fe_parse(a, src, d);
  if (d->errors || fe_check(a, p, d) || d->errors) return NULL;
  if (ir_check_values(a, p, d)) return NULL;
  return p;
}

int ir_front_check(Arena *a, const Source *src, Diags *d) {
  Program *p = checked(a, src, d);
  if (p) pick_all(a, p, d);
  return d->errors;
}

IrModule *ir_front(Arena *a, const Source *src, const char *kernel, bool grad, const char *after,
                   Diags *d) {
  Program *p = checked(a, src, d);
  if (!p) return NULL;
  Decl *kd = fe_pick_kernel(a, p, kernel, d);
  if (!kd || d->errors) return NULL;
  IrModule *m = ir_lower(a, p, kd);
  if (!ir_compile(m, grad, after)) return NULL; /* callers check `after` first */
  return m;
}
