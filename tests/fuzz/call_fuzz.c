/* call_fuzz.c: the call fuzzer's kernels, random calls and their tensors
 * (call_fuzz.h; the runner is check_call_fuzz.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "call_fuzz.h"
#include "runtime/tensor.h"

/* ---- the kernel pool ---- */

typedef struct Kern {
  const char *name;
  const char *path, *src; /* samples/ file, or source text */
  bool no_packed;         /* a buffer dim of Q_LEN or KV_LEN: refused in packed calls */
  bool no_paged;          /* a buffer dim of KV_LEN: refused in paged calls */
  bool mask;              /* has a mask (a BlockMask is built from it) */
  bool sink;              /* has a sink function */
} Kern;

static const Kern kernels[K_NKERNELS] = {
    [K_IDENTITY] = {"identity", NULL, "score f(s, b, h, q, kv) { return s; }\n", false, false, false},
    [K_CAUSAL] = {"causal", "samples/causal.score", NULL, false, false, true},
    [K_RELPOS] = {"relpos_bias", "samples/relpos_bias.score", NULL, false, false, false},
    [K_DOC_I32] = {"doc_i32", NULL,
                   "buffer doc: i32[T] sorted;\n"
                   "mask m(b, h, q, kv) { return doc[q] == doc[kv] && q >= kv; }\n",
                   false, false, true},
    [K_DOC_I64] = {"doc_i64", NULL,
                   "buffer doc: i64[T] sorted;\nmask m(b, h, q, kv) { return doc[q] == doc[kv]; }\n", false,
                   false, true},
    [K_DOC_U8] = {"doc_u8", NULL,
                  "buffer doc: u8[T] sorted;\nmask m(b, h, q, kv) { return doc[kv] <= doc[q]; }\n", false,
                  false, true},
    [K_DTYPES] = {"dtypes", NULL,
                  "buffer a: f16[H];\nbuffer c: bf16[KV_LEN];\nbuffer d: i64[Q_LEN];\nbuffer u: u8[8];\n"
                  "buffer m: bool[KV_LEN];\nbuffer g: f32[H] grad;\n"
                  "score f(s, b, h, q, kv) {\n"
                  "  return s * (1.0 + 0.1 * a[h]) + 0.2 * c[kv] + 0.05 * float(d[q] % 5)\n"
                  "         + 0.01 * float(u[kv % 8]) + g[h] * float(kv - q) * 0.05;\n}\n"
                  "mask k(b, h, q, kv) { return m[kv] || q == kv; }\n",
                  true, true, true},
    [K_PARAMS] = {"params", NULL,
                  "param float temp = 1.0;\nparam int w = 24;\n"
                  "score f(s, b, h, q, kv) { return s * temp; }\n"
                  "mask m(b, h, q, kv) { return q - kv < w && kv - q < w; }\n",
                  false, false, true},
    [K_GEMMA] = {"gemma2", "samples/gemma2.score", NULL, false, false, true},
    [K_UNSORTED] = {"unsorted", NULL,
                    "buffer lab: i32[T];\nmask m(b, h, q, kv) { return lab[q] == lab[kv]; }\n", false, false,
                    true},
    [K_FLOATMASK] = {"float_mask", NULL,
                     "mask m(b, h, q, kv) { return abs(float(q) * 0.75 - float(kv)) < 9.0; }\n", false,
                     false, true},
    [K_NEGINF] = {"neg_inf", NULL,
                  "score f(s, b, h, q, kv) { return where((q + kv) % 7 == 3, -inf, s); }\n"
                  "mask m(b, h, q, kv) { return q >= h % 3; }\n",
                  false, false, true},
    [K_HEADTEMP] = {"head_temperature", "samples/head_temperature.score", NULL, false, false, true},
    [K_LOWERRIGHT] = {"lower_right", NULL,
                      "param float cap;\n"
                      "score f(s, b, h, q, kv) { return cap * tanh(s / cap); }\n"
                      "mask m(b, h, q, kv) { return q + KV_LEN - Q_LEN >= kv; }\n",
                      false, false, true},
    [K_SINK_HEAD] = {"sink_gptoss", "samples/sink_gptoss.score", NULL, false, false, true, true},
    [K_SINK_WINDOW] = {"sink_window", "samples/sink_window.score", NULL, false, false, true, true},
    [K_SINK_QUERY] = {"sink_per_query", "samples/sink_per_query.score", NULL, false, false, true, true},
    [K_SINK_NONE] = {"sink_none", NULL,
                     "buffer sk: f32[H] grad;\n"
                     "sink s(b, h, q) { return where(h % 2 == 0, -inf, sk[h] + 0.1 * float(q % 3)); }\n"
                     "mask m(b, h, q, kv) { return q >= h % 3 && kv <= q + 5; }\n",
                     false, false, true, true},
};

static flex_kernel *loaded[K_NKERNELS + 1];

/* Kernel k of the pool (K_NKERNELS: a window mask for BlockMasks), loaded once. */
static flex_kernel *kernel(int k) {
  if (loaded[k]) return loaded[k];
  if (k == K_NKERNELS) {
    static const char win[] = "mask w(b, h, q, kv) { return q - kv < 40 && kv - q < 40; }\n";
    loaded[k] = tl_load(NULL, "window", win);
  } else {
    loaded[k] = tl_load(kernels[k].path, kernels[k].name, kernels[k].src);
  }
  return loaded[k];
}

/* float64 inputs: the reference's; every other backend refuses them. */
static const TlDtype fp64 = {"fp64", kDLFloat, 64, 1e-4, 1e-3};

static const TlDtype *spec_dtype(const Spec *s) { return s->dt == 3 ? &fp64 : &tl_dtypes[s->dt]; }

/* ---- drawing a call ---- */

static int rnd(uint64_t *rng, int n) { return n > 0 ? (int)(tl_rand(rng) % (uint64_t)n) : 0; }
static bool coin(uint64_t *rng, int in) { return rnd(rng, in) == 0; } /* one chance in `in` */

/* A length: often odd, sometimes 0 or 1. */
static int length(uint64_t *rng, int max) {
  int r = rnd(rng, 16);
  return r == 0 ? 0 : r == 1 ? 1 : 1 + rnd(rng, max);
}

void spec_draw(Spec *s, flex_backend be, bool mock, uint64_t *rng, uint64_t *mrng) {
  memset(s, 0, sizeof *s);
  bool emu = be == FLEX_BACKEND_EMU, dev = emu || mock;
  /* What makes a kernel module (on the emulator and the CUDA backend each
   * combination is a compile) comes from mrng: kernel, dtypes, head dims,
   * layout, dropout, determinism, splits, a BlockMask and its blocks,
   * offsets, the arch, a backward, checked runs, which gradients. */
  s->kern = rnd(mrng, K_NKERNELS);
  const Kern *k = &kernels[s->kern];
  /* float64 inputs: one call in four on the reference; elsewhere one in
   * twenty-five, which must be refused */
  bool ref = be == FLEX_BACKEND_REFERENCE;
  s->dt = ref ? rnd(mrng, 4) : coin(mrng, 25) ? 3 : rnd(mrng, 3);
  /* the emulator builds a module per head dim: a few of them */
  static const int edims[3] = {8, 15, 16};
  s->E = dev ? edims[rnd(mrng, 3)] : 1 + rnd(mrng, 40);
  s->EV = coin(mrng, 2) ? s->E : dev ? edims[rnd(mrng, 3)] : 1 + rnd(mrng, 40);
  int r = rnd(mrng, 10);
  s->layout = r < 2 && !k->no_packed ? L_PACKED : r == 2 && !k->no_paged ? L_PAGED : L_PADDED;
  s->out_dt = mock ? 0 : rnd(mrng, 3);
  s->deterministic = coin(mrng, 3);
  static const float drops[3] = {0.1f, 0.3f, 0.6f};
  s->dropout = coin(mrng, 6) ? drops[rnd(mrng, 3)] : 0;
  s->kv_splits = coin(mrng, 2) ? 0 : rnd(mrng, 6);
  bool blockmask = coin(mrng, 4), offsets = coin(mrng, 4);
  int bm_q = coin(mrng, 2) ? 64 : 128, bm_kv = coin(mrng, 2) ? 64 : 128; /* they pick tiles */
  s->backward = !coin(mrng, 3); /* a forward alone needs no backward kernels */
  s->check_bounds = coin(mrng, 5);
  s->grads = (unsigned)tl_rand(mrng); /* a grad buffer without its gradient: a joint without adds */
  s->sm90 = emu && coin(mrng, 2);

  s->HKV = 1 + rnd(rng, 3);
  s->H = s->HKV * (1 + rnd(rng, 3));
  s->B = 1 + rnd(rng, 3);
  s->QL = length(rng, dev ? 40 : 48);
  s->KL = length(rng, dev ? 72 : 90);
  for (int b = 0; b < s->B; b++) {
    s->lens_q[b] = length(rng, 30), s->lens_kv[b] = length(rng, 50);
    if (s->layout == L_PAGED) s->lens_kv[b] = s->KL ? rnd(rng, s->KL + 1) : 0;
  }
  s->page_size = 16 + rnd(rng, 49);
  s->spare_pages = rnd(rng, 3);
  s->lse64 = be == FLEX_BACKEND_REFERENCE && coin(rng, 3);
  for (int t = 0; t < 10 + MAXBUF; t++) s->odd |= (unsigned)coin(rng, 3) << t;
  s->dlse = coin(rng, 2);
  s->backward &= s->layout != L_PAGED;
  s->trust_sorted = coin(rng, 5);
  s->set_params = coin(rng, 2);
  s->grad64 = coin(rng, 3);
  s->scale = coin(rng, 3) ? (coin(rng, 2) ? -1 : 1) * (0.05 + 1.5 * tl_uniform(rng)) : 0;
  /* a caller's BlockMask (flex_block_mask_create wants sizes >= 1) */
  if (s->layout == L_PADDED && s->QL && s->KL && blockmask) {
    s->bm_q = bm_q, s->bm_kv = bm_kv;
    s->bm_full = coin(rng, 2);
  }
  /* a shard of a longer sequence: offsets and whole lengths (padded calls only) */
  if (s->layout == L_PADDED && offsets) {
    s->q_total = s->QL + rnd(rng, 40), s->kv_total = s->KL + rnd(rng, 60);
    s->q_off = rnd(rng, s->q_total - s->QL + 1), s->kv_off = rnd(rng, s->kv_total - s->KL + 1);
    if (coin(rng, 4)) s->q_total = s->q_off = 0; /* one side only */
  }
  if (coin(rng, 10)) { /* break one rule instead */
    s->inject = 1 + rnd(rng, I_COUNT - 1);
    /* the CUDA backend checks `sorted` promises in a kernel, which the
     * stand-in driver does not run */
    if (mock && s->inject == I_UNSORTED) s->inject = I_HEADS;
    /* nothing else refused first */
    s->q_off = s->kv_off = s->q_total = s->kv_total = 0;
    if (s->dt == 3 && !ref) s->dt = rnd(rng, 3);
    if (s->inject == I_OFFSET_PAST) s->layout = L_PADDED, s->bm_q = 0, s->q_total = s->QL + 1, s->q_off = 2;
    if (s->inject == I_OFFSET_PACKED) s->layout = L_PACKED, s->bm_q = 0, s->kv_off = 1, s->kv_total = s->KL + 1;
    if (s->inject == I_OFFSET_PACKED && kernels[s->kern].no_packed) s->kern = K_CAUSAL;
    bool bwd = (s->inject >= I_NULL_DQ && s->inject <= I_NULL_DOUT) || s->inject == I_GRAD_ON_PLAIN;
    if (bwd) s->layout = s->layout == L_PAGED ? L_PADDED : s->layout, s->backward = 1;
    if (s->inject == I_INT_PARAM) s->kern = K_PARAMS, s->layout = L_PADDED;
    if (s->inject == I_GRAD_ON_PLAIN) s->kern = K_GEMMA;
    if (s->inject == I_UNSORTED) s->kern = K_DOC_I32 + rnd(rng, 3), s->trust_sorted = 0;
    if (s->inject == I_BLOCKMASK_PACKED) s->layout = L_PACKED, s->kern = K_CAUSAL, s->bm_q = 0;
    if (s->inject == I_HEADS) s->layout = L_PADDED, s->HKV = 2, s->H = 4, s->bm_q = 0;
    if (s->inject == I_UNSORTED) s->layout = L_PADDED, s->QL = s->QL < 5 ? 5 : s->QL;
  }
}

bool spec_refused(const Spec *s, flex_backend be, const char **word) {
  if (s->dt == 3 && be != FLEX_BACKEND_REFERENCE) {
    *word = "float64 inputs run in float64 on the reference backend";
    return true;
  }
  return false;
}

static const char *const inject_names[I_COUNT] = {
    "none", "out missing", "lse missing", "dq missing", "dk missing", "dv missing", "dout missing",
    "kv_splits < 0", "dropout_p = 1", "scale NaN", "an unknown param", "an int param of 2.5",
    "an unknown arch", "lse in float16", "a gradient for a plain buffer", "a `sorted` buffer decreasing",
    "a BlockMask in a packed call", "H not a multiple of HKV", "a shard past its whole length",
    "offsets in a packed call"};

const char *inject_name(int inject) { return inject_names[inject]; }

void spec_print(const Spec *s, char *out, size_t cap) {
  snprintf(
      out, cap,
      "{.kern = %d /* %s */, .dt = %d, .B = %d, .H = %d, .HKV = %d, .QL = %d, .KL = %d, .E = %d, .EV = %d,\n"
      " .layout = %d, .lens_q = {%d, %d, %d, %d}, .lens_kv = {%d, %d, %d, %d}, .page_size = %d,\n"
      " .spare_pages = %d, .out_dt = %d, .lse64 = %d, .odd = 0x%x, .dlse = %d, .backward = %d,\n"
      " .deterministic = %d, .check_bounds = %d, .trust_sorted = %d, .set_params = %d, .grads = 0x%x,\n"
      " .grad64 = %d, .scale = %.17g, .dropout = %gf, .kv_splits = %d, .bm_q = %d, .bm_kv = %d,\n"
      " .bm_full = %d, .sm90 = %d, .q_off = %d, .kv_off = %d, .q_total = %d, .kv_total = %d,\n"
      " .inject = %d /* %s */}\n",
      s->kern, kernels[s->kern].name, s->dt, s->B, s->H, s->HKV, s->QL, s->KL, s->E, s->EV, s->layout,
      s->lens_q[0], s->lens_q[1], s->lens_q[2], s->lens_q[3], s->lens_kv[0], s->lens_kv[1], s->lens_kv[2],
      s->lens_kv[3], s->page_size, s->spare_pages, s->out_dt, s->lse64, s->odd, s->dlse, s->backward,
      s->deterministic, s->check_bounds, s->trust_sorted, s->set_params, s->grads, s->grad64, s->scale,
      (double)s->dropout, s->kv_splits, s->bm_q, s->bm_kv, s->bm_full, s->sm90, s->q_off, s->kv_off,
      s->q_total, s->kv_total, s->inject, inject_names[s->inject]);
}

/* ---- one call's tensors ---- */

enum { T_Q, T_K, T_V, T_OUT, T_LSE, T_DOUT, T_DLSE, T_DQ, T_DK, T_DV };
static const char *const tnames[10] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv"};

static DLDataType f64(void) { return rt_dtype(kDLFloat, 64); }

/* x rounded to dtype t. */
static double round_to(DLDataType t, double x) {
  unsigned char tmp[8];
  rt_elem_set(tmp, t, x);
  return rt_elem_get(tmp, t);
}

/* A tensor of shape sh for both calls: the tested view (dtype dt, odd
 * layout when odd) and the reference's float64 array; inputs get values
 * from *rng (exact in dt), outputs NaN. */
static void tensor(Call *c, int t, DLDataType dt, int nd, const int64_t *sh, bool input, uint64_t *rng) {
  tl_view_init(&c->tv[t], dt, nd, sh, (c->s->odd >> t) & 1, rng);
  if (c->mock) c->tv[t].t.device = (DLDevice){kDLCUDA, 0};
  rt_array_init(&c->ref[t], f64(), nd, sh);
  for (int64_t i = 0; i < rt_array_count(&c->ref[t]); i++)
    rt_array_set(&c->ref[t], i, input ? round_to(dt, tl_normal(rng)) : NAN);
  if (input) tl_view_put(&c->tv[t], &c->ref[t]);
  else tl_view_poison(&c->tv[t]);
  c->rv[t] = rt_array_tensor(&c->ref[t]);
}

/* An int32 vector for both calls (device memory on the stand-in driver). */
static void ints(Call *c, RtArray *a, DLTensor *t, int nd, const int64_t *sh, const int *v) {
  rt_array_init(a, rt_dtype(kDLInt, 32), nd, sh);
  for (int64_t i = 0; i < rt_array_count(a); i++) rt_array_set(a, i, v[i]);
  *t = rt_array_tensor(a);
  if (c->mock) t->device = (DLDevice){kDLCUDA, 0};
}

/* The size a free symbol of a buffer gets. */
static int64_t symbol(const char *name, int maxlen, uint64_t *rng) {
  if (!strcmp(name, "T")) return maxlen + rnd(rng, 3);
  if (!strcmp(name, "NB")) return 1 + rnd(rng, 17);
  return 1 + rnd(rng, 8);
}

/* Buffer j's values: sorted ids, lengths, small ints, bools or floats. */
static void buffer_values(RtArray *a, const flex_buffer_info *bi, int maxlen, uint64_t *rng) {
  int64_t n = rt_array_count(a), id = 0;
  for (int64_t i = 0; i < n; i++) {
    double v;
    if (bi->dtype.code == kDLFloat || bi->dtype.code == kDLBfloat) v = 0.5 * tl_normal(rng);
    else if (bi->sorted) v = (double)(id += i && coin(rng, 6));
    else if (!strcmp(bi->name, "lengths")) v = rnd(rng, maxlen + 1);
    else v = rnd(rng, bi->dtype.code == kDLBool ? 2 : 4);
    rt_array_set(a, i, v);
  }
}

static bool buffers(Call *c, const int *sizes, int maxlen, uint64_t *rng, char *why, size_t cap) {
  const Spec *s = c->s;
  for (int j = 0; j < c->info.nbuffers; j++) {
    const flex_buffer_info *bi = &c->info.buffers[j];
    int64_t sh[TL_VIEW_MAXDIMS];
    if (bi->ndim > TL_VIEW_MAXDIMS || c->nb >= MAXBUF) {
      snprintf(why, cap, "buffer %s: too many dims or buffers for the fuzzer", bi->name);
      return false;
    }
    for (int d = 0; d < bi->ndim; d++) {
      const char *n = bi->dim_name[d];
      sh[d] = bi->extent[d] >= 0 ? bi->extent[d]
              : !strcmp(n, "B")  ? sizes[0]
              : !strcmp(n, "H")  ? sizes[1]
              : !strcmp(n, "HKV") ? sizes[2]
              : !strcmp(n, "Q_LEN") ? sizes[3]
              : !strcmp(n, "KV_LEN") ? sizes[4]
                                      : symbol(n, maxlen, rng);
    }
    int i = c->nb++;
    rt_array_init(&c->buf[i], bi->dtype, bi->ndim, sh);
    buffer_values(&c->buf[i], bi, maxlen, rng);
    c->bref[i] = rt_array_tensor(&c->buf[i]);
    tl_view_init(&c->bufv[i], bi->dtype, bi->ndim, sh, (s->odd >> (10 + i)) & 1, rng);
    if (c->mock) c->bufv[i].t.device = (DLDevice){kDLCUDA, 0};
    tl_view_put(&c->bufv[i], &c->buf[i]);
    c->tfb[i] = (flex_buffer){bi->name, &c->bufv[i].t, NULL};
    c->rfb[i] = (flex_buffer){bi->name, &c->bref[i], NULL};
    if (!bi->grad) continue;
    rt_array_init(&c->gref[i], f64(), bi->ndim, sh);
    for (int64_t e = 0; e < rt_array_count(&c->gref[i]); e++) rt_array_set(&c->gref[i], e, NAN);
    c->gtref[i] = rt_array_tensor(&c->gref[i]);
    c->rfb[i].grad = &c->gtref[i]; /* the reference always computes it */
    if (!((s->grads >> i) & 1)) continue;
    tl_view_init(&c->gradv[i], rt_dtype(kDLFloat, s->grad64 ? 64 : 32), bi->ndim, sh,
                 (s->odd >> (20 + i)) & 1, rng);
    if (c->mock) c->gradv[i].t.device = (DLDevice){kDLCUDA, 0};
    tl_view_poison(&c->gradv[i]);
    c->tfb[i].grad = &c->gradv[i].t;
  }
  return true;
}

static void params(Call *c, int maxlen, uint64_t *rng) {
  for (int j = 0; j < c->info.nparams && c->np < 7; j++) {
    const flex_param_info *pi = &c->info.params[j];
    if (pi->has_default && !c->s->set_params) continue;
    double v = pi->type == FLEX_TYPE_FLOAT ? 0.5 + 2.5 * tl_uniform(rng) : rnd(rng, 2 * maxlen + 2);
    c->params[c->np++] = (flex_param){pi->name, v};
  }
}

/* A caller's BlockMask of the call's mask (a window for kernels without
 * one), expanded over B and H when bm_full (and always on the stand-in
 * driver, whose tensors must claim device memory). */
static bool block_mask(Call *c, char *why, size_t cap) {
  const Spec *s = c->s;
  flex_args ma = c->ra;
  bool own = kernels[s->kern].mask;
  if (!own) ma.params = NULL, ma.nparams = 0, ma.buffers = NULL, ma.nbuffers = 0;
  if (flex_block_mask_create(&c->bm, own ? c->kern : kernel(K_NKERNELS), &ma, s->B, s->H, s->QL, s->KL,
                             s->bm_q, s->bm_kv, NULL) != FLEX_OK) {
    snprintf(why, cap, "flex_block_mask_create: %s", flex_last_error());
    return false;
  }
  c->ta.block_mask = c->ra.block_mask = c->bm;
  if (!s->bm_full && !c->mock) return true;
  const DLTensor *src[8] = {c->bm->kv_num_blocks, c->bm->kv_indices, c->bm->full_kv_num_blocks,
                            c->bm->full_kv_indices, c->bm->q_num_blocks, c->bm->q_indices,
                            c->bm->full_q_num_blocks, c->bm->full_q_indices};
  const DLTensor *dst[8] = {NULL};
  for (int i = 0; i < 8; i++) {
    if (!src[i]) continue;
    int64_t sh[4] = {s->B, s->H, src[i]->shape[2], src[i]->ndim > 3 ? src[i]->shape[3] : 0};
    rt_array_init(&c->bma[i], rt_dtype(kDLInt, 32), src[i]->ndim, sh);
    int64_t inner = src[i]->shape[2] * (src[i]->ndim > 3 ? src[i]->shape[3] : 1);
    for (int b = 0; b < s->B; b++)
      for (int h = 0; h < s->H; h++) {
        int64_t from =
            ((src[i]->shape[0] == 1 ? 0 : b) * src[i]->shape[1] + (src[i]->shape[1] == 1 ? 0 : h)) * inner;
        memcpy((int32_t *)c->bma[i].data + ((int64_t)b * s->H + h) * inner,
               (const int32_t *)src[i]->data + from, sizeof(int32_t) * (size_t)inner);
      }
    c->bmt[i] = rt_array_tensor(&c->bma[i]);
    if (c->mock) c->bmt[i].device = (DLDevice){kDLCUDA, 0};
    dst[i] = &c->bmt[i];
  }
  c->bmx = (flex_block_mask){c->bm->block_q, c->bm->block_kv, dst[0], dst[1], dst[2], dst[3],
                             dst[4], dst[5], dst[6], dst[7]};
  c->ta.block_mask = &c->bmx;
  if (s->bm_full) c->ra.block_mask = &c->bmx;
  return true;
}

static const int inputs[5] = {T_Q, T_K, T_V, T_DOUT, T_DLSE};

static void hash_inputs(Call *c) {
  for (int i = 0; i < 5; i++) c->hash[inputs[i]] = tl_view_hash(&c->tv[inputs[i]]);
  for (int j = 0; j < c->nb; j++) c->bhash[j] = tl_view_hash(&c->bufv[j]);
}

bool call_init(Call *c, const Spec *s, flex_backend be, bool mock, uint64_t *rng, char *why, size_t cap) {
  memset(c, 0, sizeof *c);
  c->s = s, c->be = be, c->mock = mock;
  c->kern = kernel(s->kern);
  flex_kernel_get_info(c->kern, &c->info);
  DLDataType dt = rt_dtype(spec_dtype(s)->code, spec_dtype(s)->bits);
  DLDataType od = s->out_dt == 0 ? dt : rt_dtype(kDLFloat, s->out_dt == 1 ? 32 : 64);
  DLDataType l32 = rt_dtype(kDLFloat, s->lse64 ? 64 : 32), d32 = rt_dtype(kDLFloat, 32);
  /* buffers are sized by the whole sequence's lengths (a shard's too) */
  int qt = s->q_total ? s->q_total : s->QL, kt = s->kv_total ? s->kv_total : s->KL;
  int B = s->B, H = s->H, HKV = s->HKV, E = s->E, EV = s->EV, nd = 4, maxlen = qt > kt ? qt : kt;
  int64_t q[4] = {B, H, s->QL, E}, k[4] = {B, HKV, s->KL, E}, v[4] = {B, HKV, s->KL, EV};
  int64_t o[4] = {B, H, s->QL, EV}, l[3] = {B, H, s->QL};
  if (s->layout == L_PACKED) {
    int cq[5] = {0}, ck[5] = {0};
    maxlen = 0;
    for (int b = 0; b < B; b++) {
      cq[b + 1] = cq[b] + s->lens_q[b], ck[b + 1] = ck[b] + s->lens_kv[b];
      maxlen = s->lens_q[b] > maxlen ? s->lens_q[b] : maxlen;
      maxlen = s->lens_kv[b] > maxlen ? s->lens_kv[b] : maxlen;
    }
    int64_t n = B + 1;
    ints(c, &c->cuq, &c->tcuq, 1, &n, cq), ints(c, &c->cuk, &c->tcuk, 1, &n, ck);
    int64_t pq[3] = {cq[B], H, E}, pk[3] = {ck[B], HKV, E}, pv[3] = {ck[B], HKV, EV};
    int64_t po[3] = {cq[B], H, EV}, pl[2] = {H, cq[B]};
    memcpy(q, pq, sizeof pq), memcpy(k, pk, sizeof pk), memcpy(v, pv, sizeof pv), memcpy(o, po, sizeof po);
    memcpy(l, pl, sizeof pl);
    nd = 3;
  } else if (s->layout == L_PAGED) {
    int mp = (s->KL + s->page_size - 1) / s->page_size, np = B * mp + s->spare_pages, table[4 * 64];
    mp = mp ? mp : 1, np = np ? np : 1;
    int perm[4 * 64 + 8];
    for (int i = 0; i < np; i++) perm[i] = i;
    for (int i = np - 1; i > 0; i--) { /* the pool's pages in a random order */
      int j = rnd(rng, i + 1), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < B * mp; i++) table[i] = perm[i % np];
    int64_t ts[2] = {B, mp}, ls[1] = {B};
    ints(c, &c->pt, &c->tpt, 2, ts, table), ints(c, &c->kvl, &c->tkvl, 1, ls, s->lens_kv);
    int64_t pk[4] = {np, s->page_size, HKV, E}, pv[4] = {np, s->page_size, HKV, EV};
    memcpy(k, pk, sizeof pk), memcpy(v, pv, sizeof pv);
  }
  int ln = s->layout == L_PACKED ? 2 : 3, kn = s->layout == L_PAGED ? 4 : nd;
  tensor(c, T_Q, dt, nd, q, true, rng), tensor(c, T_K, dt, kn, k, true, rng),
      tensor(c, T_V, dt, kn, v, true, rng);
  tensor(c, T_DOUT, dt, nd, o, true, rng), tensor(c, T_DLSE, d32, ln, l, true, rng);
  tensor(c, T_OUT, od, nd, o, false, rng), tensor(c, T_LSE, l32, ln, l, false, rng);
  tensor(c, T_DQ, od, nd, q, false, rng), tensor(c, T_DK, od, kn, k, false, rng),
      tensor(c, T_DV, od, kn, v, false, rng);
  int sizes[5] = {B, H, HKV, qt, kt};
  if (!buffers(c, sizes, maxlen, rng, why, cap)) return false;
  params(c, maxlen, rng);
  flex_args *a[2] = {&c->ta, &c->ra};
  for (int i = 0; i < 2; i++) {
    flex_args *x = a[i];
    const DLTensor *t[10];
    for (int j = 0; j < 10; j++) t[j] = i ? &c->rv[j] : &c->tv[j].t;
    x->backend = i ? FLEX_BACKEND_REFERENCE : be;
    x->q = t[T_Q], x->k = t[T_K], x->v = t[T_V], x->out = t[T_OUT], x->lse = t[T_LSE];
    x->dout = t[T_DOUT], x->dlse = s->dlse ? t[T_DLSE] : NULL;
    x->dq = t[T_DQ], x->dk = t[T_DK], x->dv = t[T_DV];
    x->scale = s->scale;
    x->params = c->params, x->nparams = c->np;
    x->buffers = i ? c->rfb : c->tfb, x->nbuffers = c->nb;
    x->dropout_p = s->dropout, x->dropout_seed = 0x5eed0000u + (uint64_t)s->kern, x->dropout_offset = 7;
    if (s->layout == L_PACKED) x->cu_seqlens_q = &c->tcuq, x->cu_seqlens_kv = &c->tcuk;
    if (s->layout == L_PAGED) x->page_table = &c->tpt, x->kv_lens = &c->tkvl;
    x->q_offset = s->q_off, x->kv_offset = s->kv_off;
    x->q_len_total = s->q_total, x->kv_len_total = s->kv_total;
  }
  c->ta.deterministic = s->deterministic, c->ta.check_bounds = s->check_bounds;
  c->ta.trust_sorted = s->trust_sorted, c->ta.kv_splits = s->kv_splits;
  c->ta.arch = be == FLEX_BACKEND_EMU && s->sm90 ? "sm_90a" : NULL;
  if (s->bm_q && !block_mask(c, why, cap)) return false;
  hash_inputs(c);
  return true;
}

void call_free(Call *c) {
  for (int t = 0; t < 10; t++) tl_view_free(&c->tv[t]), rt_array_free(&c->ref[t]);
  for (int j = 0; j < c->nb; j++) {
    tl_view_free(&c->bufv[j]), rt_array_free(&c->buf[j]);
    if (c->gradv[j].mem) tl_view_free(&c->gradv[j]);
    if (c->gref[j].data) rt_array_free(&c->gref[j]);
  }
  for (int i = 0; c->have_exact && i < 3 + MAXBUF; i++)
    if (c->exact[i].data) rt_array_free(&c->exact[i]);
  rt_array_free(&c->cuq), rt_array_free(&c->cuk), rt_array_free(&c->pt), rt_array_free(&c->kvl);
  for (int i = 0; i < 8; i++)
    if (c->bma[i].data) rt_array_free(&c->bma[i]);
  flex_block_mask_free(c->bm);
}

/* ---- breaking a call ---- */

bool call_inject(Call *c, int inject, flex_status *want, const char **word) {
  flex_args *a = &c->ta;
  c->saved_inject = inject;
  *want = FLEX_ERR_INVALID;
  switch (inject) {
  case I_NULL_OUT: c->saved = a->out, a->out = NULL, *word = "out: the tensor is missing"; break;
  case I_NULL_LSE: c->saved = a->lse, a->lse = NULL, *word = "lse: the tensor is missing"; break;
  case I_NULL_DQ: c->saved = a->dq, a->dq = NULL, *word = "dq: the tensor is missing"; return true;
  case I_NULL_DK: c->saved = a->dk, a->dk = NULL, *word = "dk: the tensor is missing"; return true;
  case I_NULL_DV: c->saved = a->dv, a->dv = NULL, *word = "dv: the tensor is missing"; return true;
  case I_NULL_DOUT: c->saved = a->dout, a->dout = NULL, *word = "dout: the tensor is missing"; return true;
  case I_KV_SPLITS: a->kv_splits = -1, *word = "kv_splits must be"; break;
  case I_DROPOUT_P: a->dropout_p = 1.0f, *word = "dropout_p must be in [0, 1)"; break;
  case I_SCALE: a->scale = NAN, *word = "scale must be finite"; break;
  case I_UNKNOWN_PARAM:
    c->params[c->np] = (flex_param){"no_such_param", 1.0};
    a->nparams = c->np + 1, *word = "unknown param 'no_such_param'";
    break;
  case I_INT_PARAM:
    c->params[c->np] = (flex_param){"w", 2.5};
    a->params = c->params + c->np, a->nparams = 1, *word = "param 'w' is an int";
    break;
  case I_ARCH: a->arch = "sm_75", *word = "arch 'sm_75'"; break;
  case I_LSE_DTYPE:
    c->bad = *a->lse, c->bad.dtype = rt_dtype(kDLFloat, 16), c->saved = a->lse, a->lse = &c->bad;
    *word = "lse: expected float32";
    break;
  case I_GRAD_ON_PLAIN: /* gemma2's slopes are not `grad` */
    if (!c->gradv[0].mem) {
      tl_view_init(&c->gradv[0], rt_dtype(kDLFloat, 32), c->bufv[0].t.ndim, c->bufv[0].shape, false, NULL);
      if (c->mock) c->gradv[0].t.device = (DLDevice){kDLCUDA, 0};
    }
    c->tfb[0].grad = &c->gradv[0].t, *word = "is not declared `grad`";
    return true; /* the forward ignores gradients */
  case I_UNSORTED: { /* the first two ids decrease */
    rt_array_set(&c->buf[0], 0, 3), rt_array_set(&c->buf[0], 1, 1); /* spec_draw: T >= 5 */
    tl_view_put(&c->bufv[0], &c->buf[0]);
    hash_inputs(c);
    *want = FLEX_ERR_RUNTIME, *word = "declared sorted but decreases";
    break;
  }
  case I_BLOCKMASK_PACKED:
    c->saved = NULL;
    if (flex_block_mask_create(&c->bm, c->kern, &c->ra, 1, c->s->H, 64, 64, 64, 64, NULL) == FLEX_OK)
      a->block_mask = c->bm;
    *word = "block_mask: a caller's BlockMask is not accepted in a packed";
    break;
  case I_OFFSET_PAST: /* spec_draw: q_offset 2 of a whole length QL + 1 */
    *word = "lie past q_len_total";
    break;
  case I_OFFSET_PACKED: /* spec_draw: kv_offset 1 */
    *word = "not combined with a packed";
    break;
  case I_HEADS:
    c->bad = *a->q;
    memcpy(c->badshape, a->q->shape, sizeof(int64_t) * (size_t)a->q->ndim);
    c->badshape[1] = 3, c->bad.shape = c->badshape, c->saved = a->q, a->q = &c->bad;
    *word = "is not a multiple of";
    break;
  }
  return false;
}

void call_inject_undo(Call *c) {
  flex_args *a = &c->ta;
  switch (c->saved_inject) {
  case I_GRAD_ON_PLAIN: c->tfb[0].grad = NULL; break;
  case I_NULL_DQ: a->dq = c->saved; break;
  case I_NULL_DK: a->dk = c->saved; break;
  case I_NULL_DV: a->dv = c->saved; break;
  case I_NULL_DOUT: a->dout = c->saved; break;
  default: break;
  }
}

/* ---- judging a call ---- */

/* Relative norm error (NaN never passes). Where the reference is zero, or
 * zero but for rounding (root mean square below 1e-9: every row masked, a
 * gradient nothing reaches, or one that is 0 in exact arithmetic, as dQ and
 * dK when every row has one key, whose computed value is the rounding of
 * terms that cancel), a ratio measures nothing: NaN then says "not
 * measured", as long as the tested elements are finite (or the reference's
 * infinities); fully masked rows are checked exactly besides. */
static double err_or_exact(const RtArray *x, const RtArray *ref) {
  int64_t n = rt_array_count(ref);
  double ss = 0;
  for (int64_t i = 0; i < n; i++) {
    double r = rt_array_get(ref, i);
    if (isfinite(r)) ss += r * r;
  }
  if (n && sqrt(ss / (double)n) >= 1e-9) return tl_rel_err(x, ref);
  for (int64_t i = 0; i < n; i++) {
    double a = rt_array_get(x, i), r = rt_array_get(ref, i);
    if (!(isfinite(a) || (isinf(r) && a == r))) return INFINITY;
  }
  return n ? NAN : 0;
}

/* The tolerance of output t: the dtype's against another backend; the
 * rounding of the output's dtype against the reference itself. */
static double rounding(const Call *c, const TlView *v, bool grad) {
  const TlDtype *d = spec_dtype(c->s);
  DLDataType t = v->t.dtype;
  if (t.code == kDLFloat && t.bits == 64 && v != &c->tv[T_LSE]) return 1e-10;
  if (t.code == kDLFloat && t.bits >= 32) return grad ? 2e-5 : 2e-6; /* LSE: float32 in the backward */
  return grad ? d->gtol : d->tol;
}

static double tolerance(const Call *c, const TlView *v, bool grad) {
  const TlDtype *d = spec_dtype(c->s);
  if (c->be != FLEX_BACKEND_REFERENCE) return grad ? d->gtol : d->tol;
  double tol = rounding(c, v, grad);
  const Spec *s = c->s;
  if (grad) {
    /* the backward reads O as given (D = rowsum(dO O)), and a shard's
     * backward the merged LSE too, in the dtypes the tested call stores */
    bool shard = s->q_off || s->kv_off || s->q_total || s->kv_total;
    double o = rounding(c, &c->tv[T_OUT], true), l = shard ? rounding(c, &c->tv[T_LSE], true) : 0;
    tol = fmax(tol, fmax(o, l));
  }
  return tol;
}

/* Element index of column e of LSE row r in an output with `cols` columns. */
static int64_t row_at(const Call *c, int64_t r, int cols, int e) {
  if (c->s->layout != L_PACKED) return r * cols + e;
  int64_t tq = c->ref[T_LSE].shape[1], h = r / tq, t = r % tq;
  return (t * c->s->H + h) * cols + e;
}

/* An LSE is a logarithm: its absolute error is the relative error of the
 * softmax's sum, so where the reference's LSEs are small (sums near 1, as
 * one query over a few keys gives: LSE 0.03 from bf16, FLEXC_SEED=
 * 4766817962847504356, call 43993) its error is measured against 1
 * rather than |LSE|: the relative error times min(1, rms(LSE)). */
static double lse_scale(const RtArray *ref) {
  double ss = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < rt_array_count(ref); i++) {
    double r = rt_array_get(ref, i);
    if (isfinite(r)) ss += r * r, n++;
  }
  double rms = n ? sqrt(ss / (double)n) : 1;
  return rms < 1 ? rms : 1;
}

static bool compare_one(const char *name, const TlView *v, const RtArray *ref, bool is_lse, double tol,
                        CallCounts *n, char *why, size_t cap) {
  RtArray got;
  tl_view_get(v, &got);
  double e = err_or_exact(&got, ref);
  if (is_lse && isfinite(e)) e *= lse_scale(ref);
  n->unmeasured += isnan(e);
  bool ok = isnan(e) || e < tol;
  if (!ok) {
    tl_mismatches(name, &got, ref, tol, 6);
    snprintf(why, cap, "%s: relative error %g against the reference (tolerance %g)", name, e, tol);
  }
  rt_array_free(&got);
  return ok;
}

bool call_guards(Call *c, char *why, size_t cap) {
  for (int t = 0; t < 10; t++)
    if (tl_view_guards(&c->tv[t], tnames[t])) {
      snprintf(why, cap, "%s: a byte outside its elements was written", tnames[t]);
      return false;
    }
  for (int i = 0; i < 5; i++)
    if (tl_view_hash(&c->tv[inputs[i]]) != c->hash[inputs[i]]) {
      snprintf(why, cap, "input %s was changed", tnames[inputs[i]]);
      return false;
    }
  for (int j = 0; j < c->nb; j++) {
    const char *n = c->info.buffers[j].name;
    if (tl_view_hash(&c->bufv[j]) != c->bhash[j] || (c->gradv[j].mem && tl_view_guards(&c->gradv[j], n))) {
      snprintf(why, cap, "buffer %s was changed, or bytes around its gradient written", n);
      return false;
    }
  }
  return true;
}

void call_give_outputs(Call *c) {
  if (!c->have_exact) {
    for (int t = T_DQ; t <= T_DV; t++) tl_array_copy(&c->exact[t - T_DQ], &c->ref[t]);
    for (int j = 0; j < c->nb; j++)
      if (c->gref[j].data) tl_array_copy(&c->exact[3 + j], &c->gref[j]);
    c->have_exact = true;
  }
  for (int t = T_OUT; t <= T_LSE; t++) {
    RtArray got;
    tl_view_get(&c->tv[t], &got);
    for (int64_t i = 0; i < rt_array_count(&c->ref[t]); i++) rt_array_set(&c->ref[t], i, rt_array_get(&got, i));
    rt_array_free(&got);
  }
}

/* A gradient judged given the tested call's O (call_give_outputs) may also
 * differ by TL_SENSITIVITY_ROUNDINGS times how far the reference's gradient
 * moved between its own O and that one: its measured sensitivity to one
 * rounding of the tested dtype (docs/testing.md). */
static double sensitivity(const Call *c, int i, const RtArray *ref) {
  if (!c->have_exact || !c->exact[i].data) return 0;
  return TL_SENSITIVITY_ROUNDINGS * tl_rel_moved(&c->exact[i], ref);
}

bool call_compare(Call *c, bool backward, CallCounts *n, char *why, size_t cap) {
  static const int fwd[2] = {T_OUT, T_LSE}, bwd[3] = {T_DQ, T_DK, T_DV};
  for (int i = 0; i < (backward ? 3 : 2); i++) {
    int t = backward ? bwd[i] : fwd[i];
    double tol = tolerance(c, &c->tv[t], backward) + (backward ? sensitivity(c, i, &c->ref[t]) : 0);
    if (!compare_one(tnames[t], &c->tv[t], &c->ref[t], t == T_LSE, tol, n, why, cap)) return false;
  }
  for (int j = 0; backward && j < c->nb; j++)
    if (c->gradv[j].mem &&
        !compare_one(c->info.buffers[j].name, &c->gradv[j], &c->gref[j], false,
                     tolerance(c, &c->gradv[j], true) + sensitivity(c, 3 + j, &c->gref[j]), n, why, cap))
      return false;
  /* the reference's fully masked rows, exactly: LSE -inf, O 0, dQ 0 */
  RtArray lse, row;
  tl_view_get(&c->tv[backward ? T_DQ : T_OUT], &row);
  tl_view_get(&c->tv[T_LSE], &lse);
  int cols = backward ? c->s->E : c->s->EV;
  bool ok = true;
  for (int64_t r = 0; r < rt_array_count(&c->ref[T_LSE]) && ok; r++) {
    if (rt_array_get(&c->ref[T_LSE], r) != -INFINITY) continue;
    n->masked_rows += !backward;
    ok = backward || rt_array_get(&lse, r) == -INFINITY;
    for (int e = 0; e < cols && ok; e++) ok = rt_array_get(&row, row_at(c, r, cols, e)) == 0;
    if (!ok)
      snprintf(why, cap, "fully masked row %lld: %s not exact", (long long)r, backward ? "dq" : "lse or out");
  }
  rt_array_free(&lse), rt_array_free(&row);
  return ok && call_guards(c, why, cap);
}

/* The tested gradients as float64 arrays (dq, dk, dv, then the buffers'). */
static int gradients(Call *c, RtArray *g) {
  int n = 0;
  for (int t = T_DQ; t <= T_DV; t++) tl_view_get(&c->tv[t], &g[n++]);
  for (int j = 0; j < c->nb; j++)
    if (c->gradv[j].mem) tl_view_get(&c->gradv[j], &g[n++]);
  return n;
}

bool call_deterministic(Call *c, char *why, size_t cap) {
  RtArray first[3 + MAXBUF], again[3 + MAXBUF];
  int n = gradients(c, first);
  for (int t = T_DQ; t <= T_DV; t++) tl_view_poison(&c->tv[t]);
  for (int j = 0; j < c->nb; j++)
    if (c->gradv[j].mem) tl_view_poison(&c->gradv[j]);
  flex_status st = flex_backward(c->kern, &c->ta);
  bool ok = st == FLEX_OK;
  if (!ok) snprintf(why, cap, "the deterministic backward again: %s", flex_last_error());
  if (ok) gradients(c, again);
  for (int i = 0; i < n; i++) {
    if (ok && memcmp(first[i].data, again[i].data, sizeof(double) * (size_t)rt_array_count(&first[i]))) {
      snprintf(why, cap, "deterministic: gradient %d differs between two runs", i);
      ok = false;
    }
    rt_array_free(&first[i]);
    if (st == FLEX_OK) rt_array_free(&again[i]);
  }
  return ok;
}
