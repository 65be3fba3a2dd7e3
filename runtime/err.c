/* err.c: the thread's last error (rt_err, flex_last_error) and the names
 * messages use (flex_backend_name, flex_backend_parse): the lowest room of
 * the runtime, which every backend may call. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/rt.h"

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

static const char *const backend_names[] = {"reference", "emu", "cuda", "cpu"};
enum { NBACKENDS = sizeof backend_names / sizeof backend_names[0] };

const char *flex_backend_name(flex_backend b) {
  return (unsigned)b < NBACKENDS ? backend_names[b] : NULL;
}

bool flex_backend_parse(const char *name, flex_backend *out) {
  for (int i = 0; name && i < NBACKENDS; i++)
    if (!strcmp(name, backend_names[i])) {
      *out = (flex_backend)i;
      return true;
    }
  return false;
}

