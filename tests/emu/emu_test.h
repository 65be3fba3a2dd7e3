/* emu_test.h: the parameter struct of the emulator's test kernels, shared
 * by tests/emu/check_emu.c (C) and the .cu files of tests/emu (the suite prepends this file
 * to the kernel sources and compiles them as one module). */
#ifndef FLEXC_EMU_TEST_H
#define FLEXC_EMU_TEST_H

#include <stdint.h>

/* Every test kernel takes one of these; unused fields stay zero. */
typedef struct EmuTestParams {
  const void *in, *in2, *in3; /* inputs */
  void *out, *out2, *out3;    /* outputs */
  int32_t n;                  /* element count */
  int32_t mode;               /* kernel-specific switch */
} EmuTestParams;

#endif
