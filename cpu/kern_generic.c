/* kern_generic.c: cpu/kern.h for any x86-64 (SSE2: 4 floats a vector), and
 * cpu_kern(), which picks the best table this CPU runs (AVX512-BF16,
 * AVX-512, AVX2 + FMA, baseline). */
#define VW 4
#define MR 6
#define KERN_NAME "generic"
#define KERN_TABLE cpu_kern_generic
#define KERN_VMATH_W 4
#include "cpu/kern.h"

#include <stdatomic.h>
#include <stdlib.h>

const CpuKern *cpu_kern(void) {
  static _Atomic(const CpuKern *) best; /* every thread computes the same answer */
  const CpuKern *known = atomic_load(&best);
  if (known) return known;
  /* "avx512", "avx2" or "generic": a lower table than the CPU runs, so that
   * tests reach every one on a machine that has the best */
  const char *force = base_config()->cpu_isa;
  const CpuKern *k = &cpu_kern_generic;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) k = &cpu_kern_avx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
    k = &cpu_kern_avx512;
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16"))
      k = &cpu_kern_avx512bf16;
  }
  if (force && !strcmp(force, "avx512") && k == &cpu_kern_avx512bf16) k = &cpu_kern_avx512;
  if (force && !strcmp(force, "avx2") && (k == &cpu_kern_avx512 || k == &cpu_kern_avx512bf16))
    k = &cpu_kern_avx2;
#endif
  if (force && !strcmp(force, "generic")) k = &cpu_kern_generic;
  atomic_store(&best, k);
  return k;
}
