/* inputs.c: what `flexc run` and `flexc mask` both read from the command
 * line and from .npy files: params, and arrays converted to the dtype a
 * tensor or a declared buffer needs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

bool cli_split_eq(char *s, char **name, char **value) {
  char *eq = strchr(s, '=');
  if (!eq || eq == s || !eq[1]) return false;
  *eq = 0;
  *name = s;
  *value = eq + 1;
  return true;
}

int cli_param(char *arg, flex_param *out) {
  char *name, *value, *end;
  if (!cli_split_eq(arg, &name, &value))
    return cli_input_error("--param expects NAME=VALUE, got '%s'", arg);
  double x = strtod(value, &end);
  if (end == value || *end) return cli_input_error("--param %s: '%s' is not a number", name, value);
  out->name = name;
  out->value = x;
  return 0;
}

static const char *family(DLDataType t) {
  if (t.code == kDLFloat || t.code == kDLBfloat) return "float16, float32 or float64";
  if (t.code == kDLBool) return "bool or uint8";
  return "int32 or int64";
}

/* Whether a file's dtype may be read as `to` (DESIGN.md: floats for float
 * tensors, int32/int64 for int ones, bool/uint8 for bool ones; uint8
 * buffers take ints too). */
static bool readable_as(DLDataType got, DLDataType to) {
  bool is_float = got.code == kDLFloat, is_int = got.code == kDLInt;
  bool boolish = got.code == kDLBool || (got.code == kDLUInt && got.bits == 8);
  if (to.code == kDLFloat || to.code == kDLBfloat) return is_float;
  if (to.code == kDLBool) return boolish;
  if (to.code == kDLUInt) return is_int || boolish;
  return is_int;
}

DLTensor *cli_read_npy(const char *path, const char *role, DLDataType to) {
  DLTensor *raw, *out;
  if (flex_npy_load(&raw, path)) {
    fprintf(stderr, "flexc: error: %s\n", flex_last_error());
    return NULL;
  }
  if (!readable_as(raw->dtype, to)) {
    fprintf(stderr, "flexc: error: %s: %s needs %s data, got %s\n", path, role, family(to),
            cli_dtype_name(raw->dtype));
    flex_tensor_free(raw);
    return NULL;
  }
  flex_status st = flex_tensor_alloc(&out, FLEX_BACKEND_REFERENCE, to, raw->ndim, raw->shape, NULL);
  if (!st) st = flex_tensor_copy(out, raw, NULL);
  if (st) {
    fprintf(stderr, "flexc: error: %s: %s: %s\n", path, role, flex_last_error());
    flex_tensor_free(out);
    out = NULL;
  }
  flex_tensor_free(raw);
  return out;
}

const char *cli_dtype_name(DLDataType t) {
  static const struct { uint8_t code, bits; const char *name; } names[] = {
      {kDLFloat, 16, "float16"}, {kDLFloat, 32, "float32"}, {kDLFloat, 64, "float64"},
      {kDLBfloat, 16, "bfloat16"}, {kDLInt, 8, "int8"}, {kDLInt, 16, "int16"},
      {kDLInt, 32, "int32"}, {kDLInt, 64, "int64"}, {kDLUInt, 8, "uint8"}, {kDLBool, 8, "bool"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].code == t.code && names[i].bits == t.bits) return names[i].name;
  return "an unsupported dtype";
}

int cli_read_buffers(const flex_kernel_info *info, int n, const char *const *names,
                     const char *const *paths, DLTensor **tensors, flex_buffer *bufs) {
  for (int i = 0; i < n; i++) {
    const flex_buffer_info *b = NULL;
    for (int j = 0; j < info->nbuffers; j++)
      if (!strcmp(info->buffers[j].name, names[i])) b = &info->buffers[j];
    /* An undeclared name is read as is; validation then names the buffers. */
    DLDataType to = b ? b->dtype : (DLDataType){kDLFloat, 32, 1};
    char role[256];
    snprintf(role, sizeof role, "buffer '%s'", names[i]);
    tensors[i] = cli_read_npy(paths[i], role, to);
    if (!tensors[i]) {
      for (int j = 0; j < i; j++) flex_tensor_free(tensors[j]), tensors[j] = NULL;
      return 1;
    }
    bufs[i].name = names[i];
    bufs[i].tensor = tensors[i];
    bufs[i].grad = NULL;
  }
  return 0;
}

void cli_call_error(const char *msg) {
  /* The runtime names what is missing; the command line says how to pass it. */
  char name[256];
  const char *how = NULL;
  /* %n is set only when the whole pattern matched (sscanf counts the name
   * alone, so without it any "buffer 'x' ..." message got the hint). */
  int end = -1;
  if (sscanf(msg, "buffer '%255[^']' is read by the %*s but was not given%n", name, &end) == 1 &&
      end > 0)
    how = "--buffer %s=FILE.npy";
  else if ((end = -1, sscanf(msg, "param '%255[^']' has no default and was not given%n", name,
                             &end)) == 1 && end > 0)
    how = "--param %s=VALUE";
  fprintf(stderr, "flexc: error: %s", msg);
  if (how) {
    fprintf(stderr, "; pass ");
    fprintf(stderr, how, name);
  }
  fputc('\n', stderr);
}
