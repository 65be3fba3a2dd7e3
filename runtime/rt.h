/* rt.h: the runtime's insides, shared by its files (not public).
 *
 *   api.c        flex.h entry points: load kernels, validate, dispatch
 *   validate.c   rt_validate(): SDPA-style checks of every tensor -> RtCall
 *   reference.c  the float64 backend (the oracle)
 *   npy.c        NumPy .npy read/write (for flexc run and tests)
 *   emu*.c       the emulator backend (generated CUDA run on the CPU)
 *   cuda*.c      NVRTC compile, cache, driver API, launch
 */
#ifndef FLEXC_RT_H
#define FLEXC_RT_H

#include "flex.h"
#include "ir/ir.h"

/* Set the thread's last-error message; returns `st` for `return rt_err(...)`. */
flex_status rt_err(flex_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A loaded kernel (the struct behind flex_kernel). */
struct flex_kernel {
  Arena arena;         /* owns src text, AST and IR */
  Source src;
  Program *prog;
  IrModule *mod;       /* score, mask and joint functions, optimised */
};

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
} RtCall;

/* Check every tensor of `a` against the kernel and fill `c` (memory in
 * `arena`). Messages name the tensor, what was expected and what came. */
flex_status rt_validate(RtCall *c, Arena *arena, const flex_kernel *k, const flex_args *a,
                        bool backward);

/* A checked run's `sorted` promises, over host views of the buffers (by
 * slot; views with no data are skipped): FLEX_ERR_RUNTIME at the first
 * decrease. */
flex_status rt_check_sorted(const RtCall *c, const IrBufView *views);

/* Backends: each runs one validated call. */
flex_status rt_reference_forward(const RtCall *c);
flex_status rt_reference_backward(const RtCall *c);
flex_status rt_emu_forward(const RtCall *c);
flex_status rt_emu_backward(const RtCall *c);
flex_status rt_cuda_forward(const RtCall *c);
flex_status rt_cuda_backward(const RtCall *c);

#endif
