/* rt.h: the runtime's insides, shared by its files (not public).
 *
 *   api.c        flex.h entry points for calls: errors, backends, forward,
 *                backward, block masks
 *   kernel.c     flex.h entry points for kernels: load, info, check, IR, emit
 *   validate.c   rt_validate(): SDPA-style checks of every tensor -> RtCall
 *   run.c        the run sequence every device backend goes through (backend.h)
 *   launch.c     FlexParams and the mask plan of a call
 *   blockmask.c  BlockMasks: building, validating a caller's
 *   reference.c  the float64 backend (the oracle)
 *   tensor.c     DLPack helpers, tensors on a backend, copies (tensor.h)
 *   npy.c        NumPy .npy read/write
 * The device backends live in rooms of their own: emu/, cuda/ (cpu/).
 */
#ifndef FLEXC_RT_H
#define FLEXC_RT_H

#include <stdatomic.h>

#include "flex.h"
#include "ir/ir.h"

/* Set the thread's last-error message; returns `st` for `return rt_err(...)`. */
flex_status rt_err(flex_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The body of an entry point with recovery from memory exhaustion
 * (base.h's BaseTry): `return RT_TRY(expr);` evaluates expr, a
 * flex_status, and gives FLEX_ERR_NOMEM if an allocation inside failed.
 * What the interrupted call had allocated is not all returned. */
#define RT_TRY(expr)                                                           \
  do {                                                                         \
    BaseTry try_;                                                              \
    base_try_push(&try_);                                                      \
    if (setjmp(try_.jb)) {                                                     \
      base_try_pop(&try_);                                                     \
      return rt_err(FLEX_ERR_NOMEM, "out of host memory (an allocation of %zu bytes failed)", \
                    try_.bytes);                                               \
    }                                                                          \
    flex_status st_ = (expr);                                                  \
    base_try_pop(&try_);                                                       \
    return st_;                                                                \
  } while (0)

/* A loaded kernel (the struct behind flex_kernel). */
struct flex_kernel {
  Arena arena;         /* owns src text, AST and IR */
  Source src;
  IrModule *mod;       /* score, mask and joint functions, optimised */
  /* mod with a joint that adds into only some `grad` buffers, one per set
   * of wanted gradients met so far (rt_kernel_module; pushed atomically) */
  _Atomic(struct RtVariant *) variants;
  flex_param_info *info_params;   /* flex_kernel_get_info's arrays (in the arena; made on first use) */
  flex_buffer_info *info_buffers;
};

/* The module a backward runs when only the `grad` buffers with keep[slot]
 * have a gradient tensor: k->mod itself when its joint adds into no other,
 * else a copy whose joint computes and adds nothing for the others (made
 * once per set and kept with the kernel). */
const IrModule *rt_kernel_module(const flex_kernel *k, const bool *keep);

/* One validated call: sizes resolved, params and buffers bound by slot. */
typedef struct RtCall {
  const flex_kernel *kernel;
  const IrModule *mod;
  const flex_args *args;
  int B, H, HKV, G, QL, KL, E, EV;   /* G = H / HKV */
  double scale;
  DLDataType dtype;                  /* of q, k, v (all agree) */
  IrVal *params;                     /* by param slot (defaults filled in) */
  int32_t *sizes;                    /* by size slot */
  IrBufView *bufs;                   /* by buffer slot (host views; data NULL if not on host) */
  const DLTensor **buf_tensors;      /* by buffer slot: the caller's tensors (NULL: unused) */
  const DLTensor **buf_grads;        /* by buffer slot: grad outputs (NULL: none) */
  bool backward;
  int b0;                            /* a packed call's sequence: functions see b as b + b0 */
  int q_off, kv_off;                 /* position offsets: functions see q + q_off, kv + kv_off
                                        (flex_args.q_offset, kv_offset; 0 unsharded) */
  bool accumulate;                   /* a later sequence of a packed call: run statistics add up,
                                        buffer gradients add into the tensors given (not zeroed) */
  const int32_t *pages;              /* paged K/V (api/seq.c): this sequence's page table
                                        row on the call's device; k and v are views over the
                                        pools whose batch stride is the page stride. NULL: none */
  int page_size;                     /* keys per page when pages */
  int max_pages;                     /* entries in the page table row when pages */
  const DLTensor *k_pool, *v_pool;   /* the pools k and v view when pages */
} RtCall;

/* One sequence of a packed (cu_seqlens) call, run as an ordinary call of
 * B = 1 over views of the packed tensors (api/seq.c). */
typedef struct RtSeq {
  int b0, nseq;             /* this sequence's index; the number of sequences (the functions' B) */
  int total_q, total_kv;    /* TOTAL_Q, TOTAL_KV */
  int q_start, kv_start;    /* Q_START, KV_START */
  bool accumulate;          /* not the first sequence */
  const int32_t *pages;     /* paged K/V: the sequence's page table row (RtCall.pages), or NULL */
  int page_size;            /* keys per page when pages */
  int max_pages;            /* entries in the row */
  const DLTensor *k_pool, *v_pool; /* the pools the k and v views read */
} RtSeq;

/* Check every tensor of `a` against the kernel and fill `c` (memory in
 * `arena`). Messages name the tensor, what was expected and what came. */
flex_status rt_validate(RtCall *c, Arena *arena, const flex_kernel *k, const flex_args *a,
                        bool backward, const RtSeq *seq);

/* float64 runs on the reference backend only (FLEX_ERR_UNSUPPORTED
 * elsewhere, with the same message from every entry point). */
flex_status rt_check_precision(flex_backend be, DLDataType dt);

/* Params and buffers of `a` alone, for sizes B x H (= HKV) x q_len x
 * kv_len, on the host (flex_block_mask_create): the same checks and
 * messages as rt_validate. */
flex_status rt_validate_bindings(RtCall *c, Arena *arena, const flex_kernel *k, const flex_args *a,
                                 int B, int H, int q_len, int kv_len);

/* A checked run's `sorted` promises, over host views of the buffers (by
 * slot; views with no data are skipped): FLEX_ERR_RUNTIME at the first
 * decrease. */
flex_status rt_check_sorted(const RtCall *c, const IrBufView *views);
/* The message of a decrease of sorted buffer `slot`: element i is x, after
 * prev (FLEX_ERR_RUNTIME; the host and the device checks both say it). */
flex_status rt_sorted_error(const RtCall *c, int slot, int64_t i, int64_t x, int64_t prev);
/* One element of a sorted buffer of dtype t (i64, i32 or u8) at p. */
int64_t rt_sorted_elem(DType t, const void *p);

/* The DLPack dtype of a declared buffer dtype. */
DLDataType rt_buffer_dtype(DType t);

/* The float64 reference: one validated call (the backend that is not a
 * table of device verbs; see backend.h). */
flex_status rt_reference_forward(const RtCall *c);
flex_status rt_reference_backward(const RtCall *c);

#endif
