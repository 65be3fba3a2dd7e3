/* pool.c: base_pool_run(): the one pool of worker threads of the process
 * (the cpu backend, the BlockMask builder, the emulator's block runners),
 * created on first use. Its size is FLEXC_THREADS when set (1 runs
 * everything on the caller), else every online core. Items are handed out
 * one at a time from an atomic counter, so uneven items (causal rows,
 * skipped tiles) balance themselves. Calls from several threads take turns.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base.h"

/* The pool and the job it runs. */
static struct {
  pthread_once_t once;          /* creation */
  int size;                     /* workers, the caller included */
  pthread_mutex_t turn;         /* one job at a time */
  pthread_mutex_t lock;         /* guards gen, busy and the job fields */
  pthread_cond_t wake, idle;    /* new job; every helper done */
  uint64_t gen;                 /* job generation (helpers wait for a new one) */
  int busy;                     /* helpers still in the current job */
  void (*fn)(void *, int64_t, int); /* the job */
  void *ctx;                    /* its context */
  int64_t n;                    /* its items */
  _Atomic int64_t next;         /* next item to hand out */
} P = {.once = PTHREAD_ONCE_INIT,
       .turn = PTHREAD_MUTEX_INITIALIZER,
       .lock = PTHREAD_MUTEX_INITIALIZER,
       .wake = PTHREAD_COND_INITIALIZER,
       .idle = PTHREAD_COND_INITIALIZER};

static void drain(int worker) {
  for (;;) {
    int64_t i = atomic_fetch_add(&P.next, 1);
    if (i >= P.n) return;
    P.fn(P.ctx, i, worker);
  }
}

static void *helper(void *arg) {
  int worker = (int)(intptr_t)arg;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&P.lock);
    while (P.gen == seen) pthread_cond_wait(&P.wake, &P.lock);
    seen = P.gen;
    pthread_mutex_unlock(&P.lock);
    drain(worker);
    pthread_mutex_lock(&P.lock);
    if (--P.busy == 0) pthread_cond_signal(&P.idle);
    pthread_mutex_unlock(&P.lock);
  }
  return NULL;
}

static void create(void) {
  long n = base_config()->threads ? base_config()->threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n > 1024) n = 1024;
  P.size = (int)n;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 1; i < P.size; i++) {
    pthread_t t;
    if (pthread_create(&t, &attr, helper, (void *)(intptr_t)i)) {
      P.size = i; /* fewer threads than asked: run with what started */
      break;
    }
  }
  pthread_attr_destroy(&attr);
}

int base_pool_size(void) {
  pthread_once(&P.once, create);
  return P.size;
}

/* Items must not leave by the memory-exhaustion jump (base.h): the caller's
 * recovery is suspended while they run (an exhausted allocation inside one
 * aborts, as on any helper thread, instead of unwinding past the others). */
void base_pool_run(int64_t n, void (*fn)(void *ctx, int64_t item, int worker), void *ctx) {
  pthread_once(&P.once, create);
  if (n <= 0) return;
  BaseTry *held = base_try_hold();
  if (P.size == 1 || n == 1) {
    for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
    base_try_restore(held);
    return;
  }
  pthread_mutex_lock(&P.turn);
  pthread_mutex_lock(&P.lock);
  P.fn = fn, P.ctx = ctx, P.n = n;
  atomic_store(&P.next, 0);
  P.busy = P.size - 1;
  P.gen++;
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.lock);
  drain(0);
  pthread_mutex_lock(&P.lock);
  while (P.busy) pthread_cond_wait(&P.idle, &P.lock);
  pthread_mutex_unlock(&P.lock);
  pthread_mutex_unlock(&P.turn);
  base_try_restore(held);
}
