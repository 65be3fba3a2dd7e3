/* base.h: the few things every stage shares.
 *
 *   arena    bump allocation per compilation, freed at once
 *   Buf      a growable byte buffer for building text
 *   alloc    the one allocator everything goes through (replaceable)
 *   assert   internal-bug checks that name file and line
 *   config   every FLEXC_* environment variable, read in one place (config.h)
 *   pool     the one thread pool (pool.c)
 *
 * Beside it: sha256.h (SHA-256), store.h (the content-addressed module
 * store every backend compiles into), embed.c (the template embedder, a
 * build tool).
 */
#ifndef FLEXC_BASE_H
#define FLEXC_BASE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* ---- allocation --------------------------------------------------------- */

/* The allocator: realloc semantics (ptr NULL allocates, size 0 frees).
 * Returns NULL only when memory is exhausted. */
typedef void *(*base_AllocFn)(void *ud, void *ptr, size_t size);

/* Replace the allocator used by every module (default: libc realloc/free). */
void base_set_alloc(base_AllocFn fn, void *ud);
/* Allocate, resize or free through the installed allocator. On exhaustion
 * it jumps to the innermost BaseTry of this thread (the library's entry
 * points install one and return FLEX_ERR_NOMEM), and aborts with a message
 * only where none is installed (the command-line tools' own code). */
void *base_realloc(void *ptr, size_t size);
void *base_alloc(size_t size);     /* zeroed */
void base_free(void *ptr);
char *base_strdup(const char *s);

/* Recovery from memory exhaustion (Lua's model): an entry point pushes a
 * BaseTry, calls setjmp on its buffer, and pops it on every way out.
 *
 *   BaseTry t;
 *   base_try_push(&t);
 *   if (setjmp(t.jb)) { base_try_pop(&t); ...free what is known...; return NOMEM; }
 *   ...
 *   base_try_pop(&t);
 *
 * Code that holds a lock, or has made something the allocator does not
 * track (an LLVM object, a loaded library, a temporary directory), installs
 * its own BaseTry: its handler unlocks and cleans up, then passes the
 * exhaustion on with base_try_rethrow, so no jump leaves a lock held or a
 * resource behind. Code that must not be left by a jump at all (the thread
 * pool's items) suspends recovery (base_try_hold / base_try_restore): an
 * exhaustion there stops the process.
 *
 * A BaseTry owns the blocks allocated while it is innermost and not yet
 * freed: the jump frees them (nothing leaks), its pop hands them to the
 * enclosing BaseTry (or to nobody). A block published where it outlives
 * the call (a cache entry, a list a kernel keeps) is handed to nobody with
 * base_keep; blocks allocated while recovery is held belong to nobody. */
typedef struct BaseTry {
  jmp_buf jb;            /* where an exhausted allocation jumps */
  struct BaseTry *prev;  /* the enclosing one */
  size_t bytes;          /* the request that failed */
} BaseTry;
void base_try_push(BaseTry *t);
void base_try_pop(BaseTry *t);
/* After t's handler has cleaned up: the same exhaustion, raised in the
 * enclosing BaseTry (a panic where none is installed). */
_Noreturn void base_try_rethrow(const BaseTry *t);
BaseTry *base_try_hold(void);
void base_try_restore(BaseTry *held);
void base_keep(void *ptr);

/* ---- arena -------------------------------------------------------------- */

typedef struct ArenaChunk ArenaChunk;
/* Bump allocator: everything of one compilation lives here and is freed
 * with one arena_free(). */
typedef struct Arena {
  ArenaChunk *head; /* newest chunk; older chunks are linked behind it */
} Arena;

void *arena_alloc(Arena *a, size_t size);                 /* zeroed, 16-aligned */
void *arena_grow(Arena *a, void *old, size_t oldsz, size_t newsz); /* copy-grow */
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);
/* base_keep of every chunk: an arena published where it outlives the call. */
void arena_keep(Arena *a);

/* Growable array in an arena: `ARENA_PUSH(a, arr, n, cap, value)`. */
#define ARENA_PUSH(arena, arr, n, cap, value)                                  \
  do {                                                                         \
    if ((n) == (cap)) {                                                        \
      size_t nc_ = (cap) ? (size_t)(cap) * 2 : 8;                              \
      (arr) = arena_grow((arena), (arr), sizeof(*(arr)) * (size_t)(cap),       \
                         sizeof(*(arr)) * nc_);                                \
      (cap) = nc_;                                                             \
    }                                                                          \
    (arr)[(n)++] = (value);                                                    \
  } while (0)

/* ---- text buffer -------------------------------------------------------- */

/* A growable, always NUL-terminated byte buffer (heap, not arena). */
typedef struct Buf {
  char *data;  /* the bytes; data[len] == 0 */
  size_t len;  /* bytes used */
  size_t cap;  /* bytes allocated */
} Buf;

void buf_put(Buf *b, const char *s, size_t n);
void buf_puts(Buf *b, const char *s);
void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(Buf *b, const char *fmt, va_list ap);
void buf_free(Buf *b);

/* Bytes of physical memory on this machine (0 if unknown): the bound for
 * allocations whose size a user picks (shapes), so they fail with a
 * message instead of exhausting memory. */
double base_physical_memory(void);

/* Read a whole file into *out (NUL-terminated; *len excludes the NUL).
 * Returns 0, or an errno value. */
int base_read_file(const char *path, char **out, size_t *len);

/* ---- the thread pool (pool.c) ---------------------------------------------- */

/* fn(ctx, item, worker) for item in [0, n), spread over the pool's workers
 * (the caller is worker 0, workers numbered below base_pool_size()).
 * Returns when every item is done. Calls from several threads take turns;
 * an item must not call it again. Items cannot leave by the memory
 * exhaustion jump: one that exhausts memory aborts (allocate before). */
void base_pool_run(int64_t n, void (*fn)(void *ctx, int64_t item, int worker), void *ctx);
/* Workers of the pool (FLEXC_THREADS, default every online core). */
int base_pool_size(void);

/* ---- internal errors ---------------------------------------------------- */

/* An internal bug: prints file, line and message, then aborts. Never used for
 * user errors, which travel back as diagnostics or status codes. */
_Noreturn void base_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define PANIC(...) base_panic(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) PANIC("check failed: %s", #cond);                             \
  } while (0)

#endif
