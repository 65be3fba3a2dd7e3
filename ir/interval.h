/* interval.h: interval analysis of a mask function over a block of
 * (b, h, q, kv), for block-sparse attention.
 *
 * Every value of the mask function gets an abstract value over the block:
 *   bool   {false, true, either}         (may_false, may_true)
 *   i32    [lo, hi], widened to the whole i32 range when a result may wrap
 *   f32    [lo, hi] (binary64 endpoints, may be infinite) plus "may be NaN"
 * The arguments b, h, q, kv range over the block's rectangle; params and
 * sizes are the point values bound at launch; loads of `sorted` 1-D integer
 * buffers are bounded by the buffer's values at the index range's end
 * points; other loads are unknown within their dtype (or exact when every
 * index is a single value and the data is on the host).
 *
 * Soundness is with respect to the float64 reference semantics (ir_eval):
 * EMPTY and FULL are only ever reported when every element of the block
 * agrees. See docs/blockmask.md for the transfer rules and what is exact.
 */
#ifndef FLEXC_IR_INTERVAL_H
#define FLEXC_IR_INTERVAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "../kernels/interval.cuh" /* FlexBlockClass */


/* What the analysis reads besides the block's ranges (all may be NULL:
 * the corresponding values are then unknown). */
typedef struct IrIntervalEnv {
  const IrVal *params;   /* by param slot */
  const int32_t *sizes;  /* by size slot */
  const IrBufView *bufs; /* by buffer slot; host data, or data NULL when not readable */
} IrIntervalEnv;

/* An abstract value; which fields are meaningful depends on the type. */
typedef struct IrAbs {
  bool may_false, may_true; /* bool */
  int64_t lo, hi;           /* i32: inclusive range within the i32 range */
  double flo, fhi;          /* f32: inclusive range (may be +-inf) */
  bool nan;                 /* f32: may be NaN */
} IrAbs;

/* Abstract evaluation of f (a function of m) over args[ARG_*] (each a range), writing one
 * abstract value per instruction into vals (at least f->n) and returning
 * the result's. Instructions the result does not depend on are skipped. */
IrAbs ir_interval_eval(const IrModule *m, const IrFunc *f, const IrIntervalEnv *env,
                       const IrAbs *args, IrAbs *vals);

/* Classify the block b in [b0, b1], h in [h0, h1], q in [q0, q1],
 * kv in [kv0, kv1] (inclusive, non-empty) for m->mask (FULL when there is
 * no mask). Sound: PARTIAL when unsure, never a wrong EMPTY or FULL. */
FlexBlockClass ir_interval_mask(const IrModule *m, const IrIntervalEnv *env, int b0, int b1, int h0,
                       int h1, int q0, int q1, int kv0, int kv1);

/* Whether the mask depends only on what the analysis handles well (no
 * loads of buffers other than `sorted` ones), so that kernels may classify
 * blocks themselves with no BlockMask tensor ("implicit masks"). */
bool ir_interval_decidable(const IrModule *m);
/* ir_interval_decidable, and no float value in the mask: the device
 * classifier has only the integer and boolean rules (floats are unknown
 * there), so a mask with floats would leave every tile partial. Such masks
 * get a BlockMask built on the device instead, which is exact. */
bool ir_interval_device_decidable(const IrModule *m);

/* Whether the mask reads argument `arg` (ARG_B, ARG_H, ...): a BlockMask
 * dimension the mask does not read is stored with extent 1. */
bool ir_interval_uses_arg(const IrModule *m, IrArg arg);

#endif
