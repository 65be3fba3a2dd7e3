/* ir.h: the SSA IR and its passes, in pipeline order.
 *
 *   ops.def    the one op table (enum, names, printer, folding, interpreter,
 *              interval rules, CUDA); ops.c its info table and ir_op_eval()
 *   front.c    ir_front():    parse, check, lower, compile: the one front half
 *   values.c   ir_check_values(): consts and dimensions evaluated, value errors
 *   lower.c    ir_lower():    AST of one kernel -> IrModule (calls inlined)
 *   fold.c     ir_fold():     exact constant folding + algebraic simplification
 *   cse.c      ir_cse():      common subexpressions
 *   dce.c      ir_dce():      dead code
 *   autodiff.c ir_autodiff(): reverse mode -> the joint (backward) function
 *   verify.c   ir_verify():   structural checks, after every pass in debug builds
 *   print.c    ir_print():    text form (`flexc ir`)
 *   interp.c   ir_eval():     the float64 interpreter (the reference's engine)
 *   interval.c ir_interval(): interval analysis for block classification
 *   compile.c  ir_compile():  the pass list
 *
 * A function is a flat array of instructions; operands are indices of
 * earlier instructions (so the array is always in a valid evaluation order).
 * All memory lives in the module's arena.
 */
#ifndef FLEXC_IR_H
#define FLEXC_IR_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../frontend/frontend.h"
#include "../kernels/scalar.cuh"

typedef enum IrType { IT_VOID, IT_BOOL, IT_I32, IT_F32 } IrType;
const char *ir_type_name(IrType t); /* "void", "bool", "i32", "f32" */

typedef enum IrOp {
#define X(op, name, n, r, a, fl, ev, cu, iv) IR_##op,
#include "ops.def"
#undef X
  IR_NOPS
} IrOp;

/* OPF_INEXACT: the device's result is not correctly rounded (transcendentals),
 * so folding would change the value; only const evaluation folds these. */
enum { OPF_COMM = 1, OPF_EFFECT = 2, OPF_LEAF = 4, OPF_ASSOC = 8, OPF_INEXACT = 16 };

/* Static facts about an op, generated from ops.def. */
typedef struct IrOpInfo {
  const char *name;  /* printed name */
  int nargs;         /* -1: variadic */
  char rtype, atype; /* 'B' 'I' 'F' 'V' 'T' as in ops.def */
  int flags;         /* OPF_* */
  const char *cuda;  /* CUDA spelling with %0 %1 %2 */
  const char *iv;    /* interval rule of kernels/interval.cuh (flex_iv_add); NULL: none */
} IrOpInfo;
extern const IrOpInfo ir_ops[IR_NOPS];
/* The IrType an ops.def type letter names (B I F; T and V give IT_VOID). */
IrType ir_letter_type(char c);

/* A scalar value. Floats are carried in binary64 (the interpreter's
 * precision); CONST floats always hold a binary32-representable value. */
typedef union IrVal {
  bool b;
  int32_t i;
  double f;
} IrVal;

/* Which function argument an IR_ARG reads. */
typedef enum IrArg { ARG_S, ARG_B, ARG_H, ARG_Q, ARG_KV, ARG_DT, ARG_COUNT } IrArg;
const char *ir_arg_name(IrArg a); /* "s", "b", "h", "q", "kv", "dt" */

/* Most operands an instruction has (ACCUM: value + 8 indices). */
#define IR_MAXDIMS 8
#define IR_MAXARGS (IR_MAXDIMS + 1)

/* One SSA instruction; its index in IrFunc.inst is its value's name. */
typedef struct IrInst {
  uint16_t op;    /* IrOp */
  uint8_t type;   /* IrType of the result (IT_VOID for ACCUM) */
  uint8_t nargs;  /* operands used in args[] */
  int32_t aux;    /* ARG: IrArg; PARAM: param slot; SIZE: size slot; LOAD/ACCUM: buffer slot */
  IrVal imm;      /* CONST: the value */
  int32_t args[IR_MAXARGS]; /* operand indices, each < this instruction's index */
  Loc loc;        /* the source range that produced it (for checked-run errors) */
} IrInst;

typedef enum IrFuncKind {
  IRF_SCORE, /* (s, b, h, q, kv) -> f32 */
  IRF_MASK,  /* (b, h, q, kv) -> bool */
  IRF_JOINT, /* (s, b, h, q, kv, dt) -> ds (f32), plus ACCUMs into grad buffers */
  IRF_SINK,  /* (b, h, q) -> f32: an attention sink's logit */
  IRF_SINK_GRAD, /* (b, h, q, dt) -> 0, plus ACCUMs into grad buffers of dt * d sink/d X */
} IrFuncKind;

/* A function: instructions in evaluation order and the result. */
typedef struct IrFunc {
  const char *name; /* for printing: the kernel's score/mask name */
  IrFuncKind kind;
  IrInst *inst;     /* instructions */
  int n, cap;       /* used, allocated */
  int ret;          /* index of the result value */
} IrFunc;

/* A runtime scalar parameter (slot = index in IrModule.params). */
typedef struct IrParam {
  const char *id;
  IrType type;      /* IT_I32 or IT_F32 */
  bool has_default;
  IrVal def;        /* the default, when has_default */
} IrParam;

/* A buffer dimension after lowering: a fixed extent, or a size slot (a
 * predefined size or a free symbol) bound at launch. */
typedef struct IrDim {
  int32_t fixed;    /* >= 0: the extent; -1: see size */
  int size;         /* slot in IrModule.sizes when fixed < 0 */
} IrDim;

/* A buffer (slot = index in IrModule.buffers, the file's declaration order). */
typedef struct IrBuffer {
  const char *id;
  DType dtype;
  int ndims;
  IrDim dims[IR_MAXDIMS];
  bool grad;        /* backward returns its gradient */
  bool sorted;      /* 1-D integer, non-decreasing (caller's promise) */
  bool used;        /* read by the kernel's score or mask */
  Loc loc;
} IrBuffer;

/* An integer size known at launch. Slots 0..SZ_COUNT-1 are B H HKV Q_LEN
 * KV_LEN TOTAL_Q TOTAL_KV Q_START KV_START; later slots are free symbols bound from a buffer's shape. */
typedef struct IrSize {
  const char *id;
  int buffer, dim;  /* free symbols: where the value comes from; -1 for predefined */
} IrSize;

/* Everything compiled for one kernel of a file. */
typedef struct IrModule {
  Arena *arena;        /* owns everything below */
  const Program *prog; /* the checked AST it came from */
  const char *kernel;  /* the kernel's name */
  IrParam *params;   int nparams;
  IrBuffer *buffers; int nbuffers;
  IrSize *sizes;     int nsizes;
  IrFunc *score;     /* never NULL: identity (`return s`) when the kernel has none */
  IrFunc *mask;      /* NULL when the kernel has no mask */
  IrFunc *joint;     /* NULL until ir_autodiff() */
  IrFunc *sink;      /* NULL when the kernel has no sink */
  IrFunc *sink_grad; /* the sink's gradient into grad buffers (dt = the logit's), after
                        ir_autodiff; NULL without a sink */
  bool score_is_identity; /* the kernel named no score function */
} IrModule;

/* ---- building ------------------------------------------------------------ */

IrFunc *ir_func_new(Arena *a, const char *name, IrFuncKind kind);
/* Append an instruction; returns its index. */
int ir_push(Arena *a, IrFunc *f, IrInst in);
int ir_const_b(Arena *a, IrFunc *f, bool v);
int ir_const_i(Arena *a, IrFunc *f, int32_t v);
int ir_const_f(Arena *a, IrFunc *f, double v); /* rounds v to binary32 */
int ir_op1(Arena *a, IrFunc *f, IrOp op, int x);
int ir_op2(Arena *a, IrFunc *f, IrOp op, int x, int y);
int ir_op3(Arena *a, IrFunc *f, IrOp op, int x, int y, int z);

/* ---- scalar semantics (shared by the folder, interpreter and analysis) ---- */

static inline IrVal ir_vb(bool v) { IrVal r; r.f = 0; r.b = v; return r; }
static inline IrVal ir_vi(int32_t v) { IrVal r; r.f = 0; r.i = v; return r; }
static inline IrVal ir_vf(double v) { IrVal r; r.f = v; return r; }
/* Two's complement wrap to 32 bits. */
static inline int32_t ir_wrap(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }
/* The DSL's integer division and remainder (kernels/scalar.cuh: the same
 * code the generated CUDA runs): x / 0 == 0, x % 0 == x, INT_MIN / -1 wraps. */
static inline int32_t ir_idiv(int32_t a, int32_t b) { return flex_idiv(a, b); }
static inline int32_t ir_imod(int32_t a, int32_t b) { return flex_imod(a, b); }
/* float -> int truncating toward zero, saturating; NaN gives 0. */
static inline int32_t ir_f2i(double x) {
  if (x != x) return 0;
  if (x >= 2147483647.0) return INT32_MAX;
  if (x <= -2147483648.0) return INT32_MIN;
  return (int32_t)x;
}

/* ---- passes -------------------------------------------------------------- */

/* sum(i, LO, HI, EXPR) unrolls at most this many terms. */
#define IR_MAX_SUM 4096

/* The value half of checking (values.c), after fe_check: evaluates every
 * const (Decl.cnst.folded) and const dimension (Dim.value) of the file and
 * reports the errors only values reveal (a constant zero divisor, a
 * dimension that is not positive), in every declaration, used by a kernel
 * or not. Returns the error count. */
int ir_check_values(Arena *a, Program *p, Diags *d);
/* The value of a constant expression of a checked program whose consts are
 * folded: lowered and folded (ir_fold_eval). False when `e` is not constant
 * after all (it reads a let, say). Reports nothing. */
bool ir_const_eval(Arena *a, const Program *p, const Expr *e, IrVal *out);
/* Lower the kernel `kernel` (a D_KERNEL decl of a program that passed
 * fe_check and ir_check_values) into a new module in `a`. Never fails. */
IrModule *ir_lower(Arena *a, const Program *p, const Decl *kernel);

void ir_fold(Arena *a, IrFunc *f);    /* fold + simplify, then drop dead code */
/* Fold every op, OPF_INEXACT ones included: the value of a `const`, a
 * dimension or a divisor, defined as binary64 evaluation rounded to binary32
 * at each float op. True (and *out set) when f's result is a constant. */
bool ir_fold_eval(Arena *a, IrFunc *f, IrVal *out);
void ir_cse(Arena *a, IrFunc *f);
void ir_dce(Arena *a, IrFunc *f);
/* A copy of joint function f without the ACCUMs into buffers whose
 * keep[slot] is false, and without the code only they used: the joint of a
 * call that wants some buffers' gradients and not others (dce.c). */
IrFunc *ir_drop_accums(Arena *a, const IrFunc *f, const bool *keep);
/* Build m->joint from m->score (reverse mode w.r.t. s and grad buffers),
 * and m->sink_grad from m->sink (w.r.t. grad buffers). */
void ir_autodiff(IrModule *m);
/* Structural checks; panics naming the function and instruction on failure. */
void ir_verify(const IrModule *m, const IrFunc *f);

/* The standard pipeline over every function of the module: fold, cse, dce
 * (and with `grad`, autodiff followed by the same). Stops after the pass
 * named `after` ("lower", "fold", "cse", "dce", "autodiff") when not NULL;
 * returns false if `after` names no pass. */
bool ir_compile(IrModule *m, bool grad, const char *after);
/* The pass names `after` accepts, in order: "lower, fold, cse, dce, autodiff". */
const char *ir_pass_names(void);

/* The front half (front.c): parse, check, pick `kernel` (NULL: the file's
 * only or implicit one), lower and compile (ir_compile's `grad` and
 * `after`). NULL with the diagnostics in `d` on any user error. */
IrModule *ir_front(Arena *a, const Source *src, const char *kernel, bool grad, const char *after,
                   Diags *d);
/* The front half for a whole file (`flexc check`): every declaration and
 * every kernel the file has, used or not. Returns the error count. */
int ir_front_check(Arena *a, const Source *src, Diags *d);

/* Text form of a function / of the whole module. */
void ir_print_func(Buf *out, const IrModule *m, const IrFunc *f);
void ir_print(Buf *out, const IrModule *m);

/* ---- the interpreter ------------------------------------------------------- */

/* A buffer as the interpreter sees it: any dtype, element strides. */
typedef struct IrBufView {
  const void *data;
  DType dtype;
  int ndims;
  int64_t shape[IR_MAXDIMS];
  int64_t strides[IR_MAXDIMS]; /* in elements */
  double *grad;                /* ACCUM target (dense, row-major over shape); NULL if none */
} IrBufView;

/* Everything an evaluation reads. */
typedef struct IrEnv {
  IrVal args[ARG_COUNT];   /* s, b, h, q, kv, dt */
  const IrVal *params;     /* by param slot */
  const int32_t *sizes;    /* by size slot */
  const IrBufView *bufs;   /* by buffer slot */
  /* Set by ir_eval on the first failure (an out-of-range index, an i64 that
   * does not fit in 32 bits): a message naming the buffer, the index values
   * and FILE:LINE:COL. Evaluation continues with a zero value. */
  bool failed;
  char error[256];
  const Source *src;       /* for locations in `error`; may be NULL */
  const IrModule *mod;     /* for buffer names in `error` */
} IrEnv;

/* Evaluate f in binary64 / wrapping i32; returns the value of f->ret. `vals`
 * is scratch space of at least f->n values. */
IrVal ir_eval(const IrFunc *f, IrEnv *env, IrVal *vals);
/* The EVAL column of one pure op (no leaf, load or accum) on operand values
 * a, b, c: the interpreter's semantics, for the folder and the interval
 * analysis. */
IrVal ir_op_eval(const IrInst *in, IrVal a, IrVal b, IrVal c);
/* The message of a failed buffer access, as every checked run words it:
 * "WHAT buffer 'NAME' [i, j] (shape [n, m]) at FILE:LINE:COL" (shape when
 * given, location when src is not NULL). */
void ir_access_error(char *dst, size_t cap, const char *what, const IrModule *m, const Source *src,
                     const IrInst *in, const int64_t *idx, int n, const int64_t *shape, int ndims);
/* Helpers the EVAL column uses. */
IrVal ir_load(IrEnv *env, const IrInst *in, const IrVal *vals);
IrVal ir_accum(IrEnv *env, const IrInst *in, const IrVal *vals);
/* Exact decoding of IEEE binary16 and bfloat16 bit patterns. */
double ir_half_to_double(uint16_t h);
double ir_bf16_to_double(uint16_t h);

#endif
