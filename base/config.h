/* config.h: every FLEXC_* environment variable, read in one place.
 *
 * BASE_CONFIG is the table: (NAME, field, kind, meaning). base_config()
 * reads them all into one BaseConfig; nothing else in the library calls
 * getenv for a FLEXC_ variable. docs/config.md lists the same table (a test
 * compares the two). Kinds: STR is the text ("" when unset), INT the
 * number (0 when unset or not a number), FLAG true when set to anything
 * but "" or "0".
 */
#ifndef FLEXC_CONFIG_H
#define FLEXC_CONFIG_H

#include <stdbool.h>

#define BASE_CONFIG(X)                                                                           \
  X(THREADS, threads, INT, "worker threads of the one thread pool (CPU backend, BlockMask "       \
                           "builder, emulator); unset: every online core")                        \
  X(CACHE_DIR, cache_dir, STR, "the compiled-module store's directory; \"off\": memory only; "    \
                               "unset: $XDG_CACHE_HOME/flexc, else ~/.cache/flexc")               \
  X(CACHE_LOG, cache_log, STR, "a file that gets a line per compiled-kernel lookup memory did not " \
                               "serve (disk hit or miss): the GPU run counts them")              \
  X(TILES, tiles, STR, "tile shapes overriding the tile table, \"fwd=BMxBNxW,bwd=BMxBNxW\"")      \
  X(BWD_SPLITS, bwd_splits, INT, "a deterministic backward's dQ slices (key tile groups)")        \
  X(PACK_GQA, pack_gqa, STR, "\"0\": never pack the query heads of a group into one tile")        \
  X(CUDA_SM90_FWD, cuda_sm90_fwd, FLAG, "cuda on compute capability 9.0: the sm_90a forward")     \
  X(CUDA_SM90_BWD, cuda_sm90_bwd, FLAG, "cuda on compute capability 9.0: the sm_90a backward")    \
  X(CUDA_WATCHDOG, cuda_watchdog, FLAG, "cuda: an mbarrier wait of the sm_90a kernels that lasts "  \
                                        "2^33 cycles prints where and traps (a hang found)")      \
  X(LIBCUDA, libcuda, STR, "the driver library to dlopen (default libcuda.so.1)")                 \
  X(EMU_CXX, emu_cxx, STR, "the emulator's host C++ compiler (default c++)")                      \
  X(EMU_RACECHECK, emu_racecheck, FLAG, "emulator modules that check shared-memory races")        \
  X(EMU_SHUFFLE, emu_shuffle, STR, "emulator: run blocks in an order drawn from this seed")       \
  X(CPU_ISA, cpu_isa, STR, "cpu backend: force a kernel set (generic, avx2, avx512, avx512bf16)") \
  X(CPU_PACK_MB, cpu_pack_mb, INT, "cpu backend: MB of packed K/V per chunk of kv heads (64)")    \
  X(CPU_QGROUP, cpu_qgroup, INT, "cpu backend: query tiles per forward group (1 to 8)")           \
  X(CPU_KVCHUNK, cpu_kvchunk, INT, "cpu backend: key tiles per forward chunk")                    \
  X(CPU_DUMP_IR, cpu_dump_ir, FLAG, "cpu backend: print each JIT module's LLVM IR to stderr")

#define BASE_CONFIG_FIELD_STR(f) char f[1024];
#define BASE_CONFIG_FIELD_INT(f) long f;
#define BASE_CONFIG_FIELD_FLAG(f) bool f;
#define BASE_CONFIG_FIELD(name, f, kind, doc) BASE_CONFIG_FIELD_##kind(f)

/* The variables' values at the time of a base_config() call. */
typedef struct BaseConfig {
  BASE_CONFIG(BASE_CONFIG_FIELD)
} BaseConfig;

/* The environment now, in a copy of this thread's (valid until its next
 * call). Cheap enough to call once per API call; the values may change
 * between calls (tests set them). */
const BaseConfig *base_config(void);

#endif
