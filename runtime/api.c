/* api.c: the flex.h entry points.
 *
 * Loading runs the whole front half of the pipeline (parse, check, pick the
 * kernel, lower, optimise, differentiate) once; every diagnostic becomes the
 * message of a FLEX_ERR_INVALID. A call validates its tensors (validate.c)
 * and hands the validated call to the chosen backend.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"

/* The message of the thread's last failed call. */
static _Thread_local char last_error[16384];

/* Formatted into a scratch buffer first, so that a message may quote the
 * previous one (`rt_err(st, "launching %s: %s", entry, flex_last_error())`). */
flex_status rt_err(flex_status st, const char *fmt, ...) {
  static _Thread_local char scratch[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(scratch, sizeof scratch, fmt, ap);
  va_end(ap);
  memcpy(last_error, scratch, sizeof last_error);
  return st;
}

const char *flex_last_error(void) { return last_error; }

const char *flex_backend_name(flex_backend b) {
  switch (b) {
  case FLEX_BACKEND_REFERENCE: return "reference";
  case FLEX_BACKEND_EMU: return "emu";
  case FLEX_BACKEND_CUDA: return "cuda";
  }
  return NULL;
}

/* Parse, check, pick, lower and compile k->src; false with the diagnostics
 * in *d on any error. */
static bool build(flex_kernel *k, const char *kernel, Diags *d) {
  k->prog = fe_parse(&k->arena, &k->src, d);
  if (d->errors) return false;
  if (fe_check(&k->arena, k->prog, d) || d->errors) return false;
  if (ir_lower_check_all(&k->arena, k->prog, d)) return false;
  Decl *kd = fe_pick_kernel(&k->arena, k->prog, kernel, d);
  if (!kd || d->errors) return false;
  k->mod = ir_lower(&k->arena, k->prog, kd, d);
  if (!k->mod || d->errors) return false;
  ir_compile(k->mod, true, NULL);
  CHECK(k->mod->joint != NULL);
  return true;
}

flex_status flex_kernel_from_source(flex_kernel **out, const char *name, const char *text,
                                    size_t len, const char *kernel) {
  if (!out) return rt_err(FLEX_ERR_INVALID, "flex_kernel_from_source: out is NULL");
  *out = NULL;
  if (!text) return rt_err(FLEX_ERR_INVALID, "flex_kernel_from_source: text is NULL");
  /* Source positions are 32-bit; a larger length is also a caller's slip
   * (such as (size_t)-1 for "NUL-terminated"), never a real file. */
  if (len > INT32_MAX)
    return rt_err(FLEX_ERR_INVALID,
                  "%s: error: source of %zu bytes is too large (expected at most %d bytes)",
                  name ? name : "<source>", len, INT32_MAX);
  flex_kernel *k = base_alloc(sizeof *k);
  k->src.path = arena_strndup(&k->arena, name ? name : "<source>", strlen(name ? name : "<source>"));
  char *copy = arena_alloc(&k->arena, len + 1);
  memcpy(copy, text, len);
  copy[len] = 0;
  k->src.text = copy;
  k->src.len = len;
  Diags d;
  memset(&d, 0, sizeof d);
  d.src = &k->src;
  if (!build(k, kernel, &d)) {
    rt_err(FLEX_ERR_INVALID, "%s", d.text.data ? d.text.data : "invalid kernel source");
    diag_free(&d);
    flex_kernel_free(k);
    return FLEX_ERR_INVALID;
  }
  diag_free(&d);
  *out = k;
  return FLEX_OK;
}

flex_status flex_kernel_load(flex_kernel **out, const char *path, const char *kernel) {
  if (!out) return rt_err(FLEX_ERR_INVALID, "flex_kernel_load: out is NULL");
  *out = NULL;
  if (!path) return rt_err(FLEX_ERR_INVALID, "flex_kernel_load: path is NULL");
  char *text;
  size_t len;
  int e = base_read_file(path, &text, &len);
  if (e) return rt_err(FLEX_ERR_INVALID, "%s: error: cannot read file: %s", path, strerror(e));
  flex_status st = flex_kernel_from_source(out, path, text, len, kernel);
  base_free(text);
  return st;
}

void flex_kernel_free(flex_kernel *k) {
  if (!k) return;
  arena_free(&k->arena);
  base_free(k);
}

/* Validate, then run on the chosen backend. */
static flex_status call(flex_kernel *k, const flex_args *a, bool backward) {
  if (!k) return rt_err(FLEX_ERR_INVALID, "kernel is NULL");
  if (!a) return rt_err(FLEX_ERR_INVALID, "args is NULL");
  if (!flex_backend_name(a->backend))
    return rt_err(FLEX_ERR_INVALID, "unknown backend %d (expected reference, emu or cuda)",
                  (int)a->backend);
  Arena arena = {0};
  RtCall c;
  flex_status st = rt_validate(&c, &arena, k, a, backward);
  if (st == FLEX_OK) {
    switch (a->backend) {
    case FLEX_BACKEND_REFERENCE:
      st = backward ? rt_reference_backward(&c) : rt_reference_forward(&c);
      break;
    case FLEX_BACKEND_EMU: st = backward ? rt_emu_backward(&c) : rt_emu_forward(&c); break;
    case FLEX_BACKEND_CUDA: st = backward ? rt_cuda_backward(&c) : rt_cuda_forward(&c); break;
    }
  }
  arena_free(&arena);
  return st;
}

flex_status flex_forward(flex_kernel *k, const flex_args *a) { return call(k, a, false); }
flex_status flex_backward(flex_kernel *k, const flex_args *a) { return call(k, a, true); }
