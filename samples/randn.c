/* randn: write a .npy file of random normal float32 values, so the
 * command-line tools can be tried without Python.
 *
 *   randn OUT.npy D0,D1,... [SCALE [SEED]]
 *
 * SCALE multiplies the values (default 1); SEED fixes them (default: time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/npy.h"

int main(int argc, char **argv) {
  if (argc < 3 || argc > 5) {
    fprintf(stderr, "usage: randn OUT.npy D0,D1,... [SCALE [SEED]]\n");
    return 2;
  }
  int64_t shape[RT_NPY_MAXDIMS];
  int n = 0;
  for (char *p = argv[2]; *p && n < RT_NPY_MAXDIMS; n++) {
    char *end;
    long long d = strtoll(p, &end, 10);
    if (end == p || d < 0 || (*end && *end != ',')) {
      fprintf(stderr, "randn: bad shape '%s'\n", argv[2]);
      return 2;
    }
    shape[n] = d;
    p = *end ? end + 1 : end;
  }
  double scale = argc > 3 ? atof(argv[3]) : 1.0;
  uint64_t s = argc > 4 ? strtoull(argv[4], NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
  RtArray a;
  rt_array_init(&a, rt_dtype(kDLFloat, 32), n, shape);
  for (int64_t i = 0; i < rt_array_count(&a); i++) { /* Box-Muller over a 64-bit LCG */
    double u, v;
    do {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      u = (double)(s >> 11) / 9007199254740992.0;
    } while (u <= 1e-300);
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = (double)(s >> 11) / 9007199254740992.0;
    rt_array_set(&a, i, scale * sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
  }
  char err[256];
  int rc = rt_npy_write(argv[1], &a, err, sizeof err);
  rt_array_free(&a);
  if (rc) fprintf(stderr, "randn: %s\n", err);
  return rc ? 1 : 0;
}
