/* kern_avx2.c: cpu/kern.h for AVX2 + FMA (8 floats a vector, 6-row blocks). */
#pragma GCC target("avx2,fma,f16c")
#define VW 8
#define MR 6
#define KERN_NAME "avx2"
#define KERN_TABLE cpu_kern_avx2
#define KERN_VMATH_W 8
#include "cpu/kern.h"
