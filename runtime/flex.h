/* flex.h: the flexc runtime, the whole public C API.
 *
 * Load a .score kernel once, then run attention forward and backward on a
 * backend. Tensors are DLPack DLTensors (any strides, unit last-dim stride).
 * Every call returns a flex_status; on failure flex_last_error() says what
 * went wrong in words (which tensor, what was expected, what came). The
 * library never exits the process and never prints.
 *
 * Shapes (docs/language.md "Semantics"):
 *   q  [B, H,   Q_LEN,  E]     k [B, HKV, KV_LEN, E]    v [B, HKV, KV_LEN, EV]
 *   out[B, H,   Q_LEN,  EV]    lse [B, H, Q_LEN]        (natural log)
 *   dout like out, dlse like lse (optional), dq like q, dk like k, dv like v.
 * Packed variable-length batches (flex_args.cu_seqlens_q/_kv): q (TOTAL_Q,
 * H, E), k (TOTAL_KV, HKV, E), v (TOTAL_KV, HKV, EV), lse (H, TOTAL_Q).
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
  FLEX_BACKEND_CPU = 3,       /* fused attention on the host's cores (LLVM JIT of the IR) */
} flex_backend;

/* A loaded kernel: a checked .score file lowered to IR for one kernel. */
typedef struct flex_kernel flex_kernel;

/* The message of the last failed call on this thread ("" if none). */
const char *flex_last_error(void);
/* "reference", "emu", "cuda", "cpu"; NULL for an unknown value. */
const char *flex_backend_name(flex_backend b);
/* The backend named `name` ("reference", "emu", "cuda", "cpu"); false if none. */
bool flex_backend_parse(const char *name, flex_backend *out);
/* Whether this build and machine can run `b` (cuda: a driver and a device
 * of compute capability 8.0 or newer; cpu: built with LLVM; emu: a host
 * C++ compiler). When not, flex_last_error() says why. */
bool flex_backend_available(flex_backend b);

/* Load kernel `kernel` (NULL: the file's only or implicit kernel) from a
 * .score file or from source text. Diagnostics land in flex_last_error(). */
flex_status flex_kernel_load(flex_kernel **out, const char *path, const char *kernel);
flex_status flex_kernel_from_source(flex_kernel **out, const char *name, const char *text,
                                    size_t len, const char *kernel);
void flex_kernel_free(flex_kernel *k);

/* ---- what a kernel reads ------------------------------------------------ */

/* Scalar types of the language. */
typedef enum flex_type { FLEX_TYPE_BOOL = 0, FLEX_TYPE_INT = 1, FLEX_TYPE_FLOAT = 2 } flex_type;

/* A `param` of the kernel. */
typedef struct flex_param_info {
  const char *name;
  flex_type type;        /* FLEX_TYPE_INT or FLEX_TYPE_FLOAT */
  bool has_default;      /* a call may leave it out */
  double default_value;  /* when has_default */
} flex_param_info;

#define FLEX_MAX_DIMS 8

/* A `buffer` of the kernel. */
typedef struct flex_buffer_info {
  const char *name;
  DLDataType dtype;               /* the declared element type (bool: kDLBool, 8 bits) */
  int ndim;                       /* rank */
  int64_t extent[FLEX_MAX_DIMS];  /* fixed extent, or -1 when bound at launch */
  const char *dim_name[FLEX_MAX_DIMS]; /* the size's name ("H", "KV_LEN", a free symbol), or NULL when fixed */
  bool grad;                      /* the backward returns its gradient */
  bool sorted;                    /* 1-D, the caller promises non-decreasing values */
  bool used;                      /* the kernel's score or mask reads it (an unused one may be left out) */
} flex_buffer_info;

/* Features of a kernel (flex_kernel_info.features). */
enum {
  FLEX_FEATURE_SCORE = 1u << 0,        /* a score function (not the identity) */
  FLEX_FEATURE_MASK = 1u << 1,         /* a mask function */
  FLEX_FEATURE_GRAD_BUFFERS = 1u << 2, /* some buffer is `grad` */
  FLEX_FEATURE_IMPLICIT_MASK = 1u << 3, /* the kernels classify blocks themselves: no BlockMask needed */
  FLEX_FEATURE_DS_IS_DT = 1u << 4,     /* d score / d s == 1: the backward skips the joint */
  FLEX_FEATURE_SINK = 1u << 5,         /* a sink function (docs/language.md "Attention sinks") */
};

/* Everything a program needs to call a kernel it did not write. Pointers
 * stay valid until flex_kernel_free. */
typedef struct flex_kernel_info {
  const char *name;        /* the kernel's name ("default" for an implicit kernel) */
  const char *file;        /* the .score file (or the name given to flex_kernel_from_source) */
  const char *score;       /* the score function's name, or NULL for the identity */
  const char *mask;        /* the mask function's name, or NULL */
  unsigned features;       /* FLEX_FEATURE_* bits */
  int nparams;
  const flex_param_info *params;   /* in declaration order */
  int nbuffers;
  const flex_buffer_info *buffers; /* in declaration order */
  const char *sink;        /* the sink function's name, or NULL */
} flex_kernel_info;

flex_status flex_kernel_get_info(const flex_kernel *k, flex_kernel_info *out);

/* ---- tensors on a backend ----------------------------------------------- */

/* Memory that the runtime owns, for programs without a CUDA runtime of
 * their own: host memory for reference, emu and cpu, device memory on the
 * current CUDA device for cuda. The DLTensor is compact (strides NULL),
 * zero-filled in `stream` order (cuda; NULL: the default stream), and
 * freed with flex_tensor_free. */
flex_status flex_tensor_alloc(DLTensor **out, flex_backend b, DLDataType dtype, int ndim,
                              const int64_t *shape, void *stream);
void flex_tensor_free(DLTensor *t);
/* Copy src into dst (same shape; any strides; either may be on the host or
 * a CUDA device). Float dtypes convert into each other (rounding to
 * nearest even), integer and bool dtypes into each other (values must
 * fit); stream orders device copies (NULL: default stream) and the call
 * returns when dst holds the data. */
flex_status flex_tensor_copy(const DLTensor *dst, const DLTensor *src, void *stream);

/* A name for the device backend b runs on ("NVIDIA H100 80GB HBM3" for
 * cuda's current device; "host CPU" otherwise). */
flex_status flex_device_name(flex_backend b, char *out, size_t cap);

/* Wait for the work issued on `stream` (cuda; NULL: the default stream);
 * the other backends finish before their calls return. */
flex_status flex_sync(flex_backend b, void *stream);

/* NumPy .npy files (C order, little endian; float16/32/64, int32/64,
 * uint8, bool). load gives a host tensor (free with flex_tensor_free);
 * save writes any tensor (device tensors are copied to the host first). */
flex_status flex_npy_load(DLTensor **out, const char *path);
flex_status flex_npy_save(const char *path, const DLTensor *t);

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
  bool check_bounds;               /* checked run: report out-of-range buffer reads */
  bool fast_math;                  /* opt-in: hardware approximations for exp log log2 tanh sigmoid
                                      sin cos pow on emu and cuda (tanh: up to 2^-10.987 relative
                                      error, by the PTX ISA); the reference is always exact */
  bool trust_sorted;               /* waiver: skip verifying `sorted` buffers. Every call (and
                                      flex_block_mask_create) otherwise makes one O(length) pass
                                      over each `sorted` buffer before any block is skipped and
                                      fails with the buffer, the index and the two values where it
                                      decreases (device buffers: copied to the host for it) */
  /* A packed variable-length batch (docs/language.md; docs/varlen.md): int32 [B + 1]
   * offsets on the call's device, from 0, non-decreasing, ending at TOTAL_Q
   * and TOTAL_KV. When set (both are needed), q is (TOTAL_Q, H, E), k
   * (TOTAL_KV, HKV, E), v (TOTAL_KV, HKV, EV), out and dout (TOTAL_Q, H, EV),
   * lse and dlse (H, TOTAL_Q), dq, dk, dv like q, k, v; block_mask must be
   * NULL. Device backends read the offsets back to the host once per call. */
  const DLTensor *cu_seqlens_q, *cu_seqlens_kv;
  /* Dropout (docs/language.md "Dropout"): attention weights dropped with probability
   * dropout_p in [0, 1), kept ones scaled by 1 / (1 - dropout_p), by the bits
   * of Philox4x32-10 keyed by dropout_seed at dropout_offset. A backward
   * must get the forward's three values. 0: no dropout, at no cost (the
   * kernels are generated without it). */
  float dropout_p;
  uint64_t dropout_seed, dropout_offset;
  /* A paged key/value cache (docs/language.md; docs/paged.md), forward only: k is the
   * pool (NUM_PAGES, PAGE_SIZE, HKV, E), v (NUM_PAGES, PAGE_SIZE, HKV, EV),
   * PAGE_SIZE any integer in 16..256; page_table int32 [B, MAX_PAGES] and
   * kv_lens int32 [B] on q's device (both are needed). Sequence b's key kv
   * (kv < kv_lens[b], its KV_LEN) is row kv % PAGE_SIZE of page
   * page_table[b, kv / PAGE_SIZE]. q, out and lse are padded ([B, H, Q_LEN,
   * E] ...) or packed by cu_seqlens_q (cu_seqlens_kv must then be NULL).
   * kv_lens is read back to the host once per call; page indices are checked
   * only by a checked run (check_bounds) on emu and cuda (always on the
   * reference and cpu backends, which gather on the host). */
  const DLTensor *page_table, *kv_lens;
  /* Split-KV decoding (docs/decoding.md), forward on emu and cuda: the key
   * range is cut into this many chunks run by separate CTAs, whose partial
   * O and LSE a combine kernel merges. 0: automatic (split when the grid
   * has fewer CTAs than the device has SMs); 1: never; N: N chunks, clamped
   * to the number of key tiles. Negative: FLEX_ERR_INVALID. The reference
   * and cpu backends compute each row whole and ignore it. */
  int kv_splits;
  /* A deterministic backward (docs/language.md "Determinism"; docs/kernels.md): dq,
   * dk, dv and buffer gradients bitwise identical across runs with the same
   * inputs, configuration and device. dQ is summed in a fixed order over
   * groups of key tiles (emu, cuda: one fp32 dQ scratch per group, see
   * docs/kernels.md for the count), buffer gradients exactly (104 bytes of
   * scratch per element, rounded once). Without it, float atomics may vary
   * the last bits. A forward ignores it. */
  bool deterministic;
  /* The architecture the emu backend generates for: NULL or "sm_80" the
   * sm_80 kernels, "sm_90a" the sm_90a ones (the forward and backward on
   * TMA and wgmma, docs/kernels.md); any of sm_80, sm_86, sm_89, sm_90, sm_90a. Other
   * backends ignore it (cuda compiles for the device's own). */
  const char *arch;
  /* Position offsets (docs/language.md "Position offsets"): the call is a
   * shard of a longer sequence, for context parallelism. Row i of q is
   * position q_offset + i of the whole sequence and row j of k and v
   * position kv_offset + j; score, mask and sink functions see those
   * positions as q and kv, Q_LEN and KV_LEN are the whole lengths
   * q_len_total and kv_len_total, and masks, dropout bits and block
   * classification use them too, so merging the shard pairs' results by
   * LSE gives the unsharded call's. Offsets >= 0; a total of 0 means this
   * call's own length (offset 0). The shard must lie in the whole
   * sequence, whose positions must fit in int32. Not with cu_seqlens or a
   * page table. A kernel's sink is added by the shards at kv_offset 0 only
   * (and gets its gradient there), so the merge counts it once. */
  int64_t q_offset, kv_offset;
  int64_t q_len_total, kv_len_total;
} flex_args;

/* ---- block masks ---------------------------------------------------------- */

/* What building a BlockMask found. */
typedef struct flex_mask_stats {
  int64_t total;      /* blocks stored: B' * H' * nq * nkv (B', H' = 1 when the mask ignores b, h) */
  int64_t full, partial, empty;
  int64_t undecided;  /* blocks the interval analysis left open */
  int64_t refined;    /* of those, blocks element-wise evaluation found full or empty */
  int64_t evaluated;  /* mask evaluations done element by element */
  bool decidable;     /* the analysis can decide blocks without data (sorted buffers bounded by end points) */
  bool implicit;      /* the kernels classify blocks themselves: no BlockMask is built for a call */
} flex_mask_stats;

/* The BlockMask of k's mask for B x H x q_len x kv_len with blocks of
 * block_q x block_kv (0: 128), as the runtime builds it (interval analysis,
 * then element-wise evaluation of the blocks it leaves open). Params and
 * buffers come from `a` (validated as flex_forward validates them; q, k, v
 * and outputs are not read); the eight arrays are host int32 tensors owned
 * by *out (free with flex_block_mask_free). stats may be NULL. */
flex_status flex_block_mask_create(flex_block_mask **out, flex_kernel *k, const flex_args *a, int B,
                                   int H, int q_len, int kv_len, int block_q, int block_kv,
                                   flex_mask_stats *stats);
void flex_block_mask_free(flex_block_mask *m);

/* How k's mask covers a whole call (docs/blockmask.md). */
typedef enum flex_mask_class {
  FLEX_MASK_EMPTY = 0,   /* no element kept: the call's O is 0 and its LSE -inf (a shard pair
                            of a causal mask above the diagonal contributes nothing) */
  FLEX_MASK_FULL = 1,    /* every element kept */
  FLEX_MASK_PARTIAL = 2, /* mixed, or not decided by the interval analysis */
} flex_mask_class;

/* The class of the whole B x H x q_len x kv_len call of k, by the interval
 * analysis of its mask over the call's ranges of b, h, q and kv (with a's
 * position offsets, params and host buffers, validated as
 * flex_block_mask_create validates them): O(1), no element evaluated. */
flex_status flex_mask_classify(const flex_kernel *k, const flex_args *a, int B, int H, int q_len,
                               int kv_len, flex_mask_class *out);

/* ---- what the compiler makes (flexc check, ir, emit) ------------------------- */

/* Check every declaration and kernel of a .score file: FLEX_OK, or
 * FLEX_ERR_INVALID with the diagnostics in flex_last_error(). */
flex_status flex_check_file(const char *path);
/* The IR of kernel `kernel` (NULL: the only or implicit one) after the
 * pass `after` ("lower", "fold", "cse", "dce", "autodiff"; NULL: all),
 * with the joint backward function when `grad`. *text is freed with flex_free. */
flex_status flex_ir_text(char **text, const char *path, const char *kernel, bool grad,
                         const char *after);
/* How k's mask becomes blocks, for a reader (flexc check --explain): decided
 * by interval analysis, or a BlockMask built element by element on every
 * call, with the buffer read that prevents the analysis and the cost it
 * implies (per element, and in evaluations at `shape` = B, H, Q_LEN, KV_LEN
 * when not NULL). *text is freed with flex_free. */
flex_status flex_mask_explain(const flex_kernel *k, const int *shape, char **text);
/* The pass names `after` accepts, comma-separated, in order. */
const char *flex_ir_pass_names(void);

typedef enum flex_target { FLEX_TARGET_CUDA = 0, FLEX_TARGET_PTX = 1, FLEX_TARGET_CUBIN = 2 } flex_target;

/* What flex_emit makes. */
typedef struct flex_emit_options {
  flex_target target;
  const char *arch;      /* "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a" */
  DLDataType dtype;      /* of q, k, v: float16, bfloat16 or float32 */
  int head_dim;          /* E, 1..256 */
  int head_dim_v;        /* EV (0: E) */
  bool forward_only;     /* no backward entries */
  bool fast_math;        /* hardware approximations of the float builtins */
  bool resource_usage;   /* also report registers, spills, shared memory and stack per entry */
  bool dropout;          /* the kernels a call with dropout_p > 0 runs (FLEX_DROPOUT defined) */
  bool deterministic;    /* the kernels a deterministic backward runs (FLEX_DETERMINISTIC defined) */
} flex_emit_options;

/* The kernel's generated CUDA, PTX or cubin in *out (*len bytes; freed with
 * flex_free); with resource_usage, the report in *report (else NULL). */
flex_status flex_emit(const flex_kernel *k, const flex_emit_options *o, char **out, size_t *len,
                      char **report);
/* Free what flex_ir_text and flex_emit returned. */
void flex_free(void *p);

/* out = attention(q, k, v), lse = log-sum-exp per row. */
flex_status flex_forward(flex_kernel *k, const flex_args *a);
/* dq, dk, dv (and grad buffers) from dout (and dlse), given out and lse. */
flex_status flex_backward(flex_kernel *k, const flex_args *a);

#ifdef __cplusplus
}
#endif
#endif
