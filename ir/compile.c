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

/* The passes, as `--after` spells them, in pipeline order: the one table
 * the names, the pipeline and ir_pass_names() come from. */
#define PASSES(P) P(LOWER, lower) P(FOLD, fold) P(CSE, cse) P(DCE, dce) P(AUTODIFF, autodiff)
#define PASS_ENUM(E, n) PASS_##E,
#define PASS_NAME(E, n) #n,
#define PASS_LISTED(E, n) ", " #n
enum { PASSES(PASS_ENUM) NPASSES };
static const char *const pass_names[NPASSES] = {PASSES(PASS_NAME)};
static const char pass_list[] = PASSES(PASS_LISTED);

/* The pipeline; with `grad` the second half runs too. */
static const int pipeline[] = {PASS_LOWER, PASS_FOLD, PASS_CSE, PASS_DCE,
                               PASS_AUTODIFF, PASS_FOLD, PASS_CSE, PASS_DCE};
enum { NFORWARD = 4, NPIPELINE = sizeof pipeline / sizeof pipeline[0] };

const char *ir_pass_names(void) { return pass_list + 2; /* past the first ", " */ }

static void verify_all(const IrModule *m) {
#ifdef FLEXC_VERIFY_IR
  ir_verify(m, m->score);
  if (m->mask) ir_verify(m, m->mask);
  if (m->joint) ir_verify(m, m->joint);
  if (m->sink) ir_verify(m, m->sink);
  if (m->sink_grad) ir_verify(m, m->sink_grad);
#else
  (void)m;
#endif
}

/* Run one function pass over every function of the module. */
static void each(IrModule *m, void (*pass)(Arena *, IrFunc *)) {
  pass(m->arena, m->score);
  if (m->mask) pass(m->arena, m->mask);
  if (m->joint) pass(m->arena, m->joint);
  if (m->sink) pass(m->arena, m->sink);
  if (m->sink_grad) pass(m->arena, m->sink_grad);
}

static void run(IrModule *m, int pass) {
  switch (pass) {
  case PASS_LOWER: break; /* done by ir_lower */
  case PASS_FOLD: each(m, ir_fold); break;
  case PASS_CSE: each(m, ir_cse); break;
  case PASS_DCE: each(m, ir_dce); break;
  case PASS_AUTODIFF: ir_autodiff(m); break;
  }
  verify_all(m);
}

bool ir_compile(IrModule *m, bool grad, const char *after) {
  int stop = -1;
  for (int p = 0; p < NPASSES && after; p++)
    if (!strcmp(after, pass_names[p])) stop = p;
  if (after && stop < 0) return false;
  for (int i = 0; i < (grad ? NPIPELINE : NFORWARD); i++) {
    run(m, pipeline[i]);
    if (pipeline[i] == stop) return true; /* after its first run */
  }
  return true;
}
