/* kern_avx512bf16.c: cpu/kern.h for AVX-512 with AVX512-BF16: the fp32
 * kernels of kern_avx512.c plus the bf16 products (vdpbf16ps) that the
 * forward uses for bf16 inputs. */
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx512bf16,avx2,fma,f16c")
#define VW 16
#define MR 8
#define KERN_BF16 1
#define KERN_NAME "avx512bf16"
#define KERN_TABLE cpu_kern_avx512bf16
#include "cpu/kern.h"
