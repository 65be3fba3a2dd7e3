/* emu_abi.h: the one struct that crosses from the runtime (C) into a
 * compiled emulator module (C++, built at run time from generated CUDA plus
 * the shim in emu_cuda.h). Plain C so both sides include it. */
#ifndef FLEXC_EMU_ABI_H
#define FLEXC_EMU_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever EmuLaunch changes, so a stale module is never driven. */
#define EMU_ABI_VERSION 3
/* Largest dynamic shared memory a launch may ask for (sm_90 opt-in is 227 KiB). */
#define EMU_SMEM_MAX (256u * 1024u)
/* Room for the first error of a launch. */
#define EMU_ERR_LEN 1024

/* One global-memory allocation a launch may touch. */
typedef struct EmuRange {
  uintptr_t base;        /* first byte */
  uint64_t bytes;        /* length in bytes */
  const char *name;      /* for messages ("q", "out", "dq_accum") */
} EmuRange;

/* A grid or block shape. */
typedef struct EmuDim {
  unsigned x, y, z;      /* extents, each >= 1 */
} EmuDim;

/* Everything one kernel launch needs, and what it reports back. */
typedef struct EmuLaunch {
  int abi;                        /* EMU_ABI_VERSION */
  const char *kernel;             /* entry name, for messages */
  void (*entry)(const void *);    /* NAME_emu from FLEX_EMU_ENTRY */
  const void *params;             /* the kernel's PARAMS struct */
  EmuDim grid, block;             /* launch geometry */
  uint64_t smem_bytes;            /* dynamic shared memory per block */
  const EmuRange *ranges;         /* allocations global accesses must hit */
  int nranges;                    /* entries in ranges */
  int racecheck;                  /* 1: shadow shared memory, flag races (module built with race hooks) */
  int threads;                    /* block runners (>= 1), each an item of pool_run */
  /* The host's thread pool (base_pool_run): runs fn(ctx, i, worker) for
   * i in [0, n) on its workers and returns when all are done. */
  void (*pool_run)(int64_t n, void (*fn)(void *ctx, int64_t i, int worker), void *ctx);
  uint64_t shuffle;               /* nonzero: blocks run in an order drawn from this seed */
  uint64_t stack_bytes;           /* per emulated thread */
  uint64_t blocks_run;            /* out: blocks that ran to completion */
  uint64_t tiles;                 /* out: tiles visited (emu_count_tiles) */
  char error[EMU_ERR_LEN];        /* out: first error; "" on success */
} EmuLaunch;

/* The emulator's tensor map: what cuTensorMapEncodeTiled encodes into a
 * CUtensorMap (an opaque 128-byte, 64-byte aligned object on the device),
 * in an encoding of our own. Kernels receive it by value in their
 * parameters and pass its address to the flex_tma_load_* wrappers. */
#define EMU_TMAP_MAGIC 0x544d4150u /* "TMAP" */
typedef struct __attribute__((aligned(64))) FlexTensorMap {
  uint32_t magic;        /* EMU_TMAP_MAGIC once encoded */
  uint32_t rank;         /* 1..5 */
  uint32_t elem_bytes;   /* 1, 2, 4 or 8 */
  uint32_t swizzle;      /* 0 (none), 32, 64 or 128: the span in bytes */
  uint64_t base;         /* global address of element (0, ..., 0) */
  uint64_t dims[5];      /* extent of each dimension, innermost first */
  uint64_t strides[5];   /* byte stride of each dimension (strides[0] = elem_bytes) */
  uint32_t box[5];       /* the box a load copies, innermost first */
} FlexTensorMap;

/* cuTensorMapEncodeTiled's rules (tiled mode, element strides 1, no
 * interleave): returns NULL, or what is wrong. `strides` holds the byte
 * strides of dimensions 1..rank-1, as the driver's globalStrides. */
static inline const char *emu_tensor_map_encode(FlexTensorMap *m, uint32_t elem_bytes, uint32_t rank,
                                                const void *base, const uint64_t *dims,
                                                const uint64_t *strides, const uint32_t *box,
                                                uint32_t swizzle) {
  uint32_t i;
  for (i = 0; i < sizeof *m; i++) ((unsigned char *)m)[i] = 0;
  if (rank < 1 || rank > 5) return "rank must be 1..5";
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8)
    return "element size must be 1, 2, 4 or 8 bytes";
  if ((uintptr_t)base % 16) return "global address must be 16-byte aligned";
  if (swizzle != 0 && swizzle != 32 && swizzle != 64 && swizzle != 128)
    return "swizzle must be none, 32, 64 or 128 bytes";
  for (i = 0; i < rank; i++) {
    if (dims[i] == 0 || dims[i] > (1ull << 32)) return "every global dimension must be 1..2^32";
    if (box[i] == 0 || box[i] > 256) return "every box dimension must be 1..256";
    if (i > 0 && (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)))
      return "global strides must be multiples of 16 below 2^40";
  }
  if (box[0] * elem_bytes % 16) return "the box's inner dimension must be a multiple of 16 bytes";
  if (swizzle && box[0] * elem_bytes > swizzle)
    return "with a swizzle the box's inner dimension must not exceed the swizzle span";
  m->magic = EMU_TMAP_MAGIC, m->rank = rank, m->elem_bytes = elem_bytes, m->swizzle = swizzle;
  m->base = (uint64_t)(uintptr_t)base;
  for (i = 0; i < rank; i++) {
    m->dims[i] = dims[i], m->box[i] = box[i];
    m->strides[i] = i == 0 ? elem_bytes : strides[i - 1];
  }
  return 0;
}

/* The module's exported launcher ("emu_launch"): 0 on success, else -1 with
 * L->error set. */
typedef int (*EmuLaunchFn)(EmuLaunch *L);

#ifdef __cplusplus
}
#endif
#endif
