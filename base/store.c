/* store.c: the content-addressed module store (see store.h for the contract,
 * docs/store.md for the file format). */
#include "base/store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#ifndef FLEXC_VERSION
#define FLEXC_VERSION "unknown"
#endif

static const char MAGIC[8] = {'F', 'L', 'X', 'S', 'T', 'O', 'R', 'E'};
/* Larger files are not ours: an emulator module is a few MB. */
#define MAX_PAYLOAD ((size_t)256 << 20)

/* Per kind: its name (in keys and messages) and its file extension. */
static const struct {
  const char *name, *ext;
} KINDS[BASE_STORE_KINDS] = {
    [BASE_STORE_CUBIN] = {"cubin", "cubin"},
    [BASE_STORE_CPU_OBJECT] = {"cpu object", "cpu.o"},
    [BASE_STORE_EMU_MODULE] = {"emulator module", "emu.so"},
};

const char *base_store_kind_name(BaseStoreKind kind) {
  CHECK(kind >= 0 && kind < BASE_STORE_KINDS);
  return KINDS[kind].name;
}

/* One in-memory payload. */
typedef struct MemEntry {
  struct MemEntry *next;
  BaseStoreKind kind;
  uint8_t key[BASE_STORE_KEY_BYTES];
  size_t len;     /* payload bytes */
  uint8_t data[]; /* the payload */
} MemEntry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards mem and stats */
static MemEntry *mem;
static BaseStoreStats stats[BASE_STORE_KINDS];

/* ---- keys ------------------------------------------------------------------ */

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* A length prefix keeps ("ab","c") and ("a","bc") apart. */
void base_store_key_add(BaseSha256 *s, const void *data, size_t n) {
  uint8_t len[8];
  put_u64(len, n);
  base_sha256_update(s, len, 8);
  base_sha256_update(s, data, n);
}

void base_store_key_str(BaseSha256 *s, const char *text) {
  base_store_key_add(s, text ? text : "", text ? strlen(text) : 0);
}

void base_store_key_init(BaseSha256 *s, BaseStoreKind kind) {
  char fmt[16];
  snprintf(fmt, sizeof fmt, "%d", BASE_STORE_FORMAT);
  base_sha256_init(s);
  base_store_key_str(s, fmt);
  base_store_key_str(s, FLEXC_VERSION);
  base_store_key_str(s, base_store_kind_name(kind));
}

void base_store_key_final(BaseSha256 *s, uint8_t key[BASE_STORE_KEY_BYTES]) {
  base_sha256_final(s, key);
}

/* ---- memory ------------------------------------------------------------------ */

static void count(long *counter) {
  pthread_mutex_lock(&lock);
  (*counter)++;
  pthread_mutex_unlock(&lock);
}

/* The entry of `key` (under the lock); NULL if none. Entries are never
 * freed while the process runs (but by base_store_clear_memory). */
static const MemEntry *mem_find(BaseStoreKind kind, const uint8_t *key) {
  const MemEntry *e = mem;
  while (e && (e->kind != kind || memcmp(e->key, key, BASE_STORE_KEY_BYTES) != 0)) e = e->next;
  return e;
}

/* The copy is allocated outside the lock, so an exhausted allocation
 * jumps out as anywhere else (no lock is held). */
static bool mem_get(BaseStoreKind kind, const uint8_t *key, void **bytes, size_t *len) {
  pthread_mutex_lock(&lock); /* nothing allocates while it is held */
  const MemEntry *e = mem_find(kind, key);
  size_t n = e ? e->len : 0;
  pthread_mutex_unlock(&lock);
  if (!e) return false;
  uint8_t *c = base_alloc(n + 1);
  pthread_mutex_lock(&lock);
  e = mem_find(kind, key); /* the same payload, whoever put it (same key) */
  bool hit = e && e->len == n;
  if (hit) {
    memcpy(c, e->data, n);
    stats[kind].mem_hits++;
  }
  pthread_mutex_unlock(&lock);
  if (!hit) {
    base_free(c);
    return false;
  }
  c[n] = 0;
  *bytes = c, *len = n;
  return true;
}

static void mem_put(BaseStoreKind kind, const uint8_t *key, const void *bytes, size_t len) {
  MemEntry *n = base_alloc(sizeof *n + len);
  n->kind = kind;
  memcpy(n->key, key, BASE_STORE_KEY_BYTES);
  memcpy(n->data, bytes, len);
  n->len = len;
  base_keep(n); /* the store's from now on */
  pthread_mutex_lock(&lock); /* nothing below allocates */
  MemEntry **pp = &mem;
  while (*pp && ((*pp)->kind != kind || memcmp((*pp)->key, key, BASE_STORE_KEY_BYTES) != 0))
    pp = &(*pp)->next;
  MemEntry *old = *pp;
  n->next = old ? old->next : NULL; /* same key, same payload: keep the newest */
  *pp = n;
  pthread_mutex_unlock(&lock);
  base_free(old);
}

void base_store_clear_memory(void) {
  pthread_mutex_lock(&lock);
  MemEntry *e = mem;
  mem = NULL;
  pthread_mutex_unlock(&lock);
  while (e) {
    MemEntry *next = e->next;
    base_free(e);
    e = next;
  }
}

void base_store_stats(BaseStoreKind kind, BaseStoreStats *out) {
  CHECK(kind >= 0 && kind < BASE_STORE_KINDS);
  pthread_mutex_lock(&lock);
  *out = stats[kind];
  pthread_mutex_unlock(&lock);
}

/* ---- disk --------------------------------------------------------------------- */

bool base_store_dir(char *out, size_t cap) {
  const char *dir = base_config()->cache_dir;
  int n;
  if (*dir) {
    if (strcmp(dir, "off") == 0) return false;
    n = snprintf(out, cap, "%s", dir);
  } else if ((dir = getenv("XDG_CACHE_HOME")) && *dir) {
    n = snprintf(out, cap, "%s/flexc", dir);
  } else if ((dir = getenv("HOME")) && *dir) {
    n = snprintf(out, cap, "%s/.cache/flexc", dir);
  } else {
    return false;
  }
  return n > 0 && (size_t)n < cap;
}

bool base_store_path(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES], char *out,
                     size_t cap) {
  char dir[4096], hex[2 * BASE_SHA256_BYTES + 1];
  CHECK(kind >= 0 && kind < BASE_STORE_KINDS);
  if (!base_store_dir(dir, sizeof dir)) return false;
  base_sha256_hex(key, hex);
  int n = snprintf(out, cap, "%s/%s.%s", dir, hex, KINDS[kind].ext);
  return n > 0 && (size_t)n < cap;
}

/* mkdir -p with private permissions; false if the directory is not there
 * afterwards. */
static bool make_dirs(const char *path) {
  char tmp[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof tmp) return false;
  memcpy(tmp, path, n + 1);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return false;
    *p = '/';
  }
  if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return stat(tmp, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The header: magic[8] format u32 kind u32 key[32] length u64 sha[32]. */
static void make_header(uint8_t *h, BaseStoreKind kind, const uint8_t *key, const void *bytes,
                        size_t len) {
  memset(h, 0, BASE_STORE_HEADER_BYTES);
  memcpy(h, MAGIC, 8);
  for (int i = 0; i < 4; i++) {
    h[8 + i] = (uint8_t)((uint32_t)BASE_STORE_FORMAT >> (8 * i));
    h[12 + i] = (uint8_t)((uint32_t)kind >> (8 * i));
  }
  memcpy(h + 16, key, BASE_STORE_KEY_BYTES);
  put_u64(h + 48, len);
  base_sha256(bytes, len, h + 56);
}

/* Read and verify the file for `key`: every header field, exactly the
 * payload's length, its hash. A heap payload on success. */
static bool disk_get(BaseStoreKind kind, const uint8_t *key, void **bytes, size_t *len) {
  char path[4200];
  if (!base_store_path(kind, key, path, sizeof path)) return false;
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  uint8_t h[BASE_STORE_HEADER_BYTES], want[BASE_STORE_HEADER_BYTES];
  /* What the header must say before the payload is read. */
  make_header(want, kind, key, "", 0);
  bool ok = fread(h, 1, sizeof h, f) == sizeof h && memcmp(h, want, 48) == 0 &&
            get_u64(h + 48) <= MAX_PAYLOAD;
  uint8_t *data = NULL;
  size_t n = ok ? (size_t)get_u64(h + 48) : 0;
  if (ok) {
    data = base_alloc(n + 1);
    /* Exactly n bytes and then end of file: a longer file is not ours. */
    ok = fread(data, 1, n, f) == n && fgetc(f) == EOF;
  }
  fclose(f);
  if (ok) {
    make_header(want, kind, key, data, n);
    ok = memcmp(want, h, BASE_STORE_HEADER_BYTES) == 0;
  }
  if (!ok) {
    base_free(data);
    count(&stats[kind].disk_rejected);
    return false;
  }
  data[n] = 0;
  *bytes = data;
  *len = n;
  return true;
}

static bool write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= (size_t)w;
  }
  return true;
}

/* Write to a temp file in the same directory, then rename over the entry:
 * readers see the old file or the new one, never half of one. */
static void disk_put(BaseStoreKind kind, const uint8_t *key, const void *bytes, size_t len) {
  char dir[4096], path[4200], tmp[4200];
  if (!base_store_dir(dir, sizeof dir) || !make_dirs(dir)) return;
  if (!base_store_path(kind, key, path, sizeof path)) return;
  snprintf(tmp, sizeof tmp, "%s/.tmp-XXXXXX", dir);
  int fd = mkstemp(tmp);
  if (fd < 0) return;
  uint8_t h[BASE_STORE_HEADER_BYTES];
  make_header(h, kind, key, bytes, len);
  bool ok = write_all(fd, h, sizeof h) && write_all(fd, bytes, len);
  ok = (close(fd) == 0) && ok;
  if (ok && rename(tmp, path) == 0) {
    count(&stats[kind].disk_writes);
    return;
  }
  unlink(tmp);
}

/* ---- the API -------------------------------------------------------------------- */

BaseStoreHit base_store_lookup(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES],
                               void **bytes, size_t *len) {
  CHECK(kind >= 0 && kind < BASE_STORE_KINDS);
  if (mem_get(kind, key, bytes, len)) return BASE_STORE_MEM;
  if (disk_get(kind, key, bytes, len)) {
    count(&stats[kind].disk_hits);
    mem_put(kind, key, *bytes, *len);
    return BASE_STORE_DISK;
  }
  count(&stats[kind].misses);
  return BASE_STORE_MISS;
}

bool base_store_get(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES], void **bytes,
                    size_t *len) {
  return base_store_lookup(kind, key, bytes, len) != BASE_STORE_MISS;
}

void base_store_put(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES], const void *bytes,
                    size_t len) {
  CHECK(kind >= 0 && kind < BASE_STORE_KINDS);
  mem_put(kind, key, bytes, len);
  disk_put(kind, key, bytes, len);
}
