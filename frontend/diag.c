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

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 if none. */
static size_t utf8_len(const unsigned char *p, size_t n) {
  size_t len = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 && p[0] < 0xe0 ? 2 : 0;
  if (!len || len > n) return 0;
  for (size_t i = 1; i < len; i++)
    if ((p[i] & 0xc0) != 0x80) return 0;
  return len;
}

/* Lines longer than this are shown as a window around the error. */
#define SNIPPET_MAX 200

/* Echo the line holding `loc.start` and underline the range on that line.
 * UTF-8 characters are echoed as they are and take one caret column each;
 * other bytes that would garble a terminal print as '?'. */
static void render_snippet(Buf *out, const Source *src, Loc loc) {
  const unsigned char *t = (const unsigned char *)src->text;
  size_t start = loc.start > src->len ? src->len : loc.start;
  size_t bol = start, eol = start;
  while (bol > 0 && t[bol - 1] != '\n') bol--;
  if (bol < text_start(src) && start >= text_start(src)) bol = text_start(src);
  while (eol < src->len && t[eol] != '\n') eol++;
  if (eol > bol && t[eol - 1] == '\r') eol--; /* a CRLF line's '\r' is part of its end */
  size_t end = loc.end < start ? start : loc.end;
  if (end > eol) end = eol;
  size_t from = bol, to = eol; /* a window of a very long line */
  if (to - from > SNIPPET_MAX) {
    if (start - from > SNIPPET_MAX / 4) from = start - SNIPPET_MAX / 4;
    if (to - from > SNIPPET_MAX) to = from + SNIPPET_MAX;
    if (end > to) end = to;
  }
  Buf caret = {0};
  buf_puts(out, from > bol ? "    ..." : "    ");
  buf_puts(&caret, from > bol ? "       " : "    ");
  bool marked = false;
  for (size_t i = from; i < to;) {
    size_t n = t[i] >= 0x80 ? utf8_len(t + i, to - i) : 1;
    if (!n) n = 1;
    if (n > 1) buf_put(out, (const char *)t + i, n);
    else buf_put(out, t[i] == '\t' ? "\t" : t[i] < 0x20 || t[i] >= 0x7f ? "?" : (const char *)t + i, 1);
    if (i + n <= start) buf_put(&caret, t[i] == '\t' ? "\t" : " ", 1);
    else if (i < end || !marked) {
      buf_puts(&caret, marked ? "~" : "^");
      marked = true;
    }
    i += n;
  }
  if (!marked) buf_puts(&caret, "^"); /* at the end of the line */
  buf_puts(out, to < eol ? "...\n" : "\n");
  buf_put(out, caret.data, caret.len);
  buf_puts(out, "\n");
  buf_free(&caret);
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

static void vreport(Buf *out, const Diags *d, const char *kind, Loc loc, const char *fmt, va_list ap) {
  int line, col;
  src_linecol(d->src, loc.start, &line, &col);
  buf_printf(out, "%s:%d:%d: %s: ", d->src->path, line, col, kind);
  buf_vprintf(out, fmt, ap);
  buf_puts(out, "\n");
  render_snippet(out, d->src, loc);
}

/* Record one rendered error unless the very same text (place and message)
 * was recorded already: checks that meet the same construct twice report
 * it once. */
static void record_error(Diags *d, Buf *msg) {
  buf_put(msg, "", 1); /* NUL-terminate for strstr */
  d->dropped = d->text.len && strstr(d->text.data, msg->data);
  if (!d->dropped && admit_error(d)) buf_puts(&d->text, msg->data);
  buf_free(msg);
}

void diag_error(Diags *d, Loc loc, const char *fmt, ...) {
  Buf msg = {0};
  va_list ap;
  va_start(ap, fmt);
  vreport(&msg, d, "error", loc, fmt, ap);
  va_end(ap);
  record_error(d, &msg);
}

void diag_error_noloc(Diags *d, const char *fmt, ...) {
  Buf msg = {0};
  va_list ap;
  va_start(ap, fmt);
  buf_printf(&msg, "%s: error: ", d->src->path);
  buf_vprintf(&msg, fmt, ap);
  buf_puts(&msg, "\n");
  va_end(ap);
  record_error(d, &msg);
}

void diag_note(Diags *d, Loc loc, const char *fmt, ...) {
  if (d->dropped || d->errors > limit_of(d)) return; /* its error was dropped */
  va_list ap;
  va_start(ap, fmt);
  vreport(&d->text, d, "note", loc, fmt, ap);
  va_end(ap);
}

void diag_free(Diags *d) { buf_free(&d->text); }
