/* emu_host.h: the runtime's side of the emulator (C): build a module from
 * CUDA source with the host C++ compiler, load it, launch its kernels.
 *
 *   build.c    compile (g++ + the embedded shim) into the module store
 *              (base/store.h), load from it (dlopen), launch
 *   emu.c      the backend's verbs (runtime/backend.h) on top of codegen
 */
#ifndef FLEXC_EMU_HOST_H
#define FLEXC_EMU_HOST_H

#include <stdbool.h>

#include "base/base.h"
#include "emu/emu_abi.h"
#include "runtime/flex.h"

/* A compiled, loaded emulator module (lives until the process ends). */
typedef struct EmuModule EmuModule;

/* Build options (part of the store key). */
typedef struct EmuBuildOpts {
  bool racecheck;    /* instrument shared-memory accesses and flag races */
} EmuBuildOpts;

/* The module of `source` (one CUDA translation unit that includes the
 * embedded headers by name): the one this process loaded already, else its
 * shared object from the module store, else compiled, stored and loaded. On
 * failure the compiler's output goes to *log (may be NULL) and the status is
 * FLEX_ERR_COMPILE. Thread-safe. */
flex_status emu_module_get(EmuModule **out, const char *source, const EmuBuildOpts *opts, Buf *log);

/* For tests: unload every module and forget the compiler's identity, so
 * the next emu_module_get of each asks the compiler again and loads the
 * module from the store or builds it afresh. No launch may be running. */
void emu_modules_forget(void);

/* Whether the host C++ compiler ($FLEXC_EMU_CXX, else c++) can be found. */
bool emu_compiler_available(void);

/* Launch kernel L->kernel of module `m`: fills abi, entry, racecheck and, when
 * zero, threads ($FLEXC_THREADS or 2) and stack_bytes (256 KiB). On a
 * failure L->error (and *log, if given) say what happened; the status is
 * FLEX_ERR_RUNTIME (or FLEX_ERR_INVALID for an unknown entry). */
flex_status emu_module_launch(EmuModule *m, EmuLaunch *L, Buf *log);

#endif
