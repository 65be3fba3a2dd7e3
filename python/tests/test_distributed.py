"""flexc.torch.distributed on 2 and 4 processes (gloo on the host, the cpu
backend where built, FLEXC_THREADS=1 each) against the same inputs run
unsharded in this process with flexc.torch.flex_attention: out, LSE, dq,
dk, dv and buffer gradients of every case in cp_cases.CASES (causal; a
document mask reading a whole-sequence id buffer; sliding window + softcap
from a .score kernel; ALiBi with grouped heads and a `grad` buffer;
dropout; unequal query and key lengths; float64 on the reference), by both
methods, with and without load balancing, at lengths that do not divide
evenly; the shard pairs the causal mask rules out are counted as skipped;
invalid calls are refused on every rank without hanging."""
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


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def world(request, tmp_path_factory):
    """(world size, every rank's results) of one spawn of all the cases."""
    import torch.multiprocessing as mp
    W = request.param
    d = tmp_path_factory.mktemp(f"world{W}")
    print(f"test_distributed: world {W}, seed {SEED}")
    try:
        mp.spawn(CC.worker, args=(W, str(d / "rendezvous"), str(d), SEED), nprocs=W)
    finally:
        crashes = []
        for r in range(W):
            p = d / f"rank{r}.pt"
            if p.exists():
                got = torch.load(p, weights_only=False)
                if "crash" in got:
                    crashes.append(f"rank {r}:\n{got['crash']}")
        if crashes:
            print("\n".join(crashes))
    return W, [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(W)]


_refs = {}


def reference(case):
    """out, LSE and the gradients of the unsharded call (flex_attention)."""
    if case.name not in _refs:
        from flexc.torch import flex_attention
        q, k, v, dout, dlse, bufs = CC.inputs(case, SEED)
        if case.name == "alibi_gqa":
            bufs["slopes"].requires_grad_()
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        kw = CC.flex_keywords(CC.keywords(case, bufs))
        out, lse = flex_attention(*leaves, return_lse=True, backend=case.backend, **kw)
        ((out * dout).sum() + (lse * dlse).sum()).backward()
        _refs[case.name] = {"out": out.detach(), "lse": lse.detach(), "dq": leaves[0].grad,
                            "dk": leaves[1].grad, "dv": leaves[2].grad,
                            "dbuf": {n: t.grad for n, t in bufs.items() if t.grad is not None}}
    return _refs[case.name]


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


def rel(x, ref):
    assert torch.isfinite(x).all(), "non-finite values"
    return float((x.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("lb", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("method", CC.METHODS)
@pytest.mark.parametrize("name", [c.name for c in CC.CASES])
def test_matches_unsharded(world, name, method, lb):
    W, ranks = world
    case = CC.BY_NAME[name]
    ref = reference(case)
    got = [r[(name, method, lb)] for r in ranks]
    fwd, grad = (1e-10, 1e-10) if case.dtype == torch.float64 else (1e-4, 1e-3)
    errs = {}
    for key in ("out", "lse", "dq", "dk", "dv"):
        errs[key] = rel(assemble([g[key] for g in got], lb), ref[key])
    for r, g in enumerate(got):  # unshard reassembles the same on every rank
        errs[f"unshard{r}"] = rel(g["full_out"], ref["out"])
        for n, t in ref["dbuf"].items():  # a buffer's gradient: the whole call's, on every rank
            errs[f"d{n}{r}"] = rel(g["dbuf"][n], t)
        assert set(g["dbuf"]) == set(ref["dbuf"])
    print(f"{name} {method} {'balanced' if lb else 'contiguous'} world {W}: " +
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
        counts = [r[("causal", method, lb)]["counts"] for r in ranks]
        n = 2 * W if lb else W
        for phase in ("forward", "backward"):
            assert sum(c[f"{phase}_pairs"] for c in counts) == n * n
            assert sum(c[f"{phase}_skipped"] for c in counts) == n * (n - 1) // 2
        done = [c["forward_pairs"] - c["forward_skipped"] for c in counts]
        assert done == ([2 * W + 1] * W if lb else [r + 1 for r in range(W)]), done


def test_refusals(world):
    W, ranks = world
    said = [r["errors"] for r in ranks]
    for r, s in enumerate(said):
        assert "ValueError" in s["sink"] and "has a sink function" in s["sink"], s["sink"]
        assert "ValueError" in s["layout"] and "not the layout" in s["layout"], s["layout"]
        assert "ValueError" in s["method"], s["method"]
        if r == 0:
            assert "method must be 'ring' or 'allgather'" in s["method"]
        else:
            assert "rank(s) [0] of the group refused the call" in s["method"]
        assert s["buffer"] is not None and ("out-of-range read of buffer" in s["buffer"] or
                                            "failed on rank(s)" in s["buffer"]), s["buffer"]
        if r == 0:
            assert s["buffer_some"].startswith("RuntimeError") and \
                f"the forward failed on rank(s) {list(range(1, W))}" in s["buffer_some"], \
                s["buffer_some"]
        else:
            assert "out-of-range read of buffer 'doc'" in s["buffer_some"], s["buffer_some"]
        assert s["after"] is None, s["after"]
        assert s["roundtripTrue"] and s["roundtripFalse"]
    assert any("out-of-range read" in s["buffer"] for s in said)
    print("refusals:", said)
