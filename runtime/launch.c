/* launch.c: FlexParams and the mask plan of a call, shared by the emulator
 * (emu.c) and the CUDA backend (cuda.c) so the two launch exactly the same
 * way. */
#include "runtime/launch.h"

#include <string.h>

#include "ir/interval.h"

FlexStrides rt_strides4(const DLTensor *t) {
  FlexStrides s = {0, 0, 0};
  if (t) s = (FlexStrides){rt_stride_of(t, 0), rt_stride_of(t, 1), rt_stride_of(t, 2)};
  return s;
}

/* 16-byte aligned base and every non-last stride a multiple of 16 bytes
 * (8 elements of a 16-bit dtype): each row a tile loader reads starts on a
 * 16-byte boundary. */
static bool aligned16(const DLTensor *t) {
  if (!t) return true;
  int64_t es = (t->dtype.bits + 7) / 8;
  if (((uintptr_t)rt_data_of(t)) % 16) return false;
  for (int d = 0; d + 1 < t->ndim; d++)
    if ((rt_stride_of(t, d) * es) % 16) return false;
  return true;
}

/* The 16-byte cp.async path: 16-bit elements, whole 16-byte chunks per row
 * (E and EV multiples of 8, so no chunk crosses a row end), aligned rows. */
static bool use_vec16(const RtCall *c) {
  const flex_args *a = c->args;
  return c->dtype.bits == 16 && c->E % 8 == 0 && c->EV % 8 == 0 && aligned16(a->q) &&
         aligned16(a->k) && aligned16(a->v) && (!c->backward || aligned16(a->dout));
}

bool rt_launch_tma_ok(const RtCall *c) {
  const flex_args *a = c->args;
  return c->dtype.bits == 16 && c->E % 8 == 0 && c->EV % 8 == 0 && aligned16(a->q) &&
         aligned16(a->k) && aligned16(a->v) && (!c->backward || aligned16(a->dout));
}

/* One map: a [B, heads, rows, cols] 16-bit tensor at `base`. */
static flex_status tma_map(RtTmapEncode enc, void *ctx, FlexTmapBytes *map, const char *name,
                           const void *base, FlexStrides st, int cols, int rows, int heads, int B,
                           int box_rows) {
  /* Empty extents still need a valid map; the kernel reads none of it then
   * (no CTA has query rows; the walk visits no key tile). */
  uint64_t dims[4] = {(uint64_t)cols, (uint64_t)(rows > 0 ? rows : 1), (uint64_t)heads, (uint64_t)B};
  uint64_t strides[3] = {(uint64_t)st.row * 2, (uint64_t)st.h * 2, (uint64_t)st.b * 2};
  /* A dimension of extent 1 is never stepped along, so its stride is free:
   * a broadcast or per-sequence view may give 0 there, which the driver
   * need not accept. Use the packed stride instead. */
  for (int d = 1; d < 4; d++)
    if (dims[d] == 1) strides[d - 1] = d == 1 ? dims[0] * 2 : strides[d - 2] * dims[d - 1];
  uint32_t box[4] = {64, (uint32_t)box_rows, 1, 1};
  const char *why = enc(ctx, map, base, dims, strides, box);
  if (why)
    return rt_err(FLEX_ERR_UNSUPPORTED, "sm_90a kernels: no tensor map for '%s' ([%d, %d, %d, %d], "
                  "strides %lld, %lld, %lld): %s", name, B, heads, rows, cols, (long long)st.b,
                  (long long)st.h, (long long)st.row, why);
  return FLEX_OK;
}

/* A kernel's parameters take at most 4 KiB. */
_Static_assert(sizeof(FlexFwdTma) <= 4096, "the sm_90a forward's parameter fits a launch");

flex_status rt_launch_fwd_tma(const CgOptions *o, const FlexParams *p, RtTmapEncode enc, void *ctx,
                              FlexFwdTma *out) {
  memset(out, 0, sizeof *out);
  out->p = *p;
  int bm = o->fwd.block_m, bn = o->fwd.block_n;
  flex_status st = tma_map(enc, ctx, &out->tq, "q", p->q, p->sq, p->E, p->q_len, p->H, p->B, bm);
  if (!st) st = tma_map(enc, ctx, &out->tk, "k", p->k, p->sk, p->E, p->kv_len, p->HKV, p->B, bn);
  if (!st) st = tma_map(enc, ctx, &out->tv, "v", p->v, p->sv, p->EV, p->kv_len, p->HKV, p->B, bn);
  return st;
}

_Static_assert(sizeof(FlexBwdTma) <= 4096, "the sm_90a backward's parameter fits a launch");

flex_status rt_launch_bwd_tma(const CgOptions *o, const FlexParams *p, RtTmapEncode enc, void *ctx,
                              FlexBwdTma *out) {
  memset(out, 0, sizeof *out);
  out->p = *p;
  int bm = o->bwd.block_m, bn = o->bwd.block_n;
  flex_status st = tma_map(enc, ctx, &out->tq, "q", p->q, p->sq, p->E, p->q_len, p->H, p->B, bm);
  if (!st) st = tma_map(enc, ctx, &out->tdo, "dout", p->dout, p->sdo, p->EV, p->q_len, p->H, p->B, bm);
  if (!st) st = tma_map(enc, ctx, &out->tk, "k", p->k, p->sk, p->E, p->kv_len, p->HKV, p->B, bn);
  if (!st) st = tma_map(enc, ctx, &out->tv, "v", p->v, p->sv, p->EV, p->kv_len, p->HKV, p->B, bn);
  return st;
}

flex_status rt_launch_fill(const RtCall *c, FlexParams *p, const char *backend) {
  const flex_args *a = c->args;
  const IrModule *m = c->mod;
  memset(p, 0, sizeof *p);
  char why[256];
  if (!cg_module_fits(m, why, sizeof why))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend cannot run this kernel: %s", backend, why);
  if (a->lse && (a->lse->dtype.code != kDLFloat || a->lse->dtype.bits != 32 ||
                 rt_stride_of(a->lse, 2) != 1))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend needs 'lse' as float32 with unit stride "
                                        "along Q_LEN", backend);
  p->out = rt_data_of(a->out), p->so = rt_strides4(a->out);
  p->lse = (float *)rt_data_of(a->lse);
  if (a->lse) p->lse_b = rt_stride_of(a->lse, 0), p->lse_h = rt_stride_of(a->lse, 1);
  p->q = rt_data_of(a->q), p->k = rt_data_of(a->k), p->v = rt_data_of(a->v);
  p->sq = rt_strides4(a->q), p->sk = rt_strides4(a->k), p->sv = rt_strides4(a->v);
  for (int i = 0; i < m->nparams; i++) {
    if (m->params[i].type == IT_F32) p->pf[i] = (float)c->params[i].f;
    else p->pi[i] = c->params[i].i;
  }
  for (int i = 0; i < m->nsizes; i++) p->sizes[i] = c->sizes[i];
  for (int i = 0; i < m->nbuffers; i++) {
    const DLTensor *t = c->buf_tensors[i];
    if (!t) continue;
    if (!rt_contiguous(t))
      return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend needs buffer '%s' contiguous "
                                          "(row-major, no gaps)", backend, m->buffers[i].id);
    p->buf[i] = rt_data_of(t);
  }
  p->B = c->B, p->H = c->H, p->HKV = c->HKV, p->G = c->G;
  p->q_len = c->QL, p->kv_len = c->KL, p->E = c->E, p->EV = c->EV;
  p->b0 = c->b0;
  p->q_off = c->q_off, p->kv_off = c->kv_off;
  p->pages = c->pages, p->page_size = c->page_size;
  p->scale = (float)c->scale;
  p->drop_p = a->dropout_p;
  p->drop_scale = 1.0f / (1.0f - a->dropout_p);
  p->drop_seed[0] = (uint32_t)a->dropout_seed, p->drop_seed[1] = (uint32_t)(a->dropout_seed >> 32);
  p->drop_ctr3 = (uint32_t)a->dropout_offset + (uint32_t)(a->dropout_offset >> 32);
  p->vec16 = use_vec16(c);
  if (c->backward) {
    p->dq = rt_data_of(a->dq), p->dk = rt_data_of(a->dk), p->dv = rt_data_of(a->dv);
    p->sdq = rt_strides4(a->dq), p->sdk = rt_strides4(a->dk), p->sdv = rt_strides4(a->dv);
    p->dout = rt_data_of(a->dout), p->sdo = rt_strides4(a->dout);
    p->dlse = (const float *)rt_data_of(a->dlse);
  }
  return FLEX_OK;
}

flex_status rt_launch_check_geometry(const char *backend, const char *entry, const unsigned grid[3],
                                     const unsigned block[3]) {
  static const char *what[3] = {"row tiles", "heads", "batches"};
  const unsigned max[3] = {RT_GRID_X_MAX, RT_GRID_YZ_MAX, RT_GRID_YZ_MAX};
  for (int d = 0; d < 3; d++)
    if (grid[d] > max[d])
      return rt_err(FLEX_ERR_UNSUPPORTED,
                    "the %s backend cannot launch %s: its grid needs %u %s in dimension %c, the "
                    "device allows at most %u", backend, entry, grid[d], what[d], "xyz"[d], max[d]);
  if ((uint64_t)block[0] * block[1] * block[2] > 1024)
    return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend cannot launch %s: %u x %u x %u threads "
                  "per block, at most 1024", backend, entry, block[0], block[1], block[2]);
  return FLEX_OK;
}

/* ---- the mask plan ---------------------------------------------------------- */

/* The caller's BlockMask, validated and normalised; its blocks must split
 * into the kernels' tiles. */
static flex_status user_plan(const RtCall *c, const CgOptions *o, RtMaskPlan *plan) {
  const flex_block_mask *u = c->args->block_mask;
  RtMaskShape shape = {c->B, c->H, c->QL, c->KL, u->block_q, u->block_kv, 0, 0};
  flex_status st = rt_block_mask_from_user(&plan->bm, u, &shape);
  if (st) return st;
  plan->user = true;
  if (!cg_mask_blocks_ok(o, plan->bm.block_q, plan->bm.block_kv))
    return rt_err(FLEX_ERR_UNSUPPORTED,
                  "block_mask blocks of %dx%d do not split into this kernel's tiles (forward "
                  "%dx%d, backward %dx%d): use multiples of those", plan->bm.block_q,
                  plan->bm.block_kv, o->fwd.block_m, o->fwd.block_n, o->bwd.block_m,
                  o->bwd.block_n);
  return FLEX_OK;
}

flex_status rt_launch_mask_plan(const RtCall *c, const CgOptions *o, RtMaskPlan *plan) {
  memset(plan, 0, sizeof *plan);
  plan->mode = o->mask_mode;
  if (c->args->block_mask) return user_plan(c, o, plan);
  if (o->mask_builder) {
    plan->build = true;
    cg_mask_blocks(o, &plan->block_q, &plan->block_kv);
    plan->Bm = ir_interval_uses_arg(c->mod, ARG_B) ? c->B : 1;
    plan->Hm = ir_interval_uses_arg(c->mod, ARG_H) ? c->H : 1;
    plan->nq = (c->QL + plan->block_q - 1) / plan->block_q;
    plan->nkv = (c->KL + plan->block_kv - 1) / plan->block_kv;
  }
  return FLEX_OK;
}

void rt_launch_mask_free(RtMaskPlan *plan) {
  if (plan->user) rt_block_mask_free(&plan->bm);
  plan->user = false;
}

void rt_launch_mask_bytes(const RtMaskPlan *plan, size_t bytes[9]) {
  size_t bh = (size_t)plan->Bm * (size_t)plan->Hm, nq = (size_t)plan->nq, nkv = (size_t)plan->nkv;
  size_t sz[9] = {bh * nq, bh * nq * nkv, bh * nq, bh * nq * nkv,
                  bh * nkv, bh * nkv * nq, bh * nkv, bh * nkv * nq, bh * nq * nkv};
  for (int i = 0; i < 9; i++) bytes[i] = sz[i] * (i < 8 ? 4 : 1);
}

/* One side: num [B', H', rows], idx [B', H', rows, cols]; broadcast dims stride 0. */
static FlexBlockList side(const int32_t *num, const int32_t *idx, int Bm, int Hm, int rows,
                          int cols) {
  FlexBlockList l;
  memset(&l, 0, sizeof l);
  if (!num || !idx) return l;
  l.num = num, l.idx = idx;
  l.num_r = 1, l.num_h = Hm == 1 ? 0 : rows, l.num_b = Bm == 1 ? 0 : (int64_t)Hm * rows;
  l.idx_r = cols, l.idx_h = Hm == 1 ? 0 : (int64_t)rows * cols;
  l.idx_b = Bm == 1 ? 0 : (int64_t)Hm * rows * cols;
  return l;
}

void rt_launch_set_lists(FlexParams *p, int32_t *const arr[8], int Bm, int Hm, int nq, int nkv,
                         int block_q, int block_kv) {
  p->kv_list = side(arr[0], arr[1], Bm, Hm, nq, nkv);
  p->full_kv_list = side(arr[2], arr[3], Bm, Hm, nq, nkv);
  p->q_list = side(arr[4], arr[5], Bm, Hm, nkv, nq);
  p->full_q_list = side(arr[6], arr[7], Bm, Hm, nkv, nq);
  p->block_q = block_q;
  p->block_kv = block_kv;
}

void rt_launch_builder(FlexParams *p, const RtMaskPlan *plan, unsigned char *cls,
                       int32_t *const arr[8]) {
  p->mask_cls = cls;
  memcpy(p->mask_out, arr, sizeof p->mask_out);
  p->mask_B = plan->Bm, p->mask_H = plan->Hm;
  p->mask_nq = plan->nq, p->mask_nkv = plan->nkv;
  rt_launch_set_lists(p, arr, plan->Bm, plan->Hm, plan->nq, plan->nkv, plan->block_q,
                      plan->block_kv);
}

void rt_launch_user_lists(FlexParams *p, const RtMaskPlan *plan) {
  const RtBlockMask *b = &plan->bm;
  int32_t *const arr[8] = {b->kv_num_blocks, b->kv_indices, b->full_kv_num_blocks,
                           b->full_kv_indices, b->q_num_blocks, b->q_indices,
                           b->full_q_num_blocks, b->full_q_indices};
  rt_launch_set_lists(p, arr, b->B, b->H, b->nq, b->nkv, b->block_q, b->block_kv);
}


flex_status rt_launch_bounds_report(const RtCall *c, const int32_t *rec) {
  if (!rec[0]) return FLEX_OK;
  const int site = rec[1], kind = (site >> 16) & 0x3fff, i = site & 0xffff;
  const IrModule *m = c->mod;
  const IrFunc *const fns[] = {[IRF_SCORE] = m->score, [IRF_MASK] = m->mask, [IRF_JOINT] = m->joint,
                               [IRF_SINK] = m->sink, [IRF_SINK_GRAD] = m->sink_grad};
  const IrFunc *f = kind <= IRF_SINK_GRAD ? fns[kind] : NULL;
  CHECK(f && i < f->n && (f->inst[i].op == IR_LOAD || f->inst[i].op == IR_ACCUM));
  const IrInst *in = &f->inst[i];
  int64_t idx[IR_MAXDIMS];
  int n = rec[2] < IR_MAXDIMS ? rec[2] : IR_MAXDIMS;
  for (int d = 0; d < n; d++) idx[d] = rec[3 + d];
  const char *what = site & FLEX_BOUNDS_I64 ? "i64 value that does not fit in 32 bits read from"
                     : in->op == IR_ACCUM  ? "out-of-range gradient of"
                                           : "out-of-range read of";
  const IrBufView *bv = &c->bufs[in->aux];
  char msg[512];
  ir_access_error(msg, sizeof msg, what, m, &c->kernel->src, in, idx, n, bv->shape, bv->ndims);
  return rt_err(FLEX_ERR_RUNTIME, "checked run: %s", msg);
}
