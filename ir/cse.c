/* cse.c: common subexpression elimination by hash-consing.
 *
 * Every pure instruction (everything but OPF_EFFECT ops; loads included,
 * since nothing can write a buffer while a function runs) is looked up by
 * its op, type, aux, constant and operands; a repeat is replaced by the first
 * occurrence. Operands of commutative ops are compared as a sorted pair, so
 * `a + b` and `b + a` meet. The array is compacted in place: an instruction
 * only moves down, and its operands were already moved.
 */
#include <string.h>

#include "ir.h"

/* The operands in canonical order (sorted for commutative binary ops). */
static void key_args(const IrInst *in, int32_t *args) {
  for (int i = 0; i < in->nargs; i++) args[i] = in->args[i];
  if ((ir_ops[in->op].flags & OPF_COMM) && in->nargs == 2 && args[0] > args[1]) {
    args[0] = in->args[1];
    args[1] = in->args[0];
  }
}

/* The constant's bits that matter for its type (floats by bit pattern, so
 * 0.0 and -0.0 stay apart and a NaN meets itself). */
static uint64_t imm_bits(const IrInst *in) {
  if (in->op != IR_CONST) return 0;
  if (in->type == IT_BOOL) return in->imm.b;
  if (in->type == IT_I32) return (uint32_t)in->imm.i;
  uint64_t u;
  memcpy(&u, &in->imm.f, sizeof u);
  return u;
}

static uint64_t hash(const IrInst *in) {
  int32_t args[IR_MAXARGS];
  key_args(in, args);
  uint64_t h = 1469598103934665603ull;
  uint64_t parts[4] = {in->op, in->type, (uint32_t)in->aux, imm_bits(in)};
  for (int i = 0; i < 4; i++) h = (h ^ parts[i]) * 1099511628211ull;
  for (int i = 0; i < in->nargs; i++) h = (h ^ (uint32_t)args[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static bool same(const IrInst *x, const IrInst *y) {
  if (x->op != y->op || x->type != y->type || x->aux != y->aux || x->nargs != y->nargs)
    return false;
  if (imm_bits(x) != imm_bits(y)) return false;
  int32_t ax[IR_MAXARGS], ay[IR_MAXARGS];
  key_args(x, ax);
  key_args(y, ay);
  return memcmp(ax, ay, sizeof(int32_t) * x->nargs) == 0;
}

void ir_cse(Arena *a, IrFunc *f) {
  if (f->n == 0) return;
  size_t cap = 16;
  while (cap < (size_t)f->n * 2) cap *= 2;
  int *table = arena_alloc(a, sizeof(int) * cap);
  for (size_t i = 0; i < cap; i++) table[i] = -1;
  int *map = arena_alloc(a, sizeof(int) * (size_t)f->n);
  int w = 0;
  for (int i = 0; i < f->n; i++) {
    IrInst in = f->inst[i];
    for (int j = 0; j < in.nargs; j++) in.args[j] = map[in.args[j]];
    bool pure = !(ir_ops[in.op].flags & OPF_EFFECT);
    size_t slot = pure ? (size_t)hash(&in) & (cap - 1) : 0;
    if (pure) {
      while (table[slot] >= 0 && !same(&f->inst[table[slot]], &in)) slot = (slot + 1) & (cap - 1);
      if (table[slot] >= 0) {
        map[i] = table[slot];
        continue;
      }
      table[slot] = w;
    }
    f->inst[w] = in;
    map[i] = w++;
  }
  f->n = w;
  if (f->ret >= 0) f->ret = map[f->ret];
}
