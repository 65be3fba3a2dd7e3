"""flexc.torch.distributed on several processes (gloo on the host, the cpu
backend where built, FLEXC_THREADS=1 each; one spawn of 4 processes runs
worlds 1, 2, 3 and 4)
against the same inputs run in this process, unsharded, with
flexc.torch.flex_attention on the same backend and on the float64
reference: out, LSE, dq, dk, dv and buffer gradients (each rank's share,
summed) of every case in cp_cases.CASES (causal; a document mask reading a
whole-sequence id buffer; sliding window + softcap from a .score kernel;
ALiBi with grouped heads and a `grad` buffer; dropout; unequal query and
key lengths; float64 on the reference; a learned per-head sink with a
causal window and 4:1 grouped heads; a position-dependent Python sink
function sharing its tensor with a score_mod), by both methods, with and
without load balancing, at lengths that do not divide evenly, on the
default group and on a group whose ranks are not the global ones; the
shard pairs a causal mask rules out are counted as skipped; invalid calls
are refused on every rank without hanging."""
import os
import random

import pytest
import torch

import cp_cases as CC

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="this PyTorch has no torch.distributed with gloo")

SEED = random.randrange(1 << 31)
print(f"test_distributed: seed {SEED}")


# World sizes 1 to 4 (FLEXC_TEST_CP_WORLDS="2,3" picks others). One spawn of
# max(worlds) processes runs them all: the largest on the default group,
# each smaller one on a group of the last ranks (so about as long as the
# largest alone: 28 s for all four on 2 cores, 25 s for 1 to 3).
WORLDS = [int(w) for w in os.environ.get("FLEXC_TEST_CP_WORLDS", "1,2,3,4").split(",")]


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """Every rank's results (cp_cases.worker), one spawn for all worlds.
    The workers fork from a server that imported torch and flexc once."""
    import torch.multiprocessing as mp
    W = max(WORLDS)
    d = tmp_path_factory.mktemp("cp")
    print(f"test_distributed: {W} processes, worlds {WORLDS}, seed {SEED}")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(CC.PRELOAD)
    try:
        mp.start_processes(CC.worker, args=(W, str(d / "rendezvous"), str(d), SEED, WORLDS),
                           nprocs=W, start_method="forkserver")
    finally:
        for r in range(W):
            p = d / f"rank{r}.pt"
            if p.exists():
                got = torch.load(p, weights_only=False)
                if "crash" in got:
                    print(f"rank {r}:\n{got['crash']}")
    return [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(W)]


@pytest.fixture(params=WORLDS, ids=lambda w: f"world{w}")
def world(request, spawned):
    """(world size, the results of the group of that size, rank by rank)."""
    w = request.param
    ranks = CC.groups_of(WORLDS)[w]
    return w, [spawned[r] for r in (range(w) if ranks is None else ranks)]


_refs = {}


def unsharded(case, oracle):
    """out, LSE and the gradients of the unsharded call (flex_attention) on
    the case's backend, or (oracle) in float64 on the reference."""
    key = (case.name, oracle)
    if key not in _refs:
        from flexc.torch import flex_attention
        q, k, v, dout, dlse, bufs = CC.inputs(case, SEED)
        for n in CC.GRAD_BUFFERS:
            if n in bufs:
                bufs[n].requires_grad_()
        cast = (lambda x: x.double()) if oracle else (lambda x: x)
        leaves = [cast(x).clone().requires_grad_() for x in (q, k, v)]
        kw = CC.flex_keywords(CC.keywords(case, bufs))
        out, lse = flex_attention(*leaves, return_lse=True,
                                  backend="reference" if oracle else case.backend, **kw)
        ((out * cast(dout)).sum() + (lse * cast(dlse)).sum()).backward()
        _refs[key] = {"out": out.detach(), "lse": lse.detach(), "dq": leaves[0].grad,
                      "dk": leaves[1].grad, "dv": leaves[2].grad,
                      "dbuf": {n: t.grad for n, t in bufs.items() if t.grad is not None}}
    return _refs[key]


def assemble(shards, lb):
    """The whole tensor (dim 2) from every rank's shard, by the layout."""
    from flexc.torch.distributed import layout
    total = sum(s.shape[2] for s in shards)
    out = shards[0].new_empty(shards[0].shape[:2] + (total,) + shards[0].shape[3:])
    for s, pieces in zip(shards, layout(total, len(shards), lb)):
        at = 0
        for a, b in pieces:
            out[:, :, a:b] = s[:, :, at:at + b - a]
            at += b - a
    return out


TOL = {torch.float32: (1e-4, 1e-3), torch.float16: (5e-3, 2e-2), torch.bfloat16: (3e-2, 6e-2)}


def rel(x, ref):
    assert torch.isfinite(x).all(), "non-finite values"
    return float((x.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("lb", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("method", CC.METHODS)
@pytest.mark.parametrize("name", [c.name for c in CC.CASES])
def test_matches_unsharded(world, name, method, lb):
    W, ranks = world
    case = CC.BY_NAME[name]
    got = [r[(W, name, method, lb)] for r in ranks]
    # against the same call unsharded (the same backend and dtype: the
    # merge's error only), and against the float64 reference
    for oracle in (False, True):
        ref = unsharded(case, oracle)
        tight = case.dtype == torch.float64 or not oracle and case.backend == "reference"
        fwd, grad = (1e-10, 1e-10) if tight else TOL[case.dtype]
        errs = {}
        for key in ("out", "lse", "dq", "dk", "dv"):
            errs[key] = rel(assemble([g[key] for g in got], lb), ref[key])
        for r, g in enumerate(got):  # unshard reassembles the same on every rank
            errs[f"unshard{r}"] = rel(g["full_out"], ref["out"])
            assert set(g["dbuf"]) == set(ref["dbuf"])
        for n, t in ref["dbuf"].items():  # a buffer's gradient: each rank's share, summed
            errs[f"d{n}"] = rel(sum(g["dbuf"][n].double() for g in got), t)
        print(f"{name} {method} {'balanced' if lb else 'contiguous'} world {W} against "
              f"{'float64 reference' if oracle else 'unsharded'}: " +
              " ".join(f"{k} {v:.2e}" for k, v in errs.items()))
        for key, e in errs.items():
            tol = fwd if key in ("out", "lse") or key.startswith("unshard") else grad
            assert e < tol, f"{key}: relative error {e:.3e} over {tol:g} (seed {SEED})"


@pytest.mark.parametrize("method", CC.METHODS)
def test_causal_skips_the_upper_triangle(world, method):
    """Under a causal mask the pairs above the diagonal are skipped: of W x
    W chunk pairs W(W-1)/2, of 2W x 2W (balanced) W(2W-1); balanced, every
    rank computes the same 2W + 1 pairs, contiguous rank r computes r + 1."""
    W, ranks = world
    for lb in (True, False):
        counts = [r[(W, "causal", method, lb)]["counts"] for r in ranks]
        n = 2 * W if lb else W
        for phase in ("forward", "backward"):
            assert sum(c[f"{phase}_pairs"] for c in counts) == n * n
            assert sum(c[f"{phase}_skipped"] for c in counts) == n * (n - 1) // 2
        done = [c["forward_pairs"] - c["forward_skipped"] for c in counts]
        assert done == ([2 * W + 1] * W if lb else [r + 1 for r in range(W)]), done
        # what travelled: K and V of every other rank (float32 here), and in
        # the ring's backward the float32 dK and dV accumulators of every rank
        from flexc.torch.distributed import layout
        case = CC.BY_NAME["causal"]
        row = case.B * case.HKV * case.E * 4 * 2  # one row of K and V, bytes
        lengths = [sum(e - s for s, e in p) for p in layout(case.Lkv, W, lb)]
        for r, c in enumerate(counts):
            others = sum(n for j, n in enumerate(lengths) if j != r)
            if method == "ring":
                assert c["forward_bytes_in"] == row * others, (r, c)
                assert c["backward_bytes_in"] == row * (others + (case.Lkv if W > 1 else 0)), (r, c)
            else:  # padded to the longest shard
                assert c["forward_bytes_in"] == row * (W - 1) * max(lengths), (r, c)
                assert c["backward_bytes_in"] == row * (W - 1) * max(lengths), (r, c)


def test_refusals(spawned):
    """Invalid calls on the default group: refused on every rank, with the
    reason where it lies, and the group works afterwards."""
    W = len(spawned)
    said = [r["errors"] for r in spawned]
    others = list(range(1, W))
    for r, s in enumerate(said):
        def has(key, *texts):
            assert s[key] is not None and all(t in s[key] for t in texts), (r, key, s[key])
        has("sink_twice", "ValueError", "sink function of its own", "sinks=")
        has("sinks_shape", "ValueError", "sinks must be a 1-D tensor", "shape [2]")
        if r == 0:
            has("sink_fn_some", "ValueError", f"rank(s) {others} could not evaluate the sink")
        else:
            has("sink_fn_some", "ValueError", "the sink function could not be evaluated")
        has("layout", "ValueError", "not the layout", "flexc.torch.distributed.shard")
        has("kv_rows", "ValueError", "k and v must hold the same rows, got 8 and 7")
        has("heads", "ValueError", "a divisor of q's 3")
        has("dtype", "ValueError", "must share a device and a dtype")
        has("batch", "ValueError", "the ranks disagree on B: [2" + ", 1" * (W - 1) + "]")
        if r == 0:
            has("method", "ValueError", "method must be 'ring' or 'allgather', got 'zigzag'")
        else:
            has("method", "ValueError", "rank(s) [0] of the group refused the call")
        has("group_type", "TypeError", "group must be a torch.distributed ProcessGroup", "str")
        if r == 0:
            has("not_member", "ValueError", "global rank 0", "is not a member of the group")
        else:
            assert s["not_member"] is None, s["not_member"]
        has("buffer", "out-of-range read of buffer")
        if r == 0:
            has("buffer_some", "RuntimeError", f"the forward failed on rank(s) {others}")
        else:
            has("buffer_some", "out-of-range read of buffer 'doc'")
        assert s["after"] is None, s["after"]
        assert s["roundtripTrue"] and s["roundtripFalse"]
    print("refusals:", said)


def test_layout():
    """The chunks: torch.tensor_split's (the first ones a row longer), rank r
    holding r and 2W - 1 - r when balanced; too short a sequence refused."""
    from flexc.torch.distributed import layout
    assert layout(23, 3, True) == [[(0, 4), (20, 23)], [(4, 8), (16, 20)], [(8, 12), (12, 16)]]
    assert layout(23, 3, False) == [[(0, 8)], [(8, 16)], [(16, 23)]]
    assert layout(4, 2, True) == [[(0, 1), (3, 4)], [(1, 2), (2, 3)]]
    with pytest.raises(ValueError, match="a sequence of 3 rows cannot be cut into 4 chunks"):
        layout(3, 2, True)


def test_not_initialized():
    """A call without torch.distributed initialized says so."""
    import flexc.torch.distributed as cp
    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        cp.context_parallel_attention(x, x, x)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        cp.shard(x)
