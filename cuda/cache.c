/* cache.c: a cubin's store key, NVRTC on a miss, module loading (see
 * cache.h). */
#include "cuda/cache.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "cuda/nvrtc.h"
#include "runtime/embedded.h"
#include "runtime/rt.h"

void rt_cache_key(uint8_t key[BASE_STORE_KEY_BYTES], const char *source, size_t source_len,
                  const char *options, const char *nvrtc_version, const char *arch) {
  BaseSha256 s;
  base_store_key_init(&s, BASE_STORE_CUBIN);
  base_store_key_add(&s, source, source_len);
  /* The embedded templates are part of every translation unit. */
  base_store_key_add(&s, rt_embedded_digest, sizeof rt_embedded_digest);
  base_store_key_str(&s, options);
  for (int i = 0; rt_nvrtc_flags[i]; i++) base_store_key_str(&s, rt_nvrtc_flags[i]);
  base_store_key_str(&s, nvrtc_version);
  base_store_key_str(&s, arch);
  base_store_key_final(&s, key);
}

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

/* The key of `source` for this NVRTC. */
static flex_status cubin_key(uint8_t key[BASE_STORE_KEY_BYTES], const char *source,
                             size_t source_len, const char *options, const char *arch) {
  char ver[64];
  flex_status st = nvrtc_version(ver, sizeof ver);
  if (!st) rt_cache_key(key, source, source_len, options, ver, arch);
  return st;
}

/* The image of `key`: from the store, else compiled and stored. */
static flex_status image_for(const uint8_t key[BASE_STORE_KEY_BYTES], const char *source,
                             size_t source_len, const char *arch, void **image, size_t *image_len,
                             bool *hit) {
  *hit = base_store_get(BASE_STORE_CUBIN, key, image, image_len);
  if (*hit) return FLEX_OK;
  CHECK(source[source_len] == 0); /* NVRTC takes a C string */
  flex_status st = nvrtc_compile(source, arch, image, image_len);
  if (!st) base_store_put(BASE_STORE_CUBIN, key, *image, *image_len);
  return st;
}

flex_status rt_cache_compile(const char *source, size_t source_len, const char *options,
                             const char *arch, void **image, size_t *image_len, bool *hit) {
  uint8_t key[BASE_STORE_KEY_BYTES];
  flex_status st = cubin_key(key, source, source_len, options, arch);
  return st ? st : image_for(key, source, source_len, arch, image, image_len, hit);
}

/* A module loaded from one image on one device: what is the process's own
 * (the store holds the image). */
typedef struct Loaded {
  struct Loaded *next;
  uint8_t key[BASE_STORE_KEY_BYTES]; /* the image's store key */
  int device;
  RtCuModule mod;
} Loaded;

static pthread_mutex_t loaded_lock = PTHREAD_MUTEX_INITIALIZER; /* guards `loaded` */
static Loaded *loaded;

/* The module of `key` on `device`, if loaded (under loaded_lock). */
static Loaded *find_loaded(const uint8_t *key, int device) {
  Loaded *l = loaded;
  while (l && (l->device != device || memcmp(l->key, key, BASE_STORE_KEY_BYTES) != 0)) l = l->next;
  return l;
}

flex_status rt_cuda_module_for(const char *source, size_t source_len, const char *options,
                               const char *arch, int device, RtCuModule *out) {
  uint8_t key[BASE_STORE_KEY_BYTES];
  flex_status st = cubin_key(key, source, source_len, options, arch);
  if (st) return st;
  pthread_mutex_lock(&loaded_lock); /* nothing allocates while it is held */
  Loaded *l = find_loaded(key, device);
  if (l) *out = l->mod;
  pthread_mutex_unlock(&loaded_lock);
  if (l) return FLEX_OK;
  /* Not loaded: the image from the store or NVRTC, outside the lock so that
   * other threads' loaded modules are not held up by a compile. */
  void *image = NULL;
  size_t len = 0;
  bool hit;
  st = image_for(key, source, source_len, arch, &image, &len, &hit);
  if (st) return st;
  Loaded *n = base_alloc(sizeof *n);
  memcpy(n->key, key, sizeof key);
  n->device = device;
  /* Held across the load so two threads never load the same image twice. */
  BaseTry *held = base_try_hold(); /* no exhaustion jump may leave the lock held */
  pthread_mutex_lock(&loaded_lock);
  if ((l = find_loaded(key, device))) {
    *out = l->mod;
  } else if (!(st = rt_drv_module_load(&n->mod, image))) {
    n->next = loaded;
    loaded = n;
    *out = n->mod;
    n = NULL;
  }
  pthread_mutex_unlock(&loaded_lock);
  base_try_restore(held);
  base_free(n);
  base_free(image);
  return st;
}
