/* Emulator modules in the module store (base/store.h, emu/build.c): a
 * second process with the same FLEXC_CACHE_DIR loads the first one's shared
 * object from disk without running the compiler; a race-check build is
 * another entry; a second request in one process is answered by the
 * loaded module; FLEXC_CACHE_DIR=off keeps modules in memory only; an entry
 * that verifies but does not load is rebuilt and replaced; and a generated
 * forward through the public API is served from disk in a second process.
 *
 * Each test runs this program again as child processes (`--child ...`) in
 * a fresh directory, with FLEXC_EMU_CXX a wrapper around the host compiler
 * that counts compilations; a child prints the store's emulator-module
 * counters and checks its results itself. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/store.h"
#include "emu/emu_host.h"
#include "testlib.h"

static const char *self;

/* ---- the children ------------------------------------------------------------ */

/* A tiny hand-written kernel: out[i] = 2 in[i] + add. */
static const char kSource[] =
    "#include \"emu_arch.h\"\n"
    "struct StoreParams { const float *in; float *out; int n; float add; };\n"
    "extern \"C\" __global__ void store_t_axpy(const StoreParams p) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < p.n) flex_gstore(p.out + i, 2.0f * flex_gload(p.in + i) + p.add);\n"
    "}\n"
    "FLEX_EMU_ENTRY(store_t_axpy, StoreParams)\n";

typedef struct StoreParams {
  const float *in;
  float *out;
  int n;
  float add;
} StoreParams;

static void print_stats(void) {
  BaseStoreStats s;
  base_store_stats(BASE_STORE_EMU_MODULE, &s);
  printf("emu store: mem=%ld disk=%ld miss=%ld rejected=%ld writes=%ld\n", s.mem_hits, s.disk_hits,
         s.misses, s.disk_rejected, s.disk_writes);
}

/* Build (or find) the tiny kernel's module and run it on random inputs;
 * every output must be exact. */
static int kernel_child(bool race) {
  uint64_t rng = tl_seed();
  EmuBuildOpts o = {.racecheck = race};
  Buf log = {0};
  EmuModule *m = NULL;
  if (emu_module_get(&m, kSource, &o, &log) != FLEX_OK) {
    printf("build failed:\n%s\n", log.data ? log.data : "");
    return 1;
  }
  /* Asked again, the process's loaded module answers without the store. */
  BaseStoreStats s0, s1;
  base_store_stats(BASE_STORE_EMU_MODULE, &s0);
  EmuModule *again = NULL;
  if (emu_module_get(&again, kSource, &o, &log) != FLEX_OK || again != m) {
    printf("a second request did not return the loaded module\n");
    return 1;
  }
  base_store_stats(BASE_STORE_EMU_MODULE, &s1);
  if (memcmp(&s0, &s1, sizeof s0) != 0) {
    printf("a second request went to the store\n");
    return 1;
  }
  buf_free(&log);
  enum { N = 1000 };
  static float in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (float)tl_normal(&rng), out[i] = NAN;
  StoreParams p = {in, out, N, (float)tl_normal(&rng)};
  EmuRange r[2] = {{(uintptr_t)in, sizeof in, "in"}, {(uintptr_t)out, sizeof out, "out"}};
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = "store_t_axpy";
  L.params = &p;
  L.grid = (EmuDim){(N + 127) / 128, 1, 1};
  L.block = (EmuDim){128, 1, 1};
  L.ranges = r;
  L.nranges = 2;
  if (emu_module_launch(m, &L, NULL) != FLEX_OK) {
    printf("launch failed: %s\n", L.error);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < N; i++) bad += out[i] != 2.0f * in[i] + p.add;
  print_stats();
  printf("%d wrong outputs\n", bad);
  return bad != 0;
}

/* A generated forward on the emulator against the float64 reference. */
static int forward_child(void) {
  uint64_t rng = tl_seed();
  static const char src[] = "score f(s, b, h, q, kv) { return s * 0.5 + (q >= kv ? 0.0 : -1.0); }\n";
  flex_kernel *k = NULL;
  if (flex_kernel_from_source(&k, "store.score", src, strlen(src), NULL) != FLEX_OK) {
    printf("%s\n", flex_last_error());
    return 1;
  }
  DLDataType f32 = rt_dtype(kDLFloat, 32);
  int64_t sq[4] = {1, 2, 37, 16}, sl[3] = {1, 2, 37};
  TlPair q, kk, v, out, lse;
  tl_pair_init(&q, f32, 4, sq, true, &rng);
  tl_pair_init(&kk, f32, 4, sq, true, &rng);
  tl_pair_init(&v, f32, 4, sq, true, &rng);
  tl_pair_init(&out, f32, 4, sq, false, &rng);
  tl_pair_init(&lse, f32, 3, sl, false, &rng);
  flex_args a = {.backend = FLEX_BACKEND_EMU, .q = &q.tx, .k = &kk.tx, .v = &v.tx,
                 .out = &out.tx, .lse = &lse.tx};
  flex_args ref = {.backend = FLEX_BACKEND_REFERENCE, .q = &q.tref, .k = &kk.tref, .v = &v.tref,
                   .out = &out.tref, .lse = &lse.tref};
  int rc = 1;
  if (flex_forward(k, &a) != FLEX_OK || flex_forward(k, &ref) != FLEX_OK) {
    printf("%s\n", flex_last_error());
  } else {
    double eo = tl_pair_err(&out), el = tl_pair_err(&lse);
    print_stats();
    printf("error out %.3g lse %.3g\n", eo, el);
    rc = !(eo < 1e-4 && el < 1e-4);
  }
  TlPair *all[] = {&q, &kk, &v, &out, &lse};
  for (int i = 0; i < 5; i++) tl_pair_free(all[i]);
  flex_kernel_free(k);
  return rc;
}

/* ---- the parent ---------------------------------------------------------------- */

/* A child's counters. */
typedef struct Counts {
  long mem, disk, miss, rejected, writes;
} Counts;

/* A fresh directory with store/ (made current through FLEXC_CACHE_DIR) and
 * cxx.sh, which appends a line to `compiles` for each compilation and runs
 * the host compiler. */
static char root[256];

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/flexc-emu-store-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
  char path[512], dir[512];
  snprintf(dir, sizeof dir, "%s/store", root);
  setenv("FLEXC_CACHE_DIR", dir, 1);
  const char *cxx = getenv("FLEXC_EMU_CXX");
  snprintf(path, sizeof path, "%s/cxx.sh", root);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#!/bin/sh\ncase \"$*\" in *kernel.cu*) echo compile >> '%s/compiles';; esac\n"
             "exec %s \"$@\"\n", root, cxx && *cxx ? cxx : "c++");
  fclose(f);
  ck_assert_int_eq(chmod(path, 0700), 0);
  setenv("FLEXC_EMU_CXX", path, 1);
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)tl_seed());
  setenv("FLEXC_SEED", seed, 1); /* every child draws the same inputs */
}

static void teardown(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  ck_assert_int_eq(system(cmd), 0);
}

/* Compilations so far (lines of root/compiles). */
static int compiles(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/compiles", root);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

/* Files in root/store named *.emu.so (their names into names[0..), if given). */
static int entries(char names[][256], int cap) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/store", root);
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 7 || strcmp(e->d_name + len - 7, ".emu.so") != 0) continue;
    if (names && n < cap) snprintf(names[n], 256, "%s", e->d_name);
    n++;
  }
  closedir(d);
  return n;
}

/* Run this program as `--child what`; it must succeed. Its counters. */
static Counts child(const char *what) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' --child %s", self, what);
  Buf out = {0};
  int rc = tl_run(cmd, &out);
  fprintf(stderr, "  child %s: %s", what, out.data ? out.data : "\n");
  ck_assert_msg(rc == 0, "child %s failed (%d):\n%s", what, rc, out.data ? out.data : "");
  Counts c;
  const char *line = out.data ? strstr(out.data, "emu store:") : NULL;
  ck_assert_msg(line && sscanf(line, "emu store: mem=%ld disk=%ld miss=%ld rejected=%ld writes=%ld",
                               &c.mem, &c.disk, &c.miss, &c.rejected, &c.writes) == 5,
                "child %s printed no counters:\n%s", what, out.data ? out.data : "");
  buf_free(&out);
  return c;
}

START_TEST(second_process_hits_disk) {
  setup();
  Counts a = child("plain");
  ck_assert_int_eq(a.miss, 1);
  ck_assert_int_eq(a.writes, 1);
  ck_assert_int_eq(a.disk, 0);
  ck_assert_int_eq(compiles(), 1);
  ck_assert_int_eq(entries(NULL, 0), 1);
  Counts b = child("plain");
  ck_assert_int_eq(b.disk, 1); /* from the first process's file */
  ck_assert_int_eq(b.miss, 0);
  ck_assert_int_eq(b.rejected, 0);
  ck_assert_int_eq(b.writes, 0);
  ck_assert_int_eq(compiles(), 1); /* no compiler run */
  /* A race-check build of the same source is another entry. */
  Counts r = child("race");
  ck_assert_int_eq(r.miss, 1);
  ck_assert_int_eq(r.writes, 1);
  ck_assert_int_eq(compiles(), 2);
  ck_assert_int_eq(entries(NULL, 0), 2);
  Counts r2 = child("race");
  ck_assert_int_eq(r2.disk, 1);
  ck_assert_int_eq(r2.miss, 0);
  ck_assert_int_eq(compiles(), 2);
  teardown();
}
END_TEST

START_TEST(off_is_memory_only) {
  setup();
  setenv("FLEXC_CACHE_DIR", "off", 1);
  for (int i = 0; i < 2; i++) {
    Counts a = child("plain");
    ck_assert_int_eq(a.miss, 1);
    ck_assert_int_eq(a.disk, 0);
    ck_assert_int_eq(a.writes, 0);
    ck_assert_int_eq(compiles(), i + 1); /* nothing survives the process */
  }
  ck_assert_int_eq(entries(NULL, 0), 0);
  teardown();
}
END_TEST

/* An entry whose header and hash verify but whose payload is no shared
 * object (what a foreign writer could leave): it does not load, so the
 * module is rebuilt and the put replaces the entry. */
START_TEST(unloadable_entry_is_rebuilt) {
  setup();
  child("plain");
  char names[1][256];
  ck_assert_int_eq(entries(names, 1), 1);
  uint8_t key[BASE_STORE_KEY_BYTES];
  for (int i = 0; i < BASE_STORE_KEY_BYTES; i++) {
    unsigned byte;
    ck_assert_int_eq(sscanf(names[0] + 2 * i, "%2x", &byte), 1);
    key[i] = (uint8_t)byte;
  }
  static const char junk[] = "not a shared object";
  base_store_put(BASE_STORE_EMU_MODULE, key, junk, sizeof junk);
  Counts b = child("plain");
  ck_assert_int_eq(b.disk, 1);   /* it verified ... */
  ck_assert_int_eq(compiles(), 2); /* ... but was rebuilt */
  ck_assert_int_eq(b.writes, 1);
  Counts c = child("plain");
  ck_assert_int_eq(c.disk, 1);
  ck_assert_int_eq(compiles(), 2);
  teardown();
}
END_TEST

START_TEST(generated_forward_hits_disk) {
  setup();
  Counts a = child("forward");
  ck_assert_int_ge(a.miss, 1);
  ck_assert_int_eq(a.writes, a.miss);
  int n = compiles();
  ck_assert_int_eq(n, a.miss);
  /* The generated source is the same in a new process, so its key is. */
  Counts b = child("forward");
  ck_assert_int_eq(b.miss, 0);
  ck_assert_int_eq(b.disk, a.miss);
  ck_assert_int_eq(compiles(), n);
  teardown();
}
END_TEST

int main(int argc, char **argv) {
  self = argv[0];
  if (argc == 3 && !strcmp(argv[1], "--child")) {
    if (!strcmp(argv[2], "forward")) return forward_child();
    return kernel_child(!strcmp(argv[2], "race"));
  }
  if (!emu_compiler_available()) {
    printf("skipped: no host C++ compiler\n");
    return 77;
  }
  tl_seed();
  return TL_MAIN("emu_store", 600, TL_TEST(second_process_hits_disk), TL_TEST(off_is_memory_only),
                 TL_TEST(unloadable_entry_is_rebuilt), TL_TEST(generated_forward_hits_disk));
}
