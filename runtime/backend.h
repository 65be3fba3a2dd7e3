/* backend.h: the verbs a device backend supplies. The run sequence
 * (runtime/run.c: validate, plan the mask, prepare, build or upload block
 * lists, forward, backward preprocess/main/convert, gradient widening) is
 * written once over them; a backend is a table of these verbs in its own
 * room (emu/, cuda/, cpu/).
 *
 * A backend states what its device can do (CgDevice, when a call opens);
 * what the kernels are generated with is then chosen once, by cg_plan
 * (codegen/plan.c), from the call's shape and that statement. The unit of
 * work is an entry: one of the kernels of RtEntry, run over one FlexParams
 * (kernels/params.cuh), the plain-C description of a call every backend
 * shares (the sm_90a bodies' FlexFwdTma / FlexBwdTma: the same with tensor
 * maps, built by the run sequence with the backend's encoder). CUDA and the
 * emulator launch the generated entry of that name with the geometry given,
 * checked against the hardware's limits before the verb is called; a host
 * backend (cpu) runs its own code for the entry and ignores the geometry.
 *
 * The float64 reference is not a device backend: it evaluates the IR over a
 * materialised score matrix (runtime/reference.c) and is the documented
 * exception.
 */
#ifndef FLEXC_BACKEND_H
#define FLEXC_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen/codegen.h"
#include "kernels/params.cuh"
#include "runtime/launch.h"
#include "runtime/rt.h"

/* The kernels of one call, in the order the run sequence may run them. */
typedef enum RtEntry {
  RT_ENTRY_MASK_BUILD, /* flex_mask_build: a class byte per block of the BlockMask */
  RT_ENTRY_MASK_LISTS, /* flex_mask_lists: the eight BlockMask arrays from the classes */
  RT_ENTRY_FWD,        /* flex_fwd: O and LSE, or split-KV partials of them */
  RT_ENTRY_FWD_COMBINE, /* flex_fwd_combine: the partials of a split forward merged into O and LSE */
  RT_ENTRY_BWD_PRE,    /* flex_bwd_pre: D = rowsum(dO * O) - dLSE; dq_acc zeroed */
  RT_ENTRY_BWD,        /* flex_bwd: dK, dV, dq_acc and buffer gradients */
  RT_ENTRY_BWD_DQ,     /* flex_bwd_dq: dQ from dq_acc, in the input dtype */
  RT_ENTRY_SORTED,     /* flex_sorted_check: the first decrease of one `sorted` buffer */
  RT_ENTRY_GRAD_EXACT, /* flex_grad_exact: a deterministic backward's exact buffer gradient, rounded */
  RT_NENTRIES
} RtEntry;

/* The extern "C" name of an entry in the generated source. */
const char *rt_entry_name(RtEntry e);

/* One call in flight: what the run sequence knows and what a backend keeps. */
typedef struct RtRun {
  const struct RtBackend *be; /* the backend's verbs */
  const RtCall *c;            /* the validated call */
  CgOptions opts;             /* what the kernels are generated with (cg_plan) */
  CgDevice dev;               /* what the device can do (set by open) */
  void *stream;               /* the caller's stream (CUstream; NULL: default) */
  int device;                 /* device ordinal (cuda) */
  void *module;               /* the prepared kernels (owned by the backend's cache) */
  void *state;                /* the backend's per-call state (freed by close) */
  uint64_t tiles;             /* tiles visited by the last launch, where counted */
  bool ordered_release;       /* set by open: release is in the stream's order, so the
                               * call's memory goes back without waiting for its launches */
} RtRun;

/* A backend's verbs. Every verb returns FLEX_OK or a status with the
 * message set (rt_err). Memory verbs move bytes between the host and the
 * backend's memory; on a host backend they are plain memory operations. */
typedef struct RtBackend {
  const char *name; /* "emu", "cuda", "cpu": as flex_backend_name says */
  bool host_memory; /* the backend's memory is host memory (the caller's tensors are host tensors) */
  /* `sorted` promises checked by flex_sorted_check where the buffers live
   * (emu, cuda: the generated entries); false: on the host (cpu). */
  bool sorted_entry;
  /* A deterministic backward's dQ goes into one slice of the accumulator
   * per CTA of flex_bwd (the generated kernels: emu, cuda); false: the
   * backend orders its dQ adds itself (cpu). */
  bool dq_slices;
  /* Check where the call's tensors live (r->c; NULL outside a call: the
   * default device), make that device current, and state what it can do
   * for the call in r->dev. */
  flex_status (*open)(RtRun *r);
  /* Build (or find in a cache) the kernels of r->opts for the call; set r->module. */
  flex_status (*prepare)(RtRun *r);
  /* Zero-filled memory of `bytes` (> 0) on the backend; release frees it (NULL is fine). */
  flex_status (*alloc)(RtRun *r, void **out, size_t bytes);
  void (*release)(RtRun *r, void *p);
  /* Set `bytes` of backend memory to zero, in the call's stream order. */
  flex_status (*zero)(RtRun *r, void *p, size_t bytes);
  /* Copies in the call's stream order (asynchronous where the device is). */
  flex_status (*upload)(RtRun *r, void *dst, const void *src, size_t bytes);
  flex_status (*download)(RtRun *r, void *dst, const void *src, size_t bytes);
  /* Run one entry with geometry g (within the hardware's limits) over its
   * parameter block: a FlexParams, or for the sm_90a bodies' entries
   * (r->opts.fwd_sm90 / bwd_sm90) a FlexFwdTma / FlexBwdTma. */
  flex_status (*launch)(RtRun *r, RtEntry e, const CgLaunch *g, const void *params);
  /* Wait for everything issued on the call's stream. */
  flex_status (*sync)(RtRun *r);
  /* Drop what open and prepare left in r->state (may be NULL). */
  void (*close)(RtRun *r);
  /* The tensor-map encoder of the sm_90a bodies (the driver's, or the
   * emulator's stand-in); NULL: none (CgDevice.tensor_maps false). */
  RtTmapEncode tmap;
} RtBackend;

/* The device backends, each a table in its own room. */
extern const RtBackend rt_emu_backend;
extern const RtBackend rt_cuda_backend;
extern const RtBackend rt_cpu_backend;
/* Whether this build has the cpu backend (LLVM) and its JIT starts (else the reason as the last error). */
bool rt_cpu_available(void);
/* The name of CUDA device `device`. */
flex_status rt_cuda_device_name(int device, char *out, size_t cap);
/* Whether the emulator's host C++ compiler is there (else the reason as the last error). */
bool rt_emu_available(void);

/* Every tensor a call reads or writes, each once, with a name for
 * messages: q, k, v, out, lse, then a backward's dout, dlse, dq, dk, dv,
 * then each buffer and its gradient, a caller's BlockMask's arrays, and a
 * paged call's pools (whose sequence views k and v are then left out).
 * NULL ones are skipped. */
void rt_call_tensors(const RtCall *c, void (*fn)(void *ctx, const char *name, const DLTensor *t),
                     void *ctx);

/* One call, forward or backward (c->backward), through the run sequence. */
flex_status rt_run(const RtBackend *be, const RtCall *c);
/* Validate and run one call on be (NULL: the float64 reference); seq: one
 * sequence of a packed or paged call, or NULL (run.c). */
flex_status rt_call_one(const RtBackend *be, const flex_kernel *k, const flex_args *a,
                        bool backward, const RtSeq *seq);

/* What the last call on this thread did (tests and benchmarks); for a
 * packed (cu_seqlens) call, summed over its sequences. */
typedef struct RtRunStats {
  uint64_t fwd_tiles;  /* tiles the forward visited (all CTAs), where the backend counts them */
  uint64_t bwd_tiles;  /* tiles the backward visited (all CTAs, every head of a group) */
  bool built;          /* the BlockMask came from the builder entries */
  CgMaskMode mode;     /* the mask mode the kernels ran with */
  int64_t blocks[3];   /* built masks: empty, full, partial blocks */
  bool vec16;          /* the 16-byte cp.async path was on */
  int sorted_checks;   /* flex_sorted_check launches (the `sorted` check where the buffers live) */
  bool pack_gqa;       /* the forward ran grouped-query packed (docs/decoding.md) */
  int kv_splits;       /* key chunks of the forward (1: not split; 0: no forward on a device
                          backend); a packed or paged call: the most of its sequences */
  bool fwd_sm90;       /* flex_fwd was the sm_90a body (TMA + wgmma) */
  bool bwd_sm90;       /* flex_bwd was the sm_90a body (kernels/flex_bwd_sm90.cuh) */
} RtRunStats;
RtRunStats rt_run_last_stats(void);
/* Start the statistics of a new call (a packed call of no sequences runs none). */
void rt_run_stats_reset(void);

#endif
