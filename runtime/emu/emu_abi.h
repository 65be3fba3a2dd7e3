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
#define EMU_ABI_VERSION 1
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
  int threads;                    /* OS threads running blocks (>= 1) */
  uint64_t stack_bytes;           /* per emulated thread */
  uint64_t blocks_run;            /* out: blocks that ran to completion */
  uint64_t tiles;                 /* out: emu_count_tile() calls (tiles visited) */
  char error[EMU_ERR_LEN];        /* out: first error; "" on success */
} EmuLaunch;

/* The module's exported launcher ("emu_launch"): 0 on success, else -1 with
 * L->error set. */
typedef int (*EmuLaunchFn)(EmuLaunch *L);

#ifdef __cplusplus
}
#endif
#endif
