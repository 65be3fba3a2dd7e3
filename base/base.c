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

/* ---- what a BaseTry owns ----------------------------------------------------
 *
 * Every block allocated while a BaseTry is innermost belongs to it until it
 * is freed, kept (base_keep: published where it outlives the call) or the
 * BaseTry is popped (then it belongs to the enclosing one, or to nobody).
 * An exhaustion jump frees the blocks of the BaseTry it leaves, so an entry
 * point that returns FLEX_ERR_NOMEM leaks nothing. The table is this
 * thread's: a pointer hash set with linear probing, in libc memory (it must
 * not fail through the allocator it watches). */
typedef struct Owned {
  void *p;
  BaseTry *owner;
} Owned;

static _Thread_local Owned *owned;
static _Thread_local size_t owned_cap, owned_n; /* cap: a power of two, or 0 */

static size_t slot_of(const void *p) {
  uintptr_t h = (uintptr_t)p;
  h ^= h >> 33, h *= 0xff51afd7ed558ccdULL, h ^= h >> 33;
  return (size_t)h & (owned_cap - 1);
}

static Owned *owned_find(const void *p) {
  if (!owned_n) return NULL;
  for (size_t i = slot_of(p);; i = (i + 1) & (owned_cap - 1)) {
    if (owned[i].p == p) return &owned[i];
    if (!owned[i].p) return NULL;
  }
}

/* Remove the entry at e (backward-shift deletion keeps probes unbroken). */
static void owned_remove(Owned *e) {
  size_t i = (size_t)(e - owned);
  owned[i].p = NULL;
  owned_n--;
  for (size_t j = (i + 1) & (owned_cap - 1); owned[j].p; j = (j + 1) & (owned_cap - 1)) {
    size_t home = slot_of(owned[j].p);
    /* move j into the hole at i unless its home lies in (i, j] */
    if (((j - home) & (owned_cap - 1)) >= ((j - i) & (owned_cap - 1))) {
      owned[i] = owned[j];
      owned[j].p = NULL;
      i = j;
    }
  }
}

static void owned_insert(void *p, BaseTry *owner);

/* Grow the table; false when libc has no memory for it (the block then
 * goes untracked: a leak on a later failure, never a wrong free). */
static bool owned_grow(void) {
  size_t cap = owned_cap ? 2 * owned_cap : 256;
  Owned *old = owned, *t = calloc(cap, sizeof *t);
  if (!t) return false;
  size_t oc = owned_cap;
  owned = t, owned_cap = cap, owned_n = 0;
  for (size_t i = 0; i < oc; i++)
    if (old[i].p) owned_insert(old[i].p, old[i].owner);
  free(old);
  return true;
}

static void owned_insert(void *p, BaseTry *owner) {
  if (4 * (owned_n + 1) > 3 * owned_cap && !owned_grow()) return;
  size_t i = slot_of(p);
  while (owned[i].p) i = (i + 1) & (owned_cap - 1);
  owned[i] = (Owned){p, owner};
  owned_n++;
}

/* Hand t's blocks to `to` (NULL: nobody), or free them (free_them). */
static void owned_release(BaseTry *t, BaseTry *to, bool free_them) {
  for (size_t i = 0; owned_n && i < owned_cap;) {
    if (!owned[i].p || owned[i].owner != t) {
      i++;
      continue;
    }
    if (to) {
      owned[i++].owner = to;
      continue;
    }
    void *p = owned[i].p;
    owned_remove(&owned[i]); /* may shift a later entry into i: look at i again */
    if (free_them) alloc_fn(alloc_ud, p, 0);
  }
  /* Out of every BaseTry with nothing owned: the table goes back (a
   * thread that ends holds none). */
  if (!owned_n && !to && owned) {
    free(owned);
    owned = NULL, owned_cap = 0;
  }
}

void base_keep(void *p) {
  Owned *e = p ? owned_find(p) : NULL;
  if (e) owned_remove(e);
}

void base_try_push(BaseTry *t) {
  t->prev = try_top;
  t->bytes = 0;
  try_top = t;
}

void base_try_pop(BaseTry *t) {
  try_top = t->prev;
  owned_release(t, t->prev, false);
}

BaseTry *base_try_hold(void) {
  BaseTry *t = try_top;
  try_top = NULL;
  return t;
}

void base_try_restore(BaseTry *held) { try_top = held; }

/* Jump to the innermost BaseTry with an exhausted request of `size` bytes,
 * freeing its blocks; a panic where none is installed. */
static _Noreturn void try_raise(size_t size) {
  BaseTry *t = try_top;
  if (!t) PANIC("out of memory (%zu bytes)", size);
  t->bytes = size;
  try_top = t->prev;
  owned_release(t, NULL, true);
  longjmp(t->jb, 1);
}

void base_try_rethrow(const BaseTry *t) { try_raise(t->bytes); }

void *base_realloc(void *ptr, size_t size) {
  if (size == 0) size = 1;
  Owned *e = ptr ? owned_find(ptr) : NULL;
  BaseTry *owner = ptr ? (e ? e->owner : NULL) : try_top;
  void *p = alloc_fn(alloc_ud, ptr, size);
  if (!p) try_raise(size); /* ptr, if the try's, is freed too: realloc left it allocated */
  if (p != ptr) {
    if (e) owned_remove(e);
    if (owner) owned_insert(p, owner);
  }
  return p;
}

void *base_alloc(size_t size) {
  void *p = base_realloc(NULL, size);
  memset(p, 0, size);
  return p;
}

void base_free(void *ptr) {
  if (!ptr) return;
  Owned *e = owned_find(ptr);
  if (e) owned_remove(e);
  alloc_fn(alloc_ud, ptr, 0);
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

void arena_keep(Arena *a) {
  for (ArenaChunk *c = a->head; c; c = c->next) base_keep(c);
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
