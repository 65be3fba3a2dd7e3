/* print.c: the text form of the IR (`flexc ir`).
 *
 *   score alibi_softcap(s, b, h, q, kv) -> f32
 *     %0 = arg s            : f32
 *     %1 = arg h            : i32
 *     %2 = load slopes[%1]  : f32
 *     ...
 *     ret %7
 *
 * Values are renumbered densely (an accumulation has no value, so no number);
 * float constants print with %.9g, which round-trips binary32.
 */
#include <stdio.h>
#include <string.h>

#include "ir.h"

/* Column where the `: type` of an instruction line starts. */
#define TYPE_COL 22

static void put_const(Buf *out, const IrInst *in) {
  switch ((IrType)in->type) {
  case IT_BOOL: buf_puts(out, in->imm.b ? "true" : "false"); break;
  case IT_I32: buf_printf(out, "%d", (int)in->imm.i); break;
  case IT_F32:
    if (isnan(in->imm.f)) buf_puts(out, "nan");
    else if (isinf(in->imm.f)) buf_puts(out, in->imm.f < 0 ? "-inf" : "inf");
    else buf_printf(out, "%.9g", in->imm.f);
    break;
  case IT_VOID: buf_puts(out, "?"); break;
  }
}

static const char *buffer_name(const IrModule *m, int slot) {
  return m && slot >= 0 && slot < m->nbuffers ? m->buffers[slot].id : "?";
}

/* The operand list "%a, %b" in the renumbered names. */
static void put_args(Buf *out, const IrInst *in, int from, const int *num) {
  for (int j = from; j < in->nargs; j++)
    buf_printf(out, "%s%%%d", j > from ? ", " : "", num[in->args[j]]);
}

/* The right-hand side of one instruction. */
static void put_rhs(Buf *out, const IrModule *m, const IrInst *in, const int *num) {
  buf_printf(out, "%s ", ir_ops[in->op].name);
  switch ((IrOp)in->op) {
  case IR_CONST: put_const(out, in); break;
  case IR_ARG: buf_puts(out, ir_arg_name((IrArg)in->aux)); break;
  case IR_PARAM:
    buf_puts(out, m && in->aux < m->nparams ? m->params[in->aux].id : "?");
    break;
  case IR_SIZE: buf_puts(out, m && in->aux < m->nsizes ? m->sizes[in->aux].id : "?"); break;
  case IR_LOAD:
    buf_printf(out, "%s[", buffer_name(m, in->aux));
    put_args(out, in, 0, num);
    buf_puts(out, "]");
    break;
  case IR_ACCUM:
    buf_printf(out, "d_%s[", buffer_name(m, in->aux));
    put_args(out, in, 1, num);
    buf_printf(out, "] += %%%d", num[in->args[0]]);
    break;
  default: put_args(out, in, 0, num); break;
  }
}

static const char *kind_name(IrFuncKind k) {
  static const char *const n[] = {[IRF_SCORE] = "score", [IRF_MASK] = "mask", [IRF_JOINT] = "joint",
                                  [IRF_SINK] = "sink", [IRF_SINK_GRAD] = "sink_grad"};
  return n[k];
}

void ir_print_func(Buf *out, const IrModule *m, const IrFunc *f) {
  static const char *const sig[] = {[IRF_SCORE] = "(s, b, h, q, kv)", [IRF_MASK] = "(b, h, q, kv)",
                                    [IRF_JOINT] = "(s, b, h, q, kv, dt)", [IRF_SINK] = "(b, h, q)",
                                    [IRF_SINK_GRAD] = "(b, h, q, dt)"};
  IrType rt = f->kind == IRF_MASK ? IT_BOOL : IT_F32;
  buf_printf(out, "%s %s%s -> %s\n", kind_name(f->kind), f->name ? f->name : "?", sig[f->kind],
             ir_type_name(rt));
  int *num = base_alloc(sizeof(int) * (size_t)(f->n ? f->n : 1));
  int next = 0;
  Buf line = {0};
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    line.len = 0;
    if (in->type != IT_VOID) {
      num[i] = next++;
      buf_printf(&line, "%%%d = ", num[i]);
    }
    put_rhs(&line, m, in, num);
    if (in->type != IT_VOID) {
      buf_puts(&line, " ");
      while (line.len < TYPE_COL) buf_puts(&line, " ");
      buf_printf(&line, ": %s", ir_type_name((IrType)in->type));
    }
    buf_printf(out, "  %s\n", line.data);
  }
  if (f->ret >= 0 && f->ret < f->n) buf_printf(out, "  ret %%%d\n", num[f->ret]);
  buf_free(&line);
  base_free(num);
}

/* "f32[H, 64, N]" */
static void put_dims(Buf *out, const IrModule *m, const IrBuffer *b) {
  buf_printf(out, "%s[", dtype_name(b->dtype));
  for (int j = 0; j < b->ndims; j++) {
    if (j) buf_puts(out, ", ");
    if (b->dims[j].fixed >= 0) buf_printf(out, "%d", (int)b->dims[j].fixed);
    else buf_puts(out, m->sizes[b->dims[j].size].id);
  }
  buf_puts(out, "]");
}

static void put_header(Buf *out, const IrModule *m) {
  buf_printf(out, "kernel %s\n", m->kernel ? m->kernel : "?");
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    buf_printf(out, "  param %s: %s", p->id, ir_type_name(p->type));
    if (p->has_default) {
      IrInst c;
      memset(&c, 0, sizeof c);
      c.type = (uint8_t)p->type;
      c.imm = p->def;
      buf_puts(out, " = ");
      put_const(out, &c);
    }
    buf_puts(out, "\n");
  }
  for (int i = 0; i < m->nbuffers; i++) {
    const IrBuffer *b = &m->buffers[i];
    buf_printf(out, "  buffer %s: ", b->id);
    put_dims(out, m, b);
    buf_printf(out, "%s%s%s\n", b->grad ? " grad" : "", b->sorted ? " sorted" : "",
               b->used ? "" : " (unused)");
  }
  for (int i = SZ_COUNT; i < m->nsizes; i++) {
    const IrSize *s = &m->sizes[i];
    buf_printf(out, "  size %s = %s.shape[%d]\n", s->id, buffer_name(m, s->buffer), s->dim);
  }
}

void ir_print(Buf *out, const IrModule *m) {
  put_header(out, m);
  const IrFunc *fns[5] = {m->score, m->mask, m->sink, m->joint, m->sink_grad};
  for (int i = 0; i < 5; i++) {
    if (!fns[i]) continue;
    buf_puts(out, "\n");
    ir_print_func(out, m, fns[i]);
  }
}
