/* randn: write a .npy file of random values, so the command-line tools can
 * be tried without Python.
 *
 *   randn [--dtype float32|float64|int32|int64|bool] OUT.npy D0,D1,... [SCALE [SEED]]
 *
 * float32 (the default) and float64: normal values times SCALE (default 1).
 * int32, int64: uniform integers in [0, SCALE) (default 100). bool: true
 * with probability SCALE (default 0.5). SEED fixes the values (default:
 * the time). Uses flex.h alone.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flexc/flex.h>

static uint64_t s;

/* Uniform in [0, 1) from a 64-bit LCG. */
static double uniform(void) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(s >> 11) / 9007199254740992.0;
}

static double normal(void) { /* Box-Muller */
  double u;
  do u = uniform(); while (u <= 1e-300);
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * uniform());
}

int main(int argc, char **argv) {
  static const struct { const char *name; DLDataType t; double scale; } types[] = {
      {"float32", {kDLFloat, 32, 1}, 1}, {"float64", {kDLFloat, 64, 1}, 1},
      {"int32", {kDLInt, 32, 1}, 100},   {"int64", {kDLInt, 64, 1}, 100},
      {"bool", {kDLBool, 8, 1}, 0.5},
  };
  int ty = 0;
  if (argc > 2 && !strcmp(argv[1], "--dtype")) {
    while (ty < 5 && strcmp(argv[2], types[ty].name)) ty++;
    if (ty == 5) {
      fprintf(stderr, "randn: unknown --dtype '%s'\n", argv[2]);
      return 2;
    }
    argc -= 2, argv += 2;
  }
  if (argc < 3 || argc > 5) {
    fprintf(stderr, "usage: randn [--dtype float32|float64|int32|int64|bool] OUT.npy D0,D1,... [SCALE [SEED]]\n");
    return 2;
  }
  int64_t shape[FLEX_MAX_DIMS];
  int n = 0;
  for (char *p = argv[2]; *p; n++) {
    char *end;
    long long d = strtoll(p, &end, 10);
    if (n == FLEX_MAX_DIMS || end == p || d < 0 || (*end && *end != ',')) {
      fprintf(stderr, "randn: bad shape '%s'\n", argv[2]);
      return 2;
    }
    shape[n] = d;
    p = *end ? end + 1 : end;
  }
  double scale = argc > 3 ? atof(argv[3]) : types[ty].scale;
  s = argc > 4 ? strtoull(argv[4], NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
  DLTensor *t;
  if (flex_tensor_alloc(&t, FLEX_BACKEND_REFERENCE, types[ty].t, n, shape, NULL)) {
    fprintf(stderr, "randn: %s\n", flex_last_error());
    return 1;
  }
  int64_t cnt = 1;
  for (int d = 0; d < n; d++) cnt *= shape[d];
  for (int64_t i = 0; i < cnt; i++) {
    switch (ty) {
    case 0: ((float *)t->data)[i] = (float)(scale * normal()); break;
    case 1: ((double *)t->data)[i] = scale * normal(); break;
    case 2: ((int32_t *)t->data)[i] = (int32_t)floor(uniform() * scale); break;
    case 3: ((int64_t *)t->data)[i] = (int64_t)floor(uniform() * scale); break;
    default: ((uint8_t *)t->data)[i] = uniform() < scale; break;
    }
  }
  int rc = flex_npy_save(argv[1], t) != FLEX_OK;
  if (rc) fprintf(stderr, "randn: %s\n", flex_last_error());
  flex_tensor_free(t);
  return rc;
}
