/* callgraph.c: the calls between a program's functions, checked in one walk.
 *
 * Calls are inlined, so a call cycle is an error, and so are call chains
 * deeper than FE_MAX_CALL_DEPTH and functions whose inlined body has more
 * than FE_MAX_INLINED expression nodes (lowering would exhaust its guard, or
 * memory, instead). One iterative depth-first walk over the functions in
 * source order finds all three: a back edge is a cycle; every other edge
 * adds the callee's chain depth and inlined size to the caller's once the
 * callee is done.
 */
#include <string.h>

#include "fe_internal.h"

#define FE_MAX_CALL_DEPTH 200
#define FE_MAX_INLINED (1 << 20)

/* The functions and their calls, grouped by caller. A function's slot is
 * its Decl.index after the functions of the kinds before its own. */
typedef struct Graph {
  Decl **fn;      /* by slot */
  int n;          /* functions */
  int base[D_KERNEL + 1]; /* first slot of each function kind */
  int *first;     /* calls of slot v: out[first[v] .. first[v + 1]) */
  const FeCall **out; /* every call, by caller, in source order */
  int *to;        /* slot of out[i]->to */
} Graph;

static int slot(const Graph *g, const Decl *d) {
  int s = g->base[d->kind] + d->index;
  CHECK(fe_is_fn(d) && s >= 0 && s < g->n && g->fn[s] == d);
  return s;
}

static void build(Arena *a, const Program *p, const FeCall *calls, int ncalls, Graph *g) {
  memset(g, 0, sizeof *g);
  int count[D_KERNEL + 1] = {0};
  for (int i = 0; i < p->ndecls; i++) count[p->decls[i]->kind]++;
  const DeclKind fns[] = {D_SCORE, D_MASK, D_SINK, D_FUNC};
  for (int k = 0; k < 4; k++) {
    g->base[fns[k]] = g->n;
    g->n += count[fns[k]];
  }
  g->fn = arena_alloc(a, sizeof(Decl *) * (size_t)(g->n + 1));
  for (int i = 0; i < p->ndecls; i++)
    if (fe_is_fn(p->decls[i])) g->fn[g->base[p->decls[i]->kind] + p->decls[i]->index] = p->decls[i];
  g->first = arena_alloc(a, sizeof(int) * (size_t)(g->n + 2));
  memset(g->first, 0, sizeof(int) * (size_t)(g->n + 2));
  for (int e = 0; e < ncalls; e++) g->first[slot(g, calls[e].from) + 2]++;
  for (int v = 0; v < g->n; v++) g->first[v + 2] += g->first[v + 1];
  g->out = arena_alloc(a, sizeof(FeCall *) * (size_t)(ncalls + 1));
  g->to = arena_alloc(a, sizeof(int) * (size_t)(ncalls + 1));
  for (int e = 0; e < ncalls; e++) { /* stable counting sort by caller */
    int at = g->first[slot(g, calls[e].from) + 1]++;
    g->out[at] = &calls[e];
    g->to[at] = slot(g, calls[e].to);
  }
}

/* Expression nodes of `e`, not counting what its calls inline. Below
 * FE_MAX_DEPTH nothing is counted: such a tree is already an error, and the
 * cap keeps the recursion off the end of the stack. */
static int64_t expr_nodes(const Expr *e, int depth) {
  int64_t n = 1;
  if (depth > FE_MAX_DEPTH) return n;
  switch (e->kind) {
  case EX_UNARY: n += expr_nodes(e->op.a, depth + 1); break;
  case EX_BINARY: n += expr_nodes(e->op.a, depth + 1) + expr_nodes(e->op.b, depth + 1); break;
  case EX_COND: n += expr_nodes(e->cond.c, depth + 1) + expr_nodes(e->cond.a, depth + 1) + expr_nodes(e->cond.b, depth + 1); break;
  case EX_CALL:
    for (int i = 0; i < e->call.nargs; i++) n += expr_nodes(e->call.args[i], depth + 1);
    break;
  case EX_INDEX:
    for (int i = 0; i < e->index.nargs; i++) n += expr_nodes(e->index.args[i], depth + 1);
    break;
  default: break;
  }
  return n;
}

static int64_t fn_nodes(const Decl *f) {
  int64_t n = f->fn.ret ? expr_nodes(f->fn.ret, 0) : 0;
  for (int i = 0; i < f->fn.nlets; i++) n += expr_nodes(f->fn.lets[i]->value, 0);
  return n;
}

/* A back edge e from the top of the stack to node[at]: the cycle is
 * node[at..top] then back. Reported once per function that heads one:
 * "recursion: 'f' calls itself (through 'g', 'h')" at f's call. */
static void report_cycle(Diags *d, const Graph *g, const int *node, const int *next, int at,
                         int top, bool *reported) {
  if (reported[node[at]]) return;
  Buf b = {0};
  for (int k = at + 1; k <= top; k++) {
    buf_printf(&b, "%s'%s'", k == at + 1 ? " (through " : ", ", g->fn[node[k]]->id);
    reported[node[k]] = true;
  }
  if (top > at) buf_puts(&b, ")");
  reported[node[at]] = true;
  /* the call node[at] made last: next[at] was advanced past it */
  const FeCall *c = g->out[next[at] - 1];
  diag_error(d, c->loc, "recursion: '%s' calls itself%s", g->fn[node[at]]->id, b.data ? b.data : "");
  buf_free(&b);
}

void fe_check_calls(Arena *a, const Program *p, Diags *d, const FeCall *calls, int ncalls) {
  Graph g;
  build(a, p, calls, ncalls, &g);
  size_t n1 = (size_t)g.n + 1;
  char *color = arena_alloc(a, n1); /* 0 new, 1 on the stack, 2 done */
  bool *reported = arena_alloc(a, n1);
  int *node = arena_alloc(a, sizeof(int) * n1), *next = arena_alloc(a, sizeof(int) * n1);
  int *pos = arena_alloc(a, sizeof(int) * n1); /* stack position of a node on the stack */
  int *depth = arena_alloc(a, sizeof(int) * n1);
  int64_t *size = arena_alloc(a, sizeof(int64_t) * n1);
  memset(color, 0, n1);
  memset(reported, 0, n1);
  bool cycle = false;
  for (int r = 0; r < g.n; r++) {
    if (color[r]) continue;
    int top = 0;
    node[0] = r;
    next[0] = g.first[r];
    pos[r] = 0;
    color[r] = 1;
    depth[r] = 0;
    size[r] = fn_nodes(g.fn[r]);
    while (top >= 0) {
      int v = node[top], e = next[top]++;
      if (e >= g.first[v + 1]) {
        color[v] = 2;
        if (--top >= 0) { /* the caller takes the callee's measures */
          int u = node[top];
          if (depth[v] + 1 > depth[u]) depth[u] = depth[v] + 1;
          size[u] += size[v];
          if (size[u] > FE_MAX_INLINED) size[u] = FE_MAX_INLINED + 1;
        }
        continue;
      }
      int w = g.to[e];
      if (color[w] == 0) {
        top++;
        node[top] = w;
        next[top] = g.first[w];
        pos[w] = top;
        color[w] = 1;
        depth[w] = 0;
        size[w] = fn_nodes(g.fn[w]);
      } else if (color[w] == 1) {
        cycle = true;
        report_cycle(d, &g, node, next, pos[w], top, reported);
      } else {
        if (depth[w] + 1 > depth[v]) depth[v] = depth[w] + 1;
        size[v] += size[w];
        if (size[v] > FE_MAX_INLINED) size[v] = FE_MAX_INLINED + 1;
      }
    }
  }
  if (cycle) return; /* the measures left the cycles' calls out */
  for (int v = 0; v < g.n; v++)
    if (depth[v] > FE_MAX_CALL_DEPTH) {
      diag_error(d, g.fn[v]->loc,
                 "calls nested too deeply: '%s' starts a chain of %d calls (at most %d; calls are inlined)",
                 g.fn[v]->id, depth[v], FE_MAX_CALL_DEPTH);
      break;
    }
  for (int v = 0; v < g.n; v++)
    if (size[v] > FE_MAX_INLINED) {
      diag_error(d, g.fn[v]->loc,
                 "'%s' is too large once its calls are inlined (more than %d expression nodes)",
                 g.fn[v]->id, FE_MAX_INLINED);
      break;
    }
}
