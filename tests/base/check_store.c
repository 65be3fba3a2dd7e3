/* Store suite: SHA-256 against the FIPS 180-4 vectors, the embedded
 * templates' digest, the keys (the store's and a cubin's), the module store
 * in memory and on disk (base/store.h), kinds kept apart, and what happens
 * to corrupt, truncated, foreign and concurrently written entries, from
 * threads and from processes. Each test uses its own fresh directory. (The
 * emulator's modules in the store: tests/emu/check_emu_store.c.) */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/sha256.h"
#include "base/store.h"
#include "cuda/cache.h"
#include "runtime/embedded.h"
#include "testlib.h"

/* ---- SHA-256 ------------------------------------------------------------- */

static void expect_digest(const void *msg, size_t n, const char *hex) {
  uint8_t d[BASE_SHA256_BYTES];
  char got[2 * BASE_SHA256_BYTES + 1];
  base_sha256(msg, n, d);
  base_sha256_hex(d, got);
  ck_assert_str_eq(got, hex);
}

START_TEST(sha256_vectors) {
  /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf", "SHA2_Additional.pdf"). */
  expect_digest("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  expect_digest("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  expect_digest(two, strlen(two),
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                     "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
  expect_digest(four, strlen(four),
                "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  char *million = malloc(1000000);
  memset(million, 'a', 1000000);
  expect_digest(million, 1000000,
                "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(million);
}
END_TEST

START_TEST(sha256_streaming_matches_one_shot) {
  /* Every split point of a random message gives the same digest. */
  uint64_t st = tl_seed();
  uint8_t msg[300], one[32], two[32];
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)tl_rand(&st);
  base_sha256(msg, sizeof msg, one);
  for (size_t cut = 0; cut <= sizeof msg; cut += 7) {
    BaseSha256 s;
    base_sha256_init(&s);
    base_sha256_update(&s, msg, cut);
    base_sha256_update(&s, msg + cut, sizeof msg - cut);
    base_sha256_final(&s, two);
    ck_assert_mem_eq(one, two, 32);
  }
}
END_TEST

/* ---- helpers ----------------------------------------------------------------- */

/* The kind a test stores (loop tests run once per kind). */
static BaseStoreKind kind = BASE_STORE_CUBIN;

/* A fresh empty store directory, made current through FLEXC_CACHE_DIR. */
static const char *fresh_dir(void) {
  static char dir[256];
  snprintf(dir, sizeof dir, "/tmp/flexc-store-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  setenv("FLEXC_CACHE_DIR", dir, 1);
  base_store_clear_memory();
  return dir;
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
      continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

/* Files in dir whose name starts with prefix. */
static int count_files(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strcmp(e->d_name, ".") &&
        strcmp(e->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

static void random_key(uint8_t key[32], uint64_t *st) {
  char src[64];
  snprintf(src, sizeof src, "kernel %llu", (unsigned long long)tl_rand(st));
  BaseSha256 s;
  base_store_key_init(&s, kind);
  base_store_key_str(&s, src);
  base_store_key_final(&s, key);
}

static uint8_t *random_payload(size_t n, uint64_t *st) {
  uint8_t *p = malloc(n);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)tl_rand(st);
  return p;
}

/* A disk-only lookup (the memory is dropped first). */
static bool disk_lookup(const uint8_t *key, void **got, size_t *len) {
  base_store_clear_memory();
  return base_store_get(kind, key, got, len);
}

/* ---- keys -------------------------------------------------------------------- */

/* The embedder's digest (base/embed.c, at build time) is the one the
 * embedded table gives now: length-prefixed name and text of each file. */
START_TEST(embedded_digest_matches_the_table) {
  BaseSha256 s;
  base_sha256_init(&s);
  int n = 0;
  for (const EmbeddedFile *e = rt_embedded; e->name; e++, n++) {
    const char *f[2] = {e->name, e->text};
    for (int i = 0; i < 2; i++) {
      uint8_t len[8];
      for (int b = 0; b < 8; b++) len[b] = (uint8_t)((uint64_t)strlen(f[i]) >> (8 * b));
      base_sha256_update(&s, len, 8);
      base_sha256_update(&s, f[i], strlen(f[i]));
    }
  }
  uint8_t d[32];
  base_sha256_final(&s, d);
  ck_assert_int_gt(n, 10);
  ck_assert_mem_eq(d, rt_embedded_digest, 32);
}
END_TEST

/* Fields are length-prefixed, the kind is part of the key, and the same
 * fields give the same key. */
START_TEST(store_key_fields_and_kinds) {
  uint8_t k[BASE_STORE_KINDS + 2][32], again[32];
  BaseSha256 s;
  for (int kd = 0; kd < BASE_STORE_KINDS; kd++) {
    base_store_key_init(&s, (BaseStoreKind)kd);
    base_store_key_str(&s, "ab");
    base_store_key_str(&s, "c");
    base_store_key_final(&s, k[kd]);
  }
  base_store_key_init(&s, BASE_STORE_CUBIN);
  base_store_key_str(&s, "a");
  base_store_key_str(&s, "bc");
  base_store_key_final(&s, k[BASE_STORE_KINDS]);
  base_store_key_init(&s, BASE_STORE_CUBIN);
  base_store_key_add(&s, "abc", 3);
  base_store_key_final(&s, k[BASE_STORE_KINDS + 1]);
  for (int i = 0; i < BASE_STORE_KINDS + 2; i++)
    for (int j = i + 1; j < BASE_STORE_KINDS + 2; j++) ck_assert_mem_ne(k[i], k[j], 32);
  base_store_key_init(&s, BASE_STORE_CUBIN);
  base_store_key_add(&s, "ab", 2);
  base_store_key_str(&s, "c");
  base_store_key_final(&s, again);
  ck_assert_mem_eq(k[BASE_STORE_CUBIN], again, 32);
}
END_TEST

/* A cubin's key (cuda/cache.c). */
START_TEST(cubin_key_depends_on_every_field) {
  uint8_t k[6][32];
  rt_cache_key(k[0], "src", 3, "-O3", "13.0", "sm_80");
  rt_cache_key(k[1], "src2", 4, "-O3", "13.0", "sm_80");
  rt_cache_key(k[2], "src", 3, "-O2", "13.0", "sm_80");
  rt_cache_key(k[3], "src", 3, "-O3", "12.9", "sm_80");
  rt_cache_key(k[4], "src", 3, "-O3", "13.0", "sm_90a");
  rt_cache_key(k[5], "sr", 2, "c-O3", "13.0", "sm_80"); /* same bytes, other split */
  for (int i = 0; i < 6; i++)
    for (int j = i + 1; j < 6; j++) ck_assert_mem_ne(k[i], k[j], 32);
  uint8_t again[32];
  rt_cache_key(again, "src", 3, "-O3", "13.0", "sm_80");
  ck_assert_mem_eq(k[0], again, 32);
}
END_TEST

/* ---- round trips -------------------------------------------------------------- */

START_TEST(put_get_round_trip) {
  kind = (BaseStoreKind)_i;
  const char *dir = fresh_dir();
  uint64_t st = tl_seed() ^ 1;
  uint8_t key[32];
  random_key(key, &st);
  size_t n = 1000 + (size_t)(tl_rand(&st) % 5000);
  uint8_t *payload = random_payload(n, &st);
  void *got = NULL;
  size_t len = 0;
  ck_assert(!base_store_get(kind, key, &got, &len));
  base_store_put(kind, key, payload, n);
  BaseStoreStats s0, s1;
  base_store_stats(kind, &s0);
  ck_assert(base_store_get(kind, key, &got, &len)); /* memory */
  ck_assert_uint_eq(len, n);
  ck_assert_mem_eq(got, payload, n);
  ck_assert_int_eq(((char *)got)[n], 0); /* a NUL after the payload */
  base_free(got);
  ck_assert(disk_lookup(key, &got, &len)); /* disk */
  ck_assert_uint_eq(len, n);
  ck_assert_mem_eq(got, payload, n);
  ck_assert_int_eq(((char *)got)[n], 0);
  base_free(got);
  base_store_stats(kind, &s1);
  ck_assert_int_eq(s1.mem_hits, s0.mem_hits + 1);
  ck_assert_int_eq(s1.disk_hits, s0.disk_hits + 1);
  /* One entry file, no temp file left behind. */
  ck_assert_int_eq(count_files(dir, ".tmp"), 0);
  char path[4200], hex[65], want[4200];
  ck_assert(base_store_path(kind, key, path, sizeof path));
  base_sha256_hex(key, hex);
  static const char *ext[BASE_STORE_KINDS] = {"cubin", "cpu.o", "emu.so"};
  snprintf(want, sizeof want, "%s/%s.%s", dir, hex, ext[kind]);
  ck_assert_str_eq(path, want);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq((long)sb.st_size, (long)(n + BASE_STORE_HEADER_BYTES));
  ck_assert_int_eq(count_files(dir, ""), 1);
  free(payload);
  remove_dir(dir);
}
END_TEST

/* The same key bytes under every kind: separate entries, in memory and on
 * disk, each kind reading back its own payload. */
START_TEST(kinds_kept_apart) {
  const char *dir = fresh_dir();
  uint64_t st = tl_seed() ^ 5;
  uint8_t key[32];
  random_key(key, &st);
  uint8_t *payload[BASE_STORE_KINDS];
  for (int kd = 0; kd < BASE_STORE_KINDS; kd++) {
    payload[kd] = random_payload(300, &st);
    base_store_put((BaseStoreKind)kd, key, payload[kd], 300);
  }
  ck_assert_int_eq(count_files(dir, ""), BASE_STORE_KINDS);
  for (int pass = 0; pass < 2; pass++) { /* memory, then disk */
    if (pass) base_store_clear_memory();
    for (int kd = 0; kd < BASE_STORE_KINDS; kd++) {
      void *got;
      size_t len;
      ck_assert(base_store_get((BaseStoreKind)kd, key, &got, &len));
      ck_assert_uint_eq(len, 300);
      ck_assert_mem_eq(got, payload[kd], 300);
      base_free(got);
    }
  }
  for (int kd = 0; kd < BASE_STORE_KINDS; kd++) free(payload[kd]);
  remove_dir(dir);
}
END_TEST

START_TEST(directory_resolution) {
  char dir[4096];
  setenv("FLEXC_CACHE_DIR", "/some/where", 1);
  ck_assert(base_store_dir(dir, sizeof dir));
  ck_assert_str_eq(dir, "/some/where");
  unsetenv("FLEXC_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  ck_assert(base_store_dir(dir, sizeof dir));
  ck_assert_str_eq(dir, "/xdg/flexc");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  ck_assert(base_store_dir(dir, sizeof dir));
  ck_assert_str_eq(dir, "/home/u/.cache/flexc");
  setenv("FLEXC_CACHE_DIR", "off", 1);
  ck_assert(!base_store_dir(dir, sizeof dir));
}
END_TEST

START_TEST(off_disables_disk) {
  const char *dir = fresh_dir();
  setenv("FLEXC_CACHE_DIR", "off", 1);
  uint64_t st = tl_seed() ^ 2;
  uint8_t key[32];
  random_key(key, &st);
  uint8_t *payload = random_payload(100, &st);
  base_store_put(kind, key, payload, 100);
  void *got;
  size_t len;
  ck_assert(base_store_get(kind, key, &got, &len)); /* memory still works */
  base_free(got);
  ck_assert(!disk_lookup(key, &got, &len));
  setenv("FLEXC_CACHE_DIR", dir, 1);
  ck_assert_int_eq(count_files(dir, ""), 0); /* nothing was written */
  free(payload);
  remove_dir(dir);
}
END_TEST

START_TEST(unwritable_directory_is_no_disk) {
  setenv("FLEXC_CACHE_DIR", "/proc/flexc-cannot-exist/cache", 1);
  base_store_clear_memory();
  uint64_t st = tl_seed() ^ 3;
  uint8_t key[32];
  random_key(key, &st);
  uint8_t *payload = random_payload(64, &st);
  base_store_put(kind, key, payload, 64); /* must not fail or crash */
  void *got;
  size_t len;
  ck_assert(!disk_lookup(key, &got, &len));
  free(payload);
}
END_TEST

/* ---- damaged files --------------------------------------------------------------- */

enum Damage { FLIP_PAYLOAD, FLIP_HEADER, TRUNCATE, EXTEND, FOREIGN, EMPTY, OTHER_KEY, OTHER_KIND };

/* Store an entry, damage its file, and check that the damaged file is
 * rejected, that a new put replaces it (by rename: a new inode) and that the
 * replacement reads back. */
static void damage_and_recover(enum Damage how) {
  const char *dir = fresh_dir();
  uint64_t st = tl_seed() ^ (100 + (uint64_t)how);
  uint8_t key[32], other[32];
  random_key(key, &st);
  random_key(other, &st);
  size_t n = 500 + (size_t)(tl_rand(&st) % 1000);
  uint8_t *payload = random_payload(n, &st);
  base_store_put(kind, key, payload, n);
  char path[4200], opath[4200];
  ck_assert(base_store_path(kind, key, path, sizeof path));
  ck_assert(base_store_path(kind, other, opath, sizeof opath));
  FILE *f;
  switch (how) {
  case FLIP_PAYLOAD:
  case FLIP_HEADER:
    f = fopen(path, "r+b");
    fseek(f, how == FLIP_PAYLOAD ? BASE_STORE_HEADER_BYTES + (long)(tl_rand(&st) % n)
                                 : (long)(tl_rand(&st) % BASE_STORE_HEADER_BYTES),
          SEEK_SET);
    int c = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(c ^ (1 << (tl_rand(&st) % 8)), f);
    fclose(f);
    break;
  case TRUNCATE: ck_assert_int_eq(truncate(path, (off_t)(tl_rand(&st) % (n + 88))), 0); break;
  case EXTEND:
    f = fopen(path, "ab");
    fputc('x', f);
    fclose(f);
    break;
  case FOREIGN:
    f = fopen(path, "wb");
    fputs("\x7f" "ELF this is not a store entry at all, just some other file", f);
    fclose(f);
    break;
  case EMPTY:
    f = fopen(path, "wb");
    fclose(f);
    break;
  case OTHER_KEY: /* a valid entry of another key, under this key's name */
    base_store_put(kind, other, payload, n);
    ck_assert_int_eq(rename(opath, path), 0);
    break;
  case OTHER_KIND: { /* a valid entry of this key but another kind, under this name */
    BaseStoreKind ok = (BaseStoreKind)((kind + 1) % BASE_STORE_KINDS);
    base_store_put(ok, key, payload, n);
    ck_assert(base_store_path(ok, key, opath, sizeof opath));
    ck_assert_int_eq(rename(opath, path), 0);
    break;
  }
  }
  struct stat before, after;
  ck_assert_int_eq(stat(path, &before), 0);
  BaseStoreStats s0, s1;
  base_store_stats(kind, &s0);
  void *got;
  size_t len;
  ck_assert(!disk_lookup(key, &got, &len));
  base_store_stats(kind, &s1);
  ck_assert_int_eq(s1.disk_rejected, s0.disk_rejected + 1);
  base_store_put(kind, key, payload, n);
  ck_assert_int_eq(stat(path, &after), 0);
  ck_assert(before.st_ino != after.st_ino); /* replaced by rename, not rewritten in place */
  ck_assert(disk_lookup(key, &got, &len));
  ck_assert_uint_eq(len, n);
  ck_assert_mem_eq(got, payload, n);
  base_free(got);
  ck_assert_int_eq(count_files(dir, ".tmp"), 0);
  free(payload);
  remove_dir(dir);
}

START_TEST(damaged_entries_rejected_and_replaced) {
  kind = (BaseStoreKind)_i;
  for (int how = FLIP_PAYLOAD; how <= OTHER_KIND; how++) damage_and_recover((enum Damage)how);
}
END_TEST

/* ---- concurrency ------------------------------------------------------------------ */

enum { NTHREADS = 8, NKEYS = 4, ROUNDS = 40 };
static uint8_t ckeys[NKEYS][32];
static uint8_t *cpayload[NKEYS];
static size_t clen[NKEYS];
static int cbad; /* lookups that returned wrong bytes (must stay 0) */

/* Writers and readers hammer the same few keys; every hit must be exact. */
static void *hammer(void *arg) {
  uint64_t st = (uint64_t)(uintptr_t)arg;
  for (int r = 0; r < ROUNDS; r++) {
    int k = (int)(tl_rand(&st) % NKEYS);
    if (tl_rand(&st) & 1) {
      base_store_put(kind, ckeys[k], cpayload[k], clen[k]);
    } else {
      void *got;
      size_t len;
      base_store_clear_memory(); /* force reads from the disk */
      if (base_store_get(kind, ckeys[k], &got, &len)) {
        if (len != clen[k] || memcmp(got, cpayload[k], len) != 0) __atomic_add_fetch(&cbad, 1, __ATOMIC_RELAXED);
        base_free(got);
      }
    }
  }
  return NULL;
}

/* Keys and payloads for the hammers; the fresh directory. */
static const char *hammer_setup(uint64_t *st) {
  const char *dir = fresh_dir();
  for (int k = 0; k < NKEYS; k++) {
    random_key(ckeys[k], st);
    clen[k] = 20000 + (size_t)(tl_rand(st) % 20000);
    cpayload[k] = random_payload(clen[k], st);
  }
  return dir;
}

/* Every key stored once more reads back exactly; no temp file is left. */
static void hammer_check(const char *dir) {
  for (int k = 0; k < NKEYS; k++) {
    void *got;
    size_t len;
    base_store_put(kind, ckeys[k], cpayload[k], clen[k]);
    ck_assert(disk_lookup(ckeys[k], &got, &len));
    ck_assert_uint_eq(len, clen[k]);
    ck_assert_mem_eq(got, cpayload[k], len);
    base_free(got);
    free(cpayload[k]);
  }
  ck_assert_int_eq(count_files(dir, ".tmp"), 0);
  remove_dir(dir);
}

START_TEST(concurrent_writers_never_corrupt) {
  uint64_t st = tl_seed() ^ 4;
  const char *dir = hammer_setup(&st);
  BaseStoreStats s0, s1;
  base_store_stats(kind, &s0);
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    ck_assert_int_eq(pthread_create(&t[i], NULL, hammer, (void *)(uintptr_t)(st + (uint64_t)i)), 0);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  base_store_stats(kind, &s1);
  ck_assert_int_eq(cbad, 0);
  ck_assert_int_eq(s1.disk_rejected, s0.disk_rejected); /* no reader saw a partial file */
  hammer_check(dir);
}
END_TEST

/* The same with processes (each its own memory, sharing the directory):
 * a child's status counts its wrong reads and rejected files. */
START_TEST(concurrent_processes_never_corrupt) {
  uint64_t st = tl_seed() ^ 6;
  const char *dir = hammer_setup(&st);
  pid_t pid[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    pid[i] = fork();
    ck_assert_int_ge(pid[i], 0);
    if (pid[i] == 0) {
      hammer((void *)(uintptr_t)(st + (uint64_t)i));
      BaseStoreStats s;
      base_store_stats(kind, &s);
      _exit(cbad + (int)s.disk_rejected > 100 ? 100 : cbad + (int)s.disk_rejected);
    }
  }
  for (int i = 0; i < NTHREADS; i++) {
    int ws = 0;
    ck_assert_int_eq(waitpid(pid[i], &ws, 0), pid[i]);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                  "child %d: %d wrong reads or rejected files", i, WEXITSTATUS(ws));
  }
  hammer_check(dir);
}
END_TEST

int main(void) {
  return TL_MAIN("store", 0, TL_CASE("sha256", 0), TL_TEST(sha256_vectors),
                 TL_TEST(sha256_streaming_matches_one_shot), TL_CASE("keys", 0),
                 TL_TEST(embedded_digest_matches_the_table), TL_TEST(store_key_fields_and_kinds),
                 TL_TEST(cubin_key_depends_on_every_field), TL_CASE("store", 0),
                 TL_LOOP(put_get_round_trip, BASE_STORE_KINDS), TL_TEST(kinds_kept_apart),
                 TL_TEST(directory_resolution), TL_TEST(off_disables_disk), TL_TEST(unwritable_directory_is_no_disk),
                 TL_LOOP(damaged_entries_rejected_and_replaced, BASE_STORE_KINDS),
                 TL_TEST(concurrent_writers_never_corrupt), TL_TEST(concurrent_processes_never_corrupt));
}
