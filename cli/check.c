/* flexc check FILE...: parse and check each file, report diagnostics on
 * stderr. Exit status 1 when any file has an error, else 0 (silently).
 *
 * flexc check --explain FILE... [--kernel K] [--shape B,H,Q_LEN,KV_LEN]: also
 * say, per kernel of each FILE, how its mask becomes blocks (flex_mask_explain;
 * with several files each line starts with "FILE: "):
 * decided by interval analysis, or a BlockMask built element by element on
 * every call, which buffer read prevents the analysis and what it costs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Check one file; returns 1 when it has errors (or cannot be read). */
static int check_file(const char *path) {
  if (flex_check_file(path) == FLEX_OK) return 0;
  const char *msg = flex_last_error();
  size_t n = strlen(msg);
  fprintf(stderr, "%s%s", msg, n && msg[n - 1] == '\n' ? "" : "\n");
  return 1;
}

/* Explain kernel `name` (NULL: the only or implicit one) of path; every
 * line of the explanation is prefixed with "PATH: " when `named` (several
 * files on the command line). */
static int explain_one(const char *path, const char *name, const int *shape, bool named) {
  flex_kernel *k;
  if (!cli_load_kernel(&k, path, name)) return 1;
  char *text = NULL;
  flex_status st = flex_mask_explain(k, shape, &text);
  if (st) fprintf(stderr, "flexc: error: %s: %s\n", path, flex_last_error());
  else if (!named) fputs(text, stdout);
  else
    for (const char *l = text; *l;) {
      const char *e = strchr(l, '\n');
      int n = e ? (int)(e - l) : (int)strlen(l);
      printf("%s: %.*s\n", path, n, l);
      l += n + (e != NULL);
    }
  flex_free(text);
  flex_kernel_free(k);
  return st ? 1 : 0;
}

/* Every kernel of path: the only one, or the names the loader lists when
 * there are several ("the file has N kernels ('a' and 'b'); pick one"). */
static int explain(const char *path, const char *kernel, const int *shape, bool named) {
  if (kernel) return explain_one(path, kernel, shape, named);
  flex_kernel *k;
  if (flex_kernel_load(&k, path, NULL) == FLEX_OK) {
    flex_kernel_free(k);
    return explain_one(path, NULL, shape, named);
  }
  const char *msg = flex_last_error(), *p = strstr(msg, " kernels (");
  const char *e = p ? strchr(p, ')') : NULL;
  if (!p || !e) return explain_one(path, NULL, shape, named); /* reports the error */
  char names[1024];
  snprintf(names, sizeof names, "%.*s", (int)(e - p - 10), p + 10);
  int rc = 0;
  /* The names are quoted: 'a', 'b' and 'c'. */
  for (char *q = strchr(names, '\''); q; q = strchr(q, '\'')) {
    char *end = strchr(q + 1, '\'');
    if (!end) break;
    *end = 0;
    rc |= explain_one(path, q + 1, shape, named);
    q = end + 1;
  }
  return rc;
}

static bool parse_shape(const char *s, int *out) {
  for (int i = 0; i < 4; i++) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno || v < 1 || v > 1 << 30 || (i < 3 ? *end != ',' : *end != 0)) return false;
    out[i] = (int)v;
    s = end + 1;
  }
  return true;
}

int cli_check(int argc, char **argv) {
  bool want_explain = false;
  const char *kernel = NULL;
  int shape[4], *sp = NULL, nfiles = 0;
  const char *files[256];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--explain")) want_explain = true;
    else if (!strcmp(argv[i], "--kernel") || !strcmp(argv[i], "--shape")) {
      if (i + 1 >= argc) return cli_usage_error("check: %s needs a value", argv[i]);
      if (argv[i][2] == 'k') kernel = argv[++i];
      else if (!parse_shape(argv[++i], shape))
        return cli_usage_error("check: --shape wants B,H,Q_LEN,KV_LEN (positive), got '%s'", argv[i]);
      else sp = shape;
    } else if (argv[i][0] == '-' && argv[i][1] == '-')
      return cli_usage_error("check: unknown option '%s'", argv[i]);
    else if (nfiles < 256) files[nfiles++] = argv[i];
  }
  if (!nfiles) return cli_usage_error("'check' needs at least one FILE");
  if ((kernel || sp) && !want_explain) return cli_usage_error("check: --kernel and --shape go with --explain");
  int bad = 0;
  for (int i = 0; i < nfiles; i++) {
    if (check_file(files[i])) bad = 1;
    else if (want_explain && explain(files[i], kernel, sp, nfiles > 1)) bad = 1;
  }
  return bad;
}
