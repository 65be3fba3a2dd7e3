/* Fuzz suite: random bytes and random token soups (valid tokens and
 * keywords, deep nesting, long identifiers) go through `flexc check`, which
 * must exit 0 or 1 every time: never a signal, never a usage error, never a
 * hang. Runs for $FLEXC_FUZZ_SECONDS (default 10). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "testlib.h"

static const char *const tokens[] = {
    "param", "const", "buffer", "score", "mask", "kernel", "let", "return", "true", "false",
    "int", "float", "bool", "grad", "sorted", "where", "x", "y", "s", "b", "h", "q", "kv", "B",
    "H", "Q_LEN", "inf", "pi", "f32", "i32", "exp", "clamp", "0", "1", "0x7fffffff", "2147483648",
    "1.5", ".5", "2e-3", "1e99", "+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&",
    "||", "!", "?", ":", "=", ",", ";", "(", ")", "[", "]", "{", "}", "#c\n", "/*", "*/", "\n",
    "score f(s, b, h, q, kv) { return ", "mask m(b, h, q, kv) { return ", "kernel k { ",
    /* version 2 and the Python spellings it diagnoses */
    "&", "|", "^", "~", "<<", ">>", "erf", "floordiv", "floormod", "sum", "sum(i, 0, 4, ",
    "int f(int a) { return ", "float g(float x, bool c) { return ", "bool", "and", "or", "not",
    "if", "elif", "else", "True", "False", "None", "def", "lambda", "**", " // 2;", ".",
    "float(\"inf\")", "math.inf", "torch", "x.clamp(", "t[i][j]", "min=", "sum(i, 0, 4096, sum(j, 0, 4096, ",
};

/* One random input into `b`. */
static void make_input(uint64_t *rng, Buf *b) {
  int kind = (int)(tl_rand(rng) % 4);
  size_t n = 1 + tl_rand(rng) % 400;
  if (kind == 0) { /* raw bytes */
    for (size_t i = 0; i < n * 4; i++) {
      char c = (char)(tl_rand(rng) & 0xff);
      buf_put(b, &c, 1);
    }
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t r = tl_rand(rng);
    if (kind == 2 && r % 97 == 0) { /* deep nesting */
      size_t depth = tl_rand(rng) % 30000;
      const char *open = (r >> 8) % 2 ? "(" : "-";
      for (size_t k = 0; k < depth; k++) buf_puts(b, open);
    } else if (kind == 3 && r % 89 == 0) { /* a long identifier */
      size_t len = tl_rand(rng) % 120000;
      for (size_t k = 0; k < len; k++) buf_put(b, "z", 1);
    } else {
      buf_puts(b, tokens[r % (sizeof tokens / sizeof tokens[0])]);
    }
    buf_puts(b, (r >> 32) % 3 ? " " : "");
  }
}

START_TEST(fuzz_check) {
  uint64_t rng = tl_seed();
  const char *env = getenv("FLEXC_FUZZ_SECONDS");
  double seconds = env ? atof(env) : 10.0;
  char path[] = "/tmp/flexc_fuzz_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  Buf cmd = {0};
  buf_printf(&cmd, "timeout 10 %s check %s >/dev/null 2>&1", tl_flexc(), path);
  time_t start = time(NULL);
  long count = 0;
  while (difftime(time(NULL), start) < seconds) {
    Buf in = {0};
    make_input(&rng, &in);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (in.len) fwrite(in.data, 1, in.len, f);
    fclose(f);
    Buf out = {0};
    int rc = tl_run(cmd.data, &out);
    buf_free(&out);
    if (rc != 0 && rc != 1) {
      char keep[64];
      snprintf(keep, sizeof keep, "/tmp/flexc_fuzz_fail_%ld.score", count);
      rename(path, keep);
      ck_abort_msg("flexc check exited %d on input kept in %s", rc, keep);
    }
    buf_free(&in);
    count++;
  }
  fprintf(stderr, "fuzz: %ld inputs in %.0f s\n", count, seconds);
  unlink(path);
  buf_free(&cmd);
  ck_assert_int_gt(count, 0);
}
END_TEST

int main(void) {
  const char *env = getenv("FLEXC_FUZZ_SECONDS");
  /* the loop's time plus one slow input */
  return TL_MAIN("fuzz", (int)((env ? atof(env) : 10.0) + 60.0), TL_TEST(fuzz_check));
}
