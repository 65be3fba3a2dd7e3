/* compile.c: the pass list. Reads as the pipeline:
 *
 *   lower -> fold -> cse -> dce [-> autodiff -> fold -> cse -> dce]
 *
 * Lowering happens before (ir_lower builds the module); the passes here run
 * over every function the module has. Debug builds (FLEXC_VERIFY_IR) verify
 * every function after every pass.
 */
#include <string.h>

#include "ir.h"

/* The pass names, in order, as `--after` spells them. */
static const char *const pass_names[] = {"lower", "fold", "cse", "dce", "autodiff"};
enum { NPASSES = sizeof pass_names / sizeof pass_names[0] };

const char *ir_pass_names(void) { return "lower, fold, cse, dce, autodiff"; }

static void verify_all(const IrModule *m) {
#ifdef FLEXC_VERIFY_IR
  ir_verify(m, m->score);
  if (m->mask) ir_verify(m, m->mask);
  if (m->joint) ir_verify(m, m->joint);
#else
  (void)m;
#endif
}

/* Run one function pass over every function of the module. */
static void each(IrModule *m, void (*pass)(Arena *, IrFunc *)) {
  pass(m->arena, m->score);
  if (m->mask) pass(m->arena, m->mask);
  if (m->joint) pass(m->arena, m->joint);
  verify_all(m);
}

/* fold, cse, dce; false when `after` names one of them (stop here). */
static bool simplify(IrModule *m, const char *after) {
  static void (*const passes[])(Arena *, IrFunc *) = {ir_fold, ir_cse, ir_dce};
  for (int i = 0; i < 3; i++) {
    each(m, passes[i]);
    if (after && !strcmp(after, pass_names[i + 1])) return false;
  }
  return true;
}

bool ir_compile(IrModule *m, bool grad, const char *after) {
  bool known = after == NULL;
  for (int i = 0; i < NPASSES; i++) known |= after && !strcmp(after, pass_names[i]);
  if (!known) return false;
  verify_all(m);
  if (after && !strcmp(after, "lower")) return true;
  if (!simplify(m, after) || !grad) return true;
  ir_autodiff(m);
  verify_all(m);
  if (after && !strcmp(after, "autodiff")) return true;
  simplify(m, NULL);
  return true;
}
