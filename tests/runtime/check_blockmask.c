/* Block masks: for every sample kernel and several block sizes, the mask
 * from the analysis, from the block-wise builder and from a dense brute
 * force agree exactly (all eight arrays); a caller's BlockMask round-trips
 * through validation; `flexc mask` at 131072 tokens. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/blockmask.h"
#include "runtime/rt.h"
#include "testlib.h"

/* Buffers of a sample, filled by dtype (sorted ones as document ids). */
typedef struct Bind {
  IrVal params[16];
  int32_t sizes[16];
  IrBufView bufs[8];
  void *data[8];
} Bind;

static void bind(Bind *bd, const IrModule *m, const RtMaskShape *s, uint64_t *rng) {
  memset(bd, 0, sizeof *bd);
  ck_assert_int_le(m->nparams, 16);
  ck_assert_int_le(m->nsizes, 16);
  ck_assert_int_le(m->nbuffers, 8);
  for (int i = 0; i < m->nparams; i++) bd->params[i] = m->params[i].def;
  int32_t pre[SZ_COUNT] = {s->B, s->H, s->H, s->q_len, s->kv_len};
  int big = s->q_len > s->kv_len ? s->q_len : s->kv_len;
  for (int i = 0; i < m->nsizes; i++) bd->sizes[i] = i < SZ_COUNT ? pre[i] : big;
  for (int i = 0; i < m->nbuffers; i++) {
    const IrBuffer *b = &m->buffers[i];
    IrBufView *bv = &bd->bufs[i];
    int64_t n = 1;
    bv->dtype = b->dtype;
    bv->ndims = b->ndims;
    for (int d = b->ndims - 1; d >= 0; d--) {
      bv->shape[d] = b->dims[d].fixed >= 0 ? b->dims[d].fixed : bd->sizes[b->dims[d].size];
      bv->strides[d] = n;
      n *= bv->shape[d];
    }
    ck_assert_msg(b->dtype == DT_I32 || b->dtype == DT_F32, "sample buffer dtype %d", b->dtype);
    int32_t *p = calloc((size_t)n, 4);
    int id = 0;
    for (int64_t k = 0; k < n; k++) {
      if (b->sorted) {
        if (tl_rand(rng) % 23 == 0) id++;
        p[k] = id;
      } else if (b->dtype == DT_I32) {
        p[k] = 1 + (int32_t)(tl_rand(rng) % (uint64_t)s->kv_len);
      } else {
        float f = (float)tl_normal(rng);
        memcpy(&p[k], &f, 4);
      }
    }
    bd->data[i] = p;
    bv->data = p;
  }
}

static void unbind(Bind *bd) {
  for (int i = 0; i < 8; i++) free(bd->data[i]);
}

/* Class of block (b, h, i, j) read back from the arrays. */
static int class_of(const RtBlockMask *bm, int bh, int i, int j) {
  size_t row = (size_t)bh * bm->nq + i;
  for (int k = 0; k < bm->full_kv_num_blocks[row]; k++)
    if (bm->full_kv_indices[row * bm->nkv + k] == j) return 1;
  for (int k = 0; k < bm->kv_num_blocks[row]; k++)
    if (bm->kv_indices[row * bm->nkv + k] == j) return 2;
  return 0;
}

static void compare_sample(const char *path) {
  flex_kernel *k;
  ck_assert_msg(flex_kernel_load(&k, path, NULL) == FLEX_OK, "%s: %s", path, flex_last_error());
  const IrModule *m = k->mod;
  static const int blocks[][2] = {{16, 16}, {32, 64}, {128, 128}, {24, 40}};
  static const int lens[][2] = {{200, 168}, {257, 257}};
  uint64_t rng = tl_seed();
  for (size_t L = 0; L < 2; L++)
    for (size_t bs = 0; bs < 4; bs++) {
      RtMaskShape s = {2, 4, lens[L][0], lens[L][1], blocks[bs][0], blocks[bs][1], 0, 0};
      Bind bd;
      bind(&bd, m, &s, &rng);
      IrIntervalEnv env = {bd.params, bd.sizes, bd.bufs};
      RtBlockMask bm[4];
      RtMaskStats st[4];
      static const RtMaskMode modes[4] = {RT_MASK_ANALYSIS, RT_MASK_EVAL, RT_MASK_BLOCKWISE,
                                          RT_MASK_DENSE};
      for (int md = 0; md < 4; md++)
        ck_assert_msg(rt_block_mask_build(&bm[md], m, &env, &s, modes[md], &st[md]) ==
                          FLEX_OK, "%s: %s", path, flex_last_error());
      ck_assert_msg(rt_block_mask_equal(&bm[1], &bm[3]), "%s: builder != dense at %dx%d", path,
                    s.block_q, s.block_kv);
      ck_assert_msg(rt_block_mask_equal(&bm[2], &bm[3]), "%s: block-wise != dense", path);
      /* The analysis alone: sound always, and exact on every sample. */
      for (int bh = 0; bh < bm[3].B * bm[3].H; bh++)
        for (int i = 0; i < bm[3].nq; i++)
          for (int j = 0; j < bm[3].nkv; j++) {
            int a = class_of(&bm[0], bh, i, j), t = class_of(&bm[3], bh, i, j);
            ck_assert_msg(a == 2 || a == t, "%s: analysis unsound at block (%d, %d, %d)", path, bh, i, j);
          }
      ck_assert_msg(rt_block_mask_equal(&bm[0], &bm[3]),
                    "%s: analysis not exact at %dx%d, lengths %d/%d (%lld of %lld open blocks refined)",
                    path, s.block_q, s.block_kv, s.q_len, s.kv_len, (long long)st[1].refined,
                    (long long)st[1].undecided);
      for (int md = 0; md < 4; md++) rt_block_mask_free(&bm[md]);
      unbind(&bd);
    }
  flex_kernel_free(k);
}

START_TEST(samples_agree) {
  DIR *d = opendir(tl_src_path("samples"));
  ck_assert_ptr_nonnull(d);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 7 || strcmp(e->d_name + len - 6, ".score")) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "samples/%s", e->d_name);
    compare_sample(tl_src_path(rel));
    n++;
  }
  closedir(d);
  ck_assert_int_ge(n, 5);
}
END_TEST

/* A caller's mask: our own arrays wrapped as DLTensors validate and come
 * back identical, with or without the q side; a bad index is refused. */
START_TEST(user_mask_roundtrip) {
  flex_kernel *k = tl_load("samples/sliding_window.score", NULL, NULL);
  RtMaskShape s = {1, 1, 300, 300, 32, 16, 0, 0};
  IrVal params[4] = {ir_vi(50)};
  int32_t sizes[SZ_COUNT] = {1, 1, 1, 300, 300};
  IrIntervalEnv env = {params, sizes, NULL};
  RtBlockMask bm, back;
  
  ck_assert_int_eq(rt_block_mask_build(&bm, k->mod, &env, &s, RT_MASK_EVAL, NULL), FLEX_OK);
  int64_t sh[4][4] = {{1, 1, bm.nq}, {1, 1, bm.nq, bm.nkv}, {1, 1, bm.nkv}, {1, 1, bm.nkv, bm.nq}};
  int32_t *arrs[8] = {bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
                      bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices};
  DLTensor t[8];
  for (int i = 0; i < 8; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].data = arrs[i];
    t[i].device.device_type = kDLCPU;
    t[i].dtype.code = kDLInt;
    t[i].dtype.bits = 32;
    t[i].dtype.lanes = 1;
    t[i].ndim = i % 2 ? 4 : 3;
    t[i].shape = sh[(i / 4) * 2 + i % 2];
  }
  flex_block_mask u = {32, 16, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7]};
  ck_assert_msg(rt_block_mask_from_user(&back, &u, &s) == FLEX_OK, "%s", flex_last_error());
  ck_assert(rt_block_mask_equal(&bm, &back));
  rt_block_mask_free(&back);
  u.q_num_blocks = u.q_indices = u.full_q_num_blocks = u.full_q_indices = NULL;
  ck_assert_msg(rt_block_mask_from_user(&back, &u, &s) == FLEX_OK, "%s", flex_last_error());
  ck_assert(rt_block_mask_equal(&bm, &back));
  rt_block_mask_free(&back);
  bm.kv_indices[0] = bm.nkv; /* out of range (row 0 has a partial block) */
  ck_assert_int_gt(bm.kv_num_blocks[0], 0);
  ck_assert_int_eq(rt_block_mask_from_user(&back, &u, &s), FLEX_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(flex_last_error(), "kv_indices"));
  t[0].dtype.bits = 64;
  ck_assert_int_eq(rt_block_mask_from_user(&back, &u, &s), FLEX_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(flex_last_error(), "int32"));
  rt_block_mask_free(&bm);
  flex_kernel_free(k);
}
END_TEST

/* `flexc mask` on a causal mask at 131072 tokens: the counts are known in
 * closed form; the time is printed, not asserted. */
START_TEST(cli_causal_long) {
  char cmd[4096], dir[] = "/tmp/flexc_maskXXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "%s mask %s --shape 1,8,131072,131072 --out %s", tl_flexc(),
           tl_src_path("samples/causal.score"), dir);
  Buf out = {0};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = tl_run(cmd, &out);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  fprintf(stderr, "%sflexc mask at 131072 tokens (with --out): %.1f ms wall\n", out.data,
          (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
  ck_assert_int_eq(rc, 0);
  /* 1024 blocks a side: 1024*1025/2 visited, the diagonal partial. */
  ck_assert_ptr_nonnull(strstr(out.data, "1048576 total, 524800 visited (523776 full, 1024 partial), 523776 empty"));
  ck_assert_ptr_nonnull(strstr(out.data, "stored B=1 H=1"));
  const char *names[] = {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                         "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"};
  for (int i = 0; i < 8; i++) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s.npy", dir, names[i]);
    FILE *f = fopen(p, "rb");
    ck_assert_msg(f != NULL, "%s missing", p);
    fclose(f);
    remove(p);
  }
  remove(dir);
  buf_free(&out);
  /* Usage and user errors. */
  Buf o2 = {0};
  snprintf(cmd, sizeof cmd, "%s mask %s", tl_flexc(), tl_src_path("samples/causal.score"));
  ck_assert_int_eq(tl_run(cmd, &o2), 2);
  buf_free(&o2);
  snprintf(cmd, sizeof cmd, "%s mask %s --shape 1,1,64,64", tl_flexc(), tl_src_path("samples/document.score"));
  ck_assert_int_eq(tl_run(cmd, &o2), 1);
  ck_assert_ptr_nonnull(strstr(o2.data, "--buffer doc="));
  buf_free(&o2);
}
END_TEST

int main(void) {
  return TL_MAIN("blockmask", 60, TL_TEST(samples_agree), TL_TEST(user_mask_roundtrip),
                 TL_TEST(cli_causal_long));
}
