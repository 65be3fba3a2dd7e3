/* libFuzzer target: the .npy reader. The input is a file's bytes: parsed
 * (rt_npy_parse, which flex_npy_load and flexc run use), it is either
 * refused with FLEX_ERR_INVALID and a message naming the file, or an array
 * whose every element reads back (ASan checks the byte count against the
 * header), that flex_npy_save writes and flex_npy_load reads back with the
 * same dtype, shape and bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "runtime/flex.h"
#include "runtime/npy.h"

static void die(const char *what, const char *msg) { fuzz_die("fuzz_npy", what, msg); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char path[64];
  if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_npy_%d.npy", (int)getpid());
  RtArray a;
  flex_status st = rt_npy_parse("in.npy", data, size, &a);
  if (st != FLEX_OK) {
    if (st != FLEX_ERR_INVALID || !strstr(flex_last_error(), "in.npy"))
      die("rt_npy_parse", flex_last_error());
    return 0;
  }
  int64_t n = rt_array_count(&a);
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += rt_array_get(&a, i) != 0; /* every element readable */
  (void)sum;
  DLTensor t = rt_array_tensor(&a), *back = NULL;
  if (flex_npy_save(path, &t) != FLEX_OK) die("flex_npy_save", flex_last_error());
  if (flex_npy_load(&back, path) != FLEX_OK)
    die("flex_npy_load of what flex_npy_save wrote", flex_last_error());
  size_t bytes = (size_t)n * (size_t)rt_dtype_size(a.dtype);
  if (back->ndim != a.ndim || memcmp(&back->dtype, &a.dtype, sizeof a.dtype) ||
      (a.ndim && memcmp(back->shape, a.shape, sizeof(int64_t) * (size_t)a.ndim)) ||
      (bytes && memcmp(back->data, a.data, bytes)))
    die("round trip", "flex_npy_load does not give back what flex_npy_save wrote");
  flex_tensor_free(back);
  rt_array_free(&a);
  unlink(path);
  return 0;
}
