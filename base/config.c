/* config.c: the one place the library reads FLEXC_* variables (config.h). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void read_str(char *dst, size_t cap, const char *v) { snprintf(dst, cap, "%s", v ? v : ""); }
static long read_int(const char *v) { return v && *v ? strtol(v, NULL, 10) : 0; }
static bool read_flag(const char *v) { return v && *v && strcmp(v, "0") != 0; }

#define READ_STR(f, v) read_str(c->f, sizeof c->f, v)
#define READ_INT(f, v) c->f = read_int(v)
#define READ_FLAG(f, v) c->f = read_flag(v)
#define READ(name, f, kind, doc) READ_##kind(f, getenv("FLEXC_" #name));

const BaseConfig *base_config(void) {
  static _Thread_local BaseConfig now;
  BaseConfig *c = &now;
  BASE_CONFIG(READ)
  return c;
}
