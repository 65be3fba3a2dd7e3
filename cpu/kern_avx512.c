/* kern_avx512.c: cpu/kern.h for AVX-512 (16 floats a vector, 8-row blocks). */
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma,f16c")
#define VW 16
#define MR 8
#define KERN_NAME "avx512"
#define KERN_TABLE cpu_kern_avx512
#define KERN_VMATH_W 16
#include "cpu/kern.h"
