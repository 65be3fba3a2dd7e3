/* dce.c: dead code elimination. Live: the result, every OPF_EFFECT op
 * (gradient accumulations), and everything they use. One backward sweep
 * marks (operands always precede users), one forward sweep compacts. */
#include "ir.h"

void ir_dce(Arena *a, IrFunc *f) {
  if (f->n == 0) return;
  bool *live = arena_alloc(a, sizeof(bool) * (size_t)f->n);
  int *map = arena_alloc(a, sizeof(int) * (size_t)f->n);
  if (f->ret >= 0) live[f->ret] = true;
  for (int i = f->n - 1; i >= 0; i--) {
    const IrInst *in = &f->inst[i];
    if (ir_ops[in->op].flags & OPF_EFFECT) live[i] = true;
    if (!live[i]) continue;
    for (int j = 0; j < in->nargs; j++) live[in->args[j]] = true;
  }
  int w = 0;
  for (int i = 0; i < f->n; i++) {
    if (!live[i]) continue;
    IrInst in = f->inst[i];
    for (int j = 0; j < in.nargs; j++) in.args[j] = map[in.args[j]];
    f->inst[w] = in;
    map[i] = w++;
  }
  f->n = w;
  if (f->ret >= 0) f->ret = map[f->ret];
}

IrFunc *ir_drop_accums(Arena *a, const IrFunc *f, const bool *keep) {
  IrFunc *g = ir_func_new(a, f->name, f->kind);
  for (int i = 0; i < f->n; i++) ir_push(a, g, f->inst[i]);
  for (int i = 0; i < g->n; i++) {
    IrInst *in = &g->inst[i];
    /* A dropped ACCUM becomes a dead constant (same index, no operands),
     * so no operand moves; dce then removes it and its inputs. */
    if (in->op == IR_ACCUM && !keep[in->aux]) *in = (IrInst){.op = IR_CONST, .type = IT_BOOL, .loc = in->loc};
  }
  g->ret = f->ret;
  ir_dce(a, g);
  return g;
}
