/* plan.c: cg_plan(): what one call's kernels are generated with, chosen
 * once from the call's shape and the device's capabilities. Every kernel
 * choice lives here (tiles and their re-picks, the sm_90a bodies, the mask
 * mode, grouped-query packing, split-KV); the run sequence (runtime/run.c)
 * only carries it out. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/codegen.h"
#include "ir/interval.h"

/* Tiles picked again after a field that decides them changed. */
static bool retile(CgOptions *o, char *err, size_t errlen) {
  return cg_options_retile(o, err, errlen);
}

/* The mask mode: a caller's BlockMask gives lists; no mask, no test; a mask
 * the analysis decides, the walk classifies tiles itself; any other, lists
 * from the builder entries. */
static void mask_mode(CgOptions *o, const IrModule *m, const CgShape *s) {
  o->mask_builder = false;
  if (s->mask_block_q) o->mask_mode = CG_MASK_LISTS;
  else if (!o->has_mask) o->mask_mode = CG_MASK_NONE;
  else if (ir_interval_device_decidable(m)) o->mask_mode = CG_MASK_IMPLICIT;
  else o->mask_mode = CG_MASK_LISTS, o->mask_builder = true;
}

/* Grouped-query packing (docs/decoding.md): a decoding forward (Q_LEN <=
 * CG_PACK_MAX_Q_LEN) on the generated kernels with G = H / HKV > 1 runs as a
 * call of HKV heads of G Q_LEN rows, so each K/V tile is read once per
 * group instead of once per query head, and a row tile's rows are live
 * rows of the group's heads instead of padding past Q_LEN. The walk's lists
 * are per query head and dropout's bits per (head, query), so a call with
 * a BlockMask or dropout is not packed; $FLEXC_PACK_GQA=0 turns it off. */
static bool pack_gqa(const CgOptions *o, const CgShape *s, const CgDevice *d) {
  if (d->host || s->backward || s->H / s->HKV < 2 || s->QL < 1 || !s->pack_ok ||
      !strcmp(base_config()->pack_gqa, "0"))
    return false;
  return s->QL <= CG_PACK_MAX_Q_LEN && !o->dropout &&
         (o->mask_mode == CG_MASK_NONE || o->mask_mode == CG_MASK_IMPLICIT);
}

/* Key chunks of the forward (docs/decoding.md): the call's kv_splits when
 * given, clamped to the key tiles; else, when the grid has fewer CTAs than
 * the device has SMs, enough chunks for about two CTAs per SM, each chunk
 * at least two key tiles, at most CG_SPLIT_MAX. 1: not split. A host
 * backend runs every row whole and never splits. */
static int kv_splits(const CgOptions *o, const CgShape *s, const CgDevice *d) {
  if (d->host || s->backward || s->QL == 0 || s->KL == 0) return 1;
  const int tiles = cg_fwd_kv_tiles(o, s->KL);
  if (s->kv_splits > 0) return s->kv_splits < tiles ? s->kv_splits : tiles;
  int sms = d->sms > 0 ? d->sms : CG_SPLIT_DEFAULT_SMS;
  const int G = o->pack_gqa ? s->H / s->HKV : 1;
  const CgLaunch g = cg_launch_fwd(o, s->B, s->H / G, s->QL * G);
  const int64_t ctas = (int64_t)g.grid[0] * g.grid[1] * g.grid[2];
  if (ctas == 0 || ctas >= sms) return 1; /* an empty batch launches nothing */
  int64_t n = (2 * (int64_t)sms + ctas - 1) / ctas;
  if (n > tiles / 2) n = tiles / 2;
  if (n > CG_SPLIT_MAX) n = CG_SPLIT_MAX;
  return n < 2 ? 1 : (int)n;
}

bool cg_plan(CgOptions *o, int *splits, const IrModule *m, const CgShape *s, const CgDevice *d,
             char *err, size_t errlen) {
  *splits = 1;
  /* A host backend's options carry dtype, head dims, the mask and its own
   * tiles; the arch is only what cg_options_init validates against. */
  CgArch arch = d->host ? CG_SM80 : d->arch;
  if (!cg_options_init(o, m, s->dtype, s->E, s->EV, arch, s->backward, err, errlen)) return false;
  const bool folded = cg_bias_folded(o); /* what the tiles were picked for */
  /* Dropout needs registers for its Philox rounds; the sm_90a bodies need
   * TMA-loadable, unpaged K/V and no dropout: tiles picked again. */
  o->dropout = s->dropout;
  o->paged = s->paged;
  o->no_tma = !s->tma_ok || !d->tensor_maps;
  o->deterministic = s->backward && s->deterministic; /* a forward ignores it */
  o->out_f32 = s->out_f32;
  o->offsets = s->offsets;
  o->check_bounds = s->check_bounds;
  o->dqk = s->QL <= CG_DQK_MAX && s->KL <= CG_DQK_MAX;
  /* G / scale stays finite for any bias below 2^111 */
  o->bias_fold = fabsf(s->scale) >= 0x1p-16f && fabsf(s->scale) < INFINITY;
  /* A bias folded into S (flex_bias) takes an identity score's tiles. */
  if ((o->dropout || o->arch == CG_SM90A || cg_bias_folded(o) != folded) && !retile(o, err, errlen))
    return false;
  /* A caller's BlockMask whose blocks the sm_90a forward's 128 x 128 tiles
   * do not divide (64-key blocks, say) runs on the sm_80 forward's smaller
   * ones; a forward asked for key chunks too (the sm_90a body runs whole). */
  if (o->fwd_sm90 && ((s->mask_block_q && !cg_mask_blocks_ok(o, s->mask_block_q, s->mask_block_kv)) ||
                      (!s->backward && s->kv_splits > 1))) {
    o->no_tma = true;
    if (!retile(o, err, errlen)) return false;
  }
  /* A caller's BlockMask of smaller key blocks than the 128-key tiles of
   * the sm_80 forward and the backward (64, say): narrower tiles. */
  if (s->mask_block_kv) cg_fit_mask_blocks(o, s->mask_block_kv);
  if (d->host) o->fwd = d->host_fwd, o->bwd = d->host_bwd;
  mask_mode(o, m, s);
  /* The sm_90a forward runs a call unpacked and unsplit (docs/decoding.md). */
  if (!s->backward && !o->fwd_sm90) {
    const bool was = cg_bias_folded(o);
    o->pack_gqa = pack_gqa(o, s, d);
    /* Packed rows span heads, and a bias is folded per head: its tiles go
     * with it (no BlockMask and no host backend here: nothing above is
     * undone). */
    if (cg_bias_folded(o) != was && !retile(o, err, errlen)) return false;
    *splits = kv_splits(o, s, d);
    o->kv_split = *splits > 1;
  }
  return true;
}
