/* ops.c: the op info table, generated from ops.def, and small name tables. */
#include "ir.h"

/* The RTYPE/ATYPE columns are bare letters in ops.def; spell them as chars. */
#define OPT_B 'B'
#define OPT_I 'I'
#define OPT_F 'F'
#define OPT_V 'V'
#define OPT_T 'T'

const IrOpInfo ir_ops[IR_NOPS] = {
#define X(op, name, n, r, a, fl, ev, cu) [IR_##op] = {name, n, OPT_##r, OPT_##a, fl, cu},
#include "ops.def"
#undef X
};

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
