/* ops.c: the op info table, generated from ops.def, the evaluation of one
 * pure op (the EVAL column), and small name tables. */
#include <string.h>

#include "ir.h"

/* The RTYPE/ATYPE columns are bare letters in ops.def; spell them as chars.
 * The IV column becomes the rule's name (NULL: none). */
#define OPT_B 'B'
#define OPT_I 'I'
#define OPT_F 'F'
#define OPT_V 'V'
#define OPT_T 'T'
#define IV0 NULL
#define IV1(fn) #fn
#define IV2(fn) #fn

const IrOpInfo ir_ops[IR_NOPS] = {
#define X(op, name, n, r, a, fl, ev, cu, iv) [IR_##op] = {name, n, OPT_##r, OPT_##a, fl, cu, iv},
#include "ops.def"
#undef X
};

#undef IV0
#undef IV1
#undef IV2

IrType ir_letter_type(char c) {
  switch (c) {
  case 'B': return IT_BOOL;
  case 'I': return IT_I32;
  case 'F': return IT_F32;
  default: return IT_VOID;
  }
}

/* Leaves, loads and effects have no value here; only their EVAL spelling
 * must compile, so the interpreter's environment and helpers are stood in
 * for. */
#define ir_load(e, i, v) ((void)(e), (void)(i), (void)(v), ir_vi(0))
#define ir_accum(e, i, v) ((void)(e), (void)(i), (void)(v), ir_vi(0))

IrVal ir_op_eval(const IrInst *in, IrVal a, IrVal b, IrVal c) {
  CHECK(!(ir_ops[in->op].flags & OPF_LEAF) && in->op != IR_LOAD && in->op != IR_ACCUM);
  IrEnv env_storage;
  memset(&env_storage, 0, sizeof env_storage);
  IrEnv *env = &env_storage;
  const IrVal *vals = NULL;
  (void)env, (void)vals, (void)a, (void)b, (void)c;
  switch ((IrOp)in->op) {
#define X(op, name, n, r, at, fl, ev, cu, iv) case IR_##op: return (ev);
#include "ops.def"
#undef X
  case IR_NOPS: break;
  }
  PANIC("ir_op_eval: bad op %d", in->op);
}

#undef ir_load
#undef ir_accum

const char *ir_type_name(IrType t) {
  switch (t) {
  case IT_VOID: return "void";
  case IT_BOOL: return "bool";
  case IT_I32: return "i32";
  case IT_F32: return "f32";
  }
  return "?";
}

const char *ir_arg_name(IrArg a) {
  static const char *const names[ARG_COUNT] = {"s", "b", "h", "q", "kv", "dt"};
  return (unsigned)a < ARG_COUNT ? names[a] : "?";
}
