/* base.c: allocator, arena, text buffer, file reading, panics. */
#include "base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *default_alloc(void *ud, void *ptr, size_t size) {
  (void)ud;
  if (size == 0) {
    free(ptr);
    return NULL;
  }
  return realloc(ptr, size);
}

static base_AllocFn alloc_fn = default_alloc;
static void *alloc_ud;

void base_set_alloc(base_AllocFn fn, void *ud) {
  alloc_fn = fn ? fn : default_alloc;
  alloc_ud = ud;
}

/* The innermost recovery point of this thread (NULL: none, abort). */
static _Thread_local BaseTry *try_top;

void base_try_push(BaseTry *t) {
  t->prev = try_top;
  t->bytes = 0;
  try_top = t;
}

void base_try_pop(BaseTry *t) { try_top = t->prev; }

BaseTry *base_try_hold(void) {
  BaseTry *t = try_top;
  try_top = NULL;
  return t;
}

void base_try_restore(BaseTry *held) { try_top = held; }

void *base_realloc(void *ptr, size_t size) {
  if (size == 0) size = 1;
  void *p = alloc_fn(alloc_ud, ptr, size);
  if (!p && try_top) {
    try_top->bytes = size;
    longjmp(try_top->jb, 1);
  }
  if (!p) PANIC("out of memory (%zu bytes)", size);
  return p;
}

void *base_alloc(size_t size) {
  void *p = base_realloc(NULL, size);
  memset(p, 0, size);
  return p;
}

void base_free(void *ptr) {
  if (ptr) alloc_fn(alloc_ud, ptr, 0);
}

char *base_strdup(const char *s) {
  size_t n = strlen(s);
  char *p = base_realloc(NULL, n + 1);
  memcpy(p, s, n + 1);
  return p;
}

/* ---- arena -------------------------------------------------------------- */

struct ArenaChunk {
  ArenaChunk *next; /* older chunk */
  size_t used, cap; /* bytes of mem[] used and available */
  _Alignas(16) unsigned char mem[];
};

void *arena_alloc(Arena *a, size_t size) {
  size = (size + 15) & ~(size_t)15;
  ArenaChunk *c = a->head;
  if (!c || c->cap - c->used < size) {
    size_t cap = size > 65536 ? size : 65536;
    c = base_realloc(NULL, sizeof(ArenaChunk) + cap);
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = c->mem + c->used;
  c->used += size;
  memset(p, 0, size);
  return p;
}

void *arena_grow(Arena *a, void *old, size_t oldsz, size_t newsz) {
  void *p = arena_alloc(a, newsz);
  if (old && oldsz) memcpy(p, old, oldsz < newsz ? oldsz : newsz);
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Buf b = {0};
  buf_vprintf(&b, fmt, ap);
  va_end(ap);
  char *p = arena_strndup(a, b.data ? b.data : "", b.len);
  buf_free(&b);
  return p;
}

void arena_free(Arena *a) {
  ArenaChunk *c = a->head;
  while (c) {
    ArenaChunk *next = c->next;
    base_free(c);
    c = next;
  }
  a->head = NULL;
}

/* ---- text buffer -------------------------------------------------------- */

static void buf_reserve(Buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) cap *= 2;
  b->data = base_realloc(b->data, cap);
  b->cap = cap;
}

void buf_put(Buf *b, const char *s, size_t n) {
  buf_reserve(b, n);
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = 0;
}

void buf_puts(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

void buf_vprintf(Buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) PANIC("bad format '%s'", fmt);
  buf_reserve(b, (size_t)n);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void buf_printf(Buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void buf_free(Buf *b) {
  base_free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

double base_physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (double)pages * (double)size : 0.0;
}

int base_read_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno ? errno : ENOENT;
  Buf b = {0};
  char tmp[65536];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf_put(&b, tmp, n);
  int err = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (err) {
    buf_free(&b);
    return err;
  }
  if (!b.data) buf_put(&b, "", 0);
  *out = b.data;
  *len = b.len;
  return 0;
}

_Noreturn void base_panic(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flexc: internal error at %s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}
