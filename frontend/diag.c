/* diag.c: source positions and diagnostics.
 *
 *   FILE:LINE:COL: error: MESSAGE
 *       the source line
 *           ^~~~~
 *
 * Locations are byte offsets; they become 1-based line and byte column only
 * here, when something is printed. */
#include <stdio.h>
#include <string.h>

#include "frontend.h"

/* Errors recorded before "too many errors; stopping" when Diags.limit is 0. */
#define DEFAULT_LIMIT 50

/* Where the text starts: after a UTF-8 byte order mark, which the scanner
 * skips too, so it takes no column. */
static size_t text_start(const Source *src) {
  return src->len >= 3 && !memcmp(src->text, "\xef\xbb\xbf", 3) ? 3 : 0;
}

void src_linecol(const Source *src, uint32_t off, int *line, int *col) {
  if (off > src->len) off = (uint32_t)src->len;
  int l = 1;
  size_t bol = off >= text_start(src) ? text_start(src) : 0;
  for (size_t i = 0; i < off; i++)
    if (src->text[i] == '\n') {
      l++;
      bol = i + 1;
    }
  *line = l;
  *col = (int)(off - bol) + 1;
}

/* Bytes that would garble a terminal print as '?', one column each, so the
 * caret line stays aligned with the echoed source line. */
static char shown(unsigned char c) {
  if (c == '\t') return '\t';
  if (c < 0x20 || c >= 0x7f) return '?';
  return (char)c;
}

/* Echo the line holding `loc.start` and underline the range on that line. */
static void render_snippet(Buf *out, const Source *src, Loc loc) {
  size_t start = loc.start > src->len ? src->len : loc.start;
  size_t bol = start, eol = start;
  while (bol > 0 && src->text[bol - 1] != '\n') bol--;
  if (bol < text_start(src) && start >= text_start(src)) bol = text_start(src);
  while (eol < src->len && src->text[eol] != '\n') eol++;
  size_t end = loc.end < start ? start : loc.end;
  if (end > eol) end = eol;
  size_t shown_end = eol; /* a CRLF line's '\r' is part of its end, not of the line */
  if (shown_end > bol && src->text[shown_end - 1] == '\r') shown_end--;
  buf_puts(out, "    ");
  for (size_t i = bol; i < shown_end; i++) {
    char c = shown((unsigned char)src->text[i]);
    buf_put(out, &c, 1);
  }
  buf_puts(out, "\n    ");
  for (size_t i = bol; i < start; i++) buf_put(out, src->text[i] == '\t' ? "\t" : " ", 1);
  buf_puts(out, "^");
  for (size_t i = start + 1; i < end; i++) buf_puts(out, "~");
  buf_puts(out, "\n");
}

static int limit_of(const Diags *d) { return d->limit > 0 ? d->limit : DEFAULT_LIMIT; }

/* Counts an error and says whether it is still rendered; the first error
 * over the limit prints the stopping line. */
static bool admit_error(Diags *d) {
  d->errors++;
  if (d->errors <= limit_of(d)) return true;
  if (d->errors == limit_of(d) + 1) buf_puts(&d->text, "too many errors; stopping\n");
  return false;
}

static void vreport(Diags *d, const char *kind, Loc loc, const char *fmt, va_list ap) {
  int line, col;
  src_linecol(d->src, loc.start, &line, &col);
  buf_printf(&d->text, "%s:%d:%d: %s: ", d->src->path, line, col, kind);
  buf_vprintf(&d->text, fmt, ap);
  buf_puts(&d->text, "\n");
  render_snippet(&d->text, d->src, loc);
}

void diag_error(Diags *d, Loc loc, const char *fmt, ...) {
  if (!admit_error(d)) return;
  va_list ap;
  va_start(ap, fmt);
  vreport(d, "error", loc, fmt, ap);
  va_end(ap);
}

void diag_error_noloc(Diags *d, const char *fmt, ...) {
  if (!admit_error(d)) return;
  va_list ap;
  va_start(ap, fmt);
  buf_printf(&d->text, "%s: error: ", d->src->path);
  buf_vprintf(&d->text, fmt, ap);
  buf_puts(&d->text, "\n");
  va_end(ap);
}

void diag_note(Diags *d, Loc loc, const char *fmt, ...) {
  if (d->errors > limit_of(d)) return; /* its error was dropped */
  va_list ap;
  va_start(ap, fmt);
  vreport(d, "note", loc, fmt, ap);
  va_end(ap);
}

void diag_free(Diags *d) { buf_free(&d->text); }
