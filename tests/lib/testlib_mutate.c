/* testlib_mutate.c: the kernel templates as the library embeds them,
 * one-place text edits of them, and the harness of the tests that mutate
 * a kernel and require the emulator to catch it (testlib_mutant.h:
 * check_emu_broken, check_emu_sm90_broken). */
#include <stdio.h>
#include <string.h>

#include "runtime/embedded.h"
#include "testlib_mutant.h"

const char *tl_embedded(const char *name) {
  for (const EmbeddedFile *e = rt_embedded; e->name; e++)
    if (!strcmp(e->name, name)) return e->text;
  ck_abort_msg("no embedded template %s", name);
  return NULL;
}

void tl_replace_once(Buf *out, const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  ck_assert_msg(at, "mutation text not found: %s", from);
  ck_assert_msg(!strstr(at + 1, from), "mutation text found twice: %s", from);
  buf_put(out, text, (size_t)(at - text));
  buf_puts(out, to);
  buf_puts(out, at + strlen(from));
}

char *tl_mutant_source(const char *gen, const char *at, const char *file, const char *from,
                       const char *to) {
  Buf edit = {0}, out = {0};
  if (!file) {
    buf_puts(&out, gen);
    return out.data;
  }
  tl_replace_once(&edit, tl_embedded(file), from, to);
  buf_puts(&edit, "\n");
  buf_puts(&edit, at);
  tl_replace_once(&out, gen, at, edit.data);
  buf_free(&edit);
  return out.data;
}

EmuModule *tl_mutant_build(const char *src, bool race, const char *what) {
  EmuBuildOpts bo = {.racecheck = race};
  Buf log = {0};
  EmuModule *m = NULL;
  flex_status st = emu_module_get(&m, src, &bo, &log);
  ck_assert_msg(st == FLEX_OK, "%s: the mutated source does not build:\n%s", what, log.data ? log.data : "");
  buf_free(&log);
  return m;
}

flex_status tl_mutant_launch(EmuModule *m, const char *name, const void *params, CgLaunch g,
                             const EmuRange *r, int nr, char *msg) {
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = name;
  L.params = params;
  L.grid = (EmuDim){g.grid[0], g.grid[1], g.grid[2]};
  L.block = (EmuDim){g.block[0], g.block[1], g.block[2]};
  L.smem_bytes = g.smem;
  L.ranges = r;
  L.nranges = nr;
  flex_status st = emu_module_launch(m, &L, NULL);
  snprintf(msg, EMU_ERR_LEN, "%s", L.error); /* the emulator's message names the kernel */
  return st;
}

void tl_mutant_expect(const char *what, TlDetect detect, double tol, TlMutantRun run, const void *ctx) {
  char msg[EMU_ERR_LEN];
  double err;
  flex_status st;
  if (detect == TL_PASS) { /* the control, plain and race-checked */
    for (int race = 0; race < 2; race++) {
      st = run(ctx, race, msg, &err);
      ck_assert_msg(st == FLEX_OK, "%s: %s", what, msg);
      ck_assert_msg(err < tol, "%s: error %g", what, err);
    }
    return;
  }
  st = run(ctx, detect == TL_RACE, msg, &err);
  bool caught = detect == TL_RACE     ? st != FLEX_OK && strstr(msg, "shared memory race")
                : detect == TL_BOUNDS ? st != FLEX_OK && strstr(msg, "outside every allocation")
                : detect == TL_FAILS  ? st != FLEX_OK
                                      : st != FLEX_OK || !(err < tol);
  ck_assert_msg(caught, "%s went undetected (status %d, error %g): %s", what, st, err, msg);
}
