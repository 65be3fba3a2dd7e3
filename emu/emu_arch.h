/* emu_arch.h: the arch wrappers of kernels/arch.cuh, emulated on the CPU.
 * Same names and signatures as the device versions (see the kernel
 * contract); semantics from the PTX ISA's fragment layouts:
 *
 *   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
 *     g = lane / 4, t = lane % 4; each register holds two 16-bit values,
 *     the lower column (or row) in bits 0..15.
 *     A (16x16, row): a[0] = A[g][2t..2t+1]     a[1] = A[g+8][2t..2t+1]
 *                     a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
 *     B (16x8, col):  b[0] = B[2t..2t+1][g]     b[1] = B[2t+8..2t+9][g]
 *     C, D (16x8 f32): c[0..1] = C[g][2t..2t+1] c[2..3] = C[g+8][2t..2t+1]
 *   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
 *     lanes 8i..8i+7 give the row addresses of matrix i (16 bytes per row);
 *     r[i] of lane l = M_i[l/4][2(l%4)..2(l%4)+1] (.trans: M_i^T).
 *   stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: the inverse (lane 4g+t
 *     holds M_i[g][2t..2t+1] in r[i]; .trans stores M_i^T).
 *   cp.async.cg.shared.global 16 bytes: source read at issue, destination
 *     poisoned until the copy's commit group is waited for; both addresses
 *     16-byte aligned, also for a zero fill (src-size 0).
 * Hardware rules enforced besides: mma and ldmatrix are .aligned (every
 * lane of the warp at the same instruction: a call under a per-lane branch
 * fails, see EmuReq.site); ldmatrix rows are 16-byte aligned shared memory.
 */
#ifndef FLEXC_EMU_ARCH_H
#define FLEXC_EMU_ARCH_H

#include "emu_cuda.h"

/* ---- fp16 / bf16 conversions (round to nearest even, as cvt.rn) --------------- */

EMU_NOSAN static inline uint32_t emu_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
EMU_NOSAN static inline float emu_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* fp32 -> fp16 bits. NaN gives the canonical 0x7FFF, like the device. */
EMU_NOSAN static inline uint16_t flex_f2h(float f) {
  uint32_t x = emu_f2u(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fff;
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (ax >= 0x38800000u) {                                    /* normal: >= 2^-14 */
    uint32_t m = ax + 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((m - 0x38000000u) >> 13));
  }
  if (ax <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25 rounds to zero */
  uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e; /* value / 2^-24 = mant >> shift */
  uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

/* fp16 bits -> fp32 (exact). */
EMU_NOSAN static inline float flex_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return emu_u2f(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    return sign ? -v : v;
  }
  return emu_u2f(sign | ((e + 112) << 23) | (m << 13));
}

/* fp32 -> bf16 bits. NaN gives the canonical 0x7FFF. */
EMU_NOSAN static inline uint16_t flex_f2bf(float f) {
  uint32_t x = emu_f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bf16 bits -> fp32 (exact). */
EMU_NOSAN static inline float flex_bf2f(uint16_t b) { return emu_u2f((uint32_t)b << 16); }

EMU_NOSAN static inline uint32_t flex_pack_h2(float lo, float hi) {
  return (uint32_t)flex_f2h(lo) | ((uint32_t)flex_f2h(hi) << 16);
}
EMU_NOSAN static inline uint32_t flex_pack_bf2(float lo, float hi) {
  return (uint32_t)flex_f2bf(lo) | ((uint32_t)flex_f2bf(hi) << 16);
}

/* ---- global memory ---------------------------------------------------------- */

template <class T> EMU_NOSAN static inline T flex_gload(const T *p) {
  emu_check_global(p, sizeof(T), "global read");
  return *p;
}
template <class T> EMU_NOSAN static inline void flex_gstore(T *p, T v) {
  emu_check_global(p, sizeof(T), "global write");
  *p = v;
}
/* Fast math: the hardware's approximations (tanh.approx.f32, __expf and
 * friends) are not modelled; the exact values stand in, so the emulator
 * checks the wiring, not the ulps. */
static inline float flex_approx_exp(float x) { return expf(x); }
static inline float flex_approx_log(float x) { return logf(x); }
static inline float flex_approx_log2(float x) { return log2f(x); }
static inline float flex_approx_tanh(float x) { return tanhf(x); }
static inline float flex_approx_sin(float x) { return sinf(x); }
static inline float flex_approx_cos(float x) { return cosf(x); }
static inline float flex_approx_pow(float x, float y) { return powf(x, y); }
static inline float flex_approx_div(float x, float y) { return x / y; }
/* rcp.approx.ftz.f32: the exact reciprocal, subnormal operands and results
 * flushed to zero of their sign. */
static inline float flex_rcp(float x) {
  const float r = 1.0f / (fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x);
  return fabsf(r) < 1.17549435e-38f ? copysignf(0.0f, r) : r;
}
/* The softmax's 2^x (ex2.approx.ftz.f32): the exact value, with results
 * below the smallest normal flushed to zero as .ftz does. */
static inline float flex_ex2(float x) {
  const float r = exp2f(x);
  return r < 1.17549435e-38f ? 0.0f : r;
}

/* max.NaN.f32: a NaN operand gives NaN, else the larger (fmaxf otherwise). */
static inline float flex_max_nan(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }

/* Blocks may run on several OS threads: a real atomic. */
EMU_API static int32_t flex_atomic_cas(int32_t *p, int32_t cmp, int32_t v) {
  emu_check_global(p, sizeof(int32_t), "atomic compare-and-swap");
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp; /* the old value */
}
EMU_API static void flex_atomic_max_u64(uint64_t *p, uint64_t v) {
  emu_check_global(p, sizeof(uint64_t), "atomic max");
  uint64_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
}
EMU_API static void flex_atomic_add_i64(int64_t *p, int64_t v) {
  emu_check_global(p, sizeof(int64_t), "atomic add");
  __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
EMU_API static void flex_atomic_or_u64(uint64_t *p, uint64_t v) {
  emu_check_global(p, sizeof(uint64_t), "atomic or");
  __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
EMU_API static void flex_atomic_add(float *p, float v) {
  emu_check_global(p, sizeof(float), "atomic add");
  uint32_t *u = (uint32_t *)p;
  uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
  do {
    nw = emu_f2u(emu_u2f(old) + v);
  } while (!__atomic_compare_exchange_n(u, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

static inline void flex_atomic_add_below(float *p, float v, int i, int lim) {
  if (i < lim) flex_atomic_add(p, v);
}

/* ---- mma.sync m16n8k16 ------------------------------------------------------- */

/* Gather A, B, C from the lanes' fragments, D = A B + C, scatter D. All
 * inputs are read before any output is written (d may alias c). */
EMU_NOSAN static void emu_mma_fn(EmuReq **lanes, int n, float (*cvt)(uint16_t)) {
  if (n != 32) {
    emu_fail_tid(lanes[0]->tid, "mma.sync needs a full warp, this one has %d lanes", n);
    return;
  }
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    const uint32_t *a = (const uint32_t *)lanes[l]->a, *b = (const uint32_t *)lanes[l]->b;
    const float *c = (const float *)lanes[l]->c;
    int g = l >> 2, t = l & 3;
    for (int j = 0; j < 2; j++) {
      A[g][2 * t + j] = cvt((uint16_t)(a[0] >> (16 * j)));
      A[g + 8][2 * t + j] = cvt((uint16_t)(a[1] >> (16 * j)));
      A[g][2 * t + 8 + j] = cvt((uint16_t)(a[2] >> (16 * j)));
      A[g + 8][2 * t + 8 + j] = cvt((uint16_t)(a[3] >> (16 * j)));
      B[2 * t + j][g] = cvt((uint16_t)(b[0] >> (16 * j)));
      B[2 * t + 8 + j][g] = cvt((uint16_t)(b[1] >> (16 * j)));
      C[g][2 * t + j] = c[j];
      C[g + 8][2 * t + j] = c[2 + j];
    }
  }
  for (int l = 0; l < 32; l++) {
    float *d = (float *)lanes[l]->out;
    int g = l >> 2, t = l & 3;
    for (int k = 0; k < 4; k++) {
      int row = g + 8 * (k >> 1), col = 2 * t + (k & 1);
      double acc = C[row][col];
      for (int i = 0; i < 16; i++) acc += (double)A[row][i] * (double)B[i][col];
      d[k] = (float)acc;
    }
  }
}
EMU_NOSAN static void emu_mma_f16_fn(EmuReq **lanes, int n) { emu_mma_fn(lanes, n, flex_h2f); }
EMU_NOSAN static void emu_mma_bf16_fn(EmuReq **lanes, int n) { emu_mma_fn(lanes, n, flex_bf2f); }

/* The wrappers are always inlined, so the return address names the
 * kernel's call site (the .aligned rule: one instruction per warp). */
#define EMU_ALIGNED_OP static inline __attribute__((always_inline))
EMU_API static void emu_mma(EmuWarpFn fn, const char *name, float d[4], const uint32_t a[4],
                            const uint32_t b[2], const float c[4]) {
  EmuReq r = {};
  r.fn = fn, r.name = name, r.mask = 0xffffffffu, r.a = a, r.b = b, r.c = c, r.out = d;
  r.site = __builtin_return_address(0);
  emu_warp_op(&r);
}
EMU_ALIGNED_OP void flex_mma_f16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu_mma(emu_mma_f16_fn, "mma.sync.m16n8k16.f16", d, a, b, c);
}
EMU_ALIGNED_OP void flex_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu_mma(emu_mma_bf16_fn, "mma.sync.m16n8k16.bf16", d, a, b, c);
}

/* ---- ldmatrix ----------------------------------------------------------------- */

/* r->arg: number of matrices; r->width: 1 for .trans. */
EMU_NOSAN static void emu_ldmatrix_fn(EmuReq **lanes, int n) {
  int count = lanes[0]->arg, trans = lanes[0]->width;
  if (n != 32) {
    emu_fail_tid(lanes[0]->tid, "ldmatrix needs a full warp, this one has %d lanes", n);
    return;
  }
  uint16_t M[4][8][8];
  for (int m = 0; m < count; m++) {
    for (int row = 0; row < 8; row++) {
      EmuReq *src = lanes[8 * m + row];
      if (src->arg != count || src->width != trans) {
        emu_fail_tid(src->tid, "ldmatrix variants differ across the warp");
        return;
      }
      const void *p = src->c;
      uintptr_t a = (uintptr_t)p, s = (uintptr_t)emu_w->smem;
      if (a < s || a + 16 > s + emu_L->smem_bytes || (a & 15)) {
        emu_fail_tid(src->tid, "ldmatrix row address %p (matrix %d, row %d) is not a 16-byte aligned "
                               "row inside the block's %llu bytes of shared memory",
                     p, m, row, (unsigned long long)emu_L->smem_bytes);
        return;
      }
      emu_shadow_access(src->tid, a - s, 16, false);
      memcpy(M[m][row], p, 16);
    }
  }
  for (int l = 0; l < 32; l++) {
    uint32_t *r = (uint32_t *)lanes[l]->out;
    int g = l >> 2, t = l & 3;
    for (int m = 0; m < count; m++) {
      uint16_t lo = trans ? M[m][2 * t][g] : M[m][g][2 * t];
      uint16_t hi = trans ? M[m][2 * t + 1][g] : M[m][g][2 * t + 1];
      r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
  }
}

EMU_API static void emu_ldmatrix(uint32_t *r, const void *smem, int count, int trans) {
  static const char *names[2][5] = {
      {"", "ldmatrix.x1", "ldmatrix.x2", "", "ldmatrix.x4"},
      {"", "ldmatrix.x1.trans", "ldmatrix.x2.trans", "", "ldmatrix.x4.trans"}};
  EmuReq q = {};
  q.fn = emu_ldmatrix_fn, q.name = names[trans][count], q.mask = 0xffffffffu;
  q.arg = count, q.width = trans, q.c = smem, q.out = r;
  q.site = __builtin_return_address(0);
  emu_warp_op(&q);
}
EMU_ALIGNED_OP void flex_ldmatrix_x1(uint32_t r[1], const void *s) { emu_ldmatrix(r, s, 1, 0); }
EMU_ALIGNED_OP void flex_ldmatrix_x2(uint32_t r[2], const void *s) { emu_ldmatrix(r, s, 2, 0); }
EMU_ALIGNED_OP void flex_ldmatrix_x4(uint32_t r[4], const void *s) { emu_ldmatrix(r, s, 4, 0); }
EMU_ALIGNED_OP void flex_ldmatrix_x1_trans(uint32_t r[1], const void *s) { emu_ldmatrix(r, s, 1, 1); }
EMU_ALIGNED_OP void flex_ldmatrix_x2_trans(uint32_t r[2], const void *s) { emu_ldmatrix(r, s, 2, 1); }
EMU_ALIGNED_OP void flex_ldmatrix_x4_trans(uint32_t r[4], const void *s) { emu_ldmatrix(r, s, 4, 1); }
/* 32-bit shared addresses, as cvta.to.shared gives them: offsets into this
 * block's shared memory (checked where they are used). */
static inline uint32_t flex_smem_addr(const void *p) {
  return (uint32_t)emu_smem_offset(p, 0, "shared address");
}
static inline unsigned char *emu_smem_at(uint32_t a) { return emu_w->smem + a; }
/* st.shared.v2.f32 at a 32-bit shared address: in shared memory, 8-byte aligned. */
EMU_API static void flex_sts_f32x2_a(uint32_t a, float x, float y) {
  if ((uint64_t)a + 8 > emu_L->smem_bytes)
    emu_fail("st.shared.v2.f32 of 8 bytes at shared offset %u is outside the block's %llu bytes of shared memory",
             a, (unsigned long long)emu_L->smem_bytes);
  else if (a % 8)
    emu_fail("st.shared.v2.f32: shared offset %u is not 8-byte aligned", a);
  else {
    float v[2] = {x, y};
    memcpy(emu_smem_at(a), v, 8);
  }
}

/* ld.shared.v4.f32 at a 32-bit shared address: in shared memory, 16-byte aligned. */
EMU_API static void flex_lds_f32x4(float v[4], uint32_t a) {
  if ((uint64_t)a + 16 > emu_L->smem_bytes)
    emu_fail("ld.shared.v4.f32 of 16 bytes at shared offset %u is outside the block's %llu bytes of shared memory",
             a, (unsigned long long)emu_L->smem_bytes);
  else if (a % 16)
    emu_fail("ld.shared.v4.f32: shared offset %u is not 16-byte aligned", a);
  else
    memcpy(v, emu_smem_at(a), 16);
}
EMU_ALIGNED_OP void flex_ldsm_x4(uint32_t r[4], uint32_t a) { emu_ldmatrix(r, emu_smem_at(a), 4, 0); }
EMU_ALIGNED_OP void flex_ldsm_x4_trans(uint32_t r[4], uint32_t a) {
  emu_ldmatrix(r, emu_smem_at(a), 4, 1);
}

/* ---- stmatrix (sm_90) --------------------------------------------------------- */

/* stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: ldmatrix's inverse.
 * Lane 4 g + t holds M_i[g][2t..2t+1] in register i; lanes 8i..8i+7 give
 * the row addresses of matrix i; .trans stores M_i^T. r->width: 1 for
 * .trans. Every register is read before any row is written. */
EMU_NOSAN static void emu_stmatrix_fn(EmuReq **lanes, int n) {
  int trans = lanes[0]->width;
  if (n != 32) {
    emu_fail_tid(lanes[0]->tid, "stmatrix needs a full warp, this one has %d lanes", n);
    return;
  }
  uint16_t M[4][8][8];
  for (int l = 0; l < 32; l++) {
    if (lanes[l]->width != trans) {
      emu_fail_tid(lanes[l]->tid, "stmatrix variants differ across the warp");
      return;
    }
    const uint32_t *r = (const uint32_t *)lanes[l]->a;
    for (int m = 0; m < 4; m++)
      for (int c = 0; c < 2; c++) M[m][l >> 2][2 * (l & 3) + c] = (uint16_t)(r[m] >> (16 * c));
  }
  for (int m = 0; m < 4; m++)
    for (int row = 0; row < 8; row++) {
      EmuReq *dst = lanes[8 * m + row];
      uint32_t a = (uint32_t)(uintptr_t)dst->c;
      if ((uint64_t)a + 16 > emu_L->smem_bytes || (a & 15)) {
        emu_fail_tid(dst->tid, "stmatrix row address %u (matrix %d, row %d) is not a 16-byte aligned "
                               "row inside the block's %llu bytes of shared memory",
                     a, m, row, (unsigned long long)emu_L->smem_bytes);
        return;
      }
      emu_shadow_access(dst->tid, a, 16, true);
      uint16_t v[8];
      for (int k = 0; k < 8; k++) v[k] = trans ? M[m][k][row] : M[m][row][k];
      memcpy(emu_smem_at(a), v, 16);
    }
}

EMU_ALIGNED_OP void flex_stsm_x4_trans(uint32_t a, const uint32_t r[4]) {
  EmuReq q = {};
  q.fn = emu_stmatrix_fn, q.name = "stmatrix.x4.trans", q.mask = 0xffffffffu;
  q.width = 1, q.c = (const void *)(uintptr_t)a, q.a = r;
  q.site = __builtin_return_address(0);
  emu_warp_op(&q);
}

/* ---- cp.async ----------------------------------------------------------------- */

EMU_API static void flex_cp_async_16(void *smem, const void *gmem, bool pred) {
  EmuFiber *f = emu_cur;
  emu_smem_offset(smem, 16, "cp.async destination");
  if ((uintptr_t)smem & 15) emu_fail("cp.async destination %p is not 16-byte aligned", smem);
  /* .cg copies 16 bytes between 16-byte aligned addresses, also with
   * src-size 0 (the zero fill reads nothing, but the operand is still one). */
  if ((uintptr_t)gmem & 15) emu_fail("cp.async source %p is not 16-byte aligned", gmem);
  EmuCopy c;
  c.dst = (unsigned char *)smem;
  c.group = f->committed;
  if (pred) {
    emu_check_global(gmem, 16, "cp.async read");
    memcpy(c.data, gmem, 16);
  } else {
    memset(c.data, 0, 16);
  }
  memset(smem, 0xFF, 16); /* reading before the wait sees poison */
  /* The copy may land any time from now until the wait: for the race check
   * it writes the destination both now and when it lands. */
  if (emu_w->shadow) emu_shadow_access(f->tid, (size_t)(c.dst - emu_w->smem), 16, true);
  f->copies.push_back(c);
}
static inline void flex_cp_async_16_ap(uint32_t smem, const void *gmem, bool pred) {
  flex_cp_async_16(emu_smem_at(smem), gmem, pred);
}
static inline void flex_cp_async_16_a(uint32_t smem, const void *gmem) {
  flex_cp_async_16(emu_smem_at(smem), gmem, true);
}

EMU_API static void flex_cp_async_commit(void) { emu_cur->committed++; }

/* Land every copy of the committed groups except the newest `pending`. */
EMU_API static void emu_cp_async_wait(uint64_t pending) {
  EmuFiber *f = emu_cur;
  size_t keep = 0;
  for (size_t i = 0; i < f->copies.size(); i++) {
    EmuCopy &c = f->copies[i];
    if (c.group + pending < f->committed) {
      memcpy(c.dst, c.data, 16);
      if (emu_w->shadow) emu_shadow_access(f->tid, (size_t)(c.dst - emu_w->smem), 16, true);
    } else {
      f->copies[keep++] = c;
    }
  }
  f->copies.resize(keep);
}
template <int N> static inline void flex_cp_async_wait(void) { emu_cp_async_wait((uint64_t)N); }

/* ---- sm_90a: mbarrier, TMA, wgmma, setmaxnreg, elect ---------------------------- */

#include "emu_sm90.h"

#endif
