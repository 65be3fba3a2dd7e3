/* func.c: score, mask and joint IR functions -> __device__ functions.
 *
 * One `const` temporary per instruction (t<N>, N the instruction index);
 * arguments, params, sizes and buffers appear under their own names. Params
 * and sizes are read from the FlexParams struct, buffers through
 * flex_gload at a row-major offset computed from their dims. Integer
 * arithmetic wraps (helpers in common.cuh do it in unsigned).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* Names generated code uses itself; a user name equal to one gets a `_`. */
static const char *const reserved[] = {
    "s", "b", "h", "q", "kv", "dt", "p", "auto", "break", "case", "char", "class", "const",
    "continue", "default", "delete", "do", "double", "else", "enum", "extern", "float", "for",
    "goto", "if", "inline", "int", "long", "new", "operator", "private", "protected", "public",
    "register", "return", "short", "signed", "sizeof", "static", "struct", "switch", "template",
    "this", "throw", "try", "typedef", "typename", "union", "unsigned", "using", "virtual", "void",
    "volatile", "while", "bool", "true", "false", "and", "or", "not", "xor", "asm", "friend",
    "namespace", "mutable", "explicit", "export", "catch", "constexpr", "nullptr", "decltype",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "INFINITY", "NAN", "min", "max",
    "abs", "int64_t", "int32_t", "uint32_t", "uint16_t", "NULL", NULL};

/* Write a user identifier, renamed when it could clash with ours. */
static void put_name(Buf *out, const char *id) {
  bool clash = !strncmp(id, "flex_", 5) || !strncmp(id, "grad_", 5) || !strncmp(id, "__", 2) ||
               !strncmp(id, "FLEX", 4);
  if (id[0] == 't' && id[1]) {
    size_t i = 1;
    while (id[i] >= '0' && id[i] <= '9') i++;
    if (!id[i]) clash = true;
  }
  for (int i = 0; reserved[i] && !clash; i++) clash = !strcmp(id, reserved[i]);
  buf_printf(out, clash ? "%s_" : "%s", id);
}

static const char *ctype(IrType t) {
  switch (t) {
  case IT_BOOL: return "bool";
  case IT_I32: return "int";
  case IT_F32: return "float";
  default: return "void";
  }
}

/* A binary32 value as a literal that reads back to the same float. */
static void put_float(Buf *out, double v) {
  float f = (float)v;
  if (isnan(f)) {
    buf_puts(out, "(0.0f / 0.0f)");
    return;
  }
  if (isinf(f)) {
    buf_puts(out, f > 0 ? "INFINITY" : "(-INFINITY)");
    return;
  }
  char s[64];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(s, sizeof s, "%.*g", prec, (double)f);
    if ((float)strtod(s, NULL) == f) break;
  }
  bool neg = s[0] == '-';
  if (neg) buf_puts(out, "(");
  buf_puts(out, s);
  if (!strpbrk(s, ".e")) buf_puts(out, ".0");
  buf_puts(out, neg ? "f)" : "f");
}

/* The spelling of value `i` of `f` as an operand. */
static void put_operand(Buf *out, const IrModule *m, const IrFunc *f, int i) {
  const IrInst *in = &f->inst[i];
  switch (in->op) {
  case IR_CONST:
    if (in->type == IT_BOOL) buf_puts(out, in->imm.b ? "true" : "false");
    else if (in->type == IT_I32) {
      if (in->imm.i == INT32_MIN) buf_puts(out, "(-2147483647 - 1)");
      else buf_printf(out, in->imm.i < 0 ? "(%d)" : "%d", in->imm.i);
    } else put_float(out, in->imm.f);
    return;
  case IR_ARG: buf_puts(out, ir_arg_name((IrArg)in->aux)); return;
  case IR_PARAM: put_name(out, m->params[in->aux].id); return;
  case IR_SIZE: put_name(out, m->sizes[in->aux].id); return;
  default: buf_printf(out, "t%d", i); return;
  }
}

/* Integer ops that must wrap are spelled with helpers, not C operators. */
static const char *wrapping_spelling(IrOp op) {
  switch (op) {
  case IR_ADD_I: return "flex_iadd(%0, %1)";
  case IR_SUB_I: return "flex_isub(%0, %1)";
  case IR_MUL_I: return "flex_imul(%0, %1)";
  case IR_NEG_I: return "flex_ineg(%0)";
  case IR_ABS_I: return "flex_iabs(%0)";
  default: return ir_ops[op].cuda;
  }
}

/* Row-major element offset of a buffer access (indices are args[first..]). */
static void put_offset(Buf *out, const IrModule *m, const IrFunc *f, const IrInst *in, int first) {
  const IrBuffer *bf = &m->buffers[in->aux];
  if (bf->ndims == 1) {
    put_operand(out, m, f, in->args[first]);
    return;
  }
  for (int d = 1; d < bf->ndims; d++) buf_puts(out, "(");
  buf_puts(out, "(int64_t)");
  put_operand(out, m, f, in->args[first]);
  for (int d = 1; d < bf->ndims; d++) {
    buf_puts(out, " * ");
    if (bf->dims[d].fixed >= 0) buf_printf(out, "%d", bf->dims[d].fixed);
    else put_name(out, m->sizes[bf->dims[d].size].id);
    buf_puts(out, " + ");
    put_operand(out, m, f, in->args[first + d]);
    buf_puts(out, ")");
  }
}

static void put_load(Buf *out, const IrModule *m, const IrFunc *f, const IrInst *in) {
  const IrBuffer *bf = &m->buffers[in->aux];
  static const char *const pre[] = {
      [DT_F32] = "flex_gload(", [DT_F16] = "flex_h2f(flex_gload(", [DT_BF16] = "flex_bf2f(flex_gload(",
      [DT_I32] = "flex_gload(", [DT_I64] = "(int)flex_gload(", [DT_U8] = "(int)flex_gload(",
      [DT_BOOL] = "(flex_gload("};
  static const char *const post[] = {[DT_F32] = ")", [DT_F16] = "))", [DT_BF16] = "))",
                                     [DT_I32] = ")", [DT_I64] = ")", [DT_U8] = ")",
                                     [DT_BOOL] = ") != 0)"};
  buf_puts(out, pre[bf->dtype]);
  put_name(out, bf->id);
  buf_puts(out, " + ");
  put_offset(out, m, f, in, 0);
  buf_puts(out, post[bf->dtype]);
}

/* One instruction as a statement (nothing for leaves). */
static void put_inst(Buf *out, const IrModule *m, const IrFunc *f, int i) {
  const IrInst *in = &f->inst[i];
  switch (in->op) {
  case IR_CONST: case IR_ARG: case IR_PARAM: case IR_SIZE: return;
  case IR_ACCUM:
    buf_puts(out, "  flex_atomic_add(grad_");
    buf_puts(out, m->buffers[in->aux].id);
    buf_puts(out, " + ");
    put_offset(out, m, f, in, 1);
    buf_puts(out, ", ");
    put_operand(out, m, f, in->args[0]);
    buf_puts(out, ");\n");
    return;
  default: break;
  }
  buf_printf(out, "  const %s t%d = ", ctype((IrType)in->type), i);
  if (in->op == IR_LOAD) {
    put_load(out, m, f, in);
  } else {
    for (const char *c = wrapping_spelling((IrOp)in->op); *c; c++) {
      if (c[0] == '%' && c[1] >= '0' && c[1] <= '2') {
        put_operand(out, m, f, in->args[c[1] - '0']);
        c++;
      } else {
        buf_put(out, c, 1);
      }
    }
  }
  buf_puts(out, ";\n");
}

/* Declarations of the params, sizes and buffers a function reads. */
static void put_preamble(Buf *out, const IrModule *m, const IrFunc *f) {
  bool param[FLEX_CG_MAXSLOTS] = {0}, size[FLEX_CG_MAXSLOTS] = {0};
  bool load[FLEX_CG_MAXSLOTS] = {0}, accum[FLEX_CG_MAXSLOTS] = {0};
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    CHECK(in->aux < FLEX_CG_MAXSLOTS);
    if (in->op == IR_PARAM) param[in->aux] = true;
    if (in->op == IR_SIZE) size[in->aux] = true;
    if (in->op != IR_LOAD && in->op != IR_ACCUM) continue;
    (in->op == IR_LOAD ? load : accum)[in->aux] = true;
    const IrBuffer *bf = &m->buffers[in->aux];
    for (int d = 1; d < bf->ndims; d++)
      if (bf->dims[d].fixed < 0) size[bf->dims[d].size] = true;
  }
  for (int i = 0; i < m->nparams; i++) {
    if (!param[i]) continue;
    bool fl = m->params[i].type == IT_F32;
    buf_printf(out, "  const %s ", fl ? "float" : "int");
    put_name(out, m->params[i].id);
    buf_printf(out, " = p.%s[%d];\n", fl ? "pf" : "pi", i);
  }
  for (int i = 0; i < m->nsizes; i++) {
    if (!size[i]) continue;
    buf_puts(out, "  const int ");
    put_name(out, m->sizes[i].id);
    buf_printf(out, " = p.sizes[%d];\n", i);
  }
  static const char *const elem[] = {[DT_F32] = "float", [DT_F16] = "uint16_t",
                                     [DT_BF16] = "uint16_t", [DT_I32] = "int32_t",
                                     [DT_I64] = "int64_t", [DT_U8] = "unsigned char",
                                     [DT_BOOL] = "unsigned char"};
  for (int i = 0; i < m->nbuffers; i++) {
    const char *t = elem[m->buffers[i].dtype];
    if (load[i]) {
      buf_printf(out, "  const %s *", t);
      put_name(out, m->buffers[i].id);
      buf_printf(out, " = (const %s *)p.buf[%d];\n", t, i);
    }
    if (accum[i]) buf_printf(out, "  float *grad_%s = p.buf_grad[%d];\n", m->buffers[i].id, i);
  }
}

/* One function. `f` may be NULL: then the trivial body (true / s / dt). */
static void put_func(Buf *out, const IrModule *m, const IrFunc *f, IrFuncKind kind) {
  static const char *const what[] = {[IRF_SCORE] = "score", [IRF_MASK] = "mask",
                                     [IRF_JOINT] = "joint (ds from dt)"};
  if (f) buf_printf(out, "/* %s %s of kernel %s */\n", what[kind], f->name ? f->name : "", m->kernel);
  else buf_printf(out, "/* %s: none in kernel %s */\n", what[kind], m->kernel);
  switch (kind) {
  case IRF_SCORE:
    buf_puts(out, "__device__ __forceinline__ float flex_score(const FlexParams &p, float s, int b, "
                  "int h, int q, int kv) {\n");
    break;
  case IRF_MASK:
    buf_puts(out, "__device__ __forceinline__ bool flex_mask(const FlexParams &p, int b, int h, "
                  "int q, int kv) {\n");
    break;
  case IRF_JOINT:
    buf_puts(out, "__device__ __forceinline__ float flex_joint(const FlexParams &p, float s, int b, "
                  "int h, int q, int kv, float dt) {\n");
    break;
  }
  if (!f) {
    buf_printf(out, "  return %s;\n}\n\n",
               kind == IRF_MASK ? "true" : kind == IRF_SCORE ? "s" : "dt");
    return;
  }
  put_preamble(out, m, f);
  for (int i = 0; i < f->n; i++) put_inst(out, m, f, i);
  buf_puts(out, "  return ");
  put_operand(out, m, f, f->ret);
  buf_puts(out, ";\n}\n\n");
}

void cg_emit_funcs(Buf *out, const IrModule *m, const CgOptions *o) {
  put_func(out, m, o->score_identity ? NULL : m->score, IRF_SCORE);
  put_func(out, m, m->mask, IRF_MASK);
  put_func(out, m, o->backward && !o->ds_is_dt ? m->joint : NULL, IRF_JOINT);
}
