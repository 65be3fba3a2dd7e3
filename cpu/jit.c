/* jit.c: cpu_jit_get(): lower a module's functions (ir_llvm.c), optimise
 * them for the host with LLVM's O3 pipeline (the loop vectoriser sees the
 * host's AVX-512 / AVX2 through the target machine), compile them to an
 * object, link that into one ORC LLJIT for the process, and look up the
 * entry points. The object code goes through the module store
 * (base/store.h, kind BASE_STORE_CPU_OBJECT: memory, and disk unless
 * FLEXC_CACHE_DIR is off), keyed by the printed IR and the options, the
 * lowering's version, the LLVM version and the host CPU and features, so a
 * new process skips LLVM's optimiser and code generator. What only this
 * process can hold, the linked entry points, is in a table keyed by the
 * same store key.
 *
 * The JIT and its host target machine are created once, on first use.
 * Compiled code is never freed (like the CUDA backend's loaded modules, it
 * lives as long as the process). One mutex serialises compiles and table
 * lookups; the functions themselves are called from any thread.
 */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm/Config/llvm-config.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"
#include "base/store.h"
#include "kernels/exact.cuh"
#include "runtime/rt.h"

/* One linked module. */
typedef struct Entry {
  uint8_t key[BASE_STORE_KEY_BYTES]; /* its object code's store key */
  CpuModule mod;                     /* the entry points */
  struct Entry *next;                /* the next entry */
} Entry;

/* The process's JIT. */
static struct {
  pthread_mutex_t lock;     /* guards everything below */
  bool tried;               /* creation attempted */
  char why[256];            /* why creation failed (empty: it worked) */
  LLVMOrcLLJITRef jit;      /* the JIT */
  LLVMTargetMachineRef tm;  /* the host target machine for the optimiser */
  char *cpu, *features;     /* host CPU name and features */
  bool mvec;                /* glibc's libmvec loaded (vector powf) */
  Entry *linked;            /* modules linked into the JIT */
  int count;                /* how many */
  /* What a compile has made and not yet handed on: disposed of if an
   * exhausted allocation leaves the compile (cpu_jit_get's handler). */
  LLVMContextRef pend_ctx;
  LLVMModuleRef pend_mod;
  LLVMMemoryBufferRef pend_obj;
} J = {.lock = PTHREAD_MUTEX_INITIALIZER};

void cpu_bounds_fail(int32_t *bounds, int32_t site, int32_t n, int32_t i0, int32_t i1, int32_t i2,
                     int32_t i3, int32_t i4, int32_t i5, int32_t i6, int32_t i7) {
  if (!bounds) return;
  _Atomic int32_t *first = (_Atomic int32_t *)bounds;
  int32_t zero = 0;
  if (!atomic_compare_exchange_strong(first, &zero, 1)) return;
  const int32_t v[8] = {i0, i1, i2, i3, i4, i5, i6, i7};
  bounds[1] = site;
  bounds[2] = n;
  for (int d = 0; d < 8; d++) bounds[3 + d] = v[d];
}

void cpu_exact_add(int64_t *acc, int64_t i, float v) {
  int64_t *w = acc + i * FLEX_EXACT_WORDS, lo, hi;
  uint32_t flag;
  int l = flex_exact_split(v, &lo, &hi, &flag);
  if (l >= 0) w[l] += lo, w[l + 1] += hi;
  else w[FLEX_EXACT_LIMBS] |= (int64_t)flag;
}

/* Take an LLVM error's message into J.why / err and dispose of it. */
static void take_error(LLVMErrorRef e, char *dst, size_t cap) {
  char *msg = LLVMGetErrorMessage(e);
  snprintf(dst, cap, "%s", msg);
  LLVMDisposeErrorMessage(msg);
}

/* Create the JIT (under the lock). */
static void jit_create(void) {
  J.tried = true;
  if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()) {
    snprintf(J.why, sizeof J.why, "LLVM has no native target for this host");
    return;
  }
  LLVMOrcJITTargetMachineBuilderRef jtmb;
  LLVMErrorRef e = LLVMOrcJITTargetMachineBuilderDetectHost(&jtmb);
  if (e) { take_error(e, J.why, sizeof J.why); return; }
  LLVMOrcLLJITBuilderRef b = LLVMOrcCreateLLJITBuilder();
  LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(b, jtmb);
  if ((e = LLVMOrcCreateLLJIT(&J.jit, b))) { take_error(e, J.why, sizeof J.why); return; }
  /* libm (sinf, cosf, powf, fmodf) from the process; our helper by address. */
  LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(J.jit);
  LLVMOrcDefinitionGeneratorRef gen;
  e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(J.jit),
                                                           NULL, NULL);
  if (e) { take_error(e, J.why, sizeof J.why); return; }
  LLVMOrcJITDylibAddGenerator(jd, gen);
#if defined(__x86_64__) && defined(__GLIBC__)
  /* glibc's vector math (libmvec): powf on 4, 8 and 16 lanes for the loop
   * vectoriser (ir_llvm.c vector_call); loaded globally so that the
   * process search above finds its symbols. Without it pow stays a scalar
   * call. */
  J.mvec = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL) != NULL;
#endif
  /* ours: the helpers, and the vector math of kern.h (ir_llvm.c
   * vector_call names cpu_<f>_v<lanes> and cpu_<f>f_<lanes>) */
  struct { char name[32]; uintptr_t addr; } ours[2 + 2 * CPU_VM_COUNT * 3];
  int nours = 0;
  ours[nours++] = (__typeof__(ours[0])){"cpu_bounds_fail", (uintptr_t)&cpu_bounds_fail};
  ours[nours++] = (__typeof__(ours[0])){"cpu_exact_add", (uintptr_t)&cpu_exact_add};
#if defined(__x86_64__)
  const CpuVmath *vm[3] = {&cpu_vmath_4, &cpu_vmath_8, &cpu_vmath_16};
#else
  const CpuVmath *vm[1] = {&cpu_vmath_4};
#endif
  for (size_t i = 0; i < sizeof vm / sizeof *vm; i++)
    for (int f = 0; f < CPU_VM_COUNT; f++) {
      snprintf(ours[nours].name, sizeof ours[nours].name, "cpu_%s_v%d", cpu_vm_names[f], vm[i]->lanes);
      ours[nours++].addr = (uintptr_t)vm[i]->vec[f];
      snprintf(ours[nours].name, sizeof ours[nours].name, "cpu_%sf_%d", cpu_vm_names[f], vm[i]->lanes);
      ours[nours++].addr = (uintptr_t)vm[i]->scalar[f];
    }
  LLVMJITCSymbolMapPair sym[sizeof ours / sizeof *ours];
  for (int i = 0; i < nours; i++)
    sym[i] = (LLVMJITCSymbolMapPair){LLVMOrcLLJITMangleAndIntern(J.jit, ours[i].name),
                                     {(LLVMOrcExecutorAddress)ours[i].addr,
                                      {LLVMJITSymbolGenericFlagsExported, 0}}};
  if ((e = LLVMOrcJITDylibDefine(jd, LLVMOrcAbsoluteSymbols(sym, (size_t)nours))))
    { take_error(e, J.why, sizeof J.why); return; }
  char *triple = LLVMGetDefaultTargetTriple(), *msg = NULL;
  LLVMTargetRef t;
  if (LLVMGetTargetFromTriple(triple, &t, &msg)) {
    snprintf(J.why, sizeof J.why, "%s", msg ? msg : "no LLVM target for the host triple");
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    return;
  }
  J.cpu = LLVMGetHostCPUName();
  J.features = LLVMGetHostCPUFeatures();
  /* Position-independent objects: the JIT's linker may place them anywhere. */
  J.tm = LLVMCreateTargetMachine(t, triple, J.cpu, J.features, LLVMCodeGenLevelAggressive,
                                 LLVMRelocPIC, LLVMCodeModelSmall);
  LLVMDisposeMessage(triple);
}

const char *const cpu_vm_names[CPU_VM_COUNT] = {"tanh", "sin", "cos", "erf"};

int cpu_jit_lanes(void) {
#if defined(__x86_64__)
  if (J.features && strstr(J.features, "+avx512f")) return 16;
  if (J.features && strstr(J.features, "+avx2") && strstr(J.features, "+fma")) return 8;
#endif
  return 4;
}

bool cpu_jit_mvec(void) { return J.mvec; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Host attributes on every defined function, so the optimiser's cost model
 * and the code generator agree on the vector widths. */
static void set_host_attrs(LLVMModuleRef mod) {
  LLVMContextRef ctx = LLVMGetModuleContext(mod);
  bool avx512 = strstr(J.features, "+avx512f") != NULL;
  for (LLVMValueRef f = LLVMGetFirstFunction(mod); f; f = LLVMGetNextFunction(f)) {
    if (LLVMIsDeclaration(f)) continue;
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(ctx, "target-cpu", 10, J.cpu, (unsigned)strlen(J.cpu)));
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(ctx, "target-features", 15, J.features,
                                                      (unsigned)strlen(J.features)));
    if (avx512)
      LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                              LLVMCreateStringAttribute(ctx, "prefer-vector-width", 19, "512", 3));
  }
}

/* The object code of m's functions for this host, named with `prefix`:
 * lowered, optimised and compiled to an ELF object in *obj (under the lock). */
static flex_status emit_object(const IrModule *m, const CpuJitOpts *o, const char *prefix,
                               LLVMMemoryBufferRef *obj) {
  char err[512] = "";
  LLVMContextRef ctx = J.pend_ctx = LLVMContextCreate();
  LLVMModuleRef mod = J.pend_mod = LLVMModuleCreateWithNameInContext(prefix, ctx);
  char *triple = LLVMGetTargetMachineTriple(J.tm);
  LLVMSetTarget(mod, triple);
  LLVMDisposeMessage(triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(J.tm);
  LLVMSetModuleDataLayout(mod, td);
  LLVMDisposeTargetData(td);
  flex_status st = FLEX_OK;
  char *msg = NULL;
  if (!cpu_lower(mod, m, o, prefix, err, sizeof err)) {
    st = rt_err(FLEX_ERR_UNSUPPORTED, "cpu backend: %s", err);
  } else if (LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg)) {
    st = rt_err(FLEX_ERR_COMPILE, "cpu backend: generated LLVM IR does not verify: %s", msg ? msg : "");
  } else {
    set_host_attrs(mod);
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
    LLVMErrorRef e = LLVMRunPasses(mod, "default<O3>", J.tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
      take_error(e, err, sizeof err);
      st = rt_err(FLEX_ERR_COMPILE, "cpu backend: LLVM optimisation failed: %s", err);
    } else {
      if (base_config()->cpu_dump_ir) LLVMDumpModule(mod);
      char *cmsg = NULL;
      if (LLVMTargetMachineEmitToMemoryBuffer(J.tm, mod, LLVMObjectFile, &cmsg, obj))
        st = rt_err(FLEX_ERR_COMPILE, "cpu backend: LLVM code generation failed: %s", cmsg ? cmsg : "");
      LLVMDisposeMessage(cmsg);
    }
  }
  LLVMDisposeMessage(msg);
  LLVMDisposeModule(mod);
  LLVMContextDispose(ctx);
  J.pend_mod = NULL, J.pend_ctx = NULL;
  return st;
}

/* The version of the code cpu_lower emits: part of the store key (the
 * printed IR it is keyed by is flexc's IR, which does not change with the
 * lowering). The build defines it as the hash of ir_llvm.c and this file
 * (CMakeLists.txt), so that no change to either can be served an object
 * an older build wrote; the number is for builds without it. */
#ifdef FLEXC_CPU_SOURCE_HASH
#define CPU_LOWERING_VERSION "flexc cpu object 6 " FLEXC_CPU_SOURCE_HASH
#else
#define CPU_LOWERING_VERSION "flexc cpu object 6"
#endif

/* The printed module and the options: what the store key adds to the host's
 * fields. */
static void module_text(Buf *text, const IrModule *m, const CpuJitOpts *o) {
  buf_printf(text, "joint=%d identity=%d checked=%d exact=%d sink_grad=%d\n", o->joint,
             o->identity, o->check_bounds, o->exact, o->sink_grad);
  ir_print(text, m);
}

/* The store key of an object with module_text `text` (under the lock: the
 * host's fields are set). */
static void store_key(uint8_t out[BASE_STORE_KEY_BYTES], const Buf *text) {
  BaseSha256 h;
  base_store_key_init(&h, BASE_STORE_CPU_OBJECT);
  /* libmvec or not: an object may name its variants */
  const char *parts[5] = {CPU_LOWERING_VERSION, LLVM_VERSION_STRING, J.cpu, J.features,
                          J.mvec ? "libmvec" : "no libmvec"};
  for (int i = 0; i < 5; i++) base_store_key_str(&h, parts[i]);
  /* The object code reads FlexParams at fixed offsets: a new layout must
   * never be served an old object. */
  const uint64_t layout[6] = {sizeof(FlexParams), offsetof(FlexParams, sizes),
                              offsetof(FlexParams, pf), offsetof(FlexParams, pi),
                              offsetof(FlexParams, buf), offsetof(FlexParams, buf_grad)};
  base_store_key_add(&h, layout, sizeof layout);
  base_store_key_add(&h, text->data, text->len);
  base_store_key_final(&h, out);
}

/* The module's object code from the store (payload: prefix, NUL, object),
 * else compiled and stored; added to the JIT, entry points looked up (under
 * the lock). */
static flex_status compile(const IrModule *m, const CpuJitOpts *o, const uint8_t *dk,
                           CpuModule *out) {
  double t0 = now_s();
  char prefix[64], err[512] = "";
  void *bytes = NULL;
  size_t len = 0;
  LLVMMemoryBufferRef obj = NULL;
  flex_status st = FLEX_OK;
  size_t plen = 0;
  if (base_store_get(BASE_STORE_CPU_OBJECT, dk, &bytes, &len) &&
      (plen = strnlen(bytes, len)) < len && plen < sizeof prefix) {
    memcpy(prefix, bytes, plen + 1);
    obj = LLVMCreateMemoryBufferWithMemoryRangeCopy((const char *)bytes + plen + 1, len - plen - 1,
                                                    prefix); /* nothing allocates until it is added */
    out->from_disk = true;
  } else {
    /* The hash keeps names apart across processes sharing the store's
     * disk, the counter within one. */
    snprintf(prefix, sizeof prefix, "flex_%02x%02x%02x%02x%02x%02x_%d", dk[0], dk[1], dk[2], dk[3],
             dk[4], dk[5], J.count);
    st = emit_object(m, o, prefix, &obj);
    if (!st) {
      J.pend_obj = obj;
      size_t n = LLVMGetBufferSize(obj), pl = strlen(prefix) + 1;
      char *payload = base_alloc(pl + n);
      memcpy(payload, prefix, pl);
      memcpy(payload + pl, LLVMGetBufferStart(obj), n);
      base_store_put(BASE_STORE_CPU_OBJECT, dk, payload, pl + n);
      base_free(payload);
    }
  }
  base_free(bytes);
  if (st) return st;
  J.count++;
  J.pend_obj = NULL; /* the JIT's from here, added or not */
  LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(J.jit, LLVMOrcLLJITGetMainJITDylib(J.jit), obj);
  if (e) {
    take_error(e, err, sizeof err);
    return rt_err(FLEX_ERR_COMPILE, "cpu backend: JIT rejected the object code: %s", err);
  }
  const char *names[6] = {"score", "score_mask", "mask", "joint", "sink", "sink_grad"};
  void *fns[6] = {0};
  bool want[6] = {!o->identity, m->mask != NULL, m->mask != NULL, o->joint && m->joint,
                  m->sink != NULL, o->sink_grad && m->sink_grad};
  for (int i = 0; i < 6; i++) {
    if (!want[i]) continue;
    char name[128];
    snprintf(name, sizeof name, "%s_%s", prefix, names[i]);
    LLVMOrcExecutorAddress addr = 0;
    if ((e = LLVMOrcLLJITLookup(J.jit, &addr, name))) {
      take_error(e, err, sizeof err);
      return rt_err(FLEX_ERR_COMPILE, "cpu backend: JIT lookup of %s failed: %s", name, err);
    }
    fns[i] = (void *)(uintptr_t)addr;
  }
  /* Object pointers to function pointers: the JIT hands out addresses. */
  memcpy(&out->score, &fns[0], sizeof fns[0]);
  memcpy(&out->score_mask, &fns[1], sizeof fns[1]);
  memcpy(&out->mask, &fns[2], sizeof fns[2]);
  memcpy(&out->joint, &fns[3], sizeof fns[3]);
  memcpy(&out->sink, &fns[4], sizeof fns[4]);
  memcpy(&out->sink_grad, &fns[5], sizeof fns[5]);
  out->compile_s = now_s() - t0;
  return FLEX_OK;
}

/* An exhausted allocation under the lock: what the compile had made is
 * disposed of, the lock released, and the exhaustion passed on (the table
 * is as before: an entry is linked only once its module is complete). */
static _Noreturn void compile_exhausted(const BaseTry *t) {
  if (J.pend_obj) LLVMDisposeMemoryBuffer(J.pend_obj);
  if (J.pend_mod) LLVMDisposeModule(J.pend_mod);
  if (J.pend_ctx) LLVMContextDispose(J.pend_ctx);
  J.pend_obj = NULL, J.pend_mod = NULL, J.pend_ctx = NULL;
  pthread_mutex_unlock(&J.lock);
  base_try_rethrow(t);
}

flex_status cpu_jit_get(const IrModule *m, const CpuJitOpts *o, const CpuModule **out) {
  Buf text = {0};
  module_text(&text, m, o);
  BaseTry t;
  base_try_push(&t);
  pthread_mutex_lock(&J.lock);
  if (setjmp(t.jb)) compile_exhausted(&t);
  if (!J.tried) jit_create();
  flex_status st = FLEX_OK;
  if (J.why[0]) {
    st = rt_err(FLEX_ERR_UNSUPPORTED, "cpu backend: cannot start the LLVM JIT: %s", J.why);
  } else {
    uint8_t key[BASE_STORE_KEY_BYTES];
    store_key(key, &text);
    Entry *e = J.linked;
    while (e && memcmp(e->key, key, sizeof key) != 0) e = e->next;
    if (!e) {
      Entry *n = base_alloc(sizeof *n);
      memcpy(n->key, key, sizeof key);
      st = compile(m, o, key, &n->mod);
      if (st) {
        base_free(n);
      } else {
        base_keep(n); /* the table's from now on */
        n->next = J.linked;
        J.linked = e = n;
      }
    }
    if (e) *out = &e->mod;
  }
  base_try_pop(&t);
  pthread_mutex_unlock(&J.lock);
  buf_free(&text);
  return st;
}

flex_status cpu_jit_ready(void) {
  pthread_mutex_lock(&J.lock); /* jit_create allocates nothing of ours: no jump while held */
  if (!J.tried) jit_create();
  flex_status st = J.why[0] ? rt_err(FLEX_ERR_UNSUPPORTED, "cpu backend: cannot start the LLVM JIT: %s", J.why)
                            : FLEX_OK;
  pthread_mutex_unlock(&J.lock);
  return st;
}

void cpu_jit_forget(void) {
  pthread_mutex_lock(&J.lock);
  for (Entry *e = J.linked, *next; e; e = next) next = e->next, base_free(e);
  J.linked = NULL;
  pthread_mutex_unlock(&J.lock);
}

int cpu_jit_cache_size(void) {
  pthread_mutex_lock(&J.lock); /* nothing here allocates */
  int n = 0;
  for (Entry *e = J.linked; e; e = e->next) n++;
  pthread_mutex_unlock(&J.lock);
  return n;
}
