/* testlib_mutate.c: the kernel templates as the library embeds them, and
 * one-place text edits of them, for the tests that mutate a kernel and
 * require the emulator to catch it (check_emu_broken, check_emu_sm90_broken). */
#include <string.h>

#include "runtime/embedded.h"
#include "testlib.h"

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
