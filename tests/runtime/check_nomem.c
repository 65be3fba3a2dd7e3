/* check_nomem: memory exhaustion inside the library is FLEX_ERR_NOMEM,
 * never an abort. An allocator that fails every request from the N-th on
 * is installed (base_set_alloc) for N across the whole run of a kernel
 * load, a validated reference forward and backward, a BlockMask build and
 * the tensor helpers; every call must end FLEX_OK or FLEX_ERR_NOMEM with a
 * message, and every call succeeds once N is past what it needs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static long calls, fail_from = -1;

static void *failing(void *ud, void *ptr, size_t size) {
  (void)ud;
  if (size == 0) {
    free(ptr);
    return NULL;
  }
  if (fail_from >= 0 && calls++ >= fail_from) return NULL;
  return realloc(ptr, size);
}

/* Everything the run does; returns the number of calls that ran out. */
static int exercise(void) {
  int nomem = 0;
  flex_status st;
#define EXPECT(call)                                                                     \
  do {                                                                                   \
    st = (call);                                                                         \
    ck_assert_msg(st == FLEX_OK || st == FLEX_ERR_NOMEM, "%s: status %d (%s)", #call, st, \
                  flex_last_error());                                                    \
    if (st == FLEX_ERR_NOMEM) {                                                          \
      ck_assert_ptr_nonnull(strstr(flex_last_error(), "out of host memory"));            \
      nomem++;                                                                           \
    }                                                                                    \
  } while (0)
  flex_kernel *k = NULL;
  EXPECT(flex_kernel_load(&k, tl_src_path("samples/gemma2.score"), NULL));
  if (!k) return nomem;
  flex_kernel_info info;
  EXPECT(flex_kernel_get_info(k, &info));
  DLTensor *q = NULL, *kk = NULL, *v = NULL, *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL,
           *dv = NULL, *slopes = NULL;
  const int64_t s4[4] = {1, 2, 20, 8}, s3[3] = {1, 2, 20}, sh[1] = {2};
  const DLDataType f64 = {kDLFloat, 64, 1}, f32 = {kDLFloat, 32, 1};
  DLTensor **all[] = {&q, &kk, &v, &o, &lse, &dq, &dk, &dv, &slopes};
  for (int i = 0; i < 9; i++)
    EXPECT(flex_tensor_alloc(all[i], FLEX_BACKEND_REFERENCE, i == 8 ? f32 : f64, i == 4 ? 3 : i == 8 ? 1 : 4,
                             i == 4 ? s3 : i == 8 ? sh : s4, NULL));
  bool have = true;
  for (int i = 0; i < 9; i++) have = have && *all[i];
  if (have) {
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 320; j++) ((double *)(*all[i])->data)[j] = 0.01 * (j % 17) - 0.05 * i;
    flex_buffer b = {"slopes", slopes, NULL};
    flex_param p = {"window", 8};
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = FLEX_BACKEND_REFERENCE;
    a.q = q, a.k = kk, a.v = v, a.out = o, a.lse = lse, a.dout = o, a.dq = dq, a.dk = dk, a.dv = dv;
    a.buffers = &b, a.nbuffers = 1, a.params = &p, a.nparams = 1;
    EXPECT(flex_forward(k, &a));
    EXPECT(flex_backward(k, &a));
    flex_block_mask *bm = NULL;
    EXPECT(flex_block_mask_create(&bm, k, &a, 1, 2, 300, 300, 64, 64, NULL));
    flex_block_mask_free(bm);
    DLTensor *h = NULL;
    EXPECT(flex_tensor_alloc(&h, FLEX_BACKEND_REFERENCE, (DLDataType){kDLFloat, 16, 1}, 4, s4, NULL));
    if (h) EXPECT(flex_tensor_copy(h, q, NULL));
    flex_tensor_free(h);
  }
  for (int i = 0; i < 9; i++) flex_tensor_free(*all[i]);
  flex_kernel_free(k);
  return nomem;
}

START_TEST(exhaustion_everywhere) {
  base_set_alloc(failing, NULL);
  fail_from = -1;
  calls = 0;
  ck_assert_int_eq(exercise(), 0);
  fail_from = 1L << 40; /* count what a successful run needs */
  calls = 0;
  ck_assert_int_eq(exercise(), 0);
  long total = calls;
  ck_assert_int_gt(total, 10);
  long step = total / 300 + 1;
  int runs = 0, failed_runs = 0;
  for (long n = 0; n <= total; n += step) {
    fail_from = n;
    calls = 0;
    failed_runs += exercise() > 0;
    runs++;
  }
  fail_from = -1;
  base_set_alloc(NULL, NULL);
  printf("%d runs over %ld allocations, %d of them ran out somewhere\n", runs, total, failed_runs);
  ck_assert_int_gt(failed_runs, runs / 2);
}
END_TEST

int main(void) {
  return TL_MAIN("nomem", 300, TL_TEST(exhaustion_everywhere));
}
