/* kernel.c: fe_pick_kernel(): which kernel a run means (docs/language.md "Which
 * kernel a file means": the named kernel block, the only one, or an
 * implicit `default` of the file's only score, mask and sink). */
#include <string.h>

#include "frontend.h"

/* "a, b and c": the names of the program's decls of one kind. */
static int list_kind(const Program *p, DeclKind k, Buf *out) {
  int n = 0;
  for (int i = 0; i < p->ndecls; i++)
    if (p->decls[i]->kind == k && !(k == D_KERNEL && p->decls[i]->kernel.implicit)) n++;
  int seen = 0;
  for (int i = 0; i < p->ndecls; i++) {
    Decl *d = p->decls[i];
    if (d->kind != k || (k == D_KERNEL && d->kernel.implicit)) continue;
    seen++;
    buf_printf(out, "%s'%s'", seen == 1 ? "" : seen == n ? " and " : ", ", d->id);
  }
  return n;
}

/* The only decl of kind `k` (NULL if none); reports an error listing them
 * when there are several, at the second one (where the choice begins). */
static bool only_one(const Program *p, DeclKind k, Decl **out, Diags *d) {
  Buf names = {0};
  int n = list_kind(p, k, &names);
  *out = NULL;
  const Decl *second = NULL;
  for (int i = 0, seen = 0; n > 1 && !second && i < p->ndecls; i++)
    if (p->decls[i]->kind == k && ++seen == 2) second = p->decls[i];
  if (second)
    diag_error(d, second->loc, "the file has %d %s functions (%s) and no kernel block; add a kernel block that picks one",
               n, k == D_SCORE ? "score" : k == D_MASK ? "mask" : "sink", names.data);
  for (int i = 0; n == 1 && i < p->ndecls; i++)
    if (p->decls[i]->kind == k) *out = p->decls[i];
  buf_free(&names);
  return n <= 1;
}

/* Synthesise the implicit `default` kernel and append it to the program. */
static Decl *implicit_kernel(Arena *a, Program *p, Decl *score, Decl *mask, Decl *sink) {
  Decl *k = arena_alloc(a, sizeof *k);
  k->kind = D_KERNEL;
  k->id = "default";
  k->kernel.implicit = true;
  if (score) {
    k->kernel.score = score->id;
    k->kernel.score_loc = score->loc;
    k->kernel.score_fn = score;
  }
  if (mask) {
    Expr *e = arena_alloc(a, sizeof *e);
    e->kind = EX_NAME;
    e->loc = mask->loc;
    e->type = TY_BOOL;
    e->name.id = mask->id;
    e->name.ref = REF_MASK;
    e->name.decl = mask;
    k->kernel.mask = e;
  }
  if (sink) {
    k->kernel.sink = sink->id;
    k->kernel.sink_loc = sink->loc;
    k->kernel.sink_fn = sink;
  }
  Decl **decls = arena_alloc(a, sizeof(Decl *) * (size_t)(p->ndecls + 1));
  if (p->ndecls) memcpy(decls, p->decls, sizeof(Decl *) * (size_t)p->ndecls);
  decls[p->ndecls++] = k;
  p->decls = decls;
  return k;
}

Decl *fe_pick_kernel(Arena *a, Program *p, const char *name, Diags *d) {
  for (int i = 0; i < p->ndecls; i++) /* picked before: reuse it */
    if (p->decls[i]->kind == D_KERNEL && p->decls[i]->kernel.implicit &&
        (!name || !strcmp(name, "default")))
      return p->decls[i];
  Buf names = {0};
  int nk = list_kind(p, D_KERNEL, &names);
  Decl *pick = NULL;
  if (name) {
    for (int i = 0; i < p->ndecls && !pick; i++)
      if (p->decls[i]->kind == D_KERNEL && !strcmp(p->decls[i]->id, name)) pick = p->decls[i];
    if (!pick && nk == 0 && strcmp(name, "default") != 0)
      diag_error_noloc(d, "no kernel named '%s'; the file has no kernel blocks (use 'default' or no --kernel)", name);
    else if (!pick && nk > 0)
      diag_error_noloc(d, "no kernel named '%s'; the file's kernels are %s", name, names.data);
    if (pick || nk > 0 || strcmp(name, "default") != 0) {
      buf_free(&names);
      return pick;
    }
  } else if (nk == 1) {
    for (int i = 0; i < p->ndecls && !pick; i++)
      if (p->decls[i]->kind == D_KERNEL) pick = p->decls[i];
  } else if (nk > 1) {
    diag_error_noloc(d, "the file has %d kernels (%s); pick one with --kernel NAME", nk, names.data);
  }
  buf_free(&names);
  if (nk > 0) return pick;
  Decl *score, *mask, *sink;
  bool ok = only_one(p, D_SCORE, &score, d);
  ok = only_one(p, D_MASK, &mask, d) && ok;
  ok = only_one(p, D_SINK, &sink, d) && ok;
  return ok ? implicit_kernel(a, p, score, mask, sink) : NULL;
}
