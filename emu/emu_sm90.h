/* emu_sm90.h: the sm_90a wrappers of kernels/arch.cuh, emulated on the CPU.
 * Included by emu_arch.h; same names and signatures as the device versions.
 * Semantics from the PTX ISA, by section title (the numbers move between
 * ISA versions):
 *
 *   mbarrier (Parallel Synchronization and Communication: mbarrier): init with an arrival count; a phase completes when
 *     its pending arrivals and its transaction count are both zero, then
 *     pending = count again. try_wait.parity P is true once the phase of
 *     parity P has completed, i.e. when (completed phases & 1) != P.
 *   cp.async.bulk.tensor (Data Movement: cp.async.bulk.tensor) tile mode: the box at the coordinates,
 *     innermost dimension first, written densely to shared memory; elements
 *     outside the tensor are zero; the full box size counts as transaction
 *     bytes on the mbarrier. Swizzle (CUDA programming guide, TMA swizzle):
 *     16-byte chunk bits [4, 4+b) of the shared address are XORed with bits
 *     [7, 7+b), b = 1, 2, 3 for 32, 64, 128 bytes.
 *   cp.reduce.async.bulk (Data Movement: cp.reduce.async.bulk) .add.f32,
 *     shared -> global, bulk_group completion: element-wise atomic adds.
 *   wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16} (Asynchronous
 *   Warpgroup Level Matrix Multiply-Accumulate: Register Fragments):
 *     warpgroup = 4 warps, w = warp % 4, g = lane / 4, t = lane % 4.
 *     D (64xN f32): d[i] = D[16w + g + 8((i/2)%2)][8(i/4) + 2t + i%2], i < N/2.
 *     A in registers (64x16): a[0] = A[16w+g][2t..2t+1]  a[1] = A[16w+g+8][2t..2t+1]
 *                             a[2] = A[16w+g][2t+8..+9]  a[3] = A[16w+g+8][2t+8..+9]
 *     Matrix descriptor (Shared Memory Matrix Layout: Matrix Descriptor Format): bits 0-13 start address >> 4, 16-29
 *     leading byte offset (LBO) >> 4, 32-45 stride byte offset (SBO) >> 4,
 *     49-51 base offset, 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B).
 *     Canonical layouts, byte offset of element (mn, k) of a 16-bit matrix
 *     before the swizzle (W = swizzle span in bytes):
 *       K-major,  none:  (mn%8)*16 + (mn/8)*SBO + (k%8)*2 + (k/8)*LBO
 *       K-major,  W:     (mn%8)*W  + (mn/8)*SBO + k*2             (LBO unused)
 *       MN-major, none:  (mn%8)*2  + (mn/8)*SBO + (k%8)*16 + (k/8)*LBO
 *       MN-major, W:     (mn%(W/2))*2 + (mn/(W/2))*LBO + (k%8)*W + (k/8)*SBO
 *     then the swizzle above on the absolute shared address. A is M x K,
 *     B is K x N; "K-major" is the default (imm-trans 0), MN-major imm-trans 1.
 *     (The same canonical forms as CUTLASS's make_gmma_desc comments; the
 *     ISA draws them as core-matrix figures.)
 *
 *   bar.sync / bar.arrive a, b (Parallel Synchronization and Communication:
 *     bar, barrier): named barrier a (the emulator takes 1..15; 0 is
 *     __syncthreads') completes when b threads (a multiple of 32) have
 *     arrived; bar.sync waits for that, bar.arrive does not. Executed per
 *     warp; every thread arriving at one phase must give the same b.
 *
 * Rules enforced: warpgroup ops (wgmma.*, setmaxnreg) need all 128 threads
 * of the warpgroup at the same instruction (the same source position) with
 * the same immediates and the same descriptors; a wgmma.fence before the first wgmma.mma_async after a
 * wait_group; accumulator registers hold poison (NaN) from issue until the
 * wait_group that retires their group; A registers must not change before
 * then; every descriptor element and every TMA destination lies inside the
 * launch's shared memory; mbarriers are initialised, 8-byte aligned, used by
 * other threads only after a __syncthreads, counts within the PTX ranges.
 */
#ifndef FLEXC_EMU_SM90_H
#define FLEXC_EMU_SM90_H

/* ---- mbarrier ------------------------------------------------------------------ */

enum { EMU_TX_MAX = (1 << 20) - 1 }; /* arrival and transaction counts are 20 bits */

/* The mbarrier at `bar`: checked address and initialisation. */
EMU_API static EmuMbar *emu_mbar(const void *bar, const char *op) {
  uint32_t off = (uint32_t)emu_smem_offset(bar, 8, op);
  if (off & 7) emu_fail("%s: mbarrier at shared offset %u is not 8-byte aligned", op, off);
  EmuMbar *m = emu_mbar_find(emu_w, off);
  if (!m) emu_fail("%s: no mbarrier was initialised at shared offset %u", op, off);
  if (m->init_sync == emu_w->syncs && m->init_tid != emu_cur->tid)
    emu_fail("%s: mbarrier at shared offset %u used before a __syncthreads after its "
             "initialisation by thread %d", op, off, m->init_tid);
  return m;
}

/* mbarrier.init.shared::cta.b64 [bar], count */
EMU_API static void flex_mbar_init(uint64_t *bar, uint32_t count) {
  uint32_t off = (uint32_t)emu_smem_offset(bar, 8, "mbarrier.init");
  if (off & 7) emu_fail("mbarrier.init: shared offset %u is not 8-byte aligned", off);
  if (count < 1 || count > EMU_TX_MAX) emu_fail("mbarrier.init: count %u outside 1..2^20-1", count);
  EmuMbar *m = emu_mbar_find(emu_w, off);
  if (!m) {
    emu_w->mbars->push_back(EmuMbar());
    m = &emu_w->mbars->back();
  }
  m->off = off, m->count = count, m->pending = count, m->tx = 0, m->phase = 0;
  m->init_tid = emu_cur->tid, m->init_sync = emu_w->syncs;
}

/* Add `bytes` to the current phase's expected transaction count. */
EMU_API static void emu_mbar_expect(EmuMbar *m, uint32_t bytes, const char *op) {
  if (bytes > EMU_TX_MAX) emu_fail("%s: %u transaction bytes, at most 2^20-1", op, bytes);
  m->tx += bytes;
  if (m->tx > EMU_TX_MAX)
    emu_fail("%s: mbarrier at shared offset %u expects %lld transaction bytes, beyond 2^20-1", op,
             m->off, (long long)m->tx);
}

/* One arrival; returns the state token (the phase arrived on). */
EMU_API static uint64_t emu_mbar_arrive(EmuMbar *m) {
  uint64_t state = m->phase;
  if (m->pending == 0) /* the phase waits only for transaction bytes */
    emu_fail("mbarrier at shared offset %u: more than its %u arrivals in one phase", m->off, m->count);
  m->pending--;
  emu_mbar_settle(m);
  return state;
}

/* mbarrier.arrive.shared::cta.b64 state, [bar] */
EMU_API static uint64_t flex_mbar_arrive(uint64_t *bar) {
  return emu_mbar_arrive(emu_mbar(bar, "mbarrier.arrive"));
}

/* mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes */
EMU_API static void flex_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  EmuMbar *m = emu_mbar(bar, "mbarrier.arrive.expect_tx");
  emu_mbar_expect(m, bytes, "mbarrier.arrive.expect_tx");
  emu_mbar_arrive(m);
}

/* mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], bytes */
EMU_API static void flex_mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
  emu_mbar_expect(emu_mbar(bar, "mbarrier.expect_tx"), bytes, "mbarrier.expect_tx");
}

/* mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity. A thread whose
 * phase has not completed yields: it sleeps until the phase completes (or
 * the block deadlocks), then returns whether it did. */
EMU_API static bool flex_mbar_try_wait(uint64_t *bar, uint32_t parity) {
  EmuMbar *m = emu_mbar(bar, "mbarrier.try_wait.parity");
  parity &= 1;
  if ((m->phase & 1) != parity) return true;
  EmuFiber *f = emu_cur;
  f->mbar_off = m->off, f->mbar_parity = parity;
  emu_block_wait(EMU_AT_MBAR);
  m = emu_mbar(bar, "mbarrier.try_wait.parity");
  return (m->phase & 1) != parity;
}

/* Wait until the phase of this parity has completed. */
static inline void flex_mbar_wait(uint64_t *bar, uint32_t parity) {
  while (!flex_mbar_try_wait(bar, parity)) {
  }
}

/* ---- named barriers ------------------------------------------------------------ */

/* Count the calling thread in at named barrier `id`; true if that completed
 * the phase (the waiters are released, the barrier is free again). For the
 * race check a completed phase is an epoch, as an mbarrier phase. */
EMU_API static bool emu_nbar_arrive(uint32_t id, uint32_t n, const char *op) {
  EmuWorker *w = emu_w;
  if (id < 1 || id >= EMU_NBARS)
    emu_fail("%s %u: the emulator takes named barriers 1..%d (0 is __syncthreads')", op, id,
             EMU_NBARS - 1);
  if (n == 0 || n % 32 || n > (uint32_t)w->nthreads)
    emu_fail("%s %u, %u: the thread count must be a non-zero multiple of 32 and at most the "
             "block's %d threads", op, id, n, w->nthreads);
  EmuNbar *b = &w->nbar[id];
  if (b->arrived && b->count != n)
    emu_fail("%s %u, %u: threads already at this barrier's phase gave %u threads", op, id, n,
             b->count);
  b->count = n;
  b->arrived++;
  b->per_warp[emu_cur->tid / 32]++;
  if (b->arrived < n) return false;
  for (int i = 0; i < 32; i++)
    if (b->per_warp[i] % 32 && (i + 1) * 32 <= w->nthreads)
      emu_fail("%s %u: its phase completed with %u arrivals from warp %d, not whole warps: the "
               "instruction is per warp, every lane executes it", op, id, b->per_warp[i], i);
  for (int i = 0; i < w->nthreads; i++) {
    EmuFiber *f = &w->fibers[i];
    if (f->state == EMU_AT_NBAR && f->nbar_id == id) f->state = EMU_READY;
  }
  /* A waiter reads the phase's OR after it wakes; the next phase cannot
   * complete before then (it needs that waiter's arrival). */
  const uint32_t red = b->red_or;
  memset(b, 0, sizeof *b);
  b->last_or = red;
  w->epoch++;
  return true;
}

/* bar.sync id, n */
EMU_API static void emu_bar_sync(uint32_t id, uint32_t n) {
  if (emu_nbar_arrive(id, n, "bar.sync")) return;
  emu_cur->nbar_id = id;
  emu_block_wait(EMU_AT_NBAR);
}
template <int ID, int N> static inline void flex_bar_sync(void) { emu_bar_sync(ID, N); }

template <int N> static inline void flex_bar_sync_id(int id) { emu_bar_sync((uint32_t)id, N); }

/* bar.arrive id, n */
template <int ID, int N> static inline void flex_bar_arrive(void) { emu_nbar_arrive(ID, N, "bar.arrive"); }
template <int N> static inline void flex_bar_arrive_id(int id) { emu_nbar_arrive((uint32_t)id, N, "bar.arrive"); }

/* bar.red.or.pred id, n: bar.sync that also returns the OR of every
 * participating thread's predicate. */
EMU_API static bool emu_bar_red_or(uint32_t id, uint32_t n, bool pred) {
  if (id >= 1 && id < EMU_NBARS) emu_w->nbar[id].red_or |= pred; /* a bad id fails in arrive */
  if (!emu_nbar_arrive(id, n, "bar.red.or")) {
    emu_cur->nbar_id = id;
    emu_block_wait(EMU_AT_NBAR);
  }
  return emu_w->nbar[id].last_or != 0;
}
template <int N> static inline bool flex_bar_red_or_id(int id, bool pred) {
  return emu_bar_red_or((uint32_t)id, N, pred);
}

/* ---- elect.sync, fences, setmaxnreg ------------------------------------------- */

/* elect.sync with a full mask: one leader lane. The ISA promises one;
 * the emulator elects the lowest, lane 0. */
EMU_NOSAN static void emu_elect_fn(EmuReq **lanes, int n) {
  for (int l = 0; l < n; l++) lanes[l]->result = l == 0;
}
EMU_API static bool flex_elect_one(void) {
  EmuReq r = {};
  r.fn = emu_elect_fn, r.name = "elect.sync", r.mask = 0xffffffffu;
  emu_warp_op(&r);
  return r.result != 0;
}

/* fence.proxy.async.shared::cta: orders generic-proxy shared writes before
 * async-proxy reads (wgmma, bulk copies). The emulator has one memory, so
 * this is a no-op; a missing fence is not detected. */
static inline void flex_fence_proxy_async(void) {}

/* setmaxnreg.{inc,dec}.sync.aligned.u32 N: the whole warpgroup, one
 * instruction, N in 24..256 and a multiple of 8; the registers move
 * through the CTA's pool (emu_release_groups: an .inc waits until the
 * pool holds what it asks for, and a deadlock names it). */
EMU_NOSAN static void emu_setmaxnreg_fn(EmuReq **lanes, int n) {
  (void)n;
  int regs = lanes[0]->arg;
  if (regs < 24 || regs > 256 || regs % 8)
    emu_fail_tid(lanes[0]->tid, "setmaxnreg: %d registers, want a multiple of 8 in 24..256", regs);
}
#define EMU_GROUP_OP static inline __attribute__((always_inline))
/* The .aligned rule (one instruction for the whole warpgroup) is checked on
 * the call's source position: the wrappers take it as defaulted arguments
 * (evaluated at the kernel's call site; kernels never pass them). A return
 * address would also work but is fooled when the compiler duplicates a
 * call into both arms of an earlier branch on the thread index (jump
 * threading), which the same source line survives. */
#define EMU_SITE_ARGS const char *emu_file = __builtin_FILE(), int emu_line = __builtin_LINE()
#define EMU_SITE emu_site(emu_file, emu_line)
/* File and line (g++ has no __builtin_COLUMN): two calls on one line count as one site. */
static inline const void *emu_site(const char *file, int line) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a of the name: literals need not be merged */
  for (const char *c = file; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return (const void *)(uintptr_t)(h ^ ((uint64_t)line << 40));
}
EMU_API static void emu_setmaxnreg(int regs, int inc, const void *site) {
  EmuReq r = {};
  r.fn = emu_setmaxnreg_fn, r.name = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
  r.arg = regs, r.width = inc, r.site = site, r.regs = inc ? 2 : 1;
  emu_group_op(&r);
}
template <int N> EMU_GROUP_OP void flex_setmaxnreg_inc(EMU_SITE_ARGS) {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N in 24..256, a multiple of 8");
  emu_setmaxnreg(N, 1, EMU_SITE);
}
template <int N> EMU_GROUP_OP void flex_setmaxnreg_dec(EMU_SITE_ARGS) {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N in 24..256, a multiple of 8");
  emu_setmaxnreg(N, 0, EMU_SITE);
}

/* ---- cp.async.bulk.tensor ----------------------------------------------------- */

/* The shared offset `a` after a swizzle of `span` bytes (0: none). */
static inline uint32_t emu_swizzle(uint32_t a, uint32_t span) {
  uint32_t b = span == 128 ? 3 : span == 64 ? 2 : span == 32 ? 1 : 0;
  return a ^ (((a >> 7) & ((1u << b) - 1)) << 4);
}

/* Load the box at coordinates c[0..rank) into shared memory at dst,
 * completing its bytes on the mbarrier at bar. Issued by one thread. */
EMU_API static void emu_tma_load(void *dst, const FlexTensorMap *map, uint64_t *bar, const int32_t *c,
                                 uint32_t rank) {
  const char *op = "cp.async.bulk.tensor";
  if (!map || map->magic != EMU_TMAP_MAGIC) emu_fail("%s: the tensor map at %p was not encoded", op, (const void *)map);
  if (map->rank != rank)
    emu_fail("%s.%ud with a tensor map of rank %u", op, rank, map->rank);
  uint64_t elems = 1;
  for (uint32_t i = 0; i < rank; i++) elems *= map->box[i];
  uint32_t eb = map->elem_bytes, bytes = (uint32_t)(elems * eb);
  uint32_t off = (uint32_t)emu_smem_offset(dst, bytes, "cp.async.bulk.tensor destination");
  if (off % 128) emu_fail("%s: shared destination offset %u is not 128-byte aligned", op, off);
  EmuMbar *m = emu_mbar(bar, op);
  EmuBulk b;
  b.dst = off, b.bar = m->off, b.tid = emu_cur->tid, b.bytes = bytes;
  b.data.assign(bytes, 0);
  b.dst_of.resize(bytes / eb);
  const unsigned char *base = (const unsigned char *)(uintptr_t)map->base;
  uint32_t row = map->box[0];
  uint64_t nrows = elems / row;
  for (uint64_t r = 0; r < nrows; r++) {
    /* This row's coordinates in dimensions 1.. and its global row start. */
    bool inside = true;
    uint64_t rest = r, goff = 0;
    for (uint32_t i = 1; i < rank; i++) {
      int64_t x = (int64_t)c[i] + (int64_t)(rest % map->box[i]);
      rest /= map->box[i];
      if (x < 0 || (uint64_t)x >= map->dims[i]) inside = false;
      goff += (uint64_t)x * map->strides[i];
    }
    /* Elements [lo, hi) of the row are inside dimension 0. */
    int64_t x0 = c[0], lo = x0 < 0 ? -x0 : 0, hi = (int64_t)row;
    if (x0 + hi > (int64_t)map->dims[0]) hi = (int64_t)map->dims[0] - x0;
    if (inside && lo < hi) {
      const unsigned char *src = base + goff + (uint64_t)(x0 + lo) * eb;
      emu_check_global(src, (size_t)(hi - lo) * eb, "cp.async.bulk.tensor read");
      memcpy(&b.data[(r * row + (uint64_t)lo) * eb], src, (size_t)(hi - lo) * eb);
    }
  }
  /* Where each element lands: the dense box offset, swizzled. */
  for (uint64_t e = 0; e < elems; e++) {
    uint32_t a = emu_swizzle(off + (uint32_t)(e * eb), map->swizzle);
    if (a + eb > emu_L->smem_bytes)
      emu_fail("%s: swizzled destination offset %u beyond the launch's %llu bytes of shared memory",
               op, a, (unsigned long long)emu_L->smem_bytes);
    b.dst_of[e] = a;
    if (emu_w->wg_reads[a / 16])
      emu_fail("%s: writes shared offset %u, which an in-flight wgmma.mma_async still reads (not "
               "yet retired by wgmma.wait_group)", op, a);
    memset(emu_w->smem + a, 0xFF, eb); /* reading before it lands sees poison */
  }
  emu_w->bulk->push_back(b);
}

/* cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes
 * [dst], [map, {c0, ...}], [bar] */
EMU_API static void flex_tma_load_2d(void *dst, const FlexTensorMap *map, uint64_t *bar, int32_t c0,
                                     int32_t c1) {
  int32_t c[2] = {c0, c1};
  emu_tma_load(dst, map, bar, c, 2);
}
EMU_API static void flex_tma_load_3d(void *dst, const FlexTensorMap *map, uint64_t *bar, int32_t c0,
                                     int32_t c1, int32_t c2) {
  int32_t c[3] = {c0, c1, c2};
  emu_tma_load(dst, map, bar, c, 3);
}
EMU_API static void flex_tma_load_4d(void *dst, const FlexTensorMap *map, uint64_t *bar, int32_t c0,
                                     int32_t c1, int32_t c2, int32_t c3) {
  int32_t c[4] = {c0, c1, c2, c3};
  emu_tma_load(dst, map, bar, c, 4);
}

/* ---- cp.reduce.async.bulk (add, f32) -------------------------------------------- */

/* cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [gmem], [smem], bytes:
 * gmem[i] += smem[i] for bytes / 4 floats, each add atomic (blocks may run
 * on several OS threads). Done at issue; the source is remembered and must
 * not change until the cp.async.bulk.wait_group[.read] that retires it.
 * Both addresses 16-byte aligned, bytes a multiple of 16. */
EMU_API static void flex_bulk_reduce_add_f32(float *gmem, const float *smem, uint32_t bytes) {
  const char *op = "cp.reduce.async.bulk.add.f32";
  uint32_t off = (uint32_t)emu_smem_offset(smem, bytes, "cp.reduce.async.bulk source");
  if (off % 16 || (uintptr_t)gmem % 16 || bytes % 16 || bytes == 0)
    emu_fail("%s: addresses must be 16-byte aligned and the size a nonzero multiple of 16 "
             "(shared offset %u, global %p, %u bytes)", op, off, (void *)gmem, bytes);
  emu_check_global(gmem, bytes, "cp.reduce.async.bulk write");
  for (uint32_t i = 0; i < bytes / 4; i++) {
    uint32_t *u = (uint32_t *)(gmem + i);
    uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
    do {
      nw = emu_f2u(emu_u2f(old) + smem[i]);
    } while (!__atomic_compare_exchange_n(u, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  }
  EmuBulkRed r;
  r.src = off, r.group = emu_cur->bulk_committed;
  r.snap.assign((const unsigned char *)smem, (const unsigned char *)smem + bytes);
  emu_cur->bulk_red.push_back(r);
}
/* cp.async.bulk.commit_group */
EMU_API static void flex_bulk_commit(void) { emu_cur->bulk_committed++; }
/* cp.async.bulk.wait_group.read N: all but the newest N groups have read their sources. */
EMU_API static void emu_bulk_wait(uint64_t pending) {
  EmuFiber *f = emu_cur;
  size_t keep = 0;
  for (size_t i = 0; i < f->bulk_red.size(); i++) {
    EmuBulkRed &r = f->bulk_red[i];
    if (r.group + pending < f->bulk_committed) {
      if (memcmp(emu_w->smem + r.src, r.snap.data(), r.snap.size()))
        emu_fail("cp.reduce.async.bulk: its source at shared offset %u changed before the "
                 "cp.async.bulk.wait_group that retires it", r.src);
    } else {
      f->bulk_red[keep++] = r;
    }
  }
  f->bulk_red.resize(keep);
}
template <int N> static inline void flex_bulk_wait_read(void) { emu_bulk_wait((uint64_t)N); }
/* cp.async.bulk.wait_group N: the same here (the adds were done at issue). */
template <int N> static inline void flex_bulk_wait(void) { emu_bulk_wait((uint64_t)N); }

/* ---- wgmma ------------------------------------------------------------------------ */

/* A shared-memory matrix descriptor (the device encodes the same bits). */
static inline uint64_t flex_wgmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo, uint32_t swizzle) {
  uint64_t mode = swizzle == 128 ? 1 : swizzle == 64 ? 2 : swizzle == 32 ? 3 : 0;
  return (uint64_t)((smem_addr >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (mode << 62);
}

/* Descriptor d moved `bytes` further into shared memory (kernels/arch.cuh:
 * one add to the whole word, which must neither carry out of the 14-bit
 * start field nor move by a part of 16 bytes). */
static inline uint64_t flex_wgmma_desc_at(uint64_t d, uint32_t bytes) {
  if ((bytes & 15) || (d & 0x3FFF) + (bytes >> 4) > 0x3FFF)
    emu_fail("wgmma descriptor: start field 0x%x moved by %u bytes leaves it", (unsigned)(d & 0x3FFF), bytes);
  return d + (bytes >> 4);
}
/* The same by a 32-bit add to the low word (the same result wherever the
 * check above holds). */
static inline uint64_t flex_wgmma_desc_lo(uint64_t d, uint32_t bytes) {
  const uint64_t r = flex_wgmma_desc_at(d, bytes);
  return (d & 0xFFFFFFFF00000000ull) | (uint32_t)r;
}

/* What each thread passes to a wgmma.mma_async. */
struct EmuWgArgs {
  uint64_t da, db;      /* descriptors (da unused when A is in registers) */
  const uint32_t *a;    /* A registers, or NULL */
  int scale_d;          /* 0: D = A B, else D = A B + D */
};

/* The shared offset of element (mn, k) of a 16-bit matrix under descriptor
 * `desc`, major-ness `mn_major` (imm-trans); fails outside shared memory. */
EMU_NOSAN static bool emu_desc_at(int tid, uint64_t desc, int mn_major, int mn, int k, const char *which,
                                  uint32_t *at) {
  uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
  uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4, mode = (uint32_t)(desc >> 62);
  uint32_t w = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0, o;
  if (!mn_major) {
    o = w ? (uint32_t)(mn % 8) * w + (uint32_t)(mn / 8) * sbo + (uint32_t)k * 2
          : (uint32_t)(mn % 8) * 16 + (uint32_t)(mn / 8) * sbo + (uint32_t)(k % 8) * 2 + (uint32_t)(k / 8) * lbo;
  } else {
    o = w ? (uint32_t)(mn % (int)(w / 2)) * 2 + (uint32_t)(mn / (int)(w / 2)) * lbo + (uint32_t)(k % 8) * w +
                (uint32_t)(k / 8) * sbo
          : (uint32_t)(mn % 8) * 2 + (uint32_t)(mn / 8) * sbo + (uint32_t)(k % 8) * 16 + (uint32_t)(k / 8) * lbo;
  }
  uint32_t a = emu_swizzle(start + o, w);
  if ((uint64_t)a + 2 > emu_L->smem_bytes) {
    emu_fail_tid(tid, "wgmma: %s[%d][%d] at shared offset %u (descriptor 0x%016llx) is outside the "
                      "launch's %llu bytes of shared memory", which, mn, k, a,
                 (unsigned long long)desc, (unsigned long long)emu_L->smem_bytes);
    return false;
  }
  *at = a;
  return true;
}

/* Shared chunks an in-flight wgmma reads: counted up at issue, down when
 * the wait retires it; a bulk copy may not write them meanwhile. */
EMU_NOSAN static void emu_wg_reads(const std::vector<uint32_t> &chunks, int delta) {
  for (size_t i = 0; i < chunks.size(); i++) emu_w->wg_reads[chunks[i]] = (uint16_t)(emu_w->wg_reads[chunks[i]] + delta);
}

/* r->arg = N; r->width = trans_a | trans_b << 1 | bf16 << 2 | a_in_regs << 3. */
EMU_NOSAN static void emu_wgmma_fn(EmuReq **lanes, int n) {
  (void)n;
  const EmuWgArgs *g0 = (const EmuWgArgs *)lanes[0]->c;
  int N = lanes[0]->arg, ta = lanes[0]->width & 1, tb = (lanes[0]->width >> 1) & 1;
  int bf = (lanes[0]->width >> 2) & 1, rs = (lanes[0]->width >> 3) & 1;
  float (*cvt)(uint16_t) = bf ? flex_bf2f : flex_h2f;
  for (int l = 0; l < 128; l++) {
    const EmuWgArgs *g = (const EmuWgArgs *)lanes[l]->c;
    EmuFiber *f = &emu_w->fibers[lanes[l]->tid];
    if ((!rs && g->da != g0->da) || g->db != g0->db || (g->scale_d != 0) != (g0->scale_d != 0)) {
      emu_fail_tid(lanes[l]->tid, "%s: descriptors or scale-d differ across the warpgroup", lanes[0]->name);
      return;
    }
    if (!f->wg_fenced) {
      emu_fail_tid(lanes[l]->tid, "%s without a wgmma.fence since the warpgroup's last "
                                  "wgmma.wait_group (or start)", lanes[0]->name);
      return;
    }
  }
  for (uint64_t d : {g0->da, g0->db}) {
    if (((d >> 49) & 7) != 0) {
      emu_fail_tid(lanes[0]->tid, "%s: descriptor 0x%016llx has a nonzero base offset (not modelled)",
                   lanes[0]->name, (unsigned long long)d);
      return;
    }
  }
  static thread_local float A[64][16], B[16][256];
  static thread_local std::vector<uint8_t> seen;
  const uint16_t *sm = (const uint16_t *)emu_w->smem;
  uint32_t at;
  std::vector<uint32_t> chunks;
  seen.assign(emu_L->smem_bytes / 16 + 1, 0);
#define EMU_WG_READ(AT)                          \
  if (!seen[(AT) / 16]) {                        \
    seen[(AT) / 16] = 1;                         \
    chunks.push_back((AT) / 16);                 \
  }
  if (rs) {
    for (int l = 0; l < 128; l++) {
      const uint32_t *a = ((const EmuWgArgs *)lanes[l]->c)->a;
      int r0 = 16 * (l / 32) + (l % 32) / 4, c0 = 2 * (l % 4);
      for (int j = 0; j < 2; j++) {
        A[r0][c0 + j] = cvt((uint16_t)(a[0] >> (16 * j)));
        A[r0 + 8][c0 + j] = cvt((uint16_t)(a[1] >> (16 * j)));
        A[r0][c0 + 8 + j] = cvt((uint16_t)(a[2] >> (16 * j)));
        A[r0 + 8][c0 + 8 + j] = cvt((uint16_t)(a[3] >> (16 * j)));
      }
    }
  } else {
    for (int m = 0; m < 64; m++)
      for (int k = 0; k < 16; k++) {
        if (!emu_desc_at(lanes[0]->tid, g0->da, ta, m, k, "A", &at)) return;
        A[m][k] = cvt(sm[at / 2]);
        EMU_WG_READ(at)
      }
  }
  for (int k = 0; k < 16; k++)
    for (int c = 0; c < N; c++) {
      if (!emu_desc_at(lanes[0]->tid, g0->db, tb, c, k, "B", &at)) return;
      B[k][c] = cvt(sm[at / 2]);
      EMU_WG_READ(at)
    }
#undef EMU_WG_READ
  for (int l = 0; l < 128; l++) {
    EmuFiber *f = &emu_w->fibers[lanes[l]->tid];
    const EmuWgArgs *g = (const EmuWgArgs *)lanes[l]->c;
    float *d = (float *)lanes[l]->out;
    EmuWgmma e;
    e.d = d, e.n = N / 2, e.group = f->wg_committed, e.a = g->a;
    if (g->a) memcpy(e.asnap, g->a, sizeof e.asnap);
    /* The accumulator in: an earlier wgmma still in flight on the same
     * registers chains into this one (the ISA orders them); it is replaced. */
    const float *cin = d;
    size_t prev = f->wgmma.size();
    for (size_t i = 0; i < f->wgmma.size(); i++)
      if (f->wgmma[i].d == d) prev = i;
    if (prev < f->wgmma.size()) cin = f->wgmma[prev].vals;
    int w = l / 32, gr = (l % 32) / 4, t = l % 4;
    for (int i = 0; i < N / 2; i++) {
      int row = 16 * w + gr + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
      double acc = g->scale_d ? (double)cin[i] : 0.0;
      for (int k = 0; k < 16; k++) acc += (double)A[row][k] * (double)B[k][col];
      e.vals[i] = (float)acc;
    }
    if (prev < f->wgmma.size()) {
      emu_wg_reads(f->wgmma[prev].chunks, -1);
      f->wgmma.erase(f->wgmma.begin() + (long)prev);
    }
    if (l == 0) {
      e.chunks = chunks;
      emu_wg_reads(e.chunks, +1);
    }
    f->wgmma.push_back(e);
    memset(d, 0xFF, sizeof(float) * (size_t)(N / 2)); /* undefined until the wait: poison */
  }
}

EMU_API static void emu_wgmma(const char *name, int N, int flags, float *d, const EmuWgArgs *g,
                              const void *site) {
  EmuReq r = {};
  r.fn = emu_wgmma_fn, r.name = name, r.arg = N, r.width = flags, r.c = g, r.out = d, r.site = site;
  emu_group_op(&r);
}

/* wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}: D (64xN,
 * the fragment above) = A B (+ D if scale_d). _ss: A from a descriptor;
 * _rs: A from four registers. TA / TB: imm-trans-a / imm-trans-b. */
#define EMU_WGMMA_SS(NAME, BF)                                                                 \
  template <int N, int TA = 0, int TB = 0>                                                     \
  EMU_GROUP_OP void NAME(float *d, uint64_t da, uint64_t db, int scale_d, EMU_SITE_ARGS) {     \
    static_assert(N >= 8 && N <= 256 && N % 8 == 0, "wgmma: N a multiple of 8 in 8..256");     \
    EmuWgArgs g = {da, db, NULL, scale_d};                                                     \
    emu_wgmma("wgmma.mma_async (" #NAME ")", N, TA | TB << 1 | BF << 2, d, &g, EMU_SITE);     \
  }
#define EMU_WGMMA_RS(NAME, BF)                                                                 \
  template <int N, int TB = 0>                                                                 \
  EMU_GROUP_OP void NAME(float *d, const uint32_t a[4], uint64_t db, int scale_d,             \
                         EMU_SITE_ARGS) {                                                      \
    static_assert(N >= 8 && N <= 256 && N % 8 == 0, "wgmma: N a multiple of 8 in 8..256");     \
    EmuWgArgs g = {0, db, a, scale_d};                                                         \
    emu_wgmma("wgmma.mma_async (" #NAME ")", N, TB << 1 | BF << 2 | 8, d, &g, EMU_SITE);      \
  }
EMU_WGMMA_SS(flex_wgmma_ss_f16, 0)
EMU_WGMMA_SS(flex_wgmma_ss_bf16, 1)
EMU_WGMMA_RS(flex_wgmma_rs_f16, 0)
EMU_WGMMA_RS(flex_wgmma_rs_bf16, 1)

EMU_NOSAN static void emu_wg_fence_fn(EmuReq **lanes, int n) {
  for (int l = 0; l < n; l++) emu_w->fibers[lanes[l]->tid].wg_fenced = true;
}
EMU_NOSAN static void emu_wg_commit_fn(EmuReq **lanes, int n) {
  for (int l = 0; l < n; l++) emu_w->fibers[lanes[l]->tid].wg_committed++;
}
/* r->arg = N: land every result except those of the newest N committed
 * groups (and of uncommitted wgmmas). */
EMU_NOSAN static void emu_wg_wait_fn(EmuReq **lanes, int n) {
  uint64_t keep_n = (uint64_t)lanes[0]->arg;
  for (int l = 0; l < n; l++) {
    EmuFiber *f = &emu_w->fibers[lanes[l]->tid];
    size_t keep = 0;
    for (size_t i = 0; i < f->wgmma.size(); i++) {
      EmuWgmma &e = f->wgmma[i];
      if (e.group + keep_n < f->wg_committed) {
        if (e.a && memcmp(e.asnap, e.a, sizeof e.asnap)) {
          emu_fail_tid(f->tid, "wgmma.mma_async: its A registers changed before the "
                               "wgmma.wait_group that retires it");
          return;
        }
        memcpy(e.d, e.vals, sizeof(float) * (size_t)e.n);
        emu_wg_reads(e.chunks, -1);
      } else {
        f->wgmma[keep++] = e;
      }
    }
    f->wgmma.resize(keep);
    f->wg_fenced = false;
  }
}
EMU_API static void emu_wg_op(EmuWarpFn fn, const char *name, int arg, const void *site) {
  EmuReq r = {};
  r.fn = fn, r.name = name, r.arg = arg, r.site = site;
  r.late = fn == emu_wg_wait_fn; /* results arrive as late as they may */
  emu_group_op(&r);
}
/* wgmma.fence.sync.aligned */
EMU_GROUP_OP void flex_wgmma_fence(EMU_SITE_ARGS) {
  emu_wg_op(emu_wg_fence_fn, "wgmma.fence", 0, EMU_SITE);
}
/* wgmma.commit_group.sync.aligned */
EMU_GROUP_OP void flex_wgmma_commit(EMU_SITE_ARGS) {
  emu_wg_op(emu_wg_commit_fn, "wgmma.commit_group", 0, EMU_SITE);
}
/* wgmma.wait_group.sync.aligned N */
template <int N> EMU_GROUP_OP void flex_wgmma_wait(EMU_SITE_ARGS) {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group N in 0..7");
  emu_wg_op(emu_wg_wait_fn, "wgmma.wait_group", N, EMU_SITE);
}

#endif
