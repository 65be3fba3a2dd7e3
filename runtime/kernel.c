/* kernel.c: the flex.h entry points about kernels themselves: loading (the
 * front half of the pipeline, ir/front.c), describing them
 * (flex_kernel_get_info), the module a backward with some buffer gradients
 * runs (rt_kernel_module), and what the compiler makes of them (check, IR
 * text, mask explanations; CUDA, PTX and cubins are api/emit.c's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "ir/interval.h"
#include "runtime/rt.h"
#include "runtime/tensor.h"

/* ---- loading ------------------------------------------------------------------- */

/* A file's text, or FLEX_ERR_INVALID naming it. */
static flex_status read_text(const char *path, char **text, size_t *len) {
  int e = base_read_file(path, text, len);
  if (e) return rt_err(FLEX_ERR_INVALID, "%s: error: cannot read file: %s", path, strerror(e));
  return FLEX_OK;
}

/* The diagnostics of `d` as the call's error. */
static flex_status diags_status(Diags *d) {
  rt_err(FLEX_ERR_INVALID, "%s", d->text.data ? d->text.data : "invalid kernel source");
  diag_free(d);
  return FLEX_ERR_INVALID;
}

static flex_status do_kernel_from_source(flex_kernel **out, const char *name, const char *text,
                                    size_t len, const char *kernel) {
  if (!out) return rt_err(FLEX_ERR_INVALID, "flex_kernel_from_source: out is NULL");
  *out = NULL;
  if (!text) return rt_err(FLEX_ERR_INVALID, "flex_kernel_from_source: text is NULL");
  /* Source positions are 32-bit; a larger length is also a caller's slip
   * (such as (size_t)-1 for "NUL-terminated"), never a real file. */
  if (len > INT32_MAX)
    return rt_err(FLEX_ERR_INVALID,
                  "%s: error: source of %zu bytes is too large (expected at most %d bytes)",
                  name ? name : "<source>", len, INT32_MAX);
  flex_kernel *k = base_alloc(sizeof *k);
  k->src.path = arena_strndup(&k->arena, name ? name : "<source>", strlen(name ? name : "<source>"));
  char *copy = arena_alloc(&k->arena, len + 1);
  memcpy(copy, text, len);
  copy[len] = 0;
  k->src.text = copy;
  k->src.len = len;
  Diags d;
  memset(&d, 0, sizeof d);
  d.src = &k->src;
  k->mod = ir_front(&k->arena, &k->src, kernel, true, NULL, &d);
  if (!k->mod) {
    flex_kernel_free(k);
    return diags_status(&d);
  }
  diag_free(&d);
  CHECK(k->mod->joint != NULL);
  *out = k;
  return FLEX_OK;
}

flex_status flex_kernel_from_source(flex_kernel **out, const char *name, const char *text,
                                    size_t len, const char *kernel) {
  RT_TRY(do_kernel_from_source(out, name, text, len, kernel));
}

static flex_status do_kernel_load(flex_kernel **out, const char *path, const char *kernel) {
  if (!out) return rt_err(FLEX_ERR_INVALID, "flex_kernel_load: out is NULL");
  *out = NULL;
  if (!path) return rt_err(FLEX_ERR_INVALID, "flex_kernel_load: path is NULL");
  char *text;
  size_t len;
  flex_status st = read_text(path, &text, &len);
  if (st) return st;
  st = flex_kernel_from_source(out, path, text, len, kernel);
  base_free(text);
  return st;
}

flex_status flex_kernel_load(flex_kernel **out, const char *path, const char *kernel) {
  RT_TRY(do_kernel_load(out, path, kernel));
}

/* k->mod with the joint (and sink gradient) of one set of wanted buffer gradients. */
typedef struct RtVariant {
  struct RtVariant *next;
  bool *keep;          /* by buffer slot: its gradient is added (only slots the joint adds into) */
  Arena arena;         /* owns keep and joint */
  IrModule mod;        /* k->mod but for joint */
} RtVariant;

void flex_kernel_free(flex_kernel *k) {
  if (!k) return;
  for (RtVariant *v = atomic_load(&k->variants), *next; v; v = next) {
    next = v->next;
    arena_free(&v->arena);
    base_free(v);
  }
  arena_free(&k->arena);
  base_free(k);
}

/* ---- the joint a backward runs ------------------------------------------------------ */

const IrModule *rt_kernel_module(const flex_kernel *k, const bool *keep) {
  const IrModule *m = k->mod;
  int nb = m->nbuffers;
  bool dropped = false;
  const IrFunc *grads[2] = {m->joint, m->sink_grad};
  for (int g = 0; g < 2 && grads[g]; g++)
    for (int i = 0; i < grads[g]->n; i++)
      if (grads[g]->inst[i].op == IR_ACCUM) dropped = dropped || !keep[grads[g]->inst[i].aux];
  if (!dropped) return m;
  /* Compared on the slots the gradients add into: the others change nothing. */
  bool *adds = base_alloc((size_t)nb + 1);
  for (int g = 0; g < 2 && grads[g]; g++)
    for (int i = 0; i < grads[g]->n; i++)
      if (grads[g]->inst[i].op == IR_ACCUM) adds[grads[g]->inst[i].aux] = keep[grads[g]->inst[i].aux];
  flex_kernel *mk = (flex_kernel *)k; /* the variants are the kernel's cache */
  for (RtVariant *v = atomic_load(&mk->variants); v; v = v->next)
    if (!memcmp(v->keep, adds, (size_t)nb)) {
      base_free(adds);
      return &v->mod;
    }
  /* Built whole before it is published; two threads racing both publish
   * one, which is harmless (the list only grows). */
  RtVariant *v = base_alloc(sizeof *v);
  v->keep = arena_alloc(&v->arena, (size_t)nb + 1);
  memcpy(v->keep, adds, (size_t)nb);
  base_free(adds);
  v->mod = *m;
  v->mod.arena = &v->arena;
  v->mod.joint = ir_drop_accums(&v->arena, m->joint, v->keep);
  if (m->sink_grad) v->mod.sink_grad = ir_drop_accums(&v->arena, m->sink_grad, v->keep);
  base_keep(v); /* the kernel's from now on, whatever becomes of this call */
  arena_keep(&v->arena);
  v->next = atomic_load(&mk->variants);
  while (!atomic_compare_exchange_weak(&mk->variants, &v->next, v)) {}
  return &v->mod;
}

/* ---- what a kernel reads ------------------------------------------------------------ */

static flex_status do_kernel_get_info(const flex_kernel *k, flex_kernel_info *out) {
  if (!k || !out) return rt_err(FLEX_ERR_INVALID, "flex_kernel_get_info: NULL argument");
  const IrModule *m = k->mod;
  flex_kernel *mk = (flex_kernel *)k; /* the info arrays live in the kernel's arena */
  if (!mk->info_params && m->nparams) {
    mk->info_params = arena_alloc(&mk->arena, sizeof *mk->info_params * (size_t)m->nparams);
    for (int i = 0; i < m->nparams; i++) {
      const IrParam *p = &m->params[i];
      flex_param_info *o = &mk->info_params[i];
      o->name = p->id;
      o->type = p->type == IT_F32 ? FLEX_TYPE_FLOAT : FLEX_TYPE_INT;
      o->has_default = p->has_default;
      o->default_value = !p->has_default ? 0 : p->type == IT_F32 ? p->def.f : (double)p->def.i;
    }
  }
  if (!mk->info_buffers && m->nbuffers) {
    mk->info_buffers = arena_alloc(&mk->arena, sizeof *mk->info_buffers * (size_t)m->nbuffers);
    for (int i = 0; i < m->nbuffers; i++) {
      const IrBuffer *b = &m->buffers[i];
      flex_buffer_info *o = &mk->info_buffers[i];
      o->name = b->id;
      o->dtype = rt_buffer_dtype(b->dtype);
      o->ndim = b->ndims;
      for (int d = 0; d < b->ndims && d < FLEX_MAX_DIMS; d++) {
        o->extent[d] = b->dims[d].fixed >= 0 ? b->dims[d].fixed : -1;
        o->dim_name[d] = b->dims[d].fixed >= 0 ? NULL : m->sizes[b->dims[d].size].id;
      }
      o->grad = b->grad;
      o->sorted = b->sorted;
      o->used = b->used;
    }
  }
  memset(out, 0, sizeof *out);
  out->name = m->kernel;
  out->file = k->src.path;
  out->score = m->score_is_identity ? NULL : m->score->name;
  out->mask = m->mask ? m->mask->name : NULL;
  out->sink = m->sink ? m->sink->name : NULL;
  CgOptions o;
  char err[8];
  bool opts = cg_options_init(&o, m, CG_FP32, 64, 64, CG_SM80, true, err, sizeof err);
  out->features = (m->score_is_identity ? 0u : FLEX_FEATURE_SCORE) |
                  (m->mask ? FLEX_FEATURE_MASK : 0u) |
                  (opts && o.grad_buffers ? FLEX_FEATURE_GRAD_BUFFERS : 0u) |
                  (m->mask && ir_interval_device_decidable(m) ? FLEX_FEATURE_IMPLICIT_MASK : 0u) |
                  (opts && o.ds_is_dt ? FLEX_FEATURE_DS_IS_DT : 0u) |
                  (m->sink ? FLEX_FEATURE_SINK : 0u);
  out->nparams = m->nparams;
  out->params = mk->info_params;
  out->nbuffers = m->nbuffers;
  out->buffers = mk->info_buffers;
  return FLEX_OK;
}

flex_status flex_kernel_get_info(const flex_kernel *k, flex_kernel_info *out) {
  RT_TRY(do_kernel_get_info(k, out));
}

/* ---- explain a mask ------------------------------------------------------------------ */

static flex_status do_mask_explain(const flex_kernel *k, const int *shape, char **text) {
  if (!k || !text) return rt_err(FLEX_ERR_INVALID, "flex_mask_explain: NULL argument");
  const IrModule *m = k->mod;
  Buf b = {0};
  buf_printf(&b, "kernel %s: ", m->kernel);
  if (!m->mask) {
    buf_printf(&b, "no mask: every block is visited, no BlockMask is built\n");
    *text = b.data;
    return FLEX_OK;
  }
  buf_printf(&b, "mask %s\n", m->mask->name);
  /* The first read of a buffer the analysis cannot bound (not `sorted`). */
  const IrBuffer *blocker = NULL;
  for (int i = 0; i <= m->mask->ret && !blocker; i++) {
    const IrInst *in = &m->mask->inst[i];
    if (in->op == IR_LOAD && !m->buffers[in->aux].sorted) blocker = &m->buffers[in->aux];
  }
  if (ir_interval_decidable(m)) {
    buf_printf(&b, "  blocks: decided by interval analysis (no element-wise evaluation)\n");
    buf_printf(&b, "  %s\n", ir_interval_device_decidable(m)
                                 ? "the kernels classify their tiles themselves: no BlockMask per call"
                                 : "the mask has float values, which the device classifier treats as "
                                   "unknown: each call builds a BlockMask on the device");
  } else {
    buf_printf(&b, "  blocks: NOT decidable by interval analysis: it reads buffer '%s'",
               blocker ? blocker->id : "?");
    if (blocker) {
      buf_printf(&b, " (%s, %d-D, not `sorted`", dtype_name(blocker->dtype), blocker->ndims);
      if (k->src.text && blocker->loc.start <= k->src.len) {
        int line = 1;
        for (uint32_t c = 0; c < blocker->loc.start; c++) line += k->src.text[c] == '\n';
        buf_printf(&b, ", declared at %s:%d", k->src.path ? k->src.path : "?", line);
      }
      buf_printf(&b, ")");
    }
    buf_printf(&b, ", whose values bound nothing over a range of indices\n");
    bool ub = ir_interval_uses_arg(m, ARG_B), uh = ir_interval_uses_arg(m, ARG_H);
    buf_printf(&b, "  cost: every call builds a BlockMask element by element: one mask evaluation "
                   "per element of every block the analysis leaves open, up to %s%sQ_LEN*KV_LEN "
                   "per call%s", ub ? "B*" : "", uh ? "H*" : "",
               ub || uh ? "" : " (the mask reads neither b nor h: one mask serves every batch and head)");
    if (shape) {
      double n = (ub ? (double)shape[0] : 1.0) * (uh ? (double)shape[1] : 1.0) * shape[2] * shape[3];
      buf_printf(&b, " (%.3g evaluations at B=%d H=%d Q_LEN=%d KV_LEN=%d)", n, shape[0], shape[1],
                 shape[2], shape[3]);
    }
    buf_printf(&b, "\n  to make it decidable, encode the data as a `sorted` buffer of positions "
                   "(docs/blockmask.md, \"Decidable encodings\")\n");
  }
  *text = b.data;
  return FLEX_OK;
}

flex_status flex_mask_explain(const flex_kernel *k, const int *shape, char **text) {
  RT_TRY(do_mask_explain(k, shape, text));
}

/* ---- check, IR ------------------------------------------------------------------------ */

/* A .score file read for the front end: its source, diagnostics and arena. */
typedef struct FileFront {
  Source src;
  Diags d;
  Arena a;
  char *text;
} FileFront;

static flex_status front_open(FileFront *f, const char *path) {
  memset(f, 0, sizeof *f);
  size_t len;
  flex_status st = read_text(path, &f->text, &len);
  if (st) return st;
  f->src = (Source){.path = path, .text = f->text, .len = len};
  f->d.src = &f->src;
  return FLEX_OK;
}

/* The call's status: ok, or the diagnostics as its error. */
static flex_status front_close(FileFront *f, bool ok) {
  flex_status st = ok ? FLEX_OK : diags_status(&f->d);
  if (ok) diag_free(&f->d);
  arena_free(&f->a);
  base_free(f->text);
  return st;
}

static flex_status do_check_file(const char *path) {
  if (!path) return rt_err(FLEX_ERR_INVALID, "flex_check_file: path is NULL");
  FileFront f;
  flex_status st = front_open(&f, path);
  if (st) return st;
  return front_close(&f, !ir_front_check(&f.a, &f.src, &f.d));
}

flex_status flex_check_file(const char *path) {
  RT_TRY(do_check_file(path));
}

const char *flex_ir_pass_names(void) { return ir_pass_names(); }

/* Whether `name` is one of the passes ir_pass_names() lists. */
static bool known_pass(const char *name) {
  size_t n = strlen(name);
  for (const char *s = ir_pass_names(); *s;) {
    size_t k = strcspn(s, ",");
    if (k == n && !strncmp(s, name, n)) return true;
    s += k;
    while (*s == ',' || *s == ' ') s++;
  }
  return false;
}

static flex_status do_ir_text(char **text, const char *path, const char *kernel, bool grad,
                         const char *after) {
  if (!text || !path) return rt_err(FLEX_ERR_INVALID, "flex_ir_text: NULL argument");
  *text = NULL;
  if (after && !known_pass(after))
    return rt_err(FLEX_ERR_INVALID, "unknown pass '%s' (passes: %s)", after, ir_pass_names());
  FileFront f;
  flex_status st = front_open(&f, path);
  if (st) return st;
  IrModule *m = ir_front(&f.a, &f.src, kernel, grad, after, &f.d);
  if (m) {
    Buf out = {0};
    ir_print(&out, m);
    *text = out.data ? out.data : base_strdup("");
  }
  return front_close(&f, m != NULL);
}

flex_status flex_ir_text(char **text, const char *path, const char *kernel, bool grad,
                         const char *after) {
  RT_TRY(do_ir_text(text, path, kernel, grad, after));
}

void flex_free(void *p) { base_free(p); }

