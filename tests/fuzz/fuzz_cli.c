/* libFuzzer target: the flexc command line. The input is an argument list,
 * one argument per line, the first naming the command (check, ir, run,
 * emit, mask); the command's function (cli/) runs on it and must return 0,
 * 1 (a user error, said) or 2 (bad usage, said): never crash, leak or hang.
 *
 * It runs in a scratch directory holding small inputs it may name (a.score,
 * m.score, q.npy, k.npy, v.npy, do.npy, doc.npy, cq.npy, ck.npy, pt.npy,
 * kl.npy, pk.npy, pv.npy). So that it cannot touch anything else or spend
 * minutes on one input, arguments lose '/' and "..", --backend is always
 * the reference, --target always cuda (no NVRTC), --resource-usage is
 * dropped, --repeat and --threads are at most 2 and --shape at most
 * 2,4,256,256: what is left is the parsing and checking of every option. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "fuzz_common.h"
#include "runtime/flex.h"

enum { MAXARGS = 40, MAXLEN = 256 };

static void die(const char *what, const char *msg) { fuzz_die("fuzz_cli", what, msg); }

static void save(const char *name, DLDataType dt, int nd, const int64_t *shape, const double *v, int n) {
  DLTensor *t = NULL;
  if (flex_tensor_alloc(&t, FLEX_BACKEND_REFERENCE, dt, nd, shape, NULL) != FLEX_OK)
    die("alloc", flex_last_error());
  int64_t count = 1;
  for (int d = 0; d < nd; d++) count *= shape[d];
  for (int64_t i = 0; i < count; i++) {
    double x = n ? v[i % n] : (double)((i * 7) % 11) * 0.125 - 0.5;
    if (dt.code == kDLFloat) ((float *)t->data)[i] = (float)x;
    else ((int32_t *)t->data)[i] = (int32_t)x;
  }
  if (flex_npy_save(name, t) != FLEX_OK) die("save", flex_last_error());
  flex_tensor_free(t);
}

static void setup(void) {
  char dir[] = "/tmp/fuzz_cli_XXXXXX";
  if (!mkdtemp(dir) || chdir(dir)) die("scratch directory", dir);
  FILE *f = fopen("a.score", "w");
  fputs("param float softcap = 20.0;\nparam int window = 64;\nbuffer slopes: f32[H];\n"
        "score s(s, b, h, q, kv) { return softcap * tanh((s + slopes[h] * float(kv - q)) / softcap); }\n"
        "mask m(b, h, q, kv) { return q >= kv && q - kv < window; }\n", f);
  fclose(f);
  f = fopen("m.score", "w");
  fputs("buffer doc: i32[T] sorted;\nbuffer g: f32[H] grad;\n"
        "score t(s, b, h, q, kv) { return s + g[h]; }\n"
        "mask d(b, h, q, kv) { return doc[q] == doc[kv]; }\n", f);
  fclose(f);
  DLDataType f32 = {kDLFloat, 32, 1}, i32 = {kDLInt, 32, 1};
  int64_t s4[4] = {1, 2, 8, 4}, s1[1] = {8}, s2[1] = {2}, cs[1] = {3}, pts[2] = {2, 2}, ps[4] = {4, 16, 2, 4};
  save("q.npy", f32, 4, s4, NULL, 0), save("k.npy", f32, 4, s4, NULL, 0), save("v.npy", f32, 4, s4, NULL, 0);
  save("do.npy", f32, 4, s4, NULL, 0), save("slopes.npy", f32, 1, s2, (double[]){0.25, 0.5}, 2);
  save("doc.npy", i32, 1, s1, (double[]){0, 0, 0, 1, 1, 2, 2, 2}, 8);
  save("cq.npy", i32, 1, cs, (double[]){0, 3, 8}, 3), save("ck.npy", i32, 1, cs, (double[]){0, 5, 8}, 3);
  save("pt.npy", i32, 2, pts, (double[]){3, 1, 0, 2}, 4), save("kl.npy", i32, 1, s2, (double[]){20, 7}, 2);
  save("pk.npy", f32, 4, ps, NULL, 0), save("pv.npy", f32, 4, ps, NULL, 0);
}

/* Argument a made safe (see the header); prev: the one before it. */
static void sanitize(char *a, const char *prev) {
  for (char *p = a; *p; p++)
    if (*p == '/' || (p[0] == '.' && p[1] == '.')) *p = '_';
  if (!strcmp(prev, "--backend")) strcpy(a, "reference");
  if (!strcmp(prev, "--target")) strcpy(a, "cuda");
  if (!strcmp(a, "--resource-usage")) strcpy(a, "--forward-only");
  if ((!strcmp(prev, "--repeat") || !strcmp(prev, "--threads")) && atoi(a) > 2) strcpy(a, "2");
  if (!strcmp(prev, "--shape")) { /* at most 2,4,256,256 */
    static const long most[4] = {2, 4, 256, 256};
    char out[MAXLEN] = "";
    char *save = NULL;
    int i = 0;
    for (char *t = strtok_r(a, ",", &save); t; t = strtok_r(NULL, ",", &save), i++) {
      long v = strtol(t, NULL, 10);
      char num[32];
      snprintf(num, sizeof num, "%s%ld", i ? "," : "", v > most[i & 3] || v < -most[i & 3] ? most[i & 3] : v);
      strncat(out, num, sizeof out - strlen(out) - 1);
    }
    strcpy(a, out);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool ready;
  if (!ready) setup(), ready = true;
  static char store[MAXARGS][MAXLEN];
  char *argv[MAXARGS + 1];
  int argc = 0;
  size_t i = 0;
  while (i <= size && argc < MAXARGS) { /* lines, each cut to MAXLEN - 1 bytes */
    size_t j = i;
    while (j < size && data[j] != '\n') j++;
    size_t n = j - i < MAXLEN - 1 ? j - i : MAXLEN - 1;
    memcpy(store[argc], data + i, n);
    store[argc][n] = 0;
    if (strlen(store[argc]) == n) argc++; /* no NUL inside an argument */
    i = j + 1;
  }
  if (!argc) return 0;
  for (int a = 1; a < argc; a++) sanitize(store[a], store[a - 1]);
  for (int a = 0; a < argc; a++) argv[a] = store[a];
  argv[argc] = NULL;
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {{"check", cli_check}, {"ir", cli_ir}, {"run", cli_run}, {"emit", cli_emit}, {"mask", cli_mask}};
  int c = (int)((unsigned char)store[0][0] % 5);
  for (int k = 0; k < 5; k++)
    if (!strcmp(store[0], cmds[k].name)) c = k;
  int rc = cmds[c].fn(argc, argv);
  if (rc < 0 || rc > 2) die("exit status out of 0..2", cmds[c].name);
  return 0;
}
