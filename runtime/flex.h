/* flex.h: the flexc runtime, the whole public C API.
 *
 * Load a .score kernel once, then run attention forward and backward on a
 * backend. Tensors are DLPack DLTensors (any strides, unit last-dim stride).
 * Every call returns a flex_status; on failure flex_last_error() says what
 * went wrong in words (which tensor, what was expected, what came). The
 * library never exits the process and never prints.
 *
 * Shapes (DSL.md "Semantics"):
 *   q  [B, H,   Q_LEN,  E]     k [B, HKV, KV_LEN, E]    v [B, HKV, KV_LEN, EV]
 *   out[B, H,   Q_LEN,  EV]    lse [B, H, Q_LEN]        (natural log)
 *   dout like out, dlse like lse (optional), dq like q, dk like k, dv like v.
 */
#ifndef FLEXC_FLEX_H
#define FLEXC_FLEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flex_status {
  FLEX_OK = 0,
  FLEX_ERR_INVALID = 1,   /* the caller passed something wrong (a bad tensor, unknown name, bad .score) */
  FLEX_ERR_NO_DEVICE = 2, /* the CUDA backend was asked for and there is no usable CUDA device/driver */
  FLEX_ERR_COMPILE = 3,   /* NVRTC or the host compiler failed on generated code (an internal bug) */
  FLEX_ERR_RUNTIME = 4,   /* a failure while running: a CUDA error, a checked-run violation */
  FLEX_ERR_UNSUPPORTED = 5, /* valid, but not supported by this backend or build */
  FLEX_ERR_NOMEM = 6,     /* out of host or device memory */
} flex_status;

typedef enum flex_backend {
  FLEX_BACKEND_REFERENCE = 0, /* float64, fully materialised: the oracle */
  FLEX_BACKEND_EMU = 1,       /* the generated CUDA source, run on the CPU */
  FLEX_BACKEND_CUDA = 2,      /* the generated CUDA source, run on the GPU */
} flex_backend;

/* A loaded kernel: a checked .score file lowered to IR for one kernel. */
typedef struct flex_kernel flex_kernel;

/* The message of the last failed call on this thread ("" if none). */
const char *flex_last_error(void);
/* "reference", "emu", "cuda"; NULL for an unknown value. */
const char *flex_backend_name(flex_backend b);

/* Load kernel `kernel` (NULL: the file's only or implicit kernel) from a
 * .score file or from source text. Diagnostics land in flex_last_error(). */
flex_status flex_kernel_load(flex_kernel **out, const char *path, const char *kernel);
flex_status flex_kernel_from_source(flex_kernel **out, const char *name, const char *text,
                                    size_t len, const char *kernel);
void flex_kernel_free(flex_kernel *k);

/* A named runtime param value. */
typedef struct flex_param {
  const char *name;
  double value;          /* converted to the param's type (int params must be integral) */
} flex_param;

/* A named buffer, and for `grad` buffers where its gradient goes. */
typedef struct flex_buffer {
  const char *name;
  const DLTensor *tensor;  /* the data */
  const DLTensor *grad;    /* backward: d loss / d buffer (float32 or float64, same shape); may be NULL */
} flex_buffer;

/* A block mask in PyTorch's BlockMask layout (int32 tensors). kv_* are
 * required; full_* and the q_* transposed side are optional (the q side is
 * derived when absent). B and H dims may be 1 (broadcast). */
typedef struct flex_block_mask {
  int block_q, block_kv;   /* block sizes (0: 128) */
  const DLTensor *kv_num_blocks, *kv_indices;
  const DLTensor *full_kv_num_blocks, *full_kv_indices;
  const DLTensor *q_num_blocks, *q_indices;
  const DLTensor *full_q_num_blocks, *full_q_indices;
} flex_block_mask;

/* Everything one attention call reads and writes. Zero-initialise, then set
 * what you need. */
typedef struct flex_args {
  flex_backend backend;
  const DLTensor *q, *k, *v;       /* inputs */
  const DLTensor *out, *lse;       /* forward outputs; backward reads them */
  const DLTensor *dout, *dlse;     /* backward inputs (dlse may be NULL) */
  const DLTensor *dq, *dk, *dv;    /* backward outputs */
  double scale;                    /* 0: 1/sqrt(E) */
  const flex_param *params;   int nparams;
  const flex_buffer *buffers; int nbuffers;
  const flex_block_mask *block_mask; /* NULL: none (or the kernel's implicit mask) */
  void *stream;                    /* CUDA stream (CUstream); NULL: default */
  bool check_bounds;               /* checked run: report out-of-range buffer reads, broken `sorted` promises */
  bool fast_math;                  /* opt-in: hardware approximations for exp log log2 tanh sigmoid
                                      sin cos pow on emu and cuda (tanh: up to 2^-10.987 relative
                                      error, by the PTX ISA); the reference is always exact */
} flex_args;

/* out = attention(q, k, v), lse = log-sum-exp per row. */
flex_status flex_forward(flex_kernel *k, const flex_args *a);
/* dq, dk, dv (and grad buffers) from dout (and dlse), given out and lse. */
flex_status flex_backward(flex_kernel *k, const flex_args *a);

#ifdef __cplusplus
}
#endif
#endif
