/* verify.c: structural checks of a function, run after every pass in Debug
 * builds. A failure is a compiler bug, so it panics, naming the function,
 * the instruction and what is wrong. */
#include "ir.h"

static IrType value_type(DType d) {
  switch (dtype_value_type(d)) {
  case TY_BOOL: return IT_BOOL;
  case TY_INT: return IT_I32;
  default: return IT_F32;
  }
}

#define FAIL(...)                                                              \
  PANIC("ir_verify: %s %%%d (%s): %s", f->name ? f->name : "?", i,             \
        ir_ops[in->op < IR_NOPS ? in->op : 0].name, arena_printf(&scratch, __VA_ARGS__))

/* Aux of a leaf or a buffer op: in range for the module and the function. */
static void check_aux(const IrModule *m, const IrFunc *f, int i, const IrInst *in) {
  Arena scratch = {0};
  switch ((IrOp)in->op) {
  case IR_ARG:
    if (in->aux < 0 || in->aux >= ARG_COUNT) FAIL("arg %d out of range", in->aux);
    if (in->aux == ARG_S && f->kind == IRF_MASK) FAIL("a mask has no s");
    if (in->aux == ARG_DT && f->kind != IRF_JOINT && f->kind != IRF_SINK_GRAD)
      FAIL("only a gradient function has dt");
    if ((in->aux == ARG_S || in->aux == ARG_KV) && (f->kind == IRF_SINK || f->kind == IRF_SINK_GRAD))
      FAIL("a sink has no s and no kv");
    if (in->type != (in->aux == ARG_S || in->aux == ARG_DT ? IT_F32 : IT_I32))
      FAIL("arg %s has type %s", ir_arg_name((IrArg)in->aux), ir_type_name((IrType)in->type));
    break;
  case IR_PARAM:
    if (m && (in->aux < 0 || in->aux >= m->nparams)) FAIL("param slot %d out of range", in->aux);
    if (m && in->type != m->params[in->aux].type) FAIL("param type mismatch");
    break;
  case IR_SIZE:
    if (m && (in->aux < 0 || in->aux >= m->nsizes)) FAIL("size slot %d out of range", in->aux);
    break;
  case IR_LOAD: case IR_ACCUM: {
    if (!m) break;
    if (in->aux < 0 || in->aux >= m->nbuffers) FAIL("buffer slot %d out of range", in->aux);
    const IrBuffer *b = &m->buffers[in->aux];
    int want = b->ndims + (in->op == IR_ACCUM);
    if (in->nargs != want) FAIL("%d operands for %s with %d dims", in->nargs, b->id, b->ndims);
    if (in->op == IR_LOAD && in->type != value_type(b->dtype)) FAIL("load type mismatch");
    if (in->op == IR_ACCUM && !b->grad) FAIL("accumulation into %s, which has no grad", b->id);
    break;
  }
  case IR_CONST:
    if (in->type == IT_VOID) FAIL("void constant");
    if (in->type == IT_F32 && in->imm.f == in->imm.f && (double)(float)in->imm.f != in->imm.f)
      FAIL("float constant %.17g is not binary32", in->imm.f);
    break;
  default: break;
  }
  arena_free(&scratch);
}

/* Operand count and types against ops.def. */
static void check_operands(const IrFunc *f, int i, const IrInst *in) {
  Arena scratch = {0};
  const IrOpInfo *oi = &ir_ops[in->op];
  if (oi->nargs >= 0 && in->nargs != oi->nargs) FAIL("%d operands, want %d", in->nargs, oi->nargs);
  if (in->nargs > IR_MAXARGS) FAIL("%d operands", in->nargs);
  IrType rt = ir_letter_type(oi->rtype);
  if (oi->rtype != 'T' && in->type != rt) FAIL("result type %s", ir_type_name((IrType)in->type));
  if (oi->rtype == 'T' && in->type == IT_VOID) FAIL("void result");
  for (int j = 0; j < in->nargs; j++) {
    int x = in->args[j];
    if (x < 0 || x >= i) FAIL("operand %d is %%%d, not an earlier value", j, x);
    IrType want = oi->atype == 'T' ? (IrType)in->type : ir_letter_type(oi->atype);
    if (in->op == IR_SELECT && j == 0) want = IT_BOOL;
    if (in->op == IR_ACCUM) want = j == 0 ? IT_F32 : IT_I32;
    if (f->inst[x].type != want)
      FAIL("operand %d is %s, want %s", j, ir_type_name((IrType)f->inst[x].type), ir_type_name(want));
  }
  arena_free(&scratch);
}

void ir_verify(const IrModule *m, const IrFunc *f) {
  Arena scratch = {0};
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    if (in->op >= IR_NOPS) FAIL("bad op %d", in->op);
    check_operands(f, i, in);
    check_aux(m, f, i, in);
  }
  IrType want = f->kind == IRF_MASK ? IT_BOOL : IT_F32;
  if (f->ret < 0 || f->ret >= f->n)
    PANIC("ir_verify: %s: result %%%d out of range", f->name ? f->name : "?", f->ret);
  if (f->inst[f->ret].type != want)
    PANIC("ir_verify: %s: result is %s, want %s", f->name ? f->name : "?",
          ir_type_name((IrType)f->inst[f->ret].type), ir_type_name(want));
  arena_free(&scratch);
}
