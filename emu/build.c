/* emu_build.c: turn CUDA source into a loaded emulator module and launch
 * its kernels.
 *
 * The source is compiled by the host C++ compiler ($FLEXC_EMU_CXX, else
 * c++) as C++17 with -DFLEXC_EMU and the shim force-included; every
 * embedded header (kernel templates and the shim) is written into a fresh
 * temporary include directory first. Race-check modules are compiled with
 * -fsanitize=thread but linked without its runtime: the shim's own
 * __tsan_* hooks receive every load and store. Modules are cached in memory
 * for the life of the process, keyed by the exact source and options. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/embedded.h"
#include "emu/emu_host.h"

struct EmuModule {
  EmuModule *next;     /* cache list */
  char *source;        /* exact source text (the key) */
  bool racecheck;      /* build option (the key) */
  void *handle;        /* dlopen handle */
  EmuLaunchFn launch;  /* the module's emu_launch */
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static EmuModule *cache;

/* Write `len` bytes of `text` to dir/name. Returns 0 or an errno value. */
static int write_file(const char *dir, const char *name, const char *text, size_t len) {
  Buf path = {0};
  buf_printf(&path, "%s/%s", dir, name);
  FILE *f = fopen(path.data, "wb");
  buf_free(&path);
  if (!f) return errno;
  size_t n = fwrite(text, 1, len, f);
  int rc = fclose(f);
  return n == len && rc == 0 ? 0 : EIO;
}

/* Remove the build directory and everything we put in it. */
static void remove_dir(const char *dir) {
  static const char *extra[] = {"kernel.cu", "kernel.o", "kernel.so", "build.log"};
  Buf p = {0};
  for (const EmbeddedFile *e = rt_embedded; e->name; e++) {
    p.len = 0;
    buf_printf(&p, "%s/%s", dir, e->name);
    unlink(p.data);
  }
  for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
    p.len = 0;
    buf_printf(&p, "%s/%s", dir, extra[i]);
    unlink(p.data);
  }
  buf_free(&p);
  rmdir(dir);
}

/* Append the file dir/name to *log. */
static void append_file(Buf *log, const char *dir, const char *name) {
  if (!log) return;
  Buf p = {0};
  buf_printf(&p, "%s/%s", dir, name);
  char *text = NULL;
  size_t len = 0;
  if (base_read_file(p.data, &text, &len) == 0) {
    buf_put(log, text, len);
    base_free(text);
  }
  buf_free(&p);
}

/* The host C++ compiler: $FLEXC_EMU_CXX, else c++. */
static const char *compiler(void) {
  static _Thread_local char cxx[1024];
  snprintf(cxx, sizeof cxx, "%s", *base_config()->emu_cxx ? base_config()->emu_cxx : "c++");
  return cxx;
}

bool emu_compiler_available(void) {
  const char *cxx = compiler();
  if (strchr(cxx, ' ')) return true; /* a command line: let the shell decide */
  if (strchr(cxx, '/')) return access(cxx, X_OK) == 0;
  const char *path = getenv("PATH");
  Buf p = {0};
  bool found = false;
  while (path && *path && !found) {
    size_t n = strcspn(path, ":");
    p.len = 0;
    buf_printf(&p, "%.*s/%s", (int)n, path, cxx);
    found = access(p.data, X_OK) == 0;
    path += n + (path[n] == ':');
  }
  buf_free(&p);
  return found;
}

/* Compile and link dir/kernel.cu into dir/kernel.so. Returns the shell status. */
static int run_compiler(const char *dir, bool racecheck) {
  const char *cxx = compiler();
  Buf cmd = {0};
  buf_printf(&cmd,
             "%s -std=c++17 -O1 -fwrapv -fno-strict-aliasing -fPIC -pthread -w -DFLEXC_EMU "
             "-include emu_cuda.h -I'%s' %s -x c++ -c '%s/kernel.cu' -o '%s/kernel.o' "
             ">'%s/build.log' 2>&1 && %s -shared -pthread '%s/kernel.o' -o '%s/kernel.so' "
             ">>'%s/build.log' 2>&1",
             cxx, dir, racecheck ? "-fsanitize=thread" : "", dir, dir, dir, cxx, dir, dir, dir);
  int rc = system(cmd.data);
  buf_free(&cmd);
  return rc;
}

/* Build a new module (no cache). */
static flex_status build_module(EmuModule **out, const char *source, bool racecheck, Buf *log) {
  const char *tmp = getenv("TMPDIR");
  Buf dir = {0};
  buf_printf(&dir, "%s/flexc-emu-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir.data)) {
    if (log) buf_printf(log, "cannot create a build directory %s: %s\n", dir.data, strerror(errno));
    buf_free(&dir);
    return FLEX_ERR_COMPILE;
  }
  flex_status st = FLEX_ERR_COMPILE;
  int err = 0;
  for (const EmbeddedFile *e = rt_embedded; e->name && !err; e++)
    err = write_file(dir.data, e->name, e->text, strlen(e->text));
  if (!err) err = write_file(dir.data, "kernel.cu", source, strlen(source));
  if (err) {
    if (log) buf_printf(log, "cannot write into %s: %s\n", dir.data, strerror(err));
  } else if (!emu_compiler_available()) {
    if (log) buf_printf(log, "the emulator needs a host C++ compiler at run time and found none: "
                             "'%s' is not on PATH (install g++, or set FLEXC_EMU_CXX)\n", compiler());
  } else if (run_compiler(dir.data, racecheck) != 0) {
    if (log) buf_printf(log, "host C++ compiler failed on the emulated kernel source:\n");
    append_file(log, dir.data, "build.log");
  } else {
    Buf so = {0};
    buf_printf(&so, "%s/kernel.so", dir.data);
    void *h = dlopen(so.data, RTLD_NOW | RTLD_LOCAL);
    buf_free(&so);
    void *fn = h ? dlsym(h, "emu_launch") : NULL;
    if (!fn) {
      if (log) buf_printf(log, "cannot load the emulator module: %s\n", dlerror());
      if (h) dlclose(h);
    } else {
      EmuModule *m = base_alloc(sizeof *m);
      m->source = base_strdup(source);
      m->racecheck = racecheck;
      m->handle = h;
      memcpy(&m->launch, &fn, sizeof fn); /* object pointer to function pointer (POSIX) */
      *out = m;
      st = FLEX_OK;
    }
  }
  remove_dir(dir.data);
  buf_free(&dir);
  return st;
}

flex_status emu_module_get(EmuModule **out, const char *source, const EmuBuildOpts *opts, Buf *log) {
  bool race = opts && opts->racecheck;
  BaseTry *held = base_try_hold(); /* no jump may leave the lock held */
  pthread_mutex_lock(&cache_mu);
  EmuModule *m = cache;
  while (m && (m->racecheck != race || strcmp(m->source, source) != 0)) m = m->next;
  flex_status st = FLEX_OK;
  if (!m) {
    st = build_module(&m, source, race, log);
    if (st == FLEX_OK) {
      m->next = cache;
      cache = m;
    }
  }
  pthread_mutex_unlock(&cache_mu);
  base_try_restore(held);
  *out = st == FLEX_OK ? m : NULL;
  return st;
}

/* Block runners per launch, on the thread pool: $FLEXC_THREADS, else up to 2. */
static int emu_threads(void) {
  long n = base_config()->threads;
  if (n >= 1) return n > 64 ? 64 : (int)n;
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c >= 2 ? 2 : 1;
}

flex_status emu_module_launch(EmuModule *m, EmuLaunch *L, Buf *log) {
  Buf sym = {0};
  buf_printf(&sym, "%s_emu", L->kernel);
  void *fn = dlsym(m->handle, sym.data);
  buf_free(&sym);
  if (!fn) {
    snprintf(L->error, EMU_ERR_LEN, "%s: no such kernel entry in the emulator module", L->kernel);
    if (log) buf_puts(log, L->error);
    return FLEX_ERR_INVALID;
  }
  memcpy(&L->entry, &fn, sizeof fn);
  L->abi = EMU_ABI_VERSION;
  L->racecheck = m->racecheck;
  if (L->threads <= 0) L->threads = emu_threads();
  L->pool_run = base_pool_run;
  if (!L->shuffle) { /* $FLEXC_EMU_SHUFFLE: blocks in a seeded order (docs/emulator.md) */
    const char *s = base_config()->emu_shuffle;
    L->shuffle = *s ? strtoull(s, NULL, 10) : 0;
  }
  if (L->stack_bytes == 0) L->stack_bytes = 256 * 1024;
  if (m->launch(L) != 0) {
    if (!L->error[0]) snprintf(L->error, EMU_ERR_LEN, "%s: launch failed", L->kernel);
    if (log) buf_puts(log, L->error);
    return FLEX_ERR_RUNTIME;
  }
  return FLEX_OK;
}
