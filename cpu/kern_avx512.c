/* kern_avx512.c: cpu/kern.h for AVX-512 (16 floats a vector, 8-row blocks). */
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma,f16c")
#define VW 16
#define MR 8
#define KERN_NAME "avx512"
#define KERN_TABLE cpu_kern_avx512
#define KERN_TANH cpu_tanh_v16
#define KERN_TANH_FN cpu_tanh_v16_fn
#include "cpu/kern.h"
