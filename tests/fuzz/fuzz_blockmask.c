/* libFuzzer target: a caller's BlockMask (flex_block_mask: PyTorch's
 * layout, eight int32 tensors) as validation meets it. The input gives the
 * call's sizes, the block sizes, which arrays are there (and whether B and
 * H broadcast, or a dimension is off by one), then the arrays' int32
 * values. The reference backend runs the forward and the backward of a
 * small call with it: the mask is refused with FLEX_ERR_INVALID and a
 * message, or accepted; then the cpu backend must accept it too and give
 * the reference's O and LSE (fp32 tolerance), so that a mask the checks let
 * through means the same on both. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "runtime/flex.h"

static void die(const char *what, const char *msg) { fuzz_die("fuzz_blockmask", what, msg); }

/* The input, read from the front; zeros past its end. */
typedef struct In {
  const uint8_t *p;
  size_t n;
} In;

static unsigned byte(In *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}

static int32_t word(In *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)byte(in) << (8 * i);
  return (int32_t)v;
}

/* A small int most of the time (valid counts and indices), any int32 sometimes. */
static int32_t value(In *in, int32_t range) {
  int32_t w = word(in);
  return (w & 0x70000000) ? (int32_t)((uint32_t)w % (uint32_t)(range + 2)) - 1 : w;
}

static DLTensor tensor(void *data, DLDataType dt, int nd, int64_t *shape) {
  DLTensor t = {0};
  t.data = data, t.device = (DLDevice){kDLCPU, 0}, t.ndim = nd, t.dtype = dt, t.shape = shape;
  return t;
}

static flex_kernel *kernels[2];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!kernels[0]) {
    static const char causal[] = "mask m(b, h, q, kv) { return q >= kv; }\n";
    static const char plain[] = "score f(s, b, h, q, kv) { return s * 0.5; }\n";
    if (flex_kernel_from_source(&kernels[0], "causal", causal, sizeof causal - 1, NULL) ||
        flex_kernel_from_source(&kernels[1], "plain", plain, sizeof plain - 1, NULL))
      die("kernels", flex_last_error());
  }
  In in = {data, size};
  static const int blocks[8] = {16, 32, 64, 128, 0, 48, 1, -16};
  unsigned f0 = byte(&in), f1 = byte(&in), f2 = byte(&in);
  int B = 1 + (int)(f0 & 1), H = 1 + (int)(f0 >> 1 & 1), QL = (int)byte(&in), KL = (int)byte(&in);
  int bq = blocks[f1 & 7], bk = blocks[f1 >> 3 & 7], E = 4;
  flex_kernel *k = kernels[f1 >> 6 & 1];
  int nq = bq > 0 ? (QL + bq - 1) / bq : (QL + 127) / 128,
      nkv = bk > 0 ? (KL + bk - 1) / bk : (KL + 127) / 128;
  int Bm = f0 & 4 ? 1 : B, Hm = f0 & 8 ? 1 : H; /* broadcast */
  bool full = f0 & 16, qside = f0 & 32, off = f0 & 64;
  /* The eight arrays: counts [Bm, Hm, rows], indices [Bm, Hm, rows, cols]. */
  int32_t *arr[8] = {0};
  int64_t shape[8][4];
  DLTensor t[8];
  const DLTensor *tp[8] = {0};
  DLDataType i32 = {kDLInt, 32, 1};
  for (int i = 0; i < 8; i++) {
    bool want = i < 2 || (i < 4 && full) || (i >= 4 && qside && (i < 6 || full));
    if (!want) continue;
    bool kvside = i < 4, idx = i % 2;
    int rows = kvside ? nq : nkv, cols = kvside ? nkv : nq;
    int64_t *s = shape[i];
    s[0] = Bm, s[1] = Hm, s[2] = rows, s[3] = cols;
    if (off && (f2 & 7) == i) s[f2 >> 3 & 3] += f2 & 32 ? 1 : -1; /* one extent off */
    int nd = idx ? 4 : 3;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= s[d] > 0 ? s[d] : 0;
    if (n > 1 << 16) goto out; /* too big to be interesting */
    arr[i] = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int64_t e = 0; e < n; e++) arr[i][e] = value(&in, idx ? cols : cols + 1);
    t[i] = tensor(arr[i], i32, nd, s);
    tp[i] = &t[i];
  }
  if (f2 & 64) t[f2 & 1].dtype = (DLDataType){kDLInt, 64, 1}; /* a wrong dtype */
  flex_block_mask bm = {bq, bk, tp[0], tp[1], tp[2], tp[3], tp[4], tp[5], tp[6], tp[7]};
  /* a small call: q, k, v, dout random-ish from the input, fp32 */
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, H, KL, E}, ls[3] = {B, H, QL};
  size_t nqe = (size_t)B * H * QL * E, nke = (size_t)B * H * KL * E, nl = (size_t)B * H * QL;
  float *buf = calloc(3 * nqe + 2 * nke + 2 * nqe + 3 * nke + 2 * nl + 8, sizeof(float));
  float *q = buf, *kk = q + nqe, *v = kk + nke, *o = v + nke, *dout = o + nqe, *dq = dout + nqe;
  float *dk = dq + nqe, *dv = dk + nke, *lse = dv + nke, *o2 = lse + nl, *lse2 = o2 + nqe;
  for (size_t i = 0; i < nqe; i++) q[i] = (float)((int)(i * 7 % 13) - 6) * 0.25f, dout[i] = 0.5f;
  for (size_t i = 0; i < nke; i++) kk[i] = (float)((int)(i * 5 % 11) - 5) * 0.25f, v[i] = (float)(i % 9);
  DLDataType f32 = {kDLFloat, 32, 1};
  DLTensor tq = tensor(q, f32, 4, qs), tk = tensor(kk, f32, 4, ks), tv = tensor(v, f32, 4, ks);
  DLTensor to = tensor(o, f32, 4, qs), tl = tensor(lse, f32, 3, ls), tdo = tensor(dout, f32, 4, qs);
  DLTensor tdq = tensor(dq, f32, 4, qs), tdk = tensor(dk, f32, 4, ks), tdv = tensor(dv, f32, 4, ks);
  DLTensor to2 = tensor(o2, f32, 4, qs), tl2 = tensor(lse2, f32, 3, ls);
  flex_args a = {0};
  a.backend = FLEX_BACKEND_REFERENCE;
  a.q = &tq, a.k = &tk, a.v = &tv, a.out = &to, a.lse = &tl, a.dout = &tdo, a.dq = &tdq, a.dk = &tdk,
  a.dv = &tdv;
  a.block_mask = &bm;
  flex_status st = flex_forward(k, &a);
  if (st != FLEX_OK && (st != FLEX_ERR_INVALID || !flex_last_error()[0]))
    die("reference forward", flex_last_error());
  if (st == FLEX_OK) {
    st = flex_backward(k, &a);
    if (st != FLEX_OK) die("the reference's backward refused a mask its forward took", flex_last_error());
    static int cpu = -1;
    if (cpu < 0) cpu = flex_backend_available(FLEX_BACKEND_CPU);
    if (cpu) {
      a.backend = FLEX_BACKEND_CPU, a.out = &to2, a.lse = &tl2;
      st = flex_forward(k, &a);
      if (st == FLEX_ERR_UNSUPPORTED && flex_last_error()[0]) goto done; /* blocks its tiles cannot split */
      if (st != FLEX_OK) die("the cpu backend refused a mask the reference took", flex_last_error());
      double num = 0, den = 0;
      for (size_t i = 0; i < nqe; i++) num += (o[i] - o2[i]) * (o[i] - o2[i]), den += (double)o[i] * o[i];
      for (size_t i = 0; i < nl; i++)
        if (!(lse[i] == lse2[i] || fabs(lse[i] - lse2[i]) <= 1e-4 * (1 + fabs(lse[i]))))
          die("cpu against reference", "LSE differs");
      if (!(num <= 1e-8 * den + 1e-12)) die("cpu against reference", "O differs");
    }
  }
done:
  free(buf);
out:
  for (int i = 0; i < 8; i++) free(arr[i]);
  return 0;
}
