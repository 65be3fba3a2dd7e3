/* build.c: turn CUDA source into a loaded emulator module and launch its
 * kernels.
 *
 * The source is compiled by the host C++ compiler ($FLEXC_EMU_CXX, else
 * c++) as C++17 with -DFLEXC_EMU and the shim force-included; every
 * embedded header (kernel templates and the shim) is written into a fresh
 * temporary include directory first. Race-check modules are compiled with
 * -fsanitize=thread but linked without its runtime: the shim's own
 * __tsan_* hooks receive every load and store.
 *
 * The shared object goes into the module store (base/store.h, kind
 * BASE_STORE_EMU_MODULE: memory, and disk unless FLEXC_CACHE_DIR is off),
 * keyed by the exact source, the embedded headers' digest, the compile
 * flags, the race-check option and the compiler's name and --version text;
 * a later process (every test suite's forked tests) finds it there, writes
 * it to a private temporary file and dlopens that instead of running the
 * compiler. The loaded modules, which only this process can hold, are in a
 * table keyed by the same store key, for the life of the process.
 *
 * Memory exhaustion under loaded_mu: emu_module_get's own recovery point
 * removes the temporary directory a build has open (pend_dir), releases
 * the lock and passes the exhaustion on. Nothing else untracked is open
 * while anything allocates: a module's block is allocated before its
 * library is opened, and the compiler's --version text is read into a
 * fixed buffer before it is kept. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/store.h"
#include "emu/emu_host.h"
#include "runtime/embedded.h"

/* The compile and link flags (part of the key). */
#define CXXFLAGS "-std=c++17 -O1 -fwrapv -fno-strict-aliasing -fPIC -pthread -w -DFLEXC_EMU"
#define RACEFLAGS "-fsanitize=thread"
#define LDFLAGS "-shared -pthread"

struct EmuModule {
  EmuModule *next;                   /* the loaded table */
  uint8_t key[BASE_STORE_KEY_BYTES]; /* the shared object's store key */
  bool racecheck;                    /* built for race checks */
  void *handle;                      /* dlopen handle */
  EmuLaunchFn launch;                /* the module's emu_launch */
};

static pthread_mutex_t loaded_mu = PTHREAD_MUTEX_INITIALIZER; /* guards all below */
static EmuModule *loaded;
static char *cxx_named;  /* the compiler whose --version text is in cxx_id */
static Buf cxx_id;       /* that text */
static char pend_dir[PATH_MAX]; /* the temporary directory a build has open ("": none) */

/* dir/name into path (false if it does not fit). Allocates nothing. */
static bool join(char path[PATH_MAX], const char *dir, const char *name) {
  int n = snprintf(path, PATH_MAX, "%s/%s", dir, name);
  return n > 0 && n < PATH_MAX;
}

/* Write `len` bytes of `text` to dir/name. Returns 0 or an errno value. */
static int write_file(const char *dir, const char *name, const char *text, size_t len) {
  char path[PATH_MAX];
  if (!join(path, dir, name)) return ENAMETOOLONG;
  FILE *f = fopen(path, "wb");
  if (!f) return errno;
  size_t n = fwrite(text, 1, len, f);
  int rc = fclose(f);
  return n == len && rc == 0 ? 0 : EIO;
}

/* Remove the build directory and everything we put in it. Allocates
 * nothing (it runs in emu_module_get's exhaustion handler too). */
static void remove_dir(const char *dir) {
  static const char *extra[] = {"kernel.cu", "kernel.o", "kernel.so", "build.log", "module.so"};
  char p[PATH_MAX];
  for (const EmbeddedFile *e = rt_embedded; e->name; e++)
    if (join(p, dir, e->name)) unlink(p);
  for (size_t i = 0; i < sizeof extra / sizeof *extra; i++)
    if (join(p, dir, extra[i])) unlink(p);
  rmdir(dir);
}

/* Append the file dir/name to *log. */
static void append_file(Buf *log, const char *dir, const char *name) {
  char p[PATH_MAX], *text = NULL;
  size_t len = 0;
  if (log && join(p, dir, name) && base_read_file(p, &text, &len) == 0) {
    buf_put(log, text, len);
    base_free(text);
  }
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
  char dir[PATH_MAX], p[PATH_MAX];
  bool found = false;
  while (path && *path && !found) {
    size_t n = strcspn(path, ":");
    snprintf(dir, sizeof dir, "%.*s", (int)n, path);
    found = n < sizeof dir && join(p, dir, cxx) && access(p, X_OK) == 0;
    path += n + (path[n] == ':');
  }
  return found;
}

/* Compile and link dir/kernel.cu into dir/kernel.so. Returns the shell status. */
static int run_compiler(const char *dir, bool racecheck) {
  const char *cxx = compiler();
  Buf cmd = {0};
  buf_printf(&cmd,
             "%s " CXXFLAGS " -include emu_cuda.h -I'%s' %s -x c++ -c '%s/kernel.cu' -o "
             "'%s/kernel.o' >'%s/build.log' 2>&1 && %s " LDFLAGS " '%s/kernel.o' -o "
             "'%s/kernel.so' >>'%s/build.log' 2>&1",
             cxx, dir, racecheck ? RACEFLAGS : "", dir, dir, dir, cxx, dir, dir, dir);
  int rc = system(cmd.data);
  buf_free(&cmd);
  return rc;
}

/* A fresh private directory under $TMPDIR (else /tmp) into *dir; false with
 * the reason in *log. */
static bool make_temp_dir(Buf *dir, Buf *log) {
  const char *tmp = getenv("TMPDIR");
  buf_printf(dir, "%s/flexc-emu-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (dir->len < sizeof pend_dir && mkdtemp(dir->data)) {
    memcpy(pend_dir, dir->data, dir->len + 1);
    return true;
  }
  if (log) buf_printf(log, "cannot create a build directory %s: %s\n", dir->data, strerror(errno));
  return false;
}

/* Remove the directory make_temp_dir made. */
static void close_temp_dir(Buf *dir) {
  remove_dir(dir->data);
  pend_dir[0] = '\0';
  buf_free(dir);
}

/* dlopen dir/name and find its emu_launch into a new module; NULL with the
 * reason in *log. */
static EmuModule *load_module(const char *dir, const char *name, bool racecheck, Buf *log) {
  char so[PATH_MAX];
  EmuModule *m = base_alloc(sizeof *m); /* first: nothing allocates while the library is open */
  bool named = join(so, dir, name);
  void *h = named ? dlopen(so, RTLD_NOW | RTLD_LOCAL) : NULL;
  void *fn = h ? dlsym(h, "emu_launch") : NULL;
  if (!fn) {
    char why[512];
    const char *e = named ? dlerror() : "its path is too long"; /* the failed dlopen or dlsym */
    snprintf(why, sizeof why, "%s", e ? e : "unknown");
    if (h) dlclose(h);
    base_free(m);
    if (log) buf_printf(log, "cannot load the emulator module: %s\n", why);
    return NULL;
  }
  m->racecheck = racecheck;
  m->handle = h;
  memcpy(&m->launch, &fn, sizeof fn); /* object pointer to function pointer (POSIX) */
  return m;
}

/* Build a new module and put its shared object into the store. */
static EmuModule *build_module(const uint8_t *key, const char *source, bool racecheck, Buf *log) {
  Buf dir = {0};
  if (!make_temp_dir(&dir, log)) {
    buf_free(&dir);
    return NULL;
  }
  EmuModule *m = NULL;
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
    /* Stored first, loaded last: nothing allocates while the library is open. */
    char so[PATH_MAX], *bytes = NULL;
    size_t len = 0;
    if (join(so, dir.data, "kernel.so") && base_read_file(so, &bytes, &len) == 0)
      base_store_put(BASE_STORE_EMU_MODULE, key, bytes, len); /* unreadable: just not stored */
    base_free(bytes);
    m = load_module(dir.data, "kernel.so", racecheck, log);
  }
  close_temp_dir(&dir);
  return m;
}

/* The module of `key` from the store: its shared object written to a private
 * temporary file and loaded from there; NULL when the store has none (or it
 * does not load: then it is rebuilt, and the put replaces it). */
static EmuModule *stored_module(const uint8_t *key, bool racecheck) {
  void *bytes = NULL;
  size_t len = 0;
  if (!base_store_get(BASE_STORE_EMU_MODULE, key, &bytes, &len)) return NULL;
  Buf dir = {0};
  EmuModule *m = NULL;
  if (make_temp_dir(&dir, NULL)) {
    if (write_file(dir.data, "module.so", bytes, len) == 0)
      m = load_module(dir.data, "module.so", racecheck, NULL);
    close_temp_dir(&dir); /* a loaded object stays mapped */
  }
  buf_free(&dir);
  base_free(bytes);
  return m;
}

/* The compiler's identity for the key: its name and what `NAME --version`
 * prints (asked once per name and process, under loaded_mu). */
static const char *compiler_id(const char *cxx) {
  if (cxx_named && !strcmp(cxx_named, cxx)) return cxx_id.data;
  /* Read into a fixed buffer: nothing allocates while the pipe is open. */
  char cmd[1100], text[8192];
  size_t len = 0, n;
  int status = 0;
  snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", cxx);
  FILE *p = popen(cmd, "r");
  if (p) {
    while (len < sizeof text && (n = fread(text + len, 1, sizeof text - len, p)) > 0) len += n;
    status = pclose(p);
  }
  Buf id = {0};
  buf_printf(&id, "%s\n", cxx);
  buf_put(&id, text, len);
  if (p) buf_printf(&id, "\nstatus %d", status);
  char *named = base_strdup(cxx);
  base_keep(named), base_keep(id.data); /* the table's from now on */
  base_free(cxx_named);
  buf_free(&cxx_id);
  cxx_named = named, cxx_id = id;
  return cxx_id.data;
}

/* The store key of `source` built with these options by this compiler
 * (under loaded_mu). */
static void module_key(uint8_t key[BASE_STORE_KEY_BYTES], const char *source, bool racecheck) {
  BaseSha256 s;
  base_store_key_init(&s, BASE_STORE_EMU_MODULE);
  base_store_key_str(&s, source);
  base_store_key_add(&s, rt_embedded_digest, sizeof rt_embedded_digest);
  base_store_key_str(&s, CXXFLAGS " " LDFLAGS);
  base_store_key_str(&s, racecheck ? RACEFLAGS : "");
  base_store_key_str(&s, compiler_id(compiler()));
  base_store_key_final(&s, key);
}

/* An exhausted allocation under loaded_mu: the open build directory is
 * removed, the lock released and the exhaustion passed on (the table is as
 * before: a module is linked only once it is complete). */
static _Noreturn void build_exhausted(const BaseTry *t) {
  if (pend_dir[0]) remove_dir(pend_dir);
  pend_dir[0] = '\0';
  pthread_mutex_unlock(&loaded_mu);
  base_try_rethrow(t);
}

flex_status emu_module_get(EmuModule **out, const char *source, const EmuBuildOpts *opts, Buf *log) {
  bool race = opts && opts->racecheck;
  uint8_t key[BASE_STORE_KEY_BYTES];
  BaseTry t;
  base_try_push(&t);
  pthread_mutex_lock(&loaded_mu);
  if (setjmp(t.jb)) build_exhausted(&t);
  module_key(key, source, race);
  EmuModule *m = loaded;
  while (m && memcmp(m->key, key, sizeof key) != 0) m = m->next;
  if (!m && ((m = stored_module(key, race)) || (m = build_module(key, source, race, log)))) {
    base_keep(m); /* the table's from now on */
    memcpy(m->key, key, sizeof key);
    m->next = loaded;
    loaded = m;
  }
  base_try_pop(&t);
  pthread_mutex_unlock(&loaded_mu);
  *out = m;
  return m ? FLEX_OK : FLEX_ERR_COMPILE;
}

void emu_modules_forget(void) {
  pthread_mutex_lock(&loaded_mu);
  for (EmuModule *m = loaded, *next; m; m = next) {
    next = m->next;
    dlclose(m->handle);
    base_free(m);
  }
  loaded = NULL;
  base_free(cxx_named); /* the compiler is asked again too */
  buf_free(&cxx_id);
  cxx_named = NULL;
  pthread_mutex_unlock(&loaded_mu);
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
