/* emu_core.h: the emulator's engine, compiled into every emulator module.
 *
 * Each CUDA thread of a block is a fiber with its own mmap'd stack and a
 * guard page (EmuCtx below: a register switch of our own on x86-64,
 * ucontext elsewhere). One OS thread runs one block at a time: it sweeps
 * the block's fibers round-robin, each running until it blocks at
 * __syncthreads (a block barrier) or at a warp collective (shuffle, mma,
 * ldmatrix: a warp barrier), or exits. When every fiber is blocked the
 * scheduler releases what it can: a block barrier once all threads are at
 * it, a warp collective once its 32 lanes are (computing the op once, on the
 * scheduler's stack, from every lane's operands). Nothing to release while
 * threads remain is a deadlock, reported with who waits where.
 *
 * Checks a GPU would only show as wrong numbers or a crash: shared memory is
 * poisoned (0xFF) at block start; every global access through the arch
 * wrappers is checked against the launch's allocations; in race-check
 * builds (-fsanitize=thread, with the hooks at the bottom of this file
 * standing in for the sanitizer runtime) every shared-memory byte remembers
 * its last writer and readers per barrier epoch.
 *
 * This is a header only in name: a module is one translation unit, so the
 * definitions here appear exactly once. Included by emu_cuda.h. */
#ifndef FLEXC_EMU_CORE_H
#define FLEXC_EMU_CORE_H

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <vector>

#include "emu_abi.h"

#if defined(__SANITIZE_THREAD__)
#define EMU_HOOKED 1
#define EMU_NOSAN __attribute__((no_sanitize_thread))
#else
#define EMU_HOOKED 0
#define EMU_NOSAN
#endif
/* Engine entry points: never inlined, so every call is an optimisation
 * barrier for shared memory (the compiler must assume it changed). */
#define EMU_API EMU_NOSAN __attribute__((noinline))

/* The block's dynamic shared memory: one buffer per OS thread. Kernels
 * declare `extern __shared__ __align__(16) unsigned char flex_smem[];`,
 * which emu_cuda.h turns into a redeclaration of this. */
alignas(16) thread_local unsigned char flex_smem[EMU_SMEM_MAX];

/* threadIdx / blockIdx / blockDim / gridDim. */
struct EmuDim3 {
  unsigned x, y, z; /* CUDA's components */
};

/* Fiber states: running, at __syncthreads, at a warp collective, at a
 * warpgroup collective (wgmma, setmaxnreg: 128 threads), waiting on an
 * mbarrier phase, waiting at a named barrier (bar.sync id, n), exited. */
enum { EMU_READY, EMU_AT_BAR, EMU_AT_WARP, EMU_AT_GROUP, EMU_AT_MBAR, EMU_AT_NBAR, EMU_DONE };

/* Named barriers 1..15 (bar.sync / bar.arrive id, n; 0 is __syncthreads'). */
enum { EMU_NBARS = 16 };

struct EmuReq;
/* A warp collective's semantics: computed once from all lanes' requests. */
typedef void (*EmuWarpFn)(EmuReq **lanes, int nlanes);

/* What a lane posts when it reaches a warp collective. */
struct EmuReq {
  EmuWarpFn fn;         /* the op (all lanes must agree) */
  const char *name;     /* the op's name, for messages */
  unsigned mask;        /* member mask the lane passed */
  int tid;              /* the lane's linear thread id */
  int arg, width;       /* op arguments (shuffle source/offset and width; ldmatrix count) */
  uint64_t val;         /* value in (shuffles) */
  uint64_t result;      /* value out (shuffles) */
  const void *a, *b, *c; /* operand pointers (on the lane's stack or in shared memory) */
  void *out;            /* where the lane's result goes */
  uint64_t seq;         /* how many warp collectives the lane passed before this one */
  const void *site;     /* the calling instruction of a .aligned op (mma, ldmatrix); NULL: any */
  bool late;            /* an asynchronous completion (wgmma.wait_group): released only when
                           nothing else in the block can run, so work it would hide runs first */
  int regs;             /* setmaxnreg: 1 .dec, 2 .inc (to `arg` registers a thread) */
};

/* A cp.async in flight: its data is read at issue, lands at wait. */
struct EmuCopy {
  unsigned char *dst;       /* shared-memory destination */
  unsigned char data[16];   /* the bytes (zeros when the predicate was off) */
  uint64_t group;           /* commit group it belongs to */
};

/* A wgmma.mma_async in flight: its result (computed at issue) reaches the
 * thread's accumulator registers only at the wait_group that retires its
 * group; until then they hold poison. */
struct EmuWgmma {
  float *d;                 /* the thread's accumulator registers */
  int n;                    /* how many */
  float vals[128];          /* the result */
  uint64_t group;           /* commit group (the number of groups committed before it) */
  const uint32_t *a;        /* its A registers (NULL: A from shared memory) */
  uint32_t asnap[4];        /* their values at issue: they must not change before the wait */
  std::vector<uint32_t> chunks; /* 16-byte shared chunks it reads (kept by the warpgroup's first thread) */
};

/* One mbarrier object in shared memory (emulator-side state; the 8 bytes
 * in shared memory are not interpreted). */
struct EmuMbar {
  uint32_t off;             /* its shared-memory offset */
  uint32_t count;           /* expected arrivals per phase */
  uint32_t pending;         /* arrivals still missing in the current phase */
  int64_t tx;               /* transaction count still expected in the current phase */
  uint32_t phase;           /* phases completed so far (bit 0 is the phase parity) */
  int init_tid;             /* who initialised it */
  uint32_t init_sync;       /* and after how many __syncthreads (others wait for the next) */
};

/* One named barrier: its thread count while a phase is open, the
 * arrivals so far, and how many of them came from each warp (the
 * instructions are per warp: every lane of a warp takes part). */
struct EmuNbar {
  uint32_t count;           /* n of the open phase (0: none open) */
  uint32_t arrived;         /* arrivals in it */
  uint16_t per_warp[32];    /* of which from warp w */
  uint32_t red_or;          /* bar.red.or: the OR of the open phase's predicates */
  uint32_t last_or;         /* ... and of the last completed phase (what its waiters get) */
};

/* A cp.async.bulk.tensor in flight: read at issue, lands when the
 * scheduler has nothing else to run, then completes its bytes on the mbarrier. */
struct EmuBulk {
  uint32_t dst;                     /* shared-memory offset */
  uint32_t bar;                     /* mbarrier offset */
  int tid;                          /* issuing thread */
  uint32_t bytes;                   /* transaction bytes (the whole box) */
  std::vector<unsigned char> data;  /* the box, dense, innermost dimension first */
  std::vector<uint32_t> dst_of;     /* each element's (swizzled) shared offset */
};

/* A cp.reduce.async.bulk in flight: its adds are done at issue; the source
 * must stay unchanged until the bulk wait_group that retires it. */
struct EmuBulkRed {
  uint32_t src;                     /* shared-memory offset of the source */
  uint64_t group;                   /* bulk commit group */
  std::vector<unsigned char> snap;  /* the source bytes at issue */
};

/* ---- fiber contexts ------------------------------------------------------ */

/* A fiber's saved registers. glibc's swapcontext saves and restores the
 * signal mask with a system call on every switch, and a block switches
 * fibers at every barrier and warp collective of every thread: that call
 * was most of an emulated kernel's time. On x86-64 a switch is ours: push
 * the callee-saved registers, MXCSR and the x87 control word (the SysV ABI
 * keeps these across a call; everything else is the caller's), store the
 * stack pointer, load the other one, pop. The signal mask never changes
 * inside a block, so nothing else needs keeping. A new fiber starts by a
 * `ret` into flex_emu_start, which a CET shadow stack would refuse: a
 * process that enforces one (none does by default on Debian or Ubuntu)
 * needs modules built with -DFLEXC_EMU_UCONTEXT. Elsewhere (or with that
 * define) ucontext does it. */
#if defined(__x86_64__) && !defined(FLEXC_EMU_UCONTEXT)
struct EmuCtx {
  void *sp; /* the stack pointer, over the saved registers */
};
extern "C" __attribute__((visibility("hidden"))) void flex_emu_swap(EmuCtx *from, EmuCtx *to);
extern "C" __attribute__((visibility("hidden"))) void flex_emu_start(void);
/* flex_emu_swap(from, to): save into from, resume to. flex_emu_start: a
 * new fiber's first return lands here, with its function in rbx. */
asm(".text\n"
    ".globl flex_emu_swap\n.hidden flex_emu_swap\n.type flex_emu_swap, @function\n"
    ".p2align 4\n"
    "flex_emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq (%rsi), %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size flex_emu_swap, .-flex_emu_swap\n"
    ".globl flex_emu_start\n.hidden flex_emu_start\n.type flex_emu_start, @function\n"
    "flex_emu_start:\n"
    "  callq *%rbx\n"
    "  ud2\n" /* a fiber's function never returns */
    ".size flex_emu_start, .-flex_emu_start\n");

/* A fresh context that runs fn (which must never return) on
 * [stack, stack + size): the frame flex_emu_swap pops, returning into
 * flex_emu_start with the stack 16-byte aligned at its call. */
EMU_NOSAN static void emu_ctx_make(EmuCtx *c, char *stack, size_t size, void (*fn)(void)) {
  uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
  uint64_t *f = (uint64_t *)(top - 80); /* 8 words, 16 bytes spare above */
  uint32_t csr;
  uint16_t cw;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  f[0] = (uint64_t)csr | (uint64_t)cw << 32;
  f[1] = f[2] = f[3] = f[4] = 0;     /* r15 r14 r13 r12 */
  f[5] = (uint64_t)(uintptr_t)fn;    /* rbx: what flex_emu_start calls */
  f[6] = 0;                          /* rbp: ends frame-pointer walks */
  f[7] = (uint64_t)(uintptr_t)flex_emu_start;
  c->sp = f;
}
static inline void emu_ctx_swap(EmuCtx *from, EmuCtx *to) { flex_emu_swap(from, to); }
#else
struct EmuCtx {
  ucontext_t uc;
};
EMU_NOSAN static void emu_ctx_make(EmuCtx *c, char *stack, size_t size, void (*fn)(void)) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = NULL; /* fn never returns */
  makecontext(&c->uc, fn, 0);
}
static inline void emu_ctx_swap(EmuCtx *from, EmuCtx *to) { swapcontext(&from->uc, &to->uc); }
#endif

/* One emulated CUDA thread. */
struct EmuFiber {
  EmuCtx ctx;                   /* its saved registers */
  int state;                    /* EMU_READY ... EMU_DONE */
  int tid;                      /* linear thread id in the block */
  EmuDim3 tidx;                 /* threadIdx */
  EmuReq req;                   /* the pending warp collective */
  std::vector<EmuCopy> copies;  /* cp.async not yet waited for */
  uint64_t committed;           /* commit groups closed so far */
  uint64_t nwarp;               /* warp collectives passed so far */
  uint64_t ngroup;              /* warpgroup collectives passed so far */
  uint32_t mbar_off, mbar_parity; /* EMU_AT_MBAR: the barrier and the parity awaited */
  uint32_t nbar_id;             /* EMU_AT_NBAR: the named barrier awaited */
  std::vector<EmuWgmma> wgmma;  /* wgmma results not yet waited for */
  uint64_t wg_committed;        /* wgmma groups committed so far */
  bool wg_fenced;               /* a wgmma.fence since the last wait_group */
  std::vector<EmuBulkRed> bulk_red; /* bulk reductions not yet waited for */
  uint64_t bulk_committed;      /* bulk async-groups committed so far */
};

/* Per-byte race shadow: last writer and readers in the current epoch. */
struct EmuShadow {
  uint32_t w_epoch, r_epoch; /* epochs of the last write and read */
  int32_t w_tid, r_tid;      /* their threads; r_tid -1: several readers */
};

/* An OS thread running blocks one after another. */
struct EmuWorker {
  EmuCtx sched;            /* the scheduler's context */
  EmuFiber *fibers;        /* one per thread of the block */
  int nthreads;            /* threads per block */
  char *stacks;            /* all fiber stacks, each behind a guard page */
  size_t stack_span;       /* bytes per stack including its guard page */
  size_t stacks_len;       /* total mapping length */
  EmuDim3 bidx;            /* blockIdx of the running block */
  unsigned char *smem;     /* this OS thread's flex_smem */
  EmuShadow *shadow;       /* race shadow (racecheck only) */
  uint32_t epoch;          /* barrier epoch, bumped at each __syncthreads and mbarrier phase */
  uint32_t syncs;          /* __syncthreads released in this block */
  int sync_or, last_or;    /* __syncthreads_or: the open barrier's OR, the last released one's */
  uint64_t tiles, blocks;  /* counters summed into the launch */
  std::vector<EmuMbar> *mbars;   /* the block's initialised mbarriers */
  std::vector<EmuBulk> *bulk;    /* its bulk tensor copies in flight */
  uint16_t *wg_reads;            /* per 16-byte shared chunk: in-flight wgmmas reading it */
  EmuNbar nbar[EMU_NBARS];       /* named barriers */
  int wg_regs[32];         /* setmaxnreg: each warpgroup's registers a thread */
  int reg_pool;            /* the CTA's pool of registers given back by .dec, which .inc draws */
  bool failed;             /* the running block hit an error */
};

/* The registers a thread of a kernel using setmaxnreg starts with: ptxas
 * honours setmaxnreg only under __launch_bounds__(threads, 1) and then
 * gives every thread the register file's share, 65536 / threads rounded
 * down to 8 (168 for 384 threads), at most 256. */
static inline int emu_launch_regs(int nthreads) {
  int r = 65536 / nthreads / 8 * 8;
  return r > 256 ? 256 : r;
}

static EmuLaunch *emu_L;                      /* the launch in progress */
static EmuDim3 emu_block_dim, emu_grid_dim;   /* blockDim, gridDim */
static uint64_t emu_next_block;  /* next linear block to hand out (__atomic builtins: the
                                    race-check build must not see std::atomic) */
static bool emu_stop;            /* an error happened: stop all workers */
static pthread_mutex_t emu_err_mu = PTHREAD_MUTEX_INITIALIZER;    /* guards L->error */
static pthread_mutex_t emu_launch_mu = PTHREAD_MUTEX_INITIALIZER; /* one launch at a time */
static thread_local EmuWorker *emu_w;   /* this OS thread's worker */
static thread_local EmuFiber *emu_cur;  /* the fiber running now (NULL: scheduler) */

/* ---- errors --------------------------------------------------------------- */

/* Record the launch's first error, prefixed with kernel, block and thread
 * (tid < 0: no thread). */
EMU_API static void emu_record(int tid, const char *fmt, va_list ap) {
  pthread_mutex_lock(&emu_err_mu);
  if (!emu_L->error[0]) {
    char msg[EMU_ERR_LEN];
    vsnprintf(msg, sizeof msg, fmt, ap);
    EmuWorker *w = emu_w;
    if (tid >= 0) {
      unsigned bx = emu_block_dim.x, by = emu_block_dim.y;
      snprintf(emu_L->error, EMU_ERR_LEN, "%s: block (%u,%u,%u) thread (%u,%u,%u): %s",
               emu_L->kernel, w->bidx.x, w->bidx.y, w->bidx.z, (unsigned)tid % bx,
               (unsigned)tid / bx % by, (unsigned)tid / (bx * by), msg);
    } else if (w) {
      snprintf(emu_L->error, EMU_ERR_LEN, "%s: block (%u,%u,%u): %s", emu_L->kernel, w->bidx.x,
               w->bidx.y, w->bidx.z, msg);
    } else {
      snprintf(emu_L->error, EMU_ERR_LEN, "%s: %s", emu_L->kernel, msg);
    }
  }
  pthread_mutex_unlock(&emu_err_mu);
  __atomic_store_n(&emu_stop, true, __ATOMIC_SEQ_CST);
  if (emu_w) emu_w->failed = true;
}

/* Fail the launch. On a fiber this never returns: the block is abandoned. */
EMU_API __attribute__((format(printf, 2, 3))) static void emu_fail_tid(int tid, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emu_record(tid, fmt, ap);
  va_end(ap);
  if (emu_cur) {
    EmuFiber *f = emu_cur;
    f->state = EMU_DONE;
    emu_ctx_swap(&f->ctx, &emu_w->sched);
    abort(); /* an abandoned fiber is never resumed */
  }
}
#define emu_fail(...) emu_fail_tid(emu_cur ? emu_cur->tid : -1, __VA_ARGS__)

/* ---- global memory -------------------------------------------------------- */

/* Check that [p, p+n) lies inside one registered allocation. */
EMU_API static void emu_check_global(const void *p, size_t n, const char *what) {
  static thread_local int last;
  uintptr_t a = (uintptr_t)p;
  const EmuRange *r = emu_L->ranges;
  int nr = emu_L->nranges;
  if (last < nr && a >= r[last].base && a + n <= r[last].base + r[last].bytes) return;
  int best = -1;
  uint64_t bestd = UINT64_MAX;
  for (int i = 0; i < nr; i++) {
    if (a >= r[i].base && a + n <= r[i].base + r[i].bytes) {
      last = i;
      return;
    }
    uint64_t d = a < r[i].base ? r[i].base - a : a + n - (r[i].base + r[i].bytes);
    if (d < bestd) bestd = d, best = i;
  }
  if (best < 0) emu_fail("%s of %zu bytes at %p: no allocation is registered", what, n, p);
  long long off = (long long)(a - r[best].base);
  emu_fail("%s of %zu bytes at %p is outside every allocation (nearest: '%s' [%p, +%llu), "
           "access at byte offset %lld)",
           what, n, p, r[best].name ? r[best].name : "?", (void *)r[best].base,
           (unsigned long long)r[best].bytes, off);
}

/* ---- shared memory -------------------------------------------------------- */

/* Offset of [p, p+n) in the block's shared memory, or fail. */
EMU_API static size_t emu_smem_offset(const void *p, size_t n, const char *what) {
  uintptr_t a = (uintptr_t)p, s = (uintptr_t)emu_w->smem;
  if (a < s || a + n > s + emu_L->smem_bytes)
    emu_fail("%s of %zu bytes at %p is outside the block's %llu bytes of shared memory", what, n, p,
             (unsigned long long)emu_L->smem_bytes);
  return a - s;
}

/* Race bookkeeping for thread `tid` touching shared bytes [off, off+n). */
EMU_API static void emu_shadow_access(int tid, size_t off, size_t n, bool write) {
  EmuWorker *w = emu_w;
  if (!w->shadow || w->failed) return;
  if (off + n > emu_L->smem_bytes) {
    emu_fail_tid(tid, "shared memory access at offset %zu (%zu bytes) beyond the launch's %llu bytes",
                 off, n, (unsigned long long)emu_L->smem_bytes);
    return;
  }
  uint32_t e = w->epoch;
  for (size_t i = off; i < off + n; i++) {
    EmuShadow *s = &w->shadow[i];
    if (s->w_epoch == e && s->w_tid != tid) {
      emu_fail_tid(tid, "shared memory race at offset %zu: %s after a write by thread %d with no "
                        "__syncthreads between", i, write ? "write" : "read", s->w_tid);
      return;
    }
    if (write && s->r_epoch == e && s->r_tid != tid) {
      emu_fail_tid(tid, "shared memory race at offset %zu: write after a read by %s with no "
                        "__syncthreads between", i, s->r_tid < 0 ? "several threads" : "another thread");
      return;
    }
    if (write) {
      s->w_epoch = e, s->w_tid = tid;
    } else if (s->r_epoch != e) {
      s->r_epoch = e, s->r_tid = tid;
    } else if (s->r_tid != tid) {
      s->r_tid = -1;
    }
  }
}

/* ---- fibers and the scheduler --------------------------------------------- */

/* Block the current fiber in `state` until the scheduler releases it. */
EMU_API static void emu_block_wait(int state) {
  EmuFiber *f = emu_cur;
  f->state = state;
  emu_ctx_swap(&f->ctx, &emu_w->sched);
}

/* Post a warp collective and wait for its result (written into r). */
EMU_API static void emu_warp_op(EmuReq *r) {
  EmuFiber *f = emu_cur;
  r->tid = f->tid;
  r->seq = f->nwarp++;
  f->req = *r;
  emu_block_wait(EMU_AT_WARP);
  r->result = f->req.result;
}

/* Post a warpgroup collective (128 threads) and wait for it. */
EMU_API static void emu_group_op(EmuReq *r) {
  EmuFiber *f = emu_cur;
  r->tid = f->tid;
  r->seq = f->ngroup++;
  f->req = *r;
  emu_block_wait(EMU_AT_GROUP);
  r->result = f->req.result;
}

EMU_NOSAN static void emu_fiber_main(void) {
  emu_L->entry(emu_L->params);
  EmuFiber *f = emu_cur;
  /* a GPU frees the block's shared memory at exit: a bulk reduction
   * must have read its source by then */
  if (!f->bulk_red.empty())
    emu_fail("exited with %zu cp.reduce.async.bulk not waited for (cp.async.bulk.wait_group)",
             f->bulk_red.size());
  f->state = EMU_DONE;
  emu_ctx_swap(&f->ctx, &emu_w->sched);
  abort(); /* a finished fiber is never resumed */
}

/* Make every fiber fresh for the next block. */
EMU_NOSAN static void emu_block_reset(EmuWorker *w) {
  for (int i = 0; i < w->nthreads; i++) {
    EmuFiber *f = &w->fibers[i];
    f->state = EMU_READY;
    f->copies.clear();
    f->committed = 0;
    f->nwarp = 0;
    f->ngroup = 0;
    f->wgmma.clear();
    f->wg_committed = 0;
    f->wg_fenced = false;
    f->bulk_red.clear();
    f->bulk_committed = 0;
    f->tid = i;
    f->tidx.x = (unsigned)i % emu_block_dim.x;
    f->tidx.y = (unsigned)i / emu_block_dim.x % emu_block_dim.y;
    f->tidx.z = (unsigned)i / (emu_block_dim.x * emu_block_dim.y);
    size_t page = (size_t)getpagesize();
    emu_ctx_make(&f->ctx, w->stacks + (size_t)i * w->stack_span + page, w->stack_span - page,
                 emu_fiber_main);
  }
  memset(w->smem, 0xFF, emu_L->smem_bytes);
  if (w->shadow) memset(w->shadow, 0, sizeof(EmuShadow) * emu_L->smem_bytes);
  w->mbars->clear();
  for (int g = 0; g < 32; g++) w->wg_regs[g] = emu_launch_regs(w->nthreads);
  w->reg_pool = 0;
  memset(w->wg_reads, 0, sizeof(uint16_t) * (emu_L->smem_bytes / 16 + 1));
  w->bulk->clear();
  memset(w->nbar, 0, sizeof w->nbar);
  w->epoch = 1;
  w->syncs = 0;
  w->sync_or = w->last_or = 0;
  w->failed = false;
}

/* Release a block barrier everyone reached. Returns whether it did. */
EMU_NOSAN static bool emu_release_bar(EmuWorker *w, int nbar, int ndone) {
  if (nbar == 0 || nbar + ndone < w->nthreads) return false;
  if (ndone > 0) {
    int first = 0;
    while (w->fibers[first].state != EMU_DONE) first++;
    emu_fail_tid(-1, "__syncthreads divergence: %d thread(s) wait at __syncthreads but %d have "
                     "exited (first exited: thread %d)", nbar, ndone, first);
    return false;
  }
  for (int i = 0; i < w->nthreads; i++) w->fibers[i].state = EMU_READY;
  /* Its waiters read the OR as they wake, before any can reach the next. */
  w->last_or = w->sync_or;
  w->sync_or = 0;
  w->epoch++;
  w->syncs++;
  return true;
}

/* Release every warp whose lanes all wait at the same collective. */
EMU_NOSAN static bool emu_release_warps(EmuWorker *w) {
  bool progress = false;
  for (int base = 0; base < w->nthreads && !w->failed; base += 32) {
    int n = w->nthreads - base < 32 ? w->nthreads - base : 32;
    int at = 0, done = 0;
    for (int l = 0; l < n; l++) {
      at += w->fibers[base + l].state == EMU_AT_WARP;
      done += w->fibers[base + l].state == EMU_DONE;
    }
    if (at == 0) continue;
    if (at + done == n && done > 0) {
      int l0 = 0; /* a lane that waits: its request names the collective */
      while (w->fibers[base + l0].state != EMU_AT_WARP) l0++;
      const char *op = w->fibers[base + l0].req.name;
      emu_fail_tid(base, "warp collective divergence: %d lane(s) wait at %s but %d lane(s) of the "
                         "warp have exited", at, op ? op : "a warp op", done);
      return false;
    }
    if (at < n) continue;
    EmuReq *lanes[32];
    unsigned full = n == 32 ? 0xffffffffu : (1u << n) - 1;
    for (int l = 0; l < n; l++) {
      lanes[l] = &w->fibers[base + l].req;
      if (lanes[l]->fn != lanes[0]->fn) {
        emu_fail_tid(base + l, "warp divergence: lane %d is at %s while lane 0 is at %s", l,
                     lanes[l]->name, lanes[0]->name);
        return false;
      }
      /* A GPU pairs the lanes of a collective only if each reached it as
       * the same step of the warp's program: a lane that skipped one (a
       * collective under a per-thread branch) would hang or pair wrongly. */
      if (lanes[l]->seq != lanes[0]->seq) {
        emu_fail_tid(base + l, "warp divergence: lane %d reaches %s as its warp collective #%llu, "
                               "lane 0 as #%llu (a collective under a branch not every lane takes)",
                     l, lanes[l]->name, (unsigned long long)lanes[l]->seq + 1,
                     (unsigned long long)lanes[0]->seq + 1);
        return false;
      }
      /* .aligned ops (mma.sync, ldmatrix) need every lane at the same instruction. */
      if (lanes[l]->site != lanes[0]->site) {
        emu_fail_tid(base + l, "warp divergence: lane %d executes %s at a different call site "
                               "than lane 0 (.aligned needs one instruction for the whole warp)",
                     l, lanes[l]->name);
        return false;
      }
      if ((lanes[l]->mask & full) != full) {
        emu_fail_tid(base + l, "%s with member mask 0x%08x: only full-warp masks are supported",
                     lanes[l]->name, lanes[l]->mask);
        return false;
      }
    }
    lanes[0]->fn(lanes, n);
    for (int l = 0; l < n; l++) w->fibers[base + l].state = EMU_READY;
    progress = true;
  }
  return progress;
}

/* ---- sm_90 engine parts: warpgroups, mbarriers, bulk copies ----------------- */

/* Release every warpgroup (threads 128i..128i+127) whose threads all wait
 * at the same warpgroup collective (wgmma.*, setmaxnreg); `late` ones
 * (wgmma.wait_group) only when `late` is asked for. */
EMU_NOSAN static bool emu_release_groups(EmuWorker *w, bool late) {
  bool progress = false;
  for (int base = 0; base < w->nthreads && !w->failed; base += 128) {
    int n = w->nthreads - base < 128 ? w->nthreads - base : 128;
    int at = 0, done = 0;
    for (int l = 0; l < n; l++) {
      at += w->fibers[base + l].state == EMU_AT_GROUP;
      done += w->fibers[base + l].state == EMU_DONE;
    }
    if (at == 0) continue;
    int l0 = 0;
    while (w->fibers[base + l0].state != EMU_AT_GROUP) l0++;
    EmuReq *r0 = &w->fibers[base + l0].req;
    if (n < 128) {
      emu_fail_tid(base + l0, "%s needs a full warpgroup of 128 threads; threads %d..%d are only %d",
                   r0->name, base, base + n - 1, n);
      return false;
    }
    if (at + done == n && done > 0) {
      emu_fail_tid(base + l0, "warpgroup divergence: %d thread(s) wait at %s but %d thread(s) of "
                              "warpgroup %d have exited", at, r0->name, done, base / 128);
      return false;
    }
    if (at < n || (r0->late && !late)) continue;
    EmuReq *lanes[128];
    for (int l = 0; l < n; l++) {
      lanes[l] = &w->fibers[base + l].req;
      if (lanes[l]->fn != r0->fn || lanes[l]->seq != r0->seq || lanes[l]->site != r0->site ||
          lanes[l]->arg != r0->arg || lanes[l]->width != r0->width) {
        emu_fail_tid(base + l, "warpgroup divergence: thread %d of warpgroup %d is at %s (its "
                               "warpgroup op #%llu), thread %d at %s (#%llu): .sync.aligned needs "
                               "all 128 threads at the same instruction with the same immediates",
                     l, base / 128, lanes[l]->name, (unsigned long long)lanes[l]->seq + 1, l0,
                     r0->name, (unsigned long long)r0->seq + 1);
        return false;
      }
    }
    if (r0->regs) { /* setmaxnreg: .dec gives to the CTA's pool, .inc waits until it can take */
      int *cur = &w->wg_regs[base / 128], need = (r0->arg - *cur) * 128;
      if (r0->regs == 2 && need > w->reg_pool) continue; /* a deadlock reports it if nobody gives */
      if (r0->regs == 2 && need > 0) w->reg_pool -= need, *cur = r0->arg;
      if (r0->regs == 1 && need < 0) w->reg_pool -= need, *cur = r0->arg;
    }
    r0->fn(lanes, n);
    if (w->failed) return false;
    for (int l = 0; l < n; l++) w->fibers[base + l].state = EMU_READY;
    progress = true;
  }
  return progress;
}

/* The initialised mbarrier at shared offset `off`, or NULL. */
EMU_NOSAN static EmuMbar *emu_mbar_find(EmuWorker *w, uint32_t off) {
  for (size_t i = 0; i < w->mbars->size(); i++)
    if ((*w->mbars)[i].off == off) return &(*w->mbars)[i];
  return NULL;
}

/* Complete the current phase if every arrival and every transaction byte
 * is in. For the race check a completed phase is a barrier epoch: what was
 * written before it is ordered before what is read after it. That is
 * looser than the hardware (it orders every thread of the block, not only
 * the arrivers and the waiters) but never reports a race that mbarrier
 * synchronisation prevents. */
EMU_NOSAN static void emu_mbar_settle(EmuMbar *m) {
  if (m->pending == 0 && m->tx == 0) {
    m->phase++;
    m->pending = m->count;
    emu_w->epoch++;
  }
}

/* Wake the threads whose awaited phase has completed. */
EMU_NOSAN static bool emu_release_mbar(EmuWorker *w) {
  bool progress = false;
  for (int i = 0; i < w->nthreads; i++) {
    EmuFiber *f = &w->fibers[i];
    if (f->state != EMU_AT_MBAR) continue;
    EmuMbar *m = emu_mbar_find(w, f->mbar_off);
    if (!m || (m->phase & 1) != f->mbar_parity) f->state = EMU_READY, progress = true;
  }
  return progress;
}

/* Land every bulk copy in flight and complete its bytes on its mbarrier.
 * Called only when nothing else can run: a copy lands as late as it may. */
EMU_NOSAN static bool emu_land_bulk(EmuWorker *w) {
  if (w->bulk->empty()) return false;
  std::vector<EmuBulk> todo;
  todo.swap(*w->bulk);
  for (size_t i = 0; i < todo.size(); i++) {
    EmuBulk &b = todo[i];
    size_t eb = b.data.size() / b.dst_of.size();
    for (size_t e = 0; e < b.dst_of.size(); e++) memcpy(w->smem + b.dst_of[e], &b.data[e * eb], eb);
    EmuMbar *m = emu_mbar_find(w, b.bar);
    if (!m) {
      emu_fail_tid(b.tid, "cp.async.bulk.tensor completes on the mbarrier at shared offset %u, "
                          "which is no longer initialised", b.bar);
      return false;
    }
    m->tx -= (int64_t)b.bytes;
    if (m->tx < -((1 << 20) - 1)) {
      emu_fail_tid(b.tid, "mbarrier at shared offset %u: transaction count %lld below the "
                          "PTX range -(2^20-1)", b.bar, (long long)m->tx);
      return false;
    }
    emu_mbar_settle(m);
  }
  return true;
}

/* Describe a block where nobody can move. */
EMU_NOSAN static void emu_deadlock(EmuWorker *w) {
  int nbar = 0, nwarp = 0, ngroup = 0, nmbar = 0, nnbar = 0, ndone = 0, fbar = -1, fwarp = -1,
      fgroup = -1, fmbar = -1, fnbar = -1;
  for (int i = 0; i < w->nthreads; i++) {
    int s = w->fibers[i].state;
    if (s == EMU_AT_BAR && nbar++ == 0) fbar = i;
    if (s == EMU_AT_WARP && nwarp++ == 0) fwarp = i;
    if (s == EMU_AT_GROUP && ngroup++ == 0) fgroup = i;
    if (s == EMU_AT_MBAR && nmbar++ == 0) fmbar = i;
    if (s == EMU_AT_NBAR && nnbar++ == 0) fnbar = i;
    ndone += s == EMU_DONE;
  }
  char more[384] = "", named[224] = "", regs[128] = "";
  if (fgroup >= 0 && w->fibers[fgroup].req.regs == 2)
    snprintf(regs, sizeof regs, "; the CTA's register pool holds %d registers, %d short (%d a thread "
                                "at launch)", w->reg_pool,
             (w->fibers[fgroup].req.arg - w->wg_regs[fgroup / 128]) * 128 - w->reg_pool,
             emu_launch_regs(w->nthreads));
  if (ngroup || nmbar)
    snprintf(more, sizeof more, ", %d at a warpgroup collective (first %d: %s%s), %d waiting on an "
                                "mbarrier (first %d: offset %u, parity %u)",
             ngroup, fgroup, fgroup >= 0 ? w->fibers[fgroup].req.name : "-", regs, nmbar, fmbar,
             fmbar >= 0 ? w->fibers[fmbar].mbar_off : 0, fmbar >= 0 ? w->fibers[fmbar].mbar_parity : 0);
  if (nnbar) {
    const EmuNbar *b = &w->nbar[w->fibers[fnbar].nbar_id];
    int part = 0; /* a warp only part of whose lanes arrived (the instruction is per warp) */
    while (part < 32 && b->per_warp[part] % 32 == 0) part++;
    char why[64] = "";
    if (part < 32)
      snprintf(why, sizeof why, "; %u arrivals from warp %d, not whole warps", b->per_warp[part], part);
    snprintf(named, sizeof named, ", %d at a named barrier (first %d: bar.sync %u, %u of %u arrived%s)",
             nnbar, fnbar, w->fibers[fnbar].nbar_id, b->arrived, b->count, why);
  }
  emu_fail_tid(-1, "deadlock: %d thread(s) at __syncthreads (first %d), %d at a warp collective "
                   "(first %d: %s)%s%s, %d exited", nbar, fbar, nwarp, fwarp,
               fwarp >= 0 ? w->fibers[fwarp].req.name : "-", more, named, ndone);
}

/* Run one block to completion. */
EMU_NOSAN static void emu_run_block(EmuWorker *w) {
  emu_block_reset(w);
  for (;;) {
    for (int i = 0; i < w->nthreads; i++) {
      EmuFiber *f = &w->fibers[i];
      if (f->state != EMU_READY) continue;
      emu_cur = f;
      emu_ctx_swap(&w->sched, &f->ctx);
      emu_cur = NULL;
      if (w->failed || __atomic_load_n(&emu_stop, __ATOMIC_RELAXED)) return;
    }
    int nbar = 0, ndone = 0, nready = 0;
    for (int i = 0; i < w->nthreads; i++) {
      nbar += w->fibers[i].state == EMU_AT_BAR;
      ndone += w->fibers[i].state == EMU_DONE;
      nready += w->fibers[i].state == EMU_READY; /* woken by a named barrier behind them */
    }
    if (ndone == w->nthreads) break;
    bool progress = nready > 0 || emu_release_warps(w);
    if (!w->failed) progress |= emu_release_groups(w, false);
    if (!w->failed) progress |= emu_release_mbar(w);
    if (!progress && !w->failed) progress = emu_release_bar(w, nbar, ndone);
    if (!progress && !w->failed) progress = emu_land_bulk(w);
    if (!progress && !w->failed) progress = emu_release_groups(w, true);
    if (w->failed) return;
    if (!progress) {
      emu_deadlock(w);
      return;
    }
  }
  w->blocks++;
}

static uint64_t emu_gcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

/* The n-th block to run: n itself, or under a shuffle seed the image of n
 * under a bijection of [0, nblocks): an affine map a * n + c (mod nblocks)
 * with a coprime to nblocks, both drawn from the seed. A GPU promises
 * no order between blocks; a kernel whose result depends on one (beyond
 * the last bits of float atomics) shows it under a shuffle. */
static uint64_t emu_block_order(uint64_t n, uint64_t nblocks, uint64_t seed) {
  if (!seed || nblocks < 2) return n;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  uint64_t a = (x >> 17) % nblocks, c = (x >> 5) % nblocks;
  if (a == 0) a = 1;
  while (emu_gcd(a, nblocks) != 1) a = a + 1 == nblocks ? 1 : a + 1;
  return (uint64_t)(((unsigned __int128)a * n + c) % nblocks);
}

EMU_NOSAN static void *emu_worker_main(void *arg) {
  EmuWorker *w = (EmuWorker *)arg;
  emu_w = w;
  w->smem = flex_smem;
  uint64_t nblocks = (uint64_t)emu_grid_dim.x * emu_grid_dim.y * emu_grid_dim.z;
  for (;;) {
    uint64_t n = __atomic_fetch_add(&emu_next_block, 1, __ATOMIC_SEQ_CST);
    if (n >= nblocks || __atomic_load_n(&emu_stop, __ATOMIC_SEQ_CST)) break;
    uint64_t b = emu_block_order(n, nblocks, emu_L->shuffle);
    w->bidx.x = (unsigned)(b % emu_grid_dim.x);
    w->bidx.y = (unsigned)(b / emu_grid_dim.x % emu_grid_dim.y);
    w->bidx.z = (unsigned)(b / ((uint64_t)emu_grid_dim.x * emu_grid_dim.y));
    emu_run_block(w);
    if (w->failed) break;
  }
  emu_w = NULL;
  return NULL;
}

/* Set up a worker's fibers and stacks; false if memory ran out. */
EMU_NOSAN static bool emu_worker_init(EmuWorker *w, int nthreads, size_t stack) {
  size_t page = (size_t)getpagesize();
  w->nthreads = nthreads;
  w->stack_span = (stack + page - 1) / page * page + page;
  w->stacks_len = w->stack_span * (size_t)nthreads;
  void *m = mmap(NULL, w->stacks_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) return false;
  w->stacks = (char *)m;
  for (int i = 0; i < nthreads; i++) mprotect(w->stacks + (size_t)i * w->stack_span, page, PROT_NONE);
  w->fibers = new EmuFiber[(size_t)nthreads]();
  w->mbars = new std::vector<EmuMbar>();
  w->bulk = new std::vector<EmuBulk>();
  w->wg_reads = (uint16_t *)calloc(emu_L->smem_bytes / 16 + 1, sizeof(uint16_t));
  if (!w->wg_reads) return false;
  if (emu_L->racecheck) w->shadow = (EmuShadow *)calloc(emu_L->smem_bytes + 1, sizeof(EmuShadow));
  return true;
}

EMU_NOSAN static void emu_worker_free(EmuWorker *w) {
  if (w->stacks) munmap(w->stacks, w->stacks_len);
  delete[] w->fibers;
  delete w->mbars;
  delete w->bulk;
  free(w->wg_reads);
  free(w->shadow);
}

/* One block runner as an item of the host's pool. */
EMU_NOSAN static void emu_runner_item(void *ctx, int64_t i, int worker) {
  (void)worker;
  emu_worker_main(&((EmuWorker *)ctx)[i]);
}

/* The module's launcher (see EmuLaunchFn). */
extern "C" __attribute__((visibility("default"))) EMU_NOSAN int emu_launch(EmuLaunch *L) {
  if (L->abi != EMU_ABI_VERSION) return -1;
  pthread_mutex_lock(&emu_launch_mu);
  emu_L = L;
  L->error[0] = 0;
  L->blocks_run = L->tiles = 0;
  emu_block_dim = EmuDim3{L->block.x, L->block.y, L->block.z};
  emu_grid_dim = EmuDim3{L->grid.x, L->grid.y, L->grid.z};
  uint64_t nthreads = (uint64_t)L->block.x * L->block.y * L->block.z;
  uint64_t nblocks = (uint64_t)L->grid.x * L->grid.y * L->grid.z;
  __atomic_store_n(&emu_next_block, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&emu_stop, false, __ATOMIC_SEQ_CST);
  int nw = L->threads < 1 ? 1 : L->threads;
  /* The device's limits: a launch beyond them fails on a GPU. */
  if (nthreads == 0 || nthreads > 1024 || nblocks == 0 || L->grid.x > 2147483647u ||
      L->grid.y > 65535u || L->grid.z > 65535u || L->block.z > 64u) {
    snprintf(L->error, EMU_ERR_LEN, "%s: bad launch geometry: grid (%u,%u,%u), block (%u,%u,%u)",
             L->kernel, L->grid.x, L->grid.y, L->grid.z, L->block.x, L->block.y, L->block.z);
  } else if (L->smem_bytes > EMU_SMEM_MAX) {
    snprintf(L->error, EMU_ERR_LEN, "%s: %llu bytes of dynamic shared memory asked, at most %u",
             L->kernel, (unsigned long long)L->smem_bytes, EMU_SMEM_MAX);
  } else {
    if ((uint64_t)nw > nblocks) nw = (int)nblocks;
    std::vector<EmuWorker> ws((size_t)nw);
    bool ok = true;
    for (int i = 0; i < nw && ok; i++)
      ok = emu_worker_init(&ws[(size_t)i], (int)nthreads, (size_t)L->stack_bytes);
    if (!ok) snprintf(L->error, EMU_ERR_LEN, "%s: out of memory for fiber stacks", L->kernel);
    /* Each block runner is an item of the host's pool; they take blocks
     * from one counter, so runners that share a pool thread just take turns. */
    if (ok && L->pool_run && nw > 1) L->pool_run(nw, emu_runner_item, ws.data());
    else if (ok) emu_worker_main(&ws[0]);
    for (int i = 0; i < nw; i++) {
      L->blocks_run += ws[(size_t)i].blocks;
      L->tiles += ws[(size_t)i].tiles;
      emu_worker_free(&ws[(size_t)i]);
    }
  }
  int rc = L->error[0] ? -1 : 0;
  emu_L = NULL;
  pthread_mutex_unlock(&emu_launch_mu);
  return rc;
}

/* Count n visited (q-block, kv-block) tiles (kernels call it under FLEXC_EMU). */
EMU_API static void emu_count_tiles(int n) { emu_w->tiles += (uint64_t)n; }

/* ---- race-check hooks ------------------------------------------------------- */
#if EMU_HOOKED
/* Built with -fsanitize=thread and linked without its runtime: the compiler
 * calls these for every load and store of kernel code; shared-memory ones
 * feed the race shadow, everything else is ignored. */
EMU_NOSAN static inline void emu_hook(const void *p, size_t n, bool write) {
  EmuFiber *f = emu_cur;
  if (!f || !emu_w) return;
  uintptr_t a = (uintptr_t)p, s = (uintptr_t)emu_w->smem;
  if (a - s >= EMU_SMEM_MAX) return;
  emu_shadow_access(f->tid, a - s, n, write);
}
#define EMU_HOOK_RW(N)                                                               \
  extern "C" EMU_NOSAN void __tsan_read##N(void *p) { emu_hook(p, N, false); }       \
  extern "C" EMU_NOSAN void __tsan_write##N(void *p) { emu_hook(p, N, true); }       \
  extern "C" EMU_NOSAN void __tsan_unaligned_read##N(void *p) { emu_hook(p, N, false); } \
  extern "C" EMU_NOSAN void __tsan_unaligned_write##N(void *p) { emu_hook(p, N, true); } \
  extern "C" EMU_NOSAN void __tsan_volatile_read##N(void *p) { emu_hook(p, N, false); } \
  extern "C" EMU_NOSAN void __tsan_volatile_write##N(void *p) { emu_hook(p, N, true); }
EMU_HOOK_RW(1)
EMU_HOOK_RW(2)
EMU_HOOK_RW(4)
EMU_HOOK_RW(8)
EMU_HOOK_RW(16)
extern "C" EMU_NOSAN void __tsan_read_range(void *p, size_t n) { emu_hook(p, n, false); }
extern "C" EMU_NOSAN void __tsan_write_range(void *p, size_t n) { emu_hook(p, n, true); }
extern "C" EMU_NOSAN void __tsan_init(void) {}
extern "C" EMU_NOSAN void __tsan_func_entry(void *) {}
extern "C" EMU_NOSAN void __tsan_func_exit(void) {}
extern "C" EMU_NOSAN void __tsan_vptr_update(void *, void *) {}
extern "C" EMU_NOSAN void __tsan_vptr_read(void *) {}
#endif

#endif
