/* cache.c: the compiled-kernel cache (see cache.h for the contract). */
#include "cuda/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "runtime/embedded.h"
#include "cuda/nvrtc.h"
#include "runtime/rt.h"

#ifndef FLEXC_VERSION
#define FLEXC_VERSION "unknown"
#endif

static const char MAGIC[8] = {'F', 'L', 'X', 'C', 'A', 'C', 'H', 'E'};
/* Larger files are not ours: a cubin of a few kernels is well under this. */
#define MAX_PAYLOAD ((size_t)256 << 20)

/* One in-memory entry. */
typedef struct MemEntry {
  struct MemEntry *next;
  uint8_t key[RT_SHA256_BYTES];
  size_t len;      /* payload bytes */
  uint8_t data[];  /* the payload */
} MemEntry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards mem and stats */
static MemEntry *mem;
static RtCacheStats stats;

/* ---- key ----------------------------------------------------------------- */

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* A length prefix keeps ("ab","c") and ("a","bc") apart. */
static void hash_field(RtSha256 *s, const void *data, size_t n) {
  uint8_t len[8];
  put_u64(len, n);
  rt_sha256_update(s, len, 8);
  rt_sha256_update(s, data, n);
}

static pthread_once_t templates_once = PTHREAD_ONCE_INIT;
static uint8_t templates_digest[RT_SHA256_BYTES];

static void hash_templates(void) {
  RtSha256 s;
  rt_sha256_init(&s);
  for (const EmbeddedFile *e = rt_embedded; e->name; e++) {
    hash_field(&s, e->name, strlen(e->name));
    hash_field(&s, e->text, strlen(e->text));
  }
  rt_sha256_final(&s, templates_digest);
}

void rt_cache_key(uint8_t key[RT_SHA256_BYTES], const char *source, size_t source_len,
                  const char *options, const char *nvrtc_version, const char *arch) {
  RtSha256 s;
  char fmt[16];
  snprintf(fmt, sizeof fmt, "%d", RT_CACHE_FORMAT);
  rt_sha256_init(&s);
  hash_field(&s, fmt, strlen(fmt));
  hash_field(&s, FLEXC_VERSION, strlen(FLEXC_VERSION));
  hash_field(&s, source, source_len);
  /* The embedded templates are part of every translation unit; they are
   * fixed for the process, so their digest is computed once. */
  BaseTry *held = base_try_hold(); /* a jump out of a once-initialiser would block it forever */
  pthread_once(&templates_once, hash_templates);
  base_try_restore(held);
  hash_field(&s, (const char *)templates_digest, sizeof templates_digest);
  hash_field(&s, options ? options : "", options ? strlen(options) : 0);
  for (int i = 0; rt_nvrtc_flags[i]; i++) hash_field(&s, rt_nvrtc_flags[i], strlen(rt_nvrtc_flags[i]));
  hash_field(&s, nvrtc_version ? nvrtc_version : "", nvrtc_version ? strlen(nvrtc_version) : 0);
  hash_field(&s, arch ? arch : "", arch ? strlen(arch) : 0);
  rt_sha256_final(&s, key);
}

/* ---- memory ---------------------------------------------------------------- */

static bool mem_get(const uint8_t *key, void **bytes, size_t *len) {
  bool hit = false;
  pthread_mutex_lock(&lock);
  for (MemEntry *e = mem; e; e = e->next) {
    if (memcmp(e->key, key, RT_SHA256_BYTES) == 0) {
      *bytes = base_alloc(e->len ? e->len : 1);
      memcpy(*bytes, e->data, e->len);
      *len = e->len;
      stats.mem_hits++;
      hit = true;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return hit;
}

static void mem_put(const uint8_t *key, const void *bytes, size_t len) {
  MemEntry *n = base_alloc(sizeof *n + len);
  memcpy(n->key, key, RT_SHA256_BYTES);
  memcpy(n->data, bytes, len);
  n->len = len;
  pthread_mutex_lock(&lock);
  MemEntry **pp = &mem;
  while (*pp && memcmp((*pp)->key, key, RT_SHA256_BYTES) != 0) pp = &(*pp)->next;
  if (*pp) { /* replace: same key means the same payload, but keep the newest */
    n->next = (*pp)->next;
    base_free(*pp);
  } else {
    n->next = NULL;
  }
  *pp = n;
  pthread_mutex_unlock(&lock);
}

void rt_cache_clear_memory(void) {
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

static void count(long *counter) {
  pthread_mutex_lock(&lock);
  (*counter)++;
  pthread_mutex_unlock(&lock);
}

void rt_cache_stats(RtCacheStats *out) {
  pthread_mutex_lock(&lock);
  *out = stats;
  pthread_mutex_unlock(&lock);
}

/* ---- disk ------------------------------------------------------------------ */

bool rt_cache_dir(char *out, size_t cap) {
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

bool rt_cache_path(const uint8_t key[RT_SHA256_BYTES], char *out, size_t cap) {
  char dir[4096], hex[2 * RT_SHA256_BYTES + 1];
  if (!rt_cache_dir(dir, sizeof dir)) return false;
  rt_sha256_hex(key, hex);
  int n = snprintf(out, cap, "%s/%s.cubin", dir, hex);
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

/* The header: magic[8] format u32 reserved u32 key[32] length u64 sha[32]. */
static void make_header(uint8_t *h, const uint8_t *key, const void *bytes, size_t len) {
  memset(h, 0, RT_CACHE_HEADER_BYTES);
  memcpy(h, MAGIC, 8);
  h[8] = (uint8_t)RT_CACHE_FORMAT;
  h[9] = (uint8_t)(RT_CACHE_FORMAT >> 8);
  memcpy(h + 16, key, RT_SHA256_BYTES);
  put_u64(h + 48, len);
  rt_sha256(bytes, len, h + 56);
}

/* Read and verify the file for `key`; a heap payload on success. */
static bool disk_get(const uint8_t *key, void **bytes, size_t *len) {
  char path[4200];
  if (!rt_cache_path(key, path, sizeof path)) return false;
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  uint8_t h[RT_CACHE_HEADER_BYTES], want[RT_CACHE_HEADER_BYTES];
  bool ok = fread(h, 1, sizeof h, f) == sizeof h && memcmp(h, MAGIC, 8) == 0 &&
            h[8] == (uint8_t)RT_CACHE_FORMAT && h[9] == (uint8_t)(RT_CACHE_FORMAT >> 8) &&
            memcmp(h + 16, key, RT_SHA256_BYTES) == 0 && get_u64(h + 48) <= MAX_PAYLOAD;
  uint8_t *data = NULL;
  size_t n = ok ? (size_t)get_u64(h + 48) : 0;
  if (ok) {
    data = base_alloc(n + 1);
    /* Exactly n bytes and then end of file: a longer file is not ours. */
    ok = fread(data, 1, n, f) == n && fgetc(f) == EOF;
  }
  fclose(f);
  if (ok) {
    make_header(want, key, data, n);
    ok = memcmp(want, h, RT_CACHE_HEADER_BYTES) == 0;
  }
  if (!ok) {
    base_free(data);
    count(&stats.disk_rejected);
    return false;
  }
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
static void disk_put(const uint8_t *key, const void *bytes, size_t len) {
  char dir[4096], path[4200], tmp[4200];
  if (!rt_cache_dir(dir, sizeof dir) || !make_dirs(dir)) return;
  if (!rt_cache_path(key, path, sizeof path)) return;
  snprintf(tmp, sizeof tmp, "%s/.tmp-XXXXXX", dir);
  int fd = mkstemp(tmp);
  if (fd < 0) return;
  uint8_t h[RT_CACHE_HEADER_BYTES];
  make_header(h, key, bytes, len);
  bool ok = write_all(fd, h, sizeof h) && write_all(fd, bytes, len);
  ok = (close(fd) == 0) && ok;
  if (ok && rename(tmp, path) == 0) {
    count(&stats.disk_writes);
    return;
  }
  unlink(tmp);
}

/* ---- the API ----------------------------------------------------------------- */

/* The lookup; *where says what served it: "mem-hit", "disk-hit" or "miss". */
static bool cache_get(const uint8_t *key, void **bytes, size_t *len, const char **where) {
  *where = "mem-hit";
  if (mem_get(key, bytes, len)) return true;
  *where = "disk-hit";
  if (disk_get(key, bytes, len)) {
    count(&stats.disk_hits);
    mem_put(key, *bytes, *len);
    return true;
  }
  *where = "miss";
  count(&stats.misses);
  return false;
}

bool rt_cache_get(const uint8_t key[RT_SHA256_BYTES], void **bytes, size_t *len) {
  const char *where;
  return cache_get(key, bytes, len, &where);
}

void rt_cache_put(const uint8_t key[RT_SHA256_BYTES], const void *bytes, size_t len) {
  mem_put(key, bytes, len);
  disk_put(key, bytes, len);
}

/* ---- compiling through the cache -------------------------------------------- */

/* NVRTC's version string (part of the key). */
static flex_status nvrtc_version(char *out, size_t cap) {
  int v = rt_nvrtc_version();
  if (v < 0) return rt_err(FLEX_ERR_UNSUPPORTED, "NVRTC cannot be loaded: %s", flex_last_error());
  snprintf(out, cap, "%d", v);
  return FLEX_OK;
}

/* One NVRTC compile to a cubin; the image as a heap copy. */
static flex_status nvrtc_compile(const char *source, const char *arch, void **image,
                                 size_t *image_len) {
  RtNvrtcResult res;
  memset(&res, 0, sizeof res);
  flex_status st = rt_nvrtc_compile(&res, source, arch, RT_NVRTC_CUBIN, false);
  if (!st) {
    *image_len = res.image.len;
    *image = base_alloc(res.image.len + 1);
    memcpy(*image, res.image.data, res.image.len);
  }
  rt_nvrtc_free(&res);
  return st;
}

/* $FLEXC_CACHE_LOG names a file that gets one line per lookup of
 * rt_cache_compile that the memory cache did not serve: "disk-hit" or
 * "miss", the key's first 16 hex digits, the arch and the generated
 * source's header (what kernel it is).
 * One write() per line with O_APPEND, so the processes of a whole run (the
 * GPU run's checks, forked test cases) can share the file; the GPU bundle's
 * run counts its lines to show the cache served what it was filled for. */
static void log_lookup(const char *what, const uint8_t *key, const char *arch, const char *source) {
  const char *path = base_config()->cache_log;
  if (!*path || !strcmp(what, "mem-hit")) return;
  char hex[2 * RT_SHA256_BYTES + 1], line[512];
  rt_sha256_hex(key, hex);
  int n = snprintf(line, sizeof line, "%s %.16s %s ", what, hex, arch ? arch : "-");
  /* the header's first two lines ("Generated by flexc V from FILE, kernel K"; dtype, dims, mask) */
  const char *p = strncmp(source, "/* ", 3) ? source : source + 3;
  for (int nl = 0; *p && nl < 2 && n < (int)sizeof line - 2; p++) {
    if (*p == '\n') nl++, p += strspn(p + 1, " *");
    line[n++] = *p == '\n' ? ' ' : *p;
  }
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, line, (size_t)n);
  (void)w;
  close(fd);
}

flex_status rt_cache_compile(const char *source, size_t source_len, const char *options,
                             const char *arch, void **image, size_t *image_len, bool *hit) {
  char ver[64];
  uint8_t key[RT_SHA256_BYTES];
  flex_status st = nvrtc_version(ver, sizeof ver);
  if (st) return st;
  rt_cache_key(key, source, source_len, options, ver, arch);
  const char *where;
  *hit = cache_get(key, image, image_len, &where);
  log_lookup(where, key, arch, source);
  if (*hit) return FLEX_OK;
  CHECK(source[source_len] == 0); /* NVRTC takes a C string */
  st = nvrtc_compile(source, arch, image, image_len);
  if (!st) rt_cache_put(key, *image, *image_len);
  return st;
}

/* A module loaded from one image on one device. */
typedef struct Loaded {
  struct Loaded *next;
  uint8_t digest[RT_SHA256_BYTES]; /* SHA-256 of the image */
  int device;
  RtCuModule mod;
} Loaded;

static pthread_mutex_t loaded_lock = PTHREAD_MUTEX_INITIALIZER; /* guards `loaded` */
static Loaded *loaded;

flex_status rt_cuda_module_for(const char *source, size_t source_len, const char *options,
                               const char *arch, int device, RtCuModule *out) {
  void *image = NULL;
  size_t len = 0;
  bool hit;
  flex_status st = rt_cache_compile(source, source_len, options, arch, &image, &len, &hit);
  if (st) return st;
  uint8_t digest[RT_SHA256_BYTES];
  rt_sha256(image, len, digest);
  /* Held across the load so two threads never load the same image twice. */
  pthread_mutex_lock(&loaded_lock);
  Loaded *l = loaded;
  while (l && (l->device != device || memcmp(l->digest, digest, sizeof digest) != 0)) l = l->next;
  if (!l) {
    RtCuModule m;
    st = rt_drv_module_load(&m, image);
    if (!st) {
      l = base_alloc(sizeof *l);
      memcpy(l->digest, digest, sizeof digest);
      l->device = device;
      l->mod = m;
      l->next = loaded;
      loaded = l;
    }
  }
  if (l) *out = l->mod;
  pthread_mutex_unlock(&loaded_lock);
  base_free(image);
  return st;
}
