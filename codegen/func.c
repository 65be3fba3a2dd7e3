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
#include "kernels/params.cuh"

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

void cg_float_literal(Buf *out, double v) {
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
    } else cg_float_literal(out, in->imm.f);
    return;
  case IR_ARG: buf_puts(out, in->aux == ARG_B ? "(b + p.b0)" : ir_arg_name((IrArg)in->aux)); return;
  case IR_PARAM: put_name(out, m->params[in->aux].id); return;
  case IR_SIZE: put_name(out, m->sizes[in->aux].id); return;
  default: buf_printf(out, "t%d", i); return;
  }
}

/* The extent of dimension d of a buffer: a literal or a size name. */
static void put_extent(Buf *out, const IrModule *m, const IrBuffer *bf, int d) {
  if (bf->dims[d].fixed >= 0) buf_printf(out, "%d", bf->dims[d].fixed);
  else put_name(out, m->sizes[bf->dims[d].size].id);
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
    put_extent(out, m, bf, d);
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

/* A checked run (p.bounds set) tests the indices of buffer access i
 * (operands first.. of a LOAD or an ACCUM) against the extents; a failure is
 * recorded with its site ((kind << 16) | i, plus `flag`) and the access is
 * skipped. Emits `ok<i>`. */
static void put_index_check(Buf *out, const IrModule *m, const IrFunc *f, int i, int first) {
  const IrInst *in = &f->inst[i];
  const IrBuffer *bf = &m->buffers[in->aux];
  buf_printf(out, "  const bool ok%d = ", i);
  for (int d = 0; d < bf->ndims; d++) {
    buf_puts(out, d ? " && (unsigned)" : "(unsigned)");
    put_operand(out, m, f, in->args[first + d]);
    buf_puts(out, " < (unsigned)");
    put_extent(out, m, bf, d);
  }
  buf_puts(out, ";\n");
}

/* The failure record call for access i when `cond` (a C expression) holds. */
static void put_bounds_fail(Buf *out, const IrModule *m, const IrFunc *f, int i, int first,
                            const char *cond, int flag) {
  const IrInst *in = &f->inst[i];
  int n = m->buffers[in->aux].ndims;
  buf_printf(out, "  if (%s) flex_bounds_fail(p, %d, %d", cond, (((int)f->kind << 16) | i) | flag, n);
  for (int d = 0; d < 8; d++) {
    buf_puts(out, ", ");
    if (d < n) put_operand(out, m, f, in->args[first + d]);
    else buf_puts(out, "0");
  }
  buf_puts(out, ");\n");
}

/* A checked load: 0 instead of a read outside the buffer; an i64 value is
 * also tested against the int range. */
static void put_checked_load(Buf *out, const IrModule *m, const IrFunc *f, int i) {
  const IrInst *in = &f->inst[i];
  const IrBuffer *bf = &m->buffers[in->aux];
  char cond[64];
  put_index_check(out, m, f, i, 0);
  snprintf(cond, sizeof cond, "!ok%d", i);
  put_bounds_fail(out, m, f, i, 0, cond, 0);
  if (bf->dtype == DT_I64) {
    buf_printf(out, "  const int64_t w%d = ok%d ? flex_gload(", i, i);
    put_name(out, bf->id);
    buf_puts(out, " + ");
    put_offset(out, m, f, in, 0);
    buf_puts(out, ") : 0;\n");
    snprintf(cond, sizeof cond, "w%d != (int64_t)(int)w%d", i, i);
    put_bounds_fail(out, m, f, i, 0, cond, FLEX_BOUNDS_I64);
    buf_printf(out, "  const int t%d = (int)w%d;\n", i, i);
    return;
  }
  buf_printf(out, "  const %s t%d = ok%d ? ", ctype((IrType)in->type), i, i);
  put_load(out, m, f, in);
  buf_printf(out, " : %s;\n", in->type == IT_F32 ? "0.0f" : in->type == IT_BOOL ? "false" : "0");
}

/* +1 where value v is kv - q of the function's own arguments, -1 for
 * q - kv, else 0. */
static int kv_minus_q(const IrFunc *f, int v) {
  const IrInst *d = &f->inst[v];
  if (d->op != IR_SUB_I) return 0;
  const IrInst *a = &f->inst[d->args[0]], *b = &f->inst[d->args[1]];
  if (a->op != IR_ARG || b->op != IR_ARG) return 0;
  if (a->aux == ARG_KV && b->aux == ARG_Q) return 1;
  if (a->aux == ARG_Q && b->aux == ARG_KV) return -1;
  return 0;
}

/* Whether value v is read only by conversions to float (and not returned). */
static bool only_converted(const IrFunc *f, int v) {
  if (f->ret == v) return false;
  for (int j = v + 1; j < f->n; j++)
    for (int a = 0; a < f->inst[j].nargs; a++)
      if (f->inst[j].args[a] == v && f->inst[j].op != IR_I2F) return false;
  return true;
}

/* dep[i]: value i depends on an argument in `args` (a bit per IrArg), or
 * with `memory` on a buffer access (a load or an ACCUM). */
static bool *depends_on(const IrFunc *f, unsigned args, bool memory) {
  bool *dep = base_alloc((size_t)f->n + 1);
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    dep[i] = (in->op == IR_ARG && (args >> in->aux & 1)) ||
             (memory && (in->op == IR_LOAD || in->op == IR_ACCUM));
    for (int a = 0; a < in->nargs && !dep[i]; a++) dep[i] = dep[in->args[a]];
  }
  return dep;
}

/* varies[i]: value i may differ between the elements of one tile: it reads
 * s, q, kv or dt, a buffer (a load stays with its element: the kernels
 * store to global memory inside their tile loops), or under grouped-query
 * packing the head (the wrappers remap it per query row). A division by a
 * value that does not vary is flex_fdiv_uniform: a reciprocal the device
 * compiler computes once, outside the tile loop, and two multiplies per
 * element (kernels/common.cuh), where IEEE division is about seven
 * instructions and a branch to its slow path. */
static bool *per_element(const IrFunc *f, bool pack_gqa) {
  const unsigned args = 1u << ARG_S | 1u << ARG_Q | 1u << ARG_KV | 1u << ARG_DT;
  return depends_on(f, pack_gqa ? args | 1u << ARG_H : args, true);
}

/* One instruction as a statement (nothing for leaves). `exact`: a
 * deterministic backward's ACCUM, into the exact accumulator. `dqk`: a
 * float(kv - q) is the kernel's flex_dqk (CgOptions.dqk), and the kv - q
 * only it reads is not emitted. */
static void put_inst(Buf *out, const IrModule *m, const IrFunc *f, int i, bool checked, bool exact,
                     bool dqk, const bool *varies, const int *acc) {
  const IrInst *in = &f->inst[i];
  int sign = dqk && in->op == IR_I2F ? kv_minus_q(f, in->args[0]) : 0;
  if (sign) { /* float(kv - q): the kernel's conversion of it (CgOptions.dqk) */
    buf_printf(out, "  const float t%d = %sflex_dqk;\n", i, sign < 0 ? "-" : "");
    return;
  }
  if (dqk && kv_minus_q(f, i) && only_converted(f, i)) return; /* read as flex_dqk alone */
  switch (in->op) {
  case IR_CONST: case IR_ARG: case IR_PARAM: case IR_SIZE: return;
  case IR_ACCUM:
    if (checked) {
      char cond[32];
      put_index_check(out, m, f, i, 1);
      snprintf(cond, sizeof cond, "!ok%d", i);
      put_bounds_fail(out, m, f, i, 1, cond, 0);
      buf_printf(out, "  if (ok%d && flex_accum)", i);
    } else if (acc && acc[i] >= 0) { /* the tile's sum, added by flex_acc_flush */
      buf_printf(out, "  if (flex_accum && flex_acc) flex_acc->g%d += ", acc[i]);
      put_operand(out, m, f, in->args[0]);
      buf_puts(out, ";\n  else if (flex_accum)");
    } else {
      buf_puts(out, "  if (flex_accum)");
    }
    buf_puts(out, exact ? "  flex_exact_add(grad_" : "  flex_atomic_add(grad_");
    buf_puts(out, m->buffers[in->aux].id);
    buf_puts(out, exact ? ", " : " + ");
    put_offset(out, m, f, in, 1);
    buf_puts(out, ", ");
    put_operand(out, m, f, in->args[0]);
    buf_puts(out, ");\n");
    return;
  case IR_LOAD:
    if (checked) {
      put_checked_load(out, m, f, i);
      return;
    }
    break;
  default: break;
  }
  buf_printf(out, "  const %s t%d = ", ctype((IrType)in->type), i);
  if (in->op == IR_LOAD) {
    put_load(out, m, f, in);
  } else if (in->op == IR_DIV_F && varies && !varies[in->args[1]]) {
    buf_puts(out, "flex_fdiv_uniform(");
    put_operand(out, m, f, in->args[0]);
    buf_puts(out, ", ");
    put_operand(out, m, f, in->args[1]);
    buf_puts(out, ")");
  } else {
    for (const char *c = ir_ops[in->op].cuda; *c; c++) {
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
static void put_preamble(Buf *out, const IrModule *m, const IrFunc *f, bool checked, bool exact) {
  /* cg_options_init refused modules over the FlexParams limits */
  bool param[FLEX_MAX_PARAMS] = {0}, size[FLEX_MAX_SIZES] = {0};
  bool load[FLEX_MAX_BUFFERS] = {0}, accum[FLEX_MAX_BUFFERS] = {0};
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    CHECK(in->op != IR_PARAM || in->aux < FLEX_MAX_PARAMS);
    CHECK(in->op != IR_SIZE || in->aux < FLEX_MAX_SIZES);
    CHECK((in->op != IR_LOAD && in->op != IR_ACCUM) || in->aux < FLEX_MAX_BUFFERS);
    if (in->op == IR_PARAM) param[in->aux] = true;
    if (in->op == IR_SIZE) size[in->aux] = true;
    if (in->op != IR_LOAD && in->op != IR_ACCUM) continue;
    (in->op == IR_LOAD ? load : accum)[in->aux] = true;
    const IrBuffer *bf = &m->buffers[in->aux];
    for (int d = checked ? 0 : 1; d < bf->ndims; d++) /* offsets use dims 1..; checks all */
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
    if (accum[i] && exact)
      buf_printf(out, "  int64_t *grad_%s = p.grad_exact[%d];\n", m->buffers[i].id, i);
    else if (accum[i])
      buf_printf(out, "  float *grad_%s = p.buf_grad[%d];\n", m->buffers[i].id, i);
  }
}

/* A shard's functions see the whole sequence's positions (docs/language.md
 * "Position offsets"); a sink has no kv. */
static void put_offsets(Buf *out, bool q_only) {
  buf_puts(out, q_only ? "  q += p.q_off;\n" : "  q += p.q_off, kv += p.kv_off;\n");
}

/* One function. `f` may be NULL: then the trivial body (true / s / dt).
 * `pre` starts its name: "flex_", or "flex_user_" under grouped-query
 * packing (the kernels then call the wrappers of put_pack_wrappers).
 * `exact`: a deterministic backward's joint, which adds buffer gradients
 * into exact accumulators. */
static void put_func(Buf *out, const IrModule *m, const IrFunc *f, IrFuncKind kind, bool checked,
                     const char *pre, bool exact, bool offsets, bool dqk, bool pack, const int *acc) {
  static const char *const what[] = {[IRF_SCORE] = "score", [IRF_MASK] = "mask",
                                     [IRF_JOINT] = "joint (ds from dt)", [IRF_SINK] = "sink",
                                     [IRF_SINK_GRAD] = "sink gradient (into grad buffers)"};
  if (f) buf_printf(out, "/* %s %s of kernel %s */\n", what[kind], f->name ? f->name : "", m->kernel);
  else buf_printf(out, "/* %s: none in kernel %s */\n", what[kind], m->kernel);
  switch (kind) {
  case IRF_SCORE:
    buf_printf(out, "__device__ __forceinline__ float %sscore(const FlexParams &p, float s, int b, "
                    "int h, int q, int kv, float flex_dqk) {\n", pre);
    break;
  case IRF_MASK:
    buf_printf(out, "__device__ __forceinline__ bool %smask(const FlexParams &p, int b, int h, "
                    "int q, int kv) {\n", pre);
    break;
  case IRF_JOINT:
    /* flex_accum false: ds only, the buffer gradients left to another
     * caller of the same element (the sm_90a backward's second consumer). */
    buf_puts(out, "__device__ __forceinline__ float flex_joint(const FlexParams &p, float s, int b, "
                  "int h, int q, int kv, float flex_dqk, float dt, bool flex_accum = true,\n"
                  "                                            FlexAcc *flex_acc = nullptr) {\n");
    break;
  case IRF_SINK:
    buf_printf(out, "__device__ __forceinline__ float %ssink(const FlexParams &p, int b, int h, "
                    "int q) {\n", pre);
    break;
  case IRF_SINK_GRAD:
    /* dt: the sink logit's gradient, -Ps * D; returns nothing of use */
    buf_printf(out, "__device__ __forceinline__ float %ssink_grad(const FlexParams &p, int b, int h, "
                    "int q, float dt, bool flex_accum = true) {\n", pre);
    break;
  }
  if (!f) {
    buf_printf(out, "  return %s;\n}\n\n",
               kind == IRF_MASK ? "true" : kind == IRF_SCORE ? "s" : kind == IRF_SINK ? "-INFINITY" :
               kind == IRF_SINK_GRAD ? "0.0f" : "dt");
    return;
  }
  if (offsets) put_offsets(out, kind == IRF_SINK || kind == IRF_SINK_GRAD);
  put_preamble(out, m, f, checked, exact);
  bool *varies = per_element(f, pack);
  for (int i = 0; i < f->n; i++) put_inst(out, m, f, i, checked, exact, dqk, varies, acc);
  base_free(varies);
  buf_puts(out, "  return ");
  put_operand(out, m, f, f->ret);
  buf_puts(out, ";\n}\n\n");
}

/* ---- the block classifier ---------------------------------------------------- */

/* How the classifier holds a value: int range, three-valued bool, or
 * nothing (floats are unknown on the device; see kernels/interval.cuh). */
static char iv_kind(const IrInst *in) {
  return in->type == IT_I32 ? 'I' : in->type == IT_BOOL ? 'B' : 'F';
}

/* Operand k of `in` as an abstract value; a float operand is unknown. */
static void put_iv(Buf *out, const IrFunc *f, const IrInst *in, int k) {
  const IrInst *a = &f->inst[in->args[k]];
  if (iv_kind(a) == 'F') buf_puts(out, a->type == IT_BOOL ? "flex_ivb_top()" : "flex_iv_top()");
  else buf_printf(out, "t%d", in->args[k]);
}

/* Element x (an int64 expression) of a buffer, in the language's type. */
static void put_elem(Buf *out, const IrModule *m, int slot, const char *x) {
  const IrBuffer *bf = &m->buffers[slot];
  static const char *const pre[] = {[DT_I32] = "(int)flex_gload(", [DT_I64] = "(int)flex_gload(",
                                    [DT_U8] = "(int)flex_gload(", [DT_BOOL] = "(flex_gload("};
  buf_puts(out, pre[bf->dtype]);
  put_name(out, bf->id);
  buf_printf(out, " + %s)%s", x, bf->dtype == DT_BOOL ? " != 0)" : "");
}

/* The extent of dimension d of a buffer. */
static void put_dim(Buf *out, const IrBuffer *bf, int d) {
  if (bf->dims[d].fixed >= 0) buf_printf(out, "%d", bf->dims[d].fixed);
  else buf_printf(out, "p.sizes[%d]", bf->dims[d].size);
}

/* A load: exact when every index is one value in range; a sorted 1-D int
 * buffer is bounded by its end points; otherwise its dtype's range. */
static void put_iv_load(Buf *out, const IrModule *m, const IrInst *in, int i) {
  const IrBuffer *bf = &m->buffers[in->aux];
  bool u8 = bf->dtype == DT_U8;
  if (iv_kind(in) == 'B') buf_printf(out, "  FlexIvB t%d = flex_ivb_top();\n  if (", i);
  else buf_printf(out, "  FlexIvI t%d = %s;\n  if (", i, u8 ? "flex_iv_int(0, 255)" : "flex_iv_top()");
  for (int d = 0; d < in->nargs; d++) {
    buf_printf(out, "%st%d.lo >= 0 && t%d.hi < ", d ? " && " : "", in->args[d], in->args[d]);
    put_dim(out, bf, d);
  }
  buf_puts(out, ") {\n    if (");
  for (int d = 0; d < in->nargs; d++)
    buf_printf(out, "%st%d.lo == t%d.hi", d ? " && " : "", in->args[d], in->args[d]);
  buf_puts(out, ") {\n      const int64_t flex_o = ");
  for (int d = 1; d < in->nargs; d++) buf_puts(out, "(");
  buf_printf(out, "t%d.lo", in->args[0]);
  for (int d = 1; d < in->nargs; d++) {
    buf_puts(out, " * ");
    put_dim(out, bf, d);
    buf_printf(out, " + t%d.lo)", in->args[d]);
  }
  buf_puts(out, ";\n      const auto flex_v = ");
  put_elem(out, m, in->aux, "flex_o");
  buf_printf(out, ";\n      t%d = %s;\n    }", i, iv_kind(in) == 'B' ? "flex_ivb_point(flex_v)" : "flex_iv_int(flex_v, flex_v)");
  if (bf->sorted && in->nargs == 1 && iv_kind(in) == 'I') {
    char lo[48], hi[48];
    snprintf(lo, sizeof lo, "(int64_t)t%d.lo", in->args[0]);
    snprintf(hi, sizeof hi, "(int64_t)t%d.hi", in->args[0]);
    buf_puts(out, " else {\n      const int64_t flex_lo = ");
    put_elem(out, m, in->aux, lo);
    buf_puts(out, ", flex_hi = ");
    put_elem(out, m, in->aux, hi);
    buf_printf(out, ";\n      if (flex_lo <= flex_hi) t%d = flex_iv_int(flex_lo, flex_hi); /* else a broken promise */\n    }", i);
  }
  buf_puts(out, "\n  }\n");
}

/* One live instruction of the mask as an abstract value (nothing for floats). */
static void put_iv_inst(Buf *out, const IrModule *m, const IrFunc *f, int i) {
  static const char *const argn[] = {[ARG_B] = "flex_b", [ARG_H] = "flex_h", [ARG_Q] = "flex_q",
                                     [ARG_KV] = "flex_kv"};
  const IrInst *in = &f->inst[i];
  char k = iv_kind(in);
  if (k == 'F') return;
  const char *ty = k == 'I' ? "FlexIvI" : "FlexIvB";
  if (in->op == IR_LOAD) {
    put_iv_load(out, m, in, i);
    return;
  }
  buf_printf(out, "  const %s t%d = ", ty, i);
  const char *fn = ir_ops[in->op].iv; /* NULL: the top */
  switch (in->op) {
  case IR_CONST:
    if (k == 'B') buf_printf(out, "flex_ivb_point(%s)", in->imm.b ? "true" : "false");
    else buf_printf(out, "flex_iv_int(%dLL, %dLL)", in->imm.i, in->imm.i);
    break;
  case IR_ARG:
    if (in->aux >= ARG_B && in->aux <= ARG_KV)
      buf_printf(out, in->aux == ARG_B ? "flex_iv_int(%s0 + p.b0, %s1 + p.b0)" : "flex_iv_int(%s0, %s1)",
                 argn[in->aux], argn[in->aux]);
    else buf_puts(out, k == 'I' ? "flex_iv_top()" : "flex_ivb_top()");
    break;
  case IR_PARAM: case IR_SIZE:
    buf_puts(out, "flex_iv_int(");
    put_operand(out, m, f, i);
    buf_puts(out, ", ");
    put_operand(out, m, f, i);
    buf_puts(out, ")");
    break;
  case IR_SELECT:
    buf_printf(out, "%s(", k == 'I' ? "flex_iv_select" : "flex_ivb_select");
    for (int a = 0; a < 3; a++) {
      if (a) buf_puts(out, ", ");
      put_iv(out, f, in, a);
    }
    buf_puts(out, ")");
    break;
  default:
    if (!fn) {
      buf_puts(out, k == 'I' ? "flex_iv_top()" : "flex_ivb_top()");
      break;
    }
    buf_printf(out, "%s(", fn);
    for (int a = 0; a < in->nargs; a++) {
      if (a) buf_puts(out, ", ");
      put_iv(out, f, in, a);
    }
    buf_puts(out, ")");
    break;
  }
  buf_puts(out, ";\n");
}

/* flex_mask_block(): the mask over a block of (b, h, q, kv) (inclusive
 * bounds) with the interval rules of kernels/interval.cuh; returns
 * FLEX_BLOCK_EMPTY, _FULL or _PARTIAL, soundly (PARTIAL when unsure). */
static void put_classifier(Buf *out, const IrModule *m, const char *pre, bool offsets) {
  const IrFunc *f = m->mask;
  buf_printf(out, "/* block classifier of the mask of kernel %s (interval analysis) */\n"
                  "__device__ __forceinline__ int %smask_block(const FlexParams &p, int flex_b0, "
                  "int flex_b1, int flex_h0, int flex_h1, int flex_q0, int flex_q1, int flex_kv0, "
                  "int flex_kv1) {\n", m->kernel, pre);
  if (!f) {
    buf_puts(out, "  return FLEX_BLOCK_FULL;\n}\n\n");
    return;
  }
  bool *live = base_alloc((size_t)f->n + 1);
  live[f->ret] = true;
  for (int i = f->ret; i >= 0; i--)
    for (int k = 0; live[i] && k < f->inst[i].nargs; k++) live[f->inst[i].args[k]] = true;
  if (offsets) /* a shard: the whole sequence's positions */
    buf_puts(out, "  flex_q0 += p.q_off, flex_q1 += p.q_off, flex_kv0 += p.kv_off, flex_kv1 += p.kv_off;\n");
  put_preamble(out, m, f, false, false);
  for (int i = 0; i <= f->ret; i++)
    if (live[i]) put_iv_inst(out, m, f, i);
  if (iv_kind(&f->inst[f->ret]) == 'B') buf_printf(out, "  return flex_iv_class(t%d);\n}\n\n", f->ret);
  else buf_puts(out, "  return FLEX_BLOCK_PARTIAL;\n}\n\n");
  base_free(live);
}

/* Grouped-query packing (forward only): the kernels' head h is a kv head
 * and their row q runs over the G query heads of its group, Q_LEN rows
 * each (row q is query head h G + q / Q_LEN, query q % Q_LEN). These
 * wrappers hand the user's functions the real head and query; the
 * classifier gets the heads its rows span, and their whole query range
 * unless the rows lie in one head. */
static void put_pack_wrappers(Buf *out, bool has_mask, bool has_sink) {
  buf_puts(out,
           "/* grouped-query packing: kernel row q of kv head h is query q % Q_LEN of head\n"
           " * h * G + q / Q_LEN (p.pack_g = G, p.pack_q_len = Q_LEN) */\n"
           "__device__ __forceinline__ float flex_score(const FlexParams &p, float s, int b, int h, "
           "int q, int kv, float flex_dqk) {\n"
           "  return flex_user_score(p, s, b, h * p.pack_g + q / p.pack_q_len, q % p.pack_q_len, kv, "
           "flex_dqk);\n"
           "}\n\n"
           "__device__ __forceinline__ bool flex_mask(const FlexParams &p, int b, int h, int q, int kv) {\n"
           "  return flex_user_mask(p, b, h * p.pack_g + q / p.pack_q_len, q % p.pack_q_len, kv);\n"
           "}\n\n");
  if (has_sink)
    buf_puts(out,
             "__device__ __forceinline__ float flex_sink(const FlexParams &p, int b, int h, int q) {\n"
             "  return flex_user_sink(p, b, h * p.pack_g + q / p.pack_q_len, q % p.pack_q_len);\n"
             "}\n\n");
  if (!has_mask) return;
  buf_puts(out,
           "__device__ __forceinline__ int flex_mask_block(const FlexParams &p, int b0, int b1, int h0, "
           "int h1, int q0, int q1, int kv0, int kv1) {\n"
           "  const int L = p.pack_q_len, g0 = q0 / L, g1 = q1 / L;\n"
           "  return flex_user_mask_block(p, b0, b1, h0 * p.pack_g + g0, h1 * p.pack_g + g1,\n"
           "                              g0 == g1 ? q0 % L : 0, g0 == g1 ? q1 % L : L - 1, kv0, kv1);\n"
           "}\n\n");
}

/* ---- the score in the exp2 domain ------------------------------------------- */

/* flex_score_l2(p, x, b, h, q, kv, dqk): the score of the unscaled
 * accumulator x in the exp2 domain, score(x * scale) * log2 e, which the
 * forwards take for their softmax (the backwards fuse the multiply by
 * log2 e into P's exponent FMA themselves, which kept their min with 0
 * one FMNMX where a sum took a compare and a select). A score
 * s + G (G free of s: a bias, ALiBi's slopes[h] * float(kv - q)) is one
 * FMA, fmaf(x, scale log2 e, G log2 e), where the call's multiply, add
 * and multiply were three; with G = a * g and a free of q and kv (a
 * head's slope), log2 e goes on a, once per tile. Any other score: the
 * call, times log2 e. Not under grouped-query packing (its wrapper
 * remaps q). */
static void put_score_l2(Buf *out, const IrModule *m, const CgOptions *o, bool dqk) {
  const IrFunc *f = o->score_identity ? NULL : m->score;
  buf_puts(out, "/* the score in the exp2 domain, of the unscaled accumulator x */\n"
                "__device__ __forceinline__ float flex_score_l2(const FlexParams &p, float x, int b, "
                "int h, int q, int kv, float flex_dqk) {\n");
  int g = -1;
  bool *dep_s = NULL, *dep_qkv = NULL;
  if (f && !o->pack_gqa) {
    const IrInst *r = &f->inst[f->ret];
    dep_s = depends_on(f, 1u << ARG_S, false);
    for (int a = 0; r->op == IR_ADD_F && a < 2 && g < 0; a++) {
      const IrInst *x = &f->inst[r->args[a]];
      if (x->op == IR_ARG && x->aux == ARG_S && !dep_s[r->args[!a]]) g = r->args[!a];
    }
  }
  if (g < 0) {
    buf_puts(out, "  return flex_score(p, x * p.scale, b, h, q, kv, flex_dqk) * FLEX_LOG2E;\n}\n\n");
    base_free(dep_s);
    return;
  }
  if (o->offsets) put_offsets(out, false);
  put_preamble(out, m, f, o->check_bounds, false);
  /* s for any other reader (dead after the IR's cleanup, but kept exact) */
  bool s_read = false;
  for (int i = 0; i < f->n; i++)
    for (int a = 0; i != f->ret && a < f->inst[i].nargs; a++) {
      const IrInst *x = &f->inst[f->inst[i].args[a]];
      s_read |= x->op == IR_ARG && x->aux == ARG_S;
    }
  if (s_read) buf_puts(out, "  const float s = x * p.scale;\n");
  dep_qkv = depends_on(f, 1u << ARG_Q | 1u << ARG_KV | 1u << ARG_S, false);
  bool *varies = per_element(f, false);
  const IrInst *gi = &f->inst[g];
  int inv = -1; /* an operand of G = a * g free of q, kv and s */
  for (int a = 0; gi->op == IR_MUL_F && a < 2 && inv < 0; a++)
    if (!dep_qkv[gi->args[a]]) inv = a;
  bool g_alone = true; /* G read by the return alone: its product is not needed */
  for (int i = g + 1; i < f->ret; i++)
    for (int a = 0; a < f->inst[i].nargs; a++) g_alone &= f->inst[i].args[a] != g;
  for (int i = 0; i < f->n; i++)
    if (i != f->ret && !(i == g && inv >= 0 && g_alone))
      put_inst(out, m, f, i, o->check_bounds, false, dqk, varies, NULL);
  buf_puts(out, "  return fmaf(x, p.scale * FLEX_LOG2E, ");
  if (inv >= 0) {
    buf_puts(out, "(");
    put_operand(out, m, f, gi->args[inv]);
    buf_puts(out, " * FLEX_LOG2E) * ");
    put_operand(out, m, f, gi->args[!inv]);
  } else {
    put_operand(out, m, f, g);
    buf_puts(out, " * FLEX_LOG2E");
  }
  buf_puts(out, ");\n}\n\n");
  base_free(dep_s);
  base_free(dep_qkv);
  base_free(varies);
}

/* ---- a bias folded into the accumulators ------------------------------------ */

/* The declarations and instructions the values marked in need[] read,
 * outside any element (flex_bias, flex_acc_flush): need[] grows to their
 * whole cone. */
static void put_cone(Buf *out, const IrModule *m, const IrFunc *f, bool *need) {
  for (int i = f->n - 1; i >= 0; i--)
    for (int k = 0; need[i] && k < f->inst[i].nargs; k++) need[f->inst[i].args[k]] = true;
  put_preamble(out, m, f, false, false);
  for (int i = 0; i < f->n; i++)
    if (need[i]) put_inst(out, m, f, i, false, false, false, NULL, NULL);
}

/* The parts of a score s + G with G = a float(kv - q) + c, a and c free of
 * s, q and kv (ALiBi: a = slopes[h], no c), as the score's sum flattened
 * (through +, - and negation): the values of c's terms and their signs,
 * and a's value (-1: 1) and sign, where there is a linear term (`lin`). */
#define BIAS_TERMS 8
typedef struct Bias {
  int c[BIAS_TERMS], csign[BIAS_TERMS], nc;
  int a, asign;
  bool lin, s;
} Bias;

/* A linear term: `v` is float(+-(kv - q)), or a product of one with a
 * value free of s, q and kv. */
static bool bias_term(const IrFunc *f, const bool *dep, int v, int sign, Bias *bi) {
  const IrInst *in = &f->inst[v];
  if (in->op == IR_I2F && kv_minus_q(f, in->args[0])) {
    bi->a = -1, bi->asign = sign * kv_minus_q(f, in->args[0]);
    return true;
  }
  for (int k = 0; in->op == IR_MUL_F && k < 2; k++) {
    const IrInst *x = &f->inst[in->args[k]];
    if (!dep[in->args[!k]] && x->op == IR_I2F && kv_minus_q(f, x->args[0])) {
      bi->a = in->args[!k], bi->asign = sign * kv_minus_q(f, x->args[0]);
      return true;
    }
  }
  return false;
}

/* Term v (with sign) of the score's sum into bi; false if it is not s, a
 * linear term or a value free of s, q and kv. */
static bool bias_sum(const IrFunc *f, const bool *dep, int v, int sign, Bias *bi) {
  const IrInst *in = &f->inst[v];
  if (in->op == IR_ADD_F || in->op == IR_SUB_F)
    return bias_sum(f, dep, in->args[0], sign, bi) &&
           bias_sum(f, dep, in->args[1], in->op == IR_SUB_F ? -sign : sign, bi);
  if (in->op == IR_NEG_F) return bias_sum(f, dep, in->args[0], -sign, bi);
  if (in->op == IR_ARG && in->aux == ARG_S) {
    if (bi->s || sign < 0) return false; /* s once, added */
    return bi->s = true;
  }
  if (!dep[v]) {
    if (bi->nc == BIAS_TERMS) return false;
    bi->c[bi->nc] = v, bi->csign[bi->nc++] = sign;
    return true;
  }
  if (bi->lin || !bias_term(f, dep, v, sign, bi)) return false;
  return bi->lin = true;
}

/* Whether the score is s + G with G of Bias's form, and the joint (when
 * the backward calls one: buffer gradients) does not read s, which the
 * folded kernels no longer have apart from G. */
static bool bias_form(const IrModule *m, bool backward, Bias *bi) {
  const IrFunc *f = m->score;
  memset(bi, 0, sizeof *bi);
  if (!f || m->score_is_identity) return false;
  if (backward && m->joint) {
    bool *js = depends_on(m->joint, 1u << ARG_S, false);
    const bool reads = js[m->joint->ret];
    bool any = false;
    for (int i = 0; i < m->joint->n; i++) any |= js[i] && m->joint->inst[i].op == IR_ACCUM;
    base_free(js);
    if (reads || any) return false;
  }
  bool *dep = depends_on(f, 1u << ARG_S | 1u << ARG_Q | 1u << ARG_KV, false);
  const bool ok = bias_sum(f, dep, f->ret, 1, bi) && bi->s && (bi->lin || bi->nc > 0);
  base_free(dep);
  return ok;
}

bool cg_score_bias(const IrModule *m, bool backward) {
  Bias bi;
  return bias_form(m, backward, &bi);
}

bool cg_bias_folded(const CgOptions *o) {
  return o->score_bias && o->bias_fold && o->dtype != CG_FP32 && o->dqk && !o->offsets &&
         !o->pack_gqa && !o->check_bounds;
}

/* flex_bias(p, b, h, a, c): G's parts for the tensor-core kernels, which
 * start S's accumulators at G / scale (FLEX_BIAS, kernels/bias.cuh) instead
 * of 0, so that the matrix product leaves the logit over the scale and the
 * softmax is an identity score's: an add and an FMA a diagonal before the
 * product where the score took a multiply, an add and an FMA an element
 * after it. */
static void put_bias(Buf *out, const IrModule *m, const CgOptions *o) {
  Bias bi;
  if (!cg_bias_folded(o) || !bias_form(m, o->backward, &bi)) return;
  const IrFunc *f = m->score;
  bool *need = base_alloc((size_t)f->n + 1);
  if (bi.lin && bi.a >= 0) need[bi.a] = true;
  for (int i = 0; i < bi.nc; i++) need[bi.c[i]] = true;
  buf_puts(out, "/* the score's bias G = a float(kv - q) + c, a and c free of q and kv: the\n"
                " * tensor-core kernels start S's accumulators at G / scale (FLEX_BIAS) */\n"
                "#define FLEX_BIAS 1\n"
                "__device__ __forceinline__ void flex_bias(const FlexParams &p, int b, int h, "
                "float &flex_a, float &flex_c) {\n");
  put_cone(out, m, f, need);
  buf_puts(out, "  flex_a = ");
  if (!bi.lin) buf_puts(out, "0.0f");
  else if (bi.a < 0) buf_puts(out, bi.asign < 0 ? "-1.0f" : "1.0f");
  else {
    if (bi.asign < 0) buf_puts(out, "-");
    put_operand(out, m, f, bi.a);
  }
  buf_puts(out, ";\n  flex_c = ");
  if (!bi.nc) buf_puts(out, "0.0f");
  for (int i = 0; i < bi.nc; i++) {
    buf_puts(out, i == 0 ? (bi.csign[i] < 0 ? "-" : "") : bi.csign[i] < 0 ? " - " : " + ");
    put_operand(out, m, f, bi.c[i]);
  }
  buf_puts(out, ";\n  (void)b, (void)h;\n}\n\n");
  base_free(need);
}

/* ---- a tile's sums of gradients ------------------------------------------- */

/* acc[i]: the slot of the joint's ACCUM i when the element it adds to is
 * the same for a whole tile (its indices free of s, q, kv and dt:
 * slopes[h], temp[h]), else -1; NULL where there is none, or where each
 * element adds its own (a deterministic backward's exact adds, a checked
 * run's per-element index checks, packed rows). */
static int *tile_accums(const IrModule *m, const CgOptions *o, int *n) {
  const IrFunc *f = m->joint;
  *n = 0;
  if (!o->backward || o->ds_is_dt || !f || o->deterministic || o->check_bounds || o->pack_gqa)
    return NULL;
  bool *dep = depends_on(f, 1u << ARG_S | 1u << ARG_Q | 1u << ARG_KV | 1u << ARG_DT, false);
  int *acc = base_alloc(((size_t)f->n + 1) * sizeof *acc);
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    bool tile = in->op == IR_ACCUM;
    for (int a = 1; tile && a < in->nargs; a++) tile = !dep[in->args[a]];
    acc[i] = tile ? (*n)++ : -1;
  }
  base_free(dep);
  if (*n == 0) {
    base_free(acc);
    return NULL;
  }
  return acc;
}

/* FlexAcc, a thread's sums of those gradients over its elements of a tile
 * (the joint adds into it when the kernel passes one), and
 * flex_acc_flush(p, b, h, acc), which adds each over the warp and then
 * once into the gradient (common.cuh's flex_warp_add: every lane of the
 * warp calls it). Where each element adds its own, FlexAcc is empty and
 * the flush nothing. */
static void put_accums(Buf *out, const IrModule *m, const int *acc, int n) {
  const IrFunc *f = m->joint;
  if (!acc) {
    buf_puts(out, "/* no gradient a whole tile adds to one element of */\nstruct FlexAcc {};\n"
                  "__device__ __forceinline__ void flex_acc_flush(const FlexParams &, int, int, "
                  "const FlexAcc &) {}\n\n");
    return;
  }
  buf_puts(out, "/* the joint's gradients a whole tile adds to one element of: summed per\n"
                " * thread, then per warp (flex_acc_flush) */\nstruct FlexAcc {\n");
  for (int i = 0; i < n; i++) buf_printf(out, "  float g%d = 0.0f;\n", i);
  buf_puts(out, "};\n");
  buf_puts(out, "__device__ __forceinline__ void flex_acc_flush(const FlexParams &p, int b, int h, "
                "const FlexAcc &flex_acc) {\n");
  bool *need = base_alloc((size_t)f->n + 1); /* the indices */
  for (int i = 0; i < f->n; i++)
    for (int a = 1; acc[i] >= 0 && a < f->inst[i].nargs; a++) need[f->inst[i].args[a]] = true;
  put_cone(out, m, f, need);
  for (int i = 0; i < f->n; i++) {
    if (acc[i] < 0) continue;
    buf_printf(out, "  flex_warp_add(grad_%s + ", m->buffers[f->inst[i].aux].id);
    put_offset(out, m, f, &f->inst[i], 1);
    buf_printf(out, ", flex_acc.g%d);\n", acc[i]);
  }
  base_free(need);
  buf_puts(out, "  (void)p, (void)b, (void)h, (void)flex_acc;\n}\n\n");
}

void cg_emit_funcs(Buf *out, const IrModule *m, const CgOptions *o) {
  const char *pre = o->pack_gqa ? "flex_user_" : "flex_";
  /* the kernels' q and kv are the user's: float(kv - q) from the kernel */
  const bool dqk = o->dqk && !o->offsets && !o->pack_gqa;
  const bool pk = o->pack_gqa;
  int nacc;
  int *acc = tile_accums(m, o, &nacc);
  put_func(out, m, o->score_identity ? NULL : m->score, IRF_SCORE, o->check_bounds, pre, false,
           o->offsets, dqk, pk, NULL);
  put_func(out, m, m->mask, IRF_MASK, o->check_bounds, pre, false, o->offsets, false, pk, NULL);
  put_accums(out, m, acc, nacc);
  put_func(out, m, o->backward && !o->ds_is_dt ? m->joint : NULL, IRF_JOINT, o->check_bounds,
           "flex_", o->deterministic, o->offsets, dqk, pk, acc);
  base_free(acc);
  if (m->sink) {
    put_func(out, m, m->sink, IRF_SINK, o->check_bounds, pre, false, o->offsets, false, pk, NULL);
    if (o->backward)
      put_func(out, m, m->sink_grad, IRF_SINK_GRAD, o->check_bounds, "flex_", o->deterministic,
               o->offsets, false, pk, NULL);
  }
  if (o->has_mask) put_classifier(out, m, pre, o->offsets);
  if (o->pack_gqa) put_pack_wrappers(out, o->has_mask, m->sink != NULL);
  put_score_l2(out, m, o, dqk);
  put_bias(out, m, o);
}
