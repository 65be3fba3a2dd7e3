"""The cases of test_distributed.py and the worker that runs them on every
rank of a gloo group (a module of its own so that spawned processes import
it without the test file's fixtures).

Each case builds, from the whole inputs, the keywords of
context_parallel_attention and of the unsharded flex_attention: Python
score_mod/mask_mod functions (traced) or a .score kernel, buffers read by
whole-sequence position (a document id per token), a `grad` buffer (ALiBi
slopes), dropout, grouped heads, lengths that do not divide evenly."""
import os
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch

METHODS = ("ring", "allgather")


@dataclass
class Case:
    name: str
    Lq: int
    Lkv: int
    H: int = 2
    HKV: int = 2
    B: int = 1
    E: int = 16
    dtype: torch.dtype = torch.float32
    backend: str = None         # None: the host default (cpu where built)
    extra: dict = field(default_factory=dict)


CASES = [
    Case("causal", 61, 61),
    Case("document", 64, 64, B=2),
    Case("window_softcap", 53, 53),
    Case("alibi_gqa", 45, 45, H=4, HKV=2),
    Case("dropout", 50, 50, extra={"dropout_p": 0.25, "dropout_seed": 1234, "dropout_offset": 7}),
    Case("cross_lengths", 37, 58),
    Case("causal_float64_reference", 29, 29, dtype=torch.float64, backend="reference"),
    Case("sink_gqa", 43, 43, H=4, HKV=1),
    Case("sink_fn", 40, 40),
    Case("sink_kernel", 47, 47),
    Case("document_bf16", 56, 56, dtype=torch.bfloat16),
]
BY_NAME = {c.name: c for c in CASES}

WINDOW_SOFTCAP = """
param float cap = 20.0;
param int window = 13;
score softcap(s, b, h, q, kv) { return cap * tanh(s / cap); }
mask window_causal(b, h, q, kv) { return q >= kv && q - kv < window; }
kernel sliding { score = softcap; mask = window_causal; }
"""


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def inputs(case, seed):
    """The whole tensors of a case (the same on every rank and in the
    unsharded run): q, k, v, the incoming gradients of out and LSE, and
    the case's buffers."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(case.B, case.H, case.Lq, case.E, generator=g).to(case.dtype)
    k = torch.randn(case.B, case.HKV, case.Lkv, case.E, generator=g).to(case.dtype)
    v = torch.randn(case.B, case.HKV, case.Lkv, case.E, generator=g).to(case.dtype)
    dout = torch.randn(case.B, case.H, case.Lq, case.E, generator=g).to(case.dtype)
    dlse = torch.randn(case.B, case.H, case.Lq, generator=g).float()
    bufs = {}
    if case.name.startswith("document"):  # documents of random lengths, ids non-decreasing
        cuts = sorted(torch.randperm(case.Lq - 1, generator=g)[:4].add(1).tolist())
        doc = torch.zeros(case.Lq, dtype=torch.int32)
        for c in cuts:
            doc[c:] += 1
        bufs["doc"] = doc
    if case.name == "alibi_gqa":
        bufs["slopes"] = torch.rand(case.H, generator=g) * 0.5 + 0.1
    if case.name.startswith("sink"):  # logits near the rows' own, so the sink takes a share
        bufs["sinks"] = torch.randn(case.H, generator=g) + 2.0
        if case.name == "sink_gqa":
            bufs["sinks"][1] = -float("inf")  # a sink of -inf is no sink (its gradient 0)
    return q, k, v, dout, dlse, bufs


GRAD_BUFFERS = ("slopes", "sinks")  # the buffers of the cases that require grad


def keywords(case, bufs):
    """The attention keywords of a case: score_mod, mask_mod (or a kernel
    with params), dropout. `bufs` are the tensors the functions capture
    (leaves that may require grad)."""
    import flexc
    if case.name in ("causal", "dropout", "causal_float64_reference"):
        kw = {"mask_mod": causal}
    elif case.name.startswith("document"):
        doc = bufs["doc"]

        def document(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
        kw = {"mask_mod": document}
    elif case.name == "window_softcap":
        kw = {"score_mod": flexc.compile(WINDOW_SOFTCAP), "params": {"cap": 20.0, "window": 13}}
    elif case.name == "alibi_gqa":
        slopes = bufs["slopes"]

        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)
        kw = {"score_mod": alibi, "mask_mod": causal}
    elif case.name == "sink_gqa":  # gpt-oss: a learned logit per head, a causal window
        kw = {"mask_mod": lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < 17),
              "sinks": bufs["sinks"]}
    elif case.name == "sink_fn":  # a sink that reads the whole-sequence row position
        base = bufs["sinks"]

        def sink(b, h, q_idx):
            return base[h] - 0.05 * q_idx

        def rel_bias(score, b, h, q_idx, kv_idx):
            return score + base[h] * 0.1 * (q_idx - kv_idx > 8)
        kw = {"score_mod": rel_bias, "mask_mod": causal, "sinks": sink}
    elif case.name == "sink_kernel":  # a .score kernel's own sink, over a narrow window
        # (the shard pairs whose keys begin the sequence carry it; for late
        # rows the window rules them out, and they run all the same)
        kw = {"score_mod": flexc.compile("samples/sink_window.score"),
              "params": {"window": 7}, "buffers": {"sinks": bufs["sinks"]}}
    else:
        kw = {}
    kw.update(case.extra)
    return kw


def flex_keywords(kw):
    """The same call as flexc.torch.flex_attention keywords (a mask_mod
    alone becomes a -inf score_mod; a mask_mod with a score_mod, a
    combined one)."""
    kw = dict(kw)
    mask, score = kw.pop("mask_mod", None), kw.pop("score_mod", None)
    if mask is not None:
        inner = score

        def masked(s, b, h, q_idx, kv_idx):
            s2 = s if inner is None else inner(s, b, h, q_idx, kv_idx)
            return torch.where(mask(b, h, q_idx, kv_idx), s2, -float("inf"))
        score = masked
    kw["score_mod"] = score
    return kw


def run_case(cp, case, method, lb, seed, group=None):
    """One sharded forward and backward on this rank of group: its shards
    of out, LSE, dq, dk, dv, its share of every buffer's gradient, and the
    pair counts."""
    q, k, v, dout, dlse, bufs = inputs(case, seed)
    for n in GRAD_BUFFERS:
        if n in bufs:
            bufs[n].requires_grad_()
    kw = keywords(case, bufs)
    cut = lambda x: cp.shard(x, group, load_balance=lb)  # noqa: E731
    sq, sk, sv = (cut(x).detach().requires_grad_() for x in (q, k, v))
    before = dict(cp.stats)
    out, lse = cp.context_parallel_attention(sq, sk, sv, group=group, method=method,
                                             load_balance=lb, return_lse=True,
                                             backend=case.backend, **kw)
    ((out * cut(dout)).sum() + (lse * cut(dlse)).sum()).backward()
    counts = {n: cp.stats[n] - before[n] for n in cp.stats}
    return {"out": out.detach(), "lse": lse.detach(), "dq": sq.grad, "dk": sk.grad,
            "dv": sv.grad, "counts": counts,
            "dbuf": {n: t.grad for n, t in bufs.items() if t.grad is not None},
            "full_out": cp.unshard(out, group, load_balance=lb)}


def errors(cp, rank, world):
    """The refusals every rank must raise without hanging (what each said).
    Called by every rank of the default group, world >= 2."""
    import flexc
    import torch.distributed as dist
    said = {}
    x = torch.randn(1, 2, 8, 16)

    def attempt(name, fn):
        try:
            fn()
            said[name] = None
        except Exception as e:  # noqa: BLE001 - the message is what the test checks
            said[name] = f"{type(e).__name__}: {e}"
    cpa = cp.context_parallel_attention
    sink = flexc.compile("samples/sink_gptoss.score")
    attempt("sink_twice", lambda: cpa(x, x, x, score_mod=sink, buffers={"sinks": torch.zeros(2)},
                                      sinks=torch.zeros(2)))
    attempt("sinks_shape", lambda: cpa(x, x, x, mask_mod=causal, sinks=torch.zeros(3)))
    # a sink function reading a table of one shard's length: the ranks
    # whose rows lie past it fail, and every rank raises
    table = torch.zeros(8)
    attempt("sink_fn_some", lambda: cpa(x, x, x, mask_mod=causal, load_balance=False,
                                        sinks=lambda b, h, q_idx: table[q_idx]))
    # rank 0 holds two rows too few (no layout gives it 6)
    bad = torch.randn(1, 2, 6 if rank == 0 else 8, 16)
    attempt("layout", lambda: cpa(bad, bad, bad, mask_mod=causal))
    # k and v of different lengths on every rank
    attempt("kv_rows", lambda: cpa(x, x, x[:, :, :7], mask_mod=causal))
    # heads: 3 query heads over 2 key/value heads
    attempt("heads", lambda: cpa(torch.randn(1, 3, 8, 16), x, x))
    # dtypes that differ between q and k
    attempt("dtype", lambda: cpa(x, x.half(), x.half()))
    # rank 0 has a batch of 2, the others of 1
    xb = torch.randn(2 if rank == 0 else 1, 2, 8, 16)
    attempt("batch", lambda: cpa(xb, xb, xb))
    # only rank 0 names a method that does not exist
    attempt("method", lambda: cpa(x, x, x, method="zigzag" if rank == 0 else "ring"))
    # a group that is not a process group
    attempt("group_type", lambda: cpa(x, x, x, group="gloo"))
    # a group without rank 0: rank 0 is refused, the members run
    sub = dist.new_group(list(range(1, world)))
    attempt("not_member", lambda: cpa(x, x, x, group=sub, mask_mod=causal))
    # a position-indexed buffer of the shard's length, not the sequence's:
    # a checked run reports the read past its end (on the ranks that read
    # there), and every rank raises
    doc = torch.zeros(8, dtype=torch.int32)
    attempt("buffer", lambda: cpa(x, x, x, mask_mod=lambda b, h, qi, ki: doc[qi] == doc[ki],
                                  check_bounds=True))
    # read by query position only, contiguous: rank 0's rows lie inside the
    # buffer, the others' past it; rank 0 raises because they failed
    attempt("buffer_some", lambda: cpa(
        x, x, x, mask_mod=lambda b, h, qi, ki: (doc[qi] == 0) & (qi >= ki), check_bounds=True,
        load_balance=False))
    # and the group still works afterwards
    attempt("after", lambda: cpa(x, x, x, mask_mod=causal))
    # the round trip of shard and unshard, uneven and load-balanced
    y = torch.arange(2 * 3 * 23, dtype=torch.float32).view(2, 3, 23)
    for lb in (True, False):
        said[f"roundtrip{lb}"] = bool(torch.equal(cp.unshard(cp.shard(y, dim=2, load_balance=lb),
                                                             dim=2, load_balance=lb), y))
    return said


def groups_of(worlds):
    """The rank lists the cases run on, one per world size: the largest the
    default group (None), each smaller one the last ranks, so that group
    ranks and global ranks differ."""
    top = max(worlds)
    return {w: None if w == top else list(range(top - w, top)) for w in worlds}


def worker(rank, world, rendezvous, out_dir, seed, worlds):
    """On each group of groups_of(worlds), every case, method and layout;
    then the refusals on the default group; saves what this rank got to
    out_dir/rankN.pt, keyed (world size, case, method, load_balance)."""
    os.environ["FLEXC_THREADS"] = "1"  # the processes share the machine's cores
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    import flexc.torch.distributed as cp
    got = {}
    try:
        for w, ranks in groups_of(worlds).items():
            group = None if ranks is None else dist.new_group(ranks)  # every rank calls it
            if ranks is not None and rank not in ranks:
                continue
            for case in CASES:
                for method in METHODS:
                    for lb in (True, False):
                        got[(w, case.name, method, lb)] = run_case(cp, case, method, lb, seed,
                                                                   group)
        got["errors"] = errors(cp, rank, world)
    except Exception:  # noqa: BLE001 - reported to the parent, then raised
        got["crash"] = traceback.format_exc()
        torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))
        raise
    torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


# Imported once by the process the test's workers fork from.
PRELOAD = ["torch", "torch.distributed", "flexc.torch.distributed", "flexc._mods", "cp_cases"]
