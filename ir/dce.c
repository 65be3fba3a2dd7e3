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
