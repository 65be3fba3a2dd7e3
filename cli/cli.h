/* cli.h: the flexc command-line driver. One file per subcommand; each
 * returns the process exit status: 0 ok, 1 user error, 2 bad usage. */
#ifndef FLEXC_CLI_H
#define FLEXC_CLI_H

#include <stdbool.h>

#include "runtime/flex.h"

int cli_check(int argc, char **argv); /* flexc check FILE... */
int cli_ir(int argc, char **argv);    /* flexc ir FILE [--kernel K] [--grad] [--after PASS] */
int cli_run(int argc, char **argv);   /* flexc run FILE ... --out DIR */
int cli_emit(int argc, char **argv);  /* flexc emit FILE --target ... */
int cli_mask(int argc, char **argv);  /* flexc mask FILE --shape ... */

/* Print "flexc: error: MSG" (usage errors) to stderr; returns 2. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "flexc: error: MSG" (a bad value in the input) to stderr; returns 1. */
int cli_input_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Load `kernel` (NULL: the file's only one) of a .score file; on failure
 * print the diagnostics (newline-terminated) and return false. */
bool cli_load_kernel(flex_kernel **k, const char *file, const char *kernel);
/* Create a directory and its parents; true when it exists afterwards. */
bool cli_make_dir(const char *path);

/* ---- inputs (inputs.c): what run and mask both read ---- */

/* NAME=VALUE into its halves (the string is modified); false if malformed. */
bool cli_split_eq(char *s, char **name, char **value);
/* A --param NAME=VALUE (arg is modified); 0, or the exit status after the message. */
int cli_param(char *arg, flex_param *out);
/* A .npy file read as `to` (its dtype family checked, values converted,
 * ints range-checked); NULL after printing why. `role` names it ("q",
 * "buffer 'x'"). */
DLTensor *cli_read_npy(const char *path, const char *role, DLDataType to);
/* A failed call's message (flex_last_error()) as "flexc: error: ...", with
 * the option that passes a missing buffer or param. */
void cli_call_error(const char *msg);
/* "float32", "int64", ... */
const char *cli_dtype_name(DLDataType t);
/* The --buffer files (names[i] from paths[i]) as host tensors in their
 * declared dtypes, and the flex_buffer entries for them (grad NULL).
 * Returns 0, or 1 after printing why (and freeing what it had read). */
int cli_read_buffers(const flex_kernel_info *info, int n, const char *const *names,
                     const char *const *paths, DLTensor **tensors, flex_buffer *bufs);

#endif
