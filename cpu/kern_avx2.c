/* kern_avx2.c: cpu/kern.h for AVX2 + FMA (8 floats a vector, 6-row blocks). */
#pragma GCC target("avx2,fma,f16c")
#define VW 8
#define MR 6
#define KERN_NAME "avx2"
#define KERN_TABLE cpu_kern_avx2
#define KERN_TANH cpu_tanh_v8
#define KERN_TANH_FN cpu_tanh_v8_fn
#include "cpu/kern.h"
