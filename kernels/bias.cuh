/* bias.cuh: a score's bias folded into S's accumulators (FLEX_BIAS;
 * docs/kernels.md, "A bias folded into S's accumulators").
 *
 * A score s + G with G = a float(kv - q) + c, a and c free of q and kv:
 * the generated flex_bias(p, b, h, a, c) gives a head's a and c, and the
 * tensor-core bodies start each element of S (or S^T) at G / scale before
 * the matrix product, then run an identity score's softmax. An element's
 * kv - q is its row's base (converted once a tile) plus a compile-time
 * constant k: G / scale = fmaf(a / scale, base + k, c / scale), one add
 * and one FMA, shared by the elements of a diagonal. Splitting it further,
 * a k + (a base + c) with the second part once per row, would save the add
 * but turns an infinite a into inf - inf where the score has +-inf (an
 * element the score removes with -inf must stay removed). */
#ifndef FLEX_BIAS_CUH
#define FLEX_BIAS_CUH

#ifndef FLEX_BIAS
#define FLEX_BIAS 0
#endif

#if FLEX_BIAS
struct FlexBias {
  float a, c; /* over the scale (times log2 e / scale_log2) */

  /* Head h's parts; inv = log2 e / scale_log2, which the caller's S times
   * scale_log2 turns back into the logit times log2 e (cg_plan folds only
   * for |scale| >= 2^-16, so inv is finite and G / scale is for any bias
   * below 2^111). */
  __device__ __forceinline__ void init(const FlexParams &p, int b, int h, float inv) {
    flex_bias(p, b, h, a, c);
    a *= inv, c *= inv;
  }
  /* An element at kv - q = base + k. */
  __device__ __forceinline__ float at(float base, float k) const { return fmaf(a, base + k, c); }
};
#endif

#endif /* FLEX_BIAS_CUH */
