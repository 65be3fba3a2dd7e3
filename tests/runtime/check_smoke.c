/* Smoke suite: the library links and the base utilities behave. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "testlib.h"

START_TEST(arena_and_buf) {
  Arena a = {0};
  char *s = arena_printf(&a, "%d-%s", 42, "x");
  ck_assert_str_eq(s, "42-x");
  int *arr = NULL;
  size_t n = 0, cap = 0;
  for (int i = 0; i < 1000; i++) ARENA_PUSH(&a, arr, n, cap, i);
  ck_assert_int_eq(arr[999], 999);
  arena_free(&a);
  Buf b = {0};
  buf_printf(&b, "%s", "hello");
  buf_puts(&b, " world");
  ck_assert_str_eq(b.data, "hello world");
  buf_free(&b);
}
END_TEST

int main(void) {
  return TL_MAIN("smoke", 0, TL_TEST(arena_and_buf));
}
