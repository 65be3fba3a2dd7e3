/* flexc mask: the block sparsity of a kernel's mask.
 *
 *   flexc mask FILE [--kernel K] --shape B,H,Q_LEN,KV_LEN [--block-size M,N]
 *              [--param NAME=VALUE]... [--buffer NAME=F.npy]... [--out DIR]
 *
 * Builds the BlockMask the way the runtime does (interval analysis, then
 * element-wise evaluation of the blocks it leaves open), prints the block
 * counts and density, and with --out writes the eight int32 arrays as .npy.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

enum { MAXNAMED = 32 };

/* The parsed command line. */
typedef struct Opts {
  const char *file, *kernel, *out;
  int shape[4];                  /* B, H, Q_LEN, KV_LEN */
  int block[2];                  /* M, N */
  flex_param params[MAXNAMED];   /* --param values */
  int np;
  const char *bname[MAXNAMED];   /* --buffer names */
  const char *bpath[MAXNAMED];   /* and files */
  int nb;
} Opts;

/* "a,b,..." into n positive ints; false if malformed. */
static bool parse_ints(const char *s, int *out, int n) {
  for (int i = 0; i < n; i++) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > (1L << 30) || *end != (i + 1 < n ? ',' : '\0')) return false;
    out[i] = (int)v;
    s = end + 1;
  }
  return true;
}

static int parse_opts(int argc, char **argv, Opts *o) {
  memset(o, 0, sizeof *o);
  o->block[0] = o->block[1] = 128;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || !a[1]) {
      if (o->file) return cli_usage_error("mask: one FILE only ('%s')", a);
      o->file = a;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error("mask: %s needs a value", a);
    char *v = argv[++i];
    if (!strcmp(a, "--kernel")) o->kernel = v;
    else if (!strcmp(a, "--out")) o->out = v;
    else if (!strcmp(a, "--shape")) {
      if (!parse_ints(v, o->shape, 4)) return cli_usage_error("mask: --shape wants B,H,Q_LEN,KV_LEN (positive), got '%s'", v);
    } else if (!strcmp(a, "--block-size")) {
      if (!parse_ints(v, o->block, 2)) return cli_usage_error("mask: --block-size wants M,N (positive), got '%s'", v);
    } else if (!strcmp(a, "--param") || !strcmp(a, "--buffer")) {
      bool buf = a[2] == 'b';
      if ((buf ? o->nb : o->np) == MAXNAMED) return cli_usage_error("mask: too many %s options", a);
      char *name, *val;
      if (!buf) {
        int rc = cli_param(v, &o->params[o->np++]);
        if (rc) return rc;
      } else if (!cli_split_eq(v, &name, &val)) {
        return cli_usage_error("mask: --buffer wants NAME=FILE, got '%s'", v);
      } else {
        o->bname[o->nb] = name;
        o->bpath[o->nb++] = val;
      }
    } else
      return cli_usage_error("mask: unknown option '%s'", a);
  }
  if (!o->file) return cli_usage_error("mask: no FILE");
  if (!o->shape[0]) return cli_usage_error("mask: --shape B,H,Q_LEN,KV_LEN is required");
  return 0;
}

/* Write the eight arrays into dir, created when missing. */
static int write_arrays(const flex_block_mask *bm, const char *dir) {
  if (!cli_make_dir(dir)) return fprintf(stderr, "flexc: error: %s: cannot create directory\n", dir), 1;
  const char *names[8] = {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"};
  const DLTensor *arrs[8] = {bm->kv_num_blocks, bm->kv_indices, bm->full_kv_num_blocks,
                             bm->full_kv_indices, bm->q_num_blocks, bm->q_indices,
                             bm->full_q_num_blocks, bm->full_q_indices};
  for (int k = 0; k < 8; k++) {
    if (!arrs[k]) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.npy", dir, names[k]);
    if (flex_npy_save(path, arrs[k])) return fprintf(stderr, "flexc: error: %s\n", flex_last_error()), 1;
  }
  return 0;
}

static void report(const flex_kernel_info *info, const Opts *o, const flex_block_mask *bm,
                   const flex_mask_stats *st, double ms) {
  const int64_t *stored = bm->kv_num_blocks->shape;
  printf("kernel: %s   mask: %s\n", info->name, info->mask ? info->mask : "(none)");
  printf("shape: B=%d H=%d Q_LEN=%d KV_LEN=%d   block: %dx%d   stored B=%lld H=%lld\n", o->shape[0],
         o->shape[1], o->shape[2], o->shape[3], bm->block_q, bm->block_kv, (long long)stored[0],
         (long long)stored[1]);
  printf("blocks: %lld total, %lld visited (%lld full, %lld partial), %lld empty\n",
         (long long)st->total, (long long)(st->full + st->partial), (long long)st->full,
         (long long)st->partial, (long long)st->empty);
  printf("density: %.6f\n", st->total ? (double)(st->full + st->partial) / (double)st->total : 0.0);
  if (st->undecided == st->partial && st->decidable)
    printf("analysis: decided every block (no element-wise evaluation needed); %s\n",
           st->implicit
               ? "implicit mask possible"
               : "the kernels still build block lists (the device classifier treats floats as unknown)");
  else
    printf("analysis: %s; %lld of %lld open blocks resolved element-wise (%lld evaluations)\n",
           st->decidable ? "decidable" : "not decidable by interval analysis (below: the read that prevents it)",
           (long long)st->refined, (long long)st->undecided, (long long)st->evaluated);
  printf("time: %.3f ms\n", ms);
}

int cli_mask(int argc, char **argv) {
  Opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc) return rc;
  flex_kernel *k;
  if (!cli_load_kernel(&k, o.file, o.kernel)) return 1;
  flex_kernel_info info;
  flex_kernel_get_info(k, &info);
  DLTensor *host[MAXNAMED] = {0};
  flex_buffer bufs[MAXNAMED];
  rc = cli_read_buffers(&info, o.nb, o.bname, o.bpath, host, bufs);
  if (!rc) {
    flex_args a;
    memset(&a, 0, sizeof a);
    a.params = o.params, a.nparams = o.np;
    a.buffers = bufs, a.nbuffers = o.nb;
    flex_block_mask *bm;
    flex_mask_stats st;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    flex_status fs = flex_block_mask_create(&bm, k, &a, o.shape[0], o.shape[1], o.shape[2],
                                            o.shape[3], o.block[0], o.block[1], &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (fs != FLEX_OK) {
      cli_call_error(flex_last_error());
      rc = 1;
    } else {
      report(&info, &o, bm, &st, (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
      char *why = NULL; /* which read keeps the analysis from deciding, and the cost */
      if (!st.decidable && flex_mask_explain(k, o.shape, &why) == FLEX_OK) {
        const char *line = strstr(why, "  blocks: ");
        if (line) fputs(line, stdout);
      }
      flex_free(why);
      if (o.out) rc = write_arrays(bm, o.out);
      flex_block_mask_free(bm);
    }
  }
  for (int i = 0; i < o.nb; i++) flex_tensor_free(host[i]);
  flex_kernel_free(k);
  return rc;
}
