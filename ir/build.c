/* build.c: appending instructions to a function. Result types come from the
 * op table; ops whose RTYPE is T get their type from the caller (leaves) or
 * from their operands (SELECT). */
#include <string.h>

#include "ir.h"

IrFunc *ir_func_new(Arena *a, const char *name, IrFuncKind kind) {
  IrFunc *f = arena_alloc(a, sizeof *f);
  f->name = name;
  f->kind = kind;
  f->ret = -1;
  return f;
}

int ir_push(Arena *a, IrFunc *f, IrInst in) {
  ARENA_PUSH(a, f->inst, f->n, f->cap, in);
  return f->n - 1;
}

static int push_const(Arena *a, IrFunc *f, IrType t, IrVal v) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_CONST;
  in.type = (uint8_t)t;
  in.imm = v;
  return ir_push(a, f, in);
}

int ir_const_b(Arena *a, IrFunc *f, bool v) { return push_const(a, f, IT_BOOL, ir_vb(v)); }
int ir_const_i(Arena *a, IrFunc *f, int32_t v) { return push_const(a, f, IT_I32, ir_vi(v)); }
int ir_const_f(Arena *a, IrFunc *f, double v) {
  return push_const(a, f, IT_F32, ir_vf((double)(float)v));
}

/* An operator instruction with n operands. */
static int push_op(Arena *a, IrFunc *f, IrOp op, int n, const int *args) {
  const IrOpInfo *oi = &ir_ops[op];
  CHECK(oi->nargs == n);
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = (uint16_t)op;
  in.nargs = (uint8_t)n;
  for (int i = 0; i < n; i++) {
    CHECK(args[i] >= 0 && args[i] < f->n);
    in.args[i] = args[i];
  }
  if (oi->rtype == 'T') {
    CHECK(op == IR_SELECT);
    in.type = f->inst[args[1]].type;
  } else {
    in.type = (uint8_t)ir_letter_type(oi->rtype);
  }
  return ir_push(a, f, in);
}

/* Operand arrays are always 3 long, so no read past one is ever possible. */
int ir_op1(Arena *a, IrFunc *f, IrOp op, int x) {
  int args[3] = {x, 0, 0};
  return push_op(a, f, op, 1, args);
}
int ir_op2(Arena *a, IrFunc *f, IrOp op, int x, int y) {
  int args[3] = {x, y, 0};
  return push_op(a, f, op, 2, args);
}
int ir_op3(Arena *a, IrFunc *f, IrOp op, int x, int y, int z) {
  int args[3] = {x, y, z};
  return push_op(a, f, op, 3, args);
}
