/* kernel.c: kernel instantiation and launch geometry.
 *
 * cg_options_init() picks tiles from the tile table (per arch, dtype, head
 * dim and direction; FLEXC_TILES or cg_tiles_apply() override them);
 * cg_emit_cuda() writes the translation unit: header comment, template
 * includes, the device functions, and one extern "C" entry per kernel that
 * instantiates a template body. The cg_launch_*() functions give the grid,
 * block and dynamic shared memory both the CUDA backend and the emulator use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "kernels/params.cuh"
#include "ir/interval.h"

static const char *const arch_names[CG_NARCH] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};

const char *cg_arch_name(CgArch a) { return a < CG_NARCH ? arch_names[a] : "?"; }

bool cg_arch_parse(const char *s, CgArch *out) {
  for (int i = 0; i < CG_NARCH; i++)
    if (!strcmp(s, arch_names[i])) {
      *out = (CgArch)i;
      return true;
    }
  return false;
}

size_t cg_arch_smem_limit(CgArch a) {
  switch (a) {
  case CG_SM80: return 163 * 1024;
  case CG_SM86: case CG_SM89: return 99 * 1024;
  default: return 227 * 1024;
  }
}

const char *cg_dtype_name(CgDtype d) {
  return d == CG_FP32 ? "fp32" : d == CG_FP16 ? "fp16" : "bf16";
}

bool cg_dtype_parse(const char *s, CgDtype *out) {
  for (int i = 0; i < 3; i++)
    if (!strcmp(s, cg_dtype_name((CgDtype)i))) {
      *out = (CgDtype)i;
      return true;
    }
  return false;
}

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

int cg_fwd_sm90_dim(int head_dim) { return round_up(head_dim, 64); }

/* A head dim past 128 once padded to 64-column panels: the sm_90a kernels'
 * accumulators no longer fit one consumer's registers beside the scores. */
static bool sm90_wide(const CgOptions *o) {
  return cg_fwd_sm90_dim(o->head_dim) > 128 || cg_fwd_sm90_dim(o->head_dim_v) > 128;
}

/* Integer divisions and remainders in the mask: each is an interval
 * division (flex_iv_div, flex_iv_mod: 64-bit bounds) when the walk
 * classifies a tile. */
static int mask_divisions(const IrModule *m) {
  const IrFunc *f = m->mask;
  int n = 0;
  for (int i = 0; f && i <= f->ret; i++) {
    int op = f->inst[i].op;
    n += op == IR_DIV_I || op == IR_MOD_I || op == IR_FLOORDIV || op == IR_FLOORMOD;
  }
  return n;
}

/* Consumer warpgroups of the sm_90a forward: two (setmaxnreg 40 / 232,
 * FlexSm90Regs), except under an implicit mask whose tile classifier has
 * more than two integer divisions, or more than one above head dim 128:
 * with two consumers the producer runs the walk in the 40 registers
 * setmaxnreg leaves it, and ptxas spilled there (at 48: natten_gym and
 * natten_tiled, 6 and 15 divisions, 52 and 500 bytes of spill stores at E
 * = 128, natten's 4 at E = 256; at 40: dilated's 2 at E = 256, 24 bytes).
 * One consumer keeps 255 registers for everyone. */
static int sm90_consumers(const CgOptions *o) {
  return o->mask_divisions <= (sm90_wide(o) ? 1 : 2) ? 2 : 1;
}

/* The S / P V overlap of the sm_90a forward (S, P and O live at once):
 * always for an identity score; for a score function up to head dim 128
 * (above, O alone takes 128 registers, and gemma2 spilled 4 bytes with the
 * overlap in 232). */
bool cg_fwd_sm90_overlap(const CgOptions *o) {
  return o->score_identity || !sm90_wide(o);
}

bool cg_fwd_sm90_ok(const CgOptions *o) {
  return o->arch == CG_SM90A && o->dtype != CG_FP32 && !o->paged && !o->dropout && !o->no_tma;
}

/* The one place that decides the backward's body: the sm_90a one for what
 * it supports, flex_bwd_tc / flex_bwd_main for the rest. Dropout, paged
 * K/V and the deterministic variant are not in the sm_90a body, nor head
 * dims above 128 under an implicit mask with more than two integer
 * divisions: the two consumers leave the producer 40 registers for the
 * walk, and ptxas spilled there (at 48 already: natten_gym 88, natten_tiled
 * 492 bytes of spill stores at E = 256), as in the forward (sm90_consumers). */
bool cg_bwd_sm90_ok(const CgOptions *o) {
  return o->arch == CG_SM90A && o->backward && o->dtype != CG_FP32 && !o->paged && !o->dropout &&
         !o->no_tma && !o->deterministic && cg_fwd_sm90_dim(o->head_dim) <= 256 &&
         cg_fwd_sm90_dim(o->head_dim_v) <= 256 && !(sm90_wide(o) && o->mask_divisions > 2);
}

/* Whether the sm_90a backward's two consumers split the keys (flex_bwd_sm90's
 * KS, FlashAttention-3's layout): 128 keys per CTA, consumer c owning keys
 * 64 c .. 64 c + 63 with every column of dK and dV (EPT / 2 + EVPT / 2 <=
 * 128 accumulator registers per thread), so each Q and dO tile loaded
 * serves 128 keys. At E padded to 128 (65..128), EV up to 128, unless the
 * mask's tile classifier has an integer division (the producer's walk in
 * the 24 registers setmaxnreg leaves it spilled: dilated, two divisions,
 * 28 bytes) or a caller's BlockMask has blocks of 64 keys: then one
 * consumer of 64 keys. Decided once by the tiles (o->bwd.block_n). */
static bool bwd_sm90_keys_split_fits(const CgOptions *o) {
  return !sm90_wide(o) && cg_fwd_sm90_dim(o->head_dim) == 128 && o->mask_divisions == 0;
}
static bool bwd_sm90_keys_split(const CgOptions *o) {
  return o->bwd_sm90 && !sm90_wide(o) && o->bwd.block_n == 128;
}

/* Consumer warpgroups of the sm_90a backward: two splitting the keys
 * (above), or one up to head dims 128 (dK and dV of 64 keys in EPT / 2 +
 * EVPT / 2 <= 128 accumulator registers per thread); above 128, two, each
 * holding the dK, dV and dQ of half the columns (FlashAttention-3's split)
 * and both computing S^T and dP^T. */
int cg_bwd_sm90_consumers(const CgOptions *o) {
  return sm90_wide(o) || bwd_sm90_keys_split(o) ? 2 : 1;
}

/* Whether the sm_90a backward adds dQ with bulk reductions, a row each, by
 * its dQ warp (flex_bwd_sm90's DQB): one consumer, or two splitting the
 * keys (two consumers of 64 keys leave no shared memory for the staging at
 * head dims 256), and E % 4 == 0 (16-byte rows). */
static bool bwd_sm90_dq_bulk(const CgOptions *o) {
  return (cg_bwd_sm90_consumers(o) == 1 || bwd_sm90_keys_split(o)) && o->head_dim % 4 == 0;
}

/* Registers the sm_90a backward's producer warpgroup keeps with two
 * consumers (flex_bwd_sm90's PREGS; the consumers get FlexSm90Regs's
 * rest of the CTA's 384 x 168): 24 (they get 240) under a mask without
 * integer divisions, else 40 (232). At 232 the consumers spilled for
 * alibi, gemma2, dilated, softcap and document with the keys split, and
 * for alibi above head dim 128; in 24 the walker of a dividing mask
 * spilled (dilated, 28 bytes at E = 128), which is why the keys split
 * only under masks without divisions (bwd_sm90_keys_split_fits). */
static int bwd_sm90_producer_regs(const CgOptions *o) {
  return o->mask_divisions == 0 ? 24 : 40;
}

/* The sm_90a backward's padded head dim: whole 64-column panels per
 * consumer, so a consumer's dK / dV wgmma starts on a panel (an N-major
 * operand cannot start inside the 128-byte swizzle atom); with two
 * consumers splitting the columns 129..192 pads to 256 like 193..256. */
int cg_bwd_sm90_dim(const CgOptions *o, int head_dim) {
  return round_up(head_dim, sm90_wide(o) ? 128 : 64);
}

/* Dynamic shared memory of each body (must match the templates' carving). */
static size_t smem_fwd(const CgOptions *o) {
  int EP = o->head_dim_pad, EVP = o->head_dim_v_pad, BM = o->fwd.block_m, BN = o->fwd.block_n;
  if (o->fwd_sm90) { /* 1024 alignment slack, Q, 2 stages of K and V, 5 mbarriers, 4 stage words */
    int EPT = cg_fwd_sm90_dim(o->head_dim), EVPT = cg_fwd_sm90_dim(o->head_dim_v);
    return 1024u + 2u * (size_t)(BM * EPT + 2 * BN * (EPT + EVPT)) + 5 * 8 + 4 * 4;
  }
  if (o->dtype == CG_FP32)
    return 4u * (size_t)(BM * (EP + 1) + BN * (EP + 1) + BN * EVP + BM * (BN + 1));
  /* flex_fwd_tc: Q, two stages of K and V, rows padded by 8, then the walk;
   * with one m16 tile per warp and EP <= 128 (QREG) Q goes to registers and
   * its space holds V's second stage. */
  size_t q = (size_t)BM * (EP + 8), v = (size_t)BN * (EVP + 8);
  if (BM == 16 * (o->fwd.threads / 32) && EP <= 128)
    return 2u * ((q > v ? q : v) + 2 * (size_t)BN * (EP + 8) + v) + FLEX_WALK_BYTES;
  return 2u * (q + 2 * (size_t)BN * (EP + 8) + 2 * v) + FLEX_WALK_BYTES;
}

static size_t smem_bwd(const CgOptions *o) {
  int EP = o->head_dim_pad, EVP = o->head_dim_v_pad, BM = o->bwd.block_m, BN = o->bwd.block_n;
  if (o->bwd_sm90) { /* 1024 alignment slack, K, V (BN keys), 2 stages of Q and dO, 2 dS, the dQ
                       * staging (2 x 64 rows, 1 x with the keys split), 2 stages of LSE and D,
                       * 12 mbarriers, 12 words */
    size_t EPT = (size_t)cg_bwd_sm90_dim(o, o->head_dim), EVPT = (size_t)cg_bwd_sm90_dim(o, o->head_dim_v);
    return 1024u + 2u * (size_t)BN * (EPT + EVPT) + 2u * 2u * (size_t)BM * (EPT + EVPT) +
           2u * 2u * (size_t)BM * (size_t)BN + 2u * 2u * 4u * (size_t)BM + 12 * 8 + 12 * 4 +
           (bwd_sm90_dq_bulk(o) ? (bwd_sm90_keys_split(o) ? 1u : 2u) * 64u * (size_t)FLEX_BWD_SM90_DQ_ROW(EPT)
                                : 0u);
  }
  if (o->dtype != CG_FP32) /* flex_bwd_tc: K, V, Q, dO, P^T, dS^T padded by 8; LSE, D; the walk */
    return 2u * (size_t)(BN * (EP + 8) + BN * (EVP + 8) + BM * (EP + 8) + BM * (EVP + 8) +
                         2 * BN * (BM + 8)) + 8u * (size_t)BM + FLEX_WALK_BYTES;
  return 4u * (size_t)(BN * (EP + 1) + BN * (EVP + 1) + BM * (EP + 1) + BM * (EVP + 1) +
                       2 * BN * (BM + 1) + 2 * BM);
}

/* True when f computes just `return ARG`. */
static bool returns_arg(const IrFunc *f, IrArg a) {
  const IrInst *r = &f->inst[f->ret];
  return r->op == IR_ARG && r->aux == (int)a;
}

static bool has_accum(const IrFunc *f) {
  for (int i = 0; i < f->n; i++)
    if (f->inst[i].op == IR_ACCUM) return true;
  return false;
}

/* The tile table (CgTileRow in codegen.h says how a row is matched). Every
 * row runs on the emulator against the reference (check_emu_kernels
 * --tiles, CTest check_tiles), as does every shape of bench/tile_sweep.txt. */
static const CgTileRow tile_table[] = {
    /* fp32 SIMT (128 threads, 128 / BM threads per row): fp32-accurate, no TF32. */
    {CG_SM80, CG_SM90A, CG_FP32, 128, false, {32, 32, 128}, {32, 32, 128}},
    {CG_SM80, CG_SM90A, CG_FP32, 256, false, {16, 16, 128}, {16, 16, 128}},
    /* Tensor cores. Forward (FlashAttention-3's sm80 shape): 8 warps of 16
     * query rows and 128-key tiles, each warp's Q in registers (its shared
     * space then holds V's second stage): O takes EV / 2 registers per
     * thread, S 64, Q E / 4. With a score function, dropout or a mask of
     * more than two integer divisions at EV = 128, 128-key tiles spilled
     * (ptxas, bench/RESULTS.md), so those get 64-key ones. Backward: 64
     * query rows, BN keys by (EP + EVP) * BN / 128 dK/dV accumulators per
     * thread. */
    /* The sm_80-style forward on a Hopper device (sm_90 / sm_90a without
     * the TMA body), head dims up to 64, plain: 4 warps of 32 rows and
     * 64-key tiles ran at 293 / 152 TFLOP/s (noop / causal) against 212 /
     * 119 for 128 x 128 x 8 on an H200, side by side in one run
     * (bench/RESULTS.md, 2026-11-28); no spill. At 128 it spilled 64 bytes
     * (ptxas, sm_90), so 128 keeps the shape below. */
    {CG_SM90, CG_SM90A, -1, 64, true, {128, 64, 128}, {64, 128, 256}},
    {CG_SM80, CG_SM90A, -1, 64, false, {128, 128, 256}, {64, 128, 256}},
    {CG_SM80, CG_SM90A, -1, 128, true, {128, 128, 256}, {64, 128, 256}},
    {CG_SM80, CG_SM90A, -1, 128, false, {128, 64, 256}, {64, 128, 256}},
    {CG_SM80, CG_SM90A, -1, 256, false, {64, 32, 128}, {64, 32, 128}},
};

const CgTileRow *cg_tile_table(int *n) {
  *n = (int)(sizeof tile_table / sizeof *tile_table);
  return tile_table;
}

static const CgTileRow *tile_row(const CgOptions *o, int dim) {
  for (size_t i = 0; i < sizeof tile_table / sizeof *tile_table; i++) {
    const CgTileRow *r = &tile_table[i];
    bool dt = r->dtype < 0 ? o->dtype != CG_FP32 : (int)o->dtype == r->dtype;
    if (o->arch >= r->lo && o->arch <= r->hi && dt && dim <= r->max_dim &&
        (!r->plain || ((o->score_identity || cg_bias_folded(o)) && !o->dropout &&
                       o->mask_divisions <= 2)))
      return r;
  }
  return &tile_table[sizeof tile_table / sizeof *tile_table - 1];
}

static void pick_tiles(CgOptions *o) {
  int big = o->head_dim_pad > o->head_dim_v_pad ? o->head_dim_pad : o->head_dim_v_pad;
  o->fwd = tile_row(o, o->dtype == CG_FP32 ? big : o->head_dim_v_pad)->fwd;
  o->bwd = tile_row(o, big)->bwd;
  /* sm_90a forward: a producer warpgroup and two consumer warpgroups (one
   * for masks with many divisions: sm90_consumers) of 64
   * query rows each (128 rows share every K/V tile); 128 keys per tile up
   * to head dim 128 (S and O take 64 accumulator registers each), 64 above
   * (O alone takes 128). */
  o->fwd_sm90 = cg_fwd_sm90_ok(o);
  if (o->fwd_sm90) {
    int nc = sm90_consumers(o);
    o->fwd = (CgTiles){64 * nc, sm90_wide(o) ? 64 : 128, 128 * (1 + nc)};
  }
  /* sm_90a backward: a producer warpgroup and two consumer warpgroups of
   * 64 keys each (128 keys per CTA), or one or two consumers of the same 64
   * keys (16 per warp); query tiles of 64 rows. */
  o->bwd_sm90 = cg_bwd_sm90_ok(o);
  if (o->bwd_sm90) {
    o->bwd = (CgTiles){64, bwd_sm90_keys_split_fits(o) ? 128 : 64, 0};
    o->bwd.threads = 128 * (1 + cg_bwd_sm90_consumers(o));
  }
  /* A head dim above 128 on an arch with less shared memory: narrower K/V tiles. */
  size_t limit = cg_arch_smem_limit(o->arch);
  while (o->dtype != CG_FP32 && !o->fwd_sm90 && o->fwd.block_n > 16 && smem_fwd(o) > limit)
    o->fwd.block_n /= 2;
  /* The backward's K, V, P and dS scale with block_n: halve it (the warps
   * follow, max(4, block_n / 16)) until the tiles fit (sm_86: 99 KiB). */
  while (o->dtype != CG_FP32 && o->bwd.block_n > 16 && smem_bwd(o) > limit) {
    o->bwd.block_n /= 2;
    o->bwd.threads = 32 * (o->bwd.block_n / 16 < 4 ? 4 : o->bwd.block_n / 16);
  }
}

/* Whether a shape can instantiate its template (see the static_asserts of
 * kernels/flex_fwd.cuh and flex_bwd.cuh); why not in err. */
static bool tiles_valid(const CgOptions *o, const CgTiles *t, bool bwd, char *err, size_t errlen) {
  int bm = t->block_m, bn = t->block_n, w = t->threads / 32;
  bool pow2 = bm > 0 && bn > 0 && !(bm & (bm - 1)) && !(bn & (bn - 1));
  const char *why = NULL;
  if (!pow2 || t->threads % 32) why = "block sizes must be powers of two and threads whole warps";
  else if (o->dtype == CG_FP32) {
    if (t->threads != 128) why = "the fp32 kernels run 128 threads";
    else if (bm < 16 || bm > 128 || bn < 16 || bn > 128) why = "fp32 blocks are 16 to 128";
    else if (bwd && bm != bn) why = "the fp32 backward needs block_m == block_n";
    else if (bwd && bn > 32) why = "the fp32 backward keeps dK, dV in registers: block_n <= 32";
  } else if (!bwd) {
    if (w < 1 || w > 8 || bm % (16 * w) || bm / (16 * w) > 2)
      why = "forward: block_m is 16 or 32 rows per warp, 1 to 8 warps";
    else if (bn < 16 || bn > 128) why = "forward: block_n is 16 to 128";
  } else if (bm != 64 || (bn != 16 && bn != 32 && bn != 64 && bn != 128) ||
             w != (bn / 16 < 4 ? 4 : bn / 16)) {
    why = "backward: 64 x 16, 32 or 64 with 4 warps, 64 x 128 with 8";
  }
  if (why) snprintf(err, errlen, "%s tiles %dx%dx%d: %s", bwd ? "bwd" : "fwd", bm, bn, w, why);
  return !why;
}

bool cg_tiles_apply(CgOptions *o, const char *spec, char *err, size_t errlen) {
  CgTiles t[2] = {o->fwd, o->bwd};
  bool gave_fwd = false, gave_bwd = false;
  const char *s = spec;
  while (*s) {
    int bwd, bm, bn, w, n = 0;
    if (!strncmp(s, "fwd=", 4)) bwd = 0, gave_fwd = true;
    else if (!strncmp(s, "bwd=", 4)) bwd = 1, gave_bwd = true;
    else break;
    if (sscanf(s + 4, "%dx%dx%d%n", &bm, &bn, &w, &n) != 3 || w < 1 || w > 32) break;
    t[bwd].block_m = bm, t[bwd].block_n = bn, t[bwd].threads = 32 * w;
    s += 4 + n;
    if (*s == ',' && s[1]) s++;
    else if (*s) break;
  }
  if (*s || !*spec) {
    snprintf(err, errlen, "bad tile override '%s' (want fwd=MxNxWARPS,bwd=MxNxWARPS)", spec);
    return false;
  }
  CgOptions n = *o;
  n.fwd = t[0], n.bwd = t[1];
  /* A forward shape names the sm_80 body's tiles: it turns the sm_90a body off. */
  if (gave_fwd) n.fwd_sm90 = false;
  if (gave_bwd) n.bwd_sm90 = false; /* likewise the backward's */
  if ((!n.fwd_sm90 && !tiles_valid(&n, &n.fwd, false, err, errlen)) ||
      (o->backward && !n.bwd_sm90 && !tiles_valid(&n, &n.bwd, true, err, errlen)))
    return false;
  *o = n;
  return true;
}

bool cg_module_fits(const IrModule *m, char *err, size_t errlen) {
  if (m->nparams <= FLEX_MAX_PARAMS && m->nbuffers <= FLEX_MAX_BUFFERS && m->nsizes <= FLEX_MAX_SIZES)
    return true;
  snprintf(err, errlen, "kernels support at most %d params, %d buffers and %d size symbols "
           "(this one has %d, %d and %d)", FLEX_MAX_PARAMS, FLEX_MAX_BUFFERS,
           FLEX_MAX_SIZES - SZ_COUNT, m->nparams, m->nbuffers, m->nsizes - SZ_COUNT);
  return false;
}

bool cg_options_init(CgOptions *o, const IrModule *m, CgDtype dtype, int E, int EV, CgArch arch,
                     bool backward, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  if (E < 1 || E > 256 || EV < 1 || EV > 256) {
    snprintf(err, errlen, "head dims must be 1..256 (got E=%d, EV=%d)", E, EV);
    return false;
  }
  if (!cg_module_fits(m, err, errlen)) return false;
  if (backward && !m->joint) {
    snprintf(err, errlen, "backward requested but the module has no joint function");
    return false;
  }
  o->dtype = dtype;
  o->head_dim = E;
  o->head_dim_v = EV;
  o->head_dim_pad = round_up(E, 16);
  o->head_dim_v_pad = round_up(EV, 16);
  o->arch = arch;
  o->has_mask = m->mask != NULL;
  o->has_sink = m->sink != NULL;
  /* A mask the analysis decides needs no BlockMask: the walk classifies
   * its tiles. The runtime switches undecidable masks to built lists. */
  o->mask_mode = !o->has_mask ? CG_MASK_NONE
                 : ir_interval_device_decidable(m) ? CG_MASK_IMPLICIT : CG_MASK_DENSE;
  o->backward = backward;
  o->dqk = true; /* cg_plan turns it off for a call with positions past CG_DQK_MAX */
  for (int i = 0; i < m->nbuffers; i++) {
    o->grad_buffers |= m->buffers[i].grad;
    o->sorted_check |= m->buffers[i].sorted;
  }
  o->score_identity = m->score_is_identity || returns_arg(m->score, ARG_S);
  o->score_bias = !o->score_identity && cg_score_bias(m, backward);
  o->bias_fold = true; /* cg_plan decides from the call's scale */
  o->mask_divisions = o->mask_mode == CG_MASK_IMPLICIT ? mask_divisions(m) : 0;
  o->ds_is_dt = backward && returns_arg(m->joint, ARG_DT) && !has_accum(m->joint);
  o->source = m->prog && m->prog->src ? m->prog->src->path : NULL;
  return cg_options_retile(o, err, errlen);
}

bool cg_options_retile(CgOptions *o, char *err, size_t errlen) {
  pick_tiles(o);
  const char *tiles = base_config()->tiles;
  if (*tiles && !cg_tiles_apply(o, tiles, err, errlen)) return false;
  CgArch arch = o->arch;
  int E = o->head_dim, EV = o->head_dim_v;
  if (smem_fwd(o) > cg_arch_smem_limit(arch) || smem_bwd(o) > cg_arch_smem_limit(arch)) {
    snprintf(err, errlen, "no tile shape fits %s shared memory for E=%d, EV=%d", cg_arch_name(arch),
             E, EV);
    return false;
  }
  return true;
}

static unsigned cdiv(int a, int b) { return (unsigned)((a + b - 1) / b); }

/* An empty dimension stays 0: the run sequence launches nothing for it (a
 * packed sequence without queries has no query tiles and no mask rows; one
 * block of it would write a row the mask's arrays do not have). */
static CgLaunch launch(unsigned gx, int gy, int gz, int threads, size_t smem) {
  CgLaunch l = {{gx, (unsigned)gy, (unsigned)gz}, {(unsigned)threads, 1, 1}, smem};
  return l;
}

CgLaunch cg_launch_fwd(const CgOptions *o, int B, int H, int q_len) {
  return launch(cdiv(q_len, o->fwd.block_m), H, B, o->fwd.threads, smem_fwd(o));
}
CgLaunch cg_launch_fwd_split(const CgOptions *o, int B, int H, int q_len, int splits) {
  CgLaunch l = cg_launch_fwd(o, B, H, q_len);
  if (q_len > 0 && splits > 1) l.grid[0] *= (unsigned)splits;
  return l;
}
CgLaunch cg_launch_fwd_combine(const CgOptions *o, int B, int H, int q_len) {
  (void)o; /* one warp per row, four rows per CTA */
  return launch((unsigned)(((int64_t)B * H * q_len + 3) / 4), 1, 1, 128, 0);
}
int cg_fwd_kv_tiles(const CgOptions *o, int kv_len) { return (int)cdiv(kv_len, o->fwd.block_n); }
CgLaunch cg_launch_bwd_pre(const CgOptions *o, int B, int H, int q_len) {
  (void)o;
  return launch(cdiv(q_len, 128), H, B, 128, 0);
}
/* CTAs a deterministic backward aims at: two per SM of the largest GPUs
 * we target (132 on H100 SXM), so the narrower grid still fills them. */
enum { FLEX_DET_CTAS = 264 };

/* $FLEXC_BWD_SPLITS (a positive integer) overrides the count, as
 * FLEXC_TILES does the tiles: tests run CTAs of several key tiles with it. */
int cg_bwd_splits(const CgOptions *o, int B, int HKV, int kv_len) {
  int tiles = (int)cdiv(kv_len, o->bwd.block_n), bh = B * HKV > 0 ? B * HKV : 1;
  int want = (FLEX_DET_CTAS + bh - 1) / bh;
  long env = base_config()->bwd_splits;
  if (env > 0 && env < INT32_MAX) want = (int)env;
  return want < tiles ? want : tiles;
}

CgLaunch cg_launch_bwd(const CgOptions *o, int B, int HKV, int kv_len) {
  unsigned gx = o->deterministic ? (unsigned)cg_bwd_splits(o, B, HKV, kv_len)
                                 : cdiv(kv_len, o->bwd.block_n);
  return launch(gx, HKV, B, o->bwd.threads, smem_bwd(o));
}
CgLaunch cg_launch_bwd_dq(const CgOptions *o, int B, int H, int q_len) {
  (void)o;
  return launch(cdiv(q_len, 128), H, B, 128, 0);
}

CgLaunch cg_launch_mask_build(const CgOptions *o, int Bm, int Hm, int nq) {
  (void)o;
  return launch((unsigned)nq, Hm, Bm, 128, 0);
}
CgLaunch cg_launch_mask_lists(const CgOptions *o, int Bm, int Hm, int nq, int nkv) {
  (void)o;
  return launch(cdiv(nq + nkv, 128), Hm, Bm, 128, 0);
}

CgLaunch cg_launch_grad_exact(const CgOptions *o, int64_t n) {
  (void)o;
  int64_t blocks = (n + 255) / 256;
  return launch((unsigned)(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks), 1, 1, 256, 0);
}

CgLaunch cg_launch_sorted_check(const CgOptions *o, int64_t n) {
  (void)o;
  int64_t blocks = (n - 1 + 255) / 256; /* one thread per pair (i-1, i) */
  return launch((unsigned)(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks), 1, 1, 256, 0);
}

static int imax(int a, int b) { return a > b ? a : b; }

/* Tiles are powers of two, so the larger of two is a multiple of both. */
void cg_mask_blocks(const CgOptions *o, int *block_q, int *block_kv) {
  *block_q = imax(o->fwd.block_m, o->bwd.block_m);
  *block_kv = imax(o->fwd.block_n, o->bwd.block_n);
}

bool cg_mask_blocks_ok(const CgOptions *o, int block_q, int block_kv) {
  return block_q > 0 && block_kv > 0 && block_q % o->fwd.block_m == 0 &&
         block_kv % o->fwd.block_n == 0 && (!o->backward || (block_q % o->bwd.block_m == 0 &&
                                                             block_kv % o->bwd.block_n == 0));
}

void cg_fit_mask_blocks(CgOptions *o, int block_kv) {
  if (o->dtype == CG_FP32 || block_kv <= 0) return; /* fp32 tiles are square: 32 or 16 keys */
  while (!o->fwd_sm90 && o->fwd.block_n > 16 && block_kv % o->fwd.block_n) o->fwd.block_n /= 2;
  while (o->bwd.block_n > 16 && block_kv % o->bwd.block_n) {
    o->bwd.block_n /= 2;
    o->bwd.threads = 32 * (o->bwd.block_n / 16 < 4 ? 4 : o->bwd.block_n / 16);
  }
}

static const char *elem_type(CgDtype d) {
  return d == CG_FP32 ? "FlexF32" : d == CG_FP16 ? "FlexF16" : "FlexBF16";
}

static const char *mask_mode(CgMaskMode m) {
  /* IMPLICIT runs the DENSE body: the walk's `full` flag skips the
   * per-element test on full tiles, and empty tiles are never visited. */
  return m == CG_MASK_NONE ? "FLEX_MASK_NONE" : m == CG_MASK_LISTS ? "FLEX_MASK_LISTS"
                                                                   : "FLEX_MASK_DENSE";
}

static void entry(Buf *out, const char *name, int threads, const char *body) {
  buf_printf(out, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const FlexParams p) {\n"
                  "  %s(p);\n}\nFLEX_EMU_ENTRY(%s, FlexParams)\n\n",
             threads, name, body, name);
}

/* The sm_90a forward: one __grid_constant__ FlexFwdTma (params and tensor
 * maps), register count known at entry (one CTA per SM). */
static void entry_sm90(Buf *out, const CgOptions *o, const char *el, const char *oel,
                       const char *mm, const char *sid) {
  buf_printf(out, "extern \"C\" __global__ void __launch_bounds__(%d, 1) flex_fwd("
                  "const __grid_constant__ FlexFwdTma t) {\n"
                  "  flex_fwd_sm90<%s, %s, %d, %d, %d, %d, %s, %s, %s>(t);\n}\n"
                  "FLEX_EMU_ENTRY(flex_fwd, FlexFwdTma)\n\n",
             o->fwd.threads, el, oel, cg_fwd_sm90_dim(o->head_dim), cg_fwd_sm90_dim(o->head_dim_v),
             o->fwd.block_n, o->fwd.block_m / 64, cg_fwd_sm90_overlap(o) ? "true" : "false", mm, sid);
}

/* The sm_90a backward: one __grid_constant__ FlexBwdTma. */
static void entry_bwd_sm90(Buf *out, const CgOptions *o, const char *el, const char *mm,
                           const char *sid) {
  buf_printf(out, "extern \"C\" __global__ void __launch_bounds__(%d, 1) flex_bwd("
                  "const __grid_constant__ FlexBwdTma t) {\n"
                  "  flex_bwd_sm90<%s, %d, %d, %d, %s, %s, %s, %s, %s, %d>(t);\n}\n"
                  "FLEX_EMU_ENTRY(flex_bwd, FlexBwdTma)\n\n",
             o->bwd.threads, el, cg_bwd_sm90_dim(o, o->head_dim), cg_bwd_sm90_dim(o, o->head_dim_v),
             cg_bwd_sm90_consumers(o), mm, sid, o->ds_is_dt ? "false" : "true",
             bwd_sm90_dq_bulk(o) ? "true" : "false", bwd_sm90_keys_split(o) ? "true" : "false",
             bwd_sm90_producer_regs(o));
}

static void emit_entries(Buf *out, const CgOptions *o) {
  char body[256];
  const char *el = elem_type(o->dtype), *mm = mask_mode(o->mask_mode);
  const char *oel = o->out_f32 ? "FlexF32" : el; /* O's element type */
  /* SCORE_ID of the tensor-core bodies: an identity score's softmax also
   * for a bias folded into S's accumulators (flex_bias); the fp32 bodies
   * call the score. */
  const char *sid = o->score_identity || cg_bias_folded(o) ? "true" : "false";
  const char *sid32 = o->score_identity ? "true" : "false";
  int EP = o->head_dim_pad, EVP = o->head_dim_v_pad;
  const char *paged = o->paged ? ", true" : ""; /* the PAGED argument (default false) */
  if (o->fwd_sm90)
    entry_sm90(out, o, el, oel, mm, sid);
  else if (o->dtype == CG_FP32)
    snprintf(body, sizeof body, "flex_fwd_simt<%d, %d, %d, %d, %s, %s%s>", EP, EVP, o->fwd.block_m,
             o->fwd.block_n, mm, sid32, paged);
  else
    snprintf(body, sizeof body, "flex_fwd_tc<%s, %s, %d, %d, %d, %d, %d, %s, %s%s>", el, oel, EP,
             EVP, o->fwd.block_m, o->fwd.block_n, o->fwd.threads / 32, mm, sid, paged);
  if (!o->fwd_sm90) entry(out, "flex_fwd", o->fwd.threads, body);
  snprintf(body, sizeof body, "flex_fwd_combine_body<%s>", oel);
  entry(out, "flex_fwd_combine", 128, body);
  if (o->mask_builder) {
    entry(out, "flex_mask_build", 128, "flex_mask_build_body");
    entry(out, "flex_mask_lists", 128, "flex_mask_lists_body");
  }
  if (o->sorted_check) entry(out, "flex_sorted_check", 256, "flex_sorted_check_body");
  if (!o->backward) return;
  snprintf(body, sizeof body, "flex_bwd_pre<%s, %s>", el, oel);
  entry(out, "flex_bwd_pre", 128, body);
  snprintf(body, sizeof body, "%s<%s, %d, %d, %d, %d, %s, %s, %s>",
           o->dtype == CG_FP32 ? "flex_bwd_main" : "flex_bwd_tc", el, EP, EVP,
           o->bwd.block_m, o->bwd.block_n, mm, o->dtype == CG_FP32 ? sid32 : sid,
           o->ds_is_dt ? "false" : "true");
  if (o->bwd_sm90)
    entry_bwd_sm90(out, o, el, mm, sid);
  else
    entry(out, "flex_bwd", o->bwd.threads, body);
  snprintf(body, sizeof body, "flex_bwd_dq<%s>", el);
  entry(out, "flex_bwd_dq", 128, body);
  if (o->deterministic && o->grad_buffers) entry(out, "flex_grad_exact", 256, "flex_grad_exact_body");
}

void cg_emit_cuda(Buf *out, const IrModule *m, const CgOptions *o) {
  buf_printf(out,
             "/* Generated by flexc %s from %s, kernel %s: do not edit.\n"
             " * dtype %s%s, head dims E=%d EV=%d (padded %d, %d), %s, mask %s%s%s%s.\n"
             " * forward tile %dx%d, %d threads per CTA; backward tile %dx%d, %d threads%s%s%s%s%s%s.\n */\n",
             FLEXC_VERSION, o->source ? o->source : "<source>", m->kernel, cg_dtype_name(o->dtype),
             o->out_f32 && o->dtype != CG_FP32 ? " (O in fp32)" : "",
             o->head_dim, o->head_dim_v, o->head_dim_pad, o->head_dim_v_pad, cg_arch_name(o->arch),
             o->mask_mode == CG_MASK_NONE       ? "none"
             : o->mask_mode == CG_MASK_LISTS    ? "block lists"
             : o->mask_mode == CG_MASK_IMPLICIT ? "implicit (tiles classified in the walk)"
                                                : "dense",
             o->score_identity ? ", identity score" : "",
             cg_bias_folded(o) ? ", the score's bias folded into S (flex_bias)" : "",
             o->ds_is_dt ? ", ds = dt" : "",
             o->fwd.block_m, o->fwd.block_n, o->fwd.threads, o->bwd.block_m, o->bwd.block_n,
             o->bwd.threads,
             o->fast_math ? ", fast math (approximate exp, log, tanh, sigmoid, sin, cos, pow)" : "",
             o->dropout ? ", dropout (Philox4x32-10, kernels/philox.cuh)" : "",
             o->paged ? ", K/V paged" : "", o->kv_split && !o->backward ? ", split-KV" : "",
             o->deterministic && o->backward ? ", deterministic backward" : "",
             o->watchdog ? ", watchdog (an mbarrier wait of 2^33 cycles traps)" : "");
  if (o->pack_gqa)
    buf_puts(out, "/* grouped-query packing: a tile's rows are the query heads of one kv head */\n");
  if (o->fwd_sm90)
    buf_puts(out, "/* forward: sm_90a body (TMA, mbarrier ring, wgmma; kernels/flex_fwd_sm90.cuh) */\n");
  if (o->bwd_sm90 && o->backward)
    buf_puts(out, "/* backward: sm_90a body (TMA, mbarrier ring, wgmma; kernels/flex_bwd_sm90.cuh) */\n");
  if (o->fast_math) buf_puts(out, "#define FLEX_FAST_MATH 1\n");
  if (o->watchdog) buf_puts(out, "#define FLEX_WATCHDOG 1\n");
  if (o->dropout) buf_puts(out, "#define FLEX_DROPOUT 1\n");
  if (o->kv_split && !o->backward) buf_puts(out, "#define FLEX_KV_SPLIT 1\n");
  if (o->deterministic && o->backward) buf_puts(out, "#define FLEX_DETERMINISTIC 1\n");
  if (o->has_sink) buf_puts(out, "#define FLEX_SINK 1\n");
  if (o->offsets) buf_puts(out, "#define FLEX_OFFSETS 1\n");
  buf_puts(out, "#include \"common.cuh\"\n");
  if (o->has_mask) buf_puts(out, "#include \"interval.cuh\"\n");
  if (o->mask_mode == CG_MASK_IMPLICIT)
    buf_printf(out, "#define FLEX_WALK_IMPLICIT 1\n#define FLEX_WALK_FWD_ROWS %d\n"
                    "#define FLEX_WALK_BWD_ROWS %d\n", o->fwd.block_m, o->bwd.block_n);
  buf_puts(out, "\n");
  cg_emit_funcs(out, m, o);
  if (o->mask_builder) buf_puts(out, "#include \"flex_blockmask.cuh\"\n");
  if (o->sorted_check) buf_puts(out, "#include \"flex_sorted.cuh\"\n");
  buf_puts(out, o->fwd_sm90 ? "#include \"flex_fwd_sm90.cuh\"\n" : "#include \"flex_fwd.cuh\"\n");
  if (o->backward)
    buf_puts(out, o->bwd_sm90 ? "#include \"flex_bwd_sm90.cuh\"\n" : "#include \"flex_bwd.cuh\"\n");
  buf_puts(out, "\n");
  emit_entries(out, o);
}
