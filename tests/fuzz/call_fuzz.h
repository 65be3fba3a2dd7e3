/* call_fuzz.h: the call fuzzer's calls (call_fuzz.c): the kernel pool, a
 * call's description (Spec) drawn at random or written by hand, and the
 * tensors of one call on the backend under test and on the reference. */
#ifndef FLEXC_CALL_FUZZ_H
#define FLEXC_CALL_FUZZ_H

#include <stdbool.h>
#include <stdint.h>

#include "testlib.h"

/* The kernel pool (call_fuzz.c: kernels[]). */
enum {
  K_IDENTITY,  /* no score, no mask */
  K_CAUSAL,    /* an implicit mask */
  K_RELPOS,    /* a `grad` buffer [H, NB] */
  K_DOC_I32,   /* `sorted` document ids: i32, i64, u8 */
  K_DOC_I64,
  K_DOC_U8,
  K_DTYPES,    /* buffers of every dtype, a bool mask, a `grad` buffer */
  K_PARAMS,    /* a float and an int param with defaults */
  K_GEMMA,     /* samples/gemma2.score: a buffer, params, a score and two masks */
  K_UNSORTED,  /* an undecidable mask: the runtime builds the lists */
  K_FLOATMASK, /* a float mask: built lists */
  K_NEGINF,    /* a score of -inf, fully masked rows */
  K_HEADTEMP,  /* samples/head_temperature.score: a `grad` [H] and a per-batch length */
  K_LOWERRIGHT, /* lower-right causal with a softcap and a required param */
  K_SINK_HEAD,  /* samples/sink_gptoss.score: a learned sink per head (`grad`) and a causal mask */
  K_SINK_WINDOW, /* samples/sink_window.score: the same in a kernel block with a window param */
  K_SINK_QUERY, /* samples/sink_per_query.score: a sink computed per query from two `grad` buffers */
  K_SINK_NONE,  /* a sink of -inf (no sink) on some heads, rows every key of which is masked */
  K_NKERNELS
};

/* Layouts. */
enum { L_PADDED, L_PACKED, L_PAGED };

/* Errors a call may be built to make (Spec.inject). */
enum {
  I_NONE,
  I_NULL_OUT, I_NULL_LSE, I_NULL_DQ, I_NULL_DK, I_NULL_DV, I_NULL_DOUT, /* a required tensor missing */
  I_KV_SPLITS, I_DROPOUT_P, I_SCALE, I_UNKNOWN_PARAM, I_INT_PARAM, I_ARCH, I_LSE_DTYPE,
  I_GRAD_ON_PLAIN, I_UNSORTED, I_BLOCKMASK_PACKED, I_HEADS,
  I_OFFSET_PAST, I_OFFSET_PACKED, /* a shard past its whole length; offsets in a packed call */
  I_COUNT
};

/* One call, as drawn. Zero is a plain padded fp32 forward. */
typedef struct Spec {
  int kern;               /* K_* */
  int dt;                 /* q, k, v, dout: tl_dtypes index, or 3: float64 (the reference only) */
  int B, H, HKV, QL, KL, E, EV;
  int layout;             /* L_*; packed and paged: B sequences */
  int lens_q[4], lens_kv[4]; /* packed query / key lengths, paged key lengths (<= KL) */
  int page_size, spare_pages;
  int out_dt;             /* out, dq, dk, dv: 0 q's dtype, 1 float32, 2 float64 */
  int lse64;              /* lse float64 (the reference only) */
  unsigned odd;           /* bit per tensor (call_fuzz.c: T_*): an odd layout */
  int dlse, backward, deterministic, check_bounds, trust_sorted;
  int set_params;         /* set every param (else the ones without defaults only) */
  unsigned grads;         /* bit per buffer: its gradient tensor given */
  int grad64;             /* gradients float64 (else float32) */
  double scale;
  float dropout;
  int kv_splits;
  int bm_q, bm_kv;        /* a caller's BlockMask of these blocks (0: none) */
  int bm_full;            /* ... with B and H expanded (not broadcast) */
  int sm90;               /* emu: arch sm_90a */
  int q_off, kv_off;      /* position offsets of a padded call (a shard of a longer sequence) */
  int q_total, kv_total;  /* ... and the whole lengths (0: the call's own) */
  int inject;             /* I_*: an error the call must get */
} Spec;

/* Draw a call for backend be (mock: cuda over the stand-in driver): what
 * selects its kernel module from mrng, the rest from rng (the same
 * generator but for a run that pools modules, check_call_fuzz.c). */
void spec_draw(Spec *s, flex_backend be, bool mock, uint64_t *rng, uint64_t *mrng);
/* Whether a valid call s on backend be must be refused with
 * FLEX_ERR_UNSUPPORTED (float64 inputs off the reference, a sink with
 * position offsets); *word: what the message must say. */
bool spec_refused(const Spec *s, flex_backend be, const char **word);
/* s as a C initializer, into out. */
void spec_print(const Spec *s, char *out, size_t cap);
const char *inject_name(int inject);

enum { MAXBUF = 8 };

/* A call's tensors: the tested call's views (ta) and the reference's plain
 * float64 tensors (ra). */
typedef struct Call {
  const Spec *s;
  flex_kernel *kern;             /* borrowed from the pool */
  flex_kernel_info info;
  flex_backend be;
  bool mock;
  TlView tv[10];                 /* q k v out lse dout dlse dq dk dv, as the tested call sees them */
  RtArray ref[10];               /* the same, float64 and compact, for the reference */
  uint64_t hash[10];             /* inputs' bytes before the call */
  uint64_t bhash[MAXBUF];        /* buffers' bytes before the call */
  TlView bufv[MAXBUF], gradv[MAXBUF]; /* buffers and gradients, tested */
  RtArray buf[MAXBUF], gref[MAXBUF];  /* the same for the reference (buffers in their dtype) */
  DLTensor bref[MAXBUF], gtref[MAXBUF];
  flex_buffer tfb[MAXBUF], rfb[MAXBUF];
  int nb;
  flex_param params[8];
  int np;
  RtArray cuq, cuk, pt, kvl;     /* packed offsets, page table, key lengths */
  DLTensor tcuq, tcuk, tpt, tkvl;
  flex_block_mask *bm;           /* from flex_block_mask_create */
  RtArray bma[8];                /* its arrays expanded over B and H */
  DLTensor bmt[8];
  flex_block_mask bmx;
  DLTensor rv[10];               /* views of ref[] */
  flex_args ta, ra;
  int saved_inject;              /* call_inject's undo */
  const DLTensor *saved;
  RtArray exact[3 + MAXBUF];     /* the reference's gradients from its own O (call_give_outputs) */
  bool have_exact;
  DLTensor bad;                  /* a tensor the injection breaks */
  int64_t badshape[TL_VIEW_MAXDIMS];
} Call;

/* The tensors of s on backend be, inputs from *rng; false (why) when the
 * call cannot be built. */
bool call_init(Call *c, const Spec *s, flex_backend be, bool mock, uint64_t *rng, char *why, size_t cap);
void call_free(Call *c);
/* Break c's tested call as inject says; the status and message word it
 * must get. Returns whether the break is in the backward's tensors. */
bool call_inject(Call *c, int inject, flex_status *want, const char **word);
void call_inject_undo(Call *c);
/* What comparisons counted. */
typedef struct CallCounts {
  long masked_rows; /* the reference's fully masked rows, found exact */
  long unmeasured;  /* outputs the reference has as 0 but for rounding: not compared by a ratio */
} CallCounts;
/* The tested outputs (forward's or backward's) against the reference's;
 * guards and inputs intact. */
bool call_compare(Call *c, bool backward, CallCounts *n, char *why, size_t cap);
/* The tested forward's O and LSE into the reference's: a shard's backward
 * reads them as given (docs/language.md "Position offsets"), so the oracle
 * is given the same ones. The reference's gradients from its own O are kept:
 * how far they move with O's rounding measures how much rounding the
 * gradients can show (call_compare widens the tolerance by it). */
void call_give_outputs(Call *c);
/* No byte outside a tensor's elements written, no input changed. */
bool call_guards(Call *c, char *why, size_t cap);
/* The tested backward again: the same gradient bits. */
bool call_deterministic(Call *c, char *why, size_t cap);

#endif
