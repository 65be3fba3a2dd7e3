/* flexc: the command-line driver. main() only dispatches; each subcommand
 * lives in its own file and is the whole pipeline for that job. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *usage; /* one line for `flexc --help` */
  const char *help;  /* every option, for `flexc COMMAND --help` */
} commands[] = {
    {"check", cli_check, "check FILE...                      report diagnostics only",
     "flexc check [--explain [--kernel K] [--shape B,H,Q_LEN,KV_LEN]] FILE...\n"
     "  Parse and check each .score file; diagnostics on stderr, nothing on success.\n"
     "  --explain: per kernel, whether its mask is decided by interval analysis or\n"
     "  needs a BlockMask built element by element on every call, which buffer read\n"
     "  prevents the analysis, and the cost (at --shape, in evaluations).\n"},
    {"ir", cli_ir, "ir FILE [--kernel K] [--grad] [--after PASS]   print the IR",
     "flexc ir FILE [--kernel K] [--grad] [--after lower|fold|cse|dce|autodiff]\n"
     "  Print the IR of the kernel's score and mask functions (--grad: and the joint\n"
     "  backward function), after the given pass (default: all of them).\n"},
    {"run", cli_run, "run FILE --q Q.npy --k K.npy --v V.npy ... --out DIR   run attention",
     "flexc run FILE [--kernel K] --q Q.npy --k K.npy --v V.npy [--dout DO.npy]\n"
     "          [--dlse DLSE.npy] [--buffer NAME=F.npy]... [--param NAME=VALUE]...\n"
     "          [--scale X] [--dtype fp32|fp16|bf16] [--backend reference|emu|cuda|cpu]\n"
     "          [--arch sm_80|sm_86|sm_89|sm_90|sm_90a] [--check-bounds] [--trust-sorted]\n"
     "          [--fast-math] [--deterministic] [--dropout P --seed S [--offset O]]\n"
     "          [--cu-seqlens-q CQ.npy --cu-seqlens-kv CK.npy]\n"
     "          [--page-table PT.npy --kv-lens KL.npy] [--repeat N] [--threads N]\n"
     "          [--kv-splits N] --out DIR\n"
     "  Forward (and with --dout, backward) attention; writes out.npy, lse.npy and\n"
     "  dq.npy dk.npy dv.npy d_NAME.npy into DIR.\n"
     "  --backend: reference by default here (the exact float64 oracle); the Python\n"
     "  package picks cuda for CUDA tensors and cpu for host tensors instead.\n"
     "  --fast-math: hardware\n"
     "  approximations of exp, log, tanh, sigmoid, sin, cos, pow (emu and cuda).\n"
     "  --arch: the architecture the emu backend generates for (default sm_80;\n"
     "  sm_90a: the TMA + wgmma forward); other backends ignore it.\n"
     "  `sorted` buffers are verified on every run; --trust-sorted skips that\n"
     "  (only for buffers the caller has verified: an unsorted one gives wrong results).\n"
     "  --dropout P --seed S [--offset O]: drop attention weights with probability P\n"
     "  in [0, 1) by Philox4x32-10 bits (seed and offset: unsigned 64-bit); the\n"
     "  backward uses the same bits.\n"
     "  --deterministic: the backward's gradients are bitwise the same on every run\n"
     "  (no float atomics; a forward ignores it).\n"
     "  --cu-seqlens-q/-kv: a packed batch (int32 [B+1] offsets); q, k, v, dout are\n"
     "  (total length, heads, head dim), lse.npy is (H, TOTAL_Q).\n"
     "  --page-table/--kv-lens: a paged key/value cache (int32 [B, MAX_PAGES] and\n"
     "  [B]); k and v are pools (pages, page size 16..256, heads, head dim); q is\n"
     "  padded, or packed with --cu-seqlens-q alone; forward only.\n"
     "  --repeat N: make each call N times and print the median times (the files\n"
     "  hold the last call's results). --threads N: worker threads of the cpu and\n"
     "  emu backends (default: every core for cpu, 2 for emu).\n"
     "  --kv-splits N: split-KV decoding on emu and cuda: 0 automatic (default),\n"
     "  1 never, N key chunks (clamped to the key tiles).\n"},
    {"emit", cli_emit, "emit FILE --target cuda|ptx|cubin --arch SM --head-dim E --dtype T   emit kernels",
     "flexc emit FILE --target cuda|ptx|cubin --arch sm_80|sm_86|sm_89|sm_90|sm_90a\n"
     "           --head-dim E [--head-dim-v EV] --dtype fp16|bf16|fp32 [--kernel K]\n"
     "           [--forward-only] [--fast-math] [--dropout] [--deterministic]\n"
     "           [--resource-usage] [-o OUT]\n"
     "  The kernel's generated CUDA, or its PTX or cubin through NVRTC.\n"
     "  --dropout: the kernels a call with dropout runs (FLEX_DROPOUT).\n"
     "  --deterministic: the kernels a deterministic backward runs (FLEX_DETERMINISTIC).\n"
     "  --resource-usage: registers, spills, shared memory and stack per kernel.\n"},
    {"mask", cli_mask, "mask FILE --shape B,H,Q_LEN,KV_LEN ...   block sparsity of a mask",
     "flexc mask FILE [--kernel K] --shape B,H,Q_LEN,KV_LEN [--block-size M,N]\n"
     "           [--param N=V]... [--buffer N=F.npy]... [--out DIR]\n"
     "  Build the kernel's BlockMask and print its density; --out writes its eight\n"
     "  arrays as .npy files.\n"},
};

/* `flexc COMMAND --help` (or -h) anywhere in the arguments. */
static bool wants_help(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
  return false;
}

static void usage(FILE *f) {
  fprintf(f, "usage: flexc COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  flexc %s\n", commands[i].usage);
  fprintf(f, "\n  flexc --help       this text\n  flexc --version    the version\n"
             "\nexit status: 0 ok, 1 error in the input, 2 bad usage\n");
}

/* "flexc: error: MSG" on stderr, with a pointer to the help for usage errors. */
static void verror(bool usage, const char *fmt, va_list ap) {
  fprintf(stderr, "flexc: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, usage ? "\n(see flexc --help)\n" : "\n");
}

int cli_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(true, fmt, ap);
  va_end(ap);
  return 2;
}

/* A value that is not what an option needs: an error in the input (status
 * 1), like a bad .npy file, rather than a misuse of the command. */
int cli_input_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(false, fmt, ap);
  va_end(ap);
  return 1;
}

bool cli_load_kernel(flex_kernel **k, const char *file, const char *kernel) {
  if (flex_kernel_load(k, file, kernel) == FLEX_OK) return true;
  const char *msg = flex_last_error();
  size_t n = strlen(msg);
  fprintf(stderr, "%s%s", msg, n && msg[n - 1] == '\n' ? "" : "\n");
  return false;
}

bool cli_make_dir(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return false;
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0777) && errno != EEXIST) return false;
      *p = '/';
    }
  return !mkdir(tmp, 0777) || errno == EEXIST;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("flexc %s\n", FLEXC_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      if (wants_help(argc, argv)) {
        fputs(commands[i].help, stdout);
        return 0;
      }
      return commands[i].fn(argc - 1, argv + 1);
    }
  return cli_usage_error("unknown command '%s'", argv[1]);
}
