"""attention-gym's and PyTorch's own FlexAttention score_mods and
mask_mods (mods.py), written as Python functions and traced by flexc:
every one traces; flexc.torch.flex_attention matches PyTorch's
flex_attention (eager, float64, CPU) forward on the cpu backend (float32)
and the reference (float64), and dense float64 autograd for dq, dk, dv and
the gradients of the captured tensors that require grad; with PyTorch's
BlockMask and with flexc.torch.create_block_mask, which lists the same
blocks as PyTorch's create_block_mask. (That each of them traces, to
.score that `flexc check` accepts, is test_trace.py's, which CI runs;
this matrix, about two minutes on two cores, has the CTest label `slow`.)

Tolerances (relative norm error): float32 1e-4 forward, 1e-3 gradients;
bfloat16 3e-2 and 6e-2; the float64 reference 1e-6: a captured float
tensor is a binary32 buffer and a float literal a binary32 constant in
.score (docs/language.md), so the float64 result is exact only up to those.
Inputs are fresh random every run (seed printed)."""
import os
import random

import pytest
import torch
from mods import MODS
from oracle import dense_mods, eager_only, rel_err
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention

import flexc.torch as ft
from flexc import _mods

SEED = int(os.environ.get("FLEXC_SEED", random.randrange(1 << 31)))
print(f"test_mods: FLEXC_SEED={SEED}")
B, H, HKV, E = 2, 4, 2, 16
BLOCK = 16
ids = [m.name for m in MODS]


def _setup(mod, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(SEED + sum(map(ord, mod.name)))
    score_mod, mask_mod, leaves = mod.make(B, H, mod.q_len, mod.kv_len, g)
    q = torch.randn(B, H, mod.q_len, E, generator=g, dtype=dtype)
    k = torch.randn(B, HKV, mod.kv_len, E, generator=g, dtype=dtype)
    v = torch.randn(B, HKV, mod.kv_len, E, generator=g, dtype=dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return score_mod, mask_mod, leaves, (q, k, v), g


def _torch_block_mask(mask_mod, mod, block=BLOCK):
    return None if mask_mod is None else create_block_mask(
        mask_mod, B, H, mod.q_len, mod.kv_len, device="cpu", BLOCK_SIZE=block)


@pytest.mark.parametrize("mod", MODS, ids=ids)
def test_forward_matches_torch_flex_attention(mod):
    eager_only()
    score_mod, mask_mod, _, (q, k, v), _ = _setup(mod)
    bm = _torch_block_mask(mask_mod, mod)
    with torch.no_grad():
        ref, aux = torch_flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                        enable_gqa=True, return_lse=True)
    # float64 on the reference, with PyTorch's BlockMask (its lists and its mask_mod)
    out, lse = ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                 backend="reference", return_lse=True)
    assert out.dtype == torch.float64
    assert rel_err(out, ref) < 1e-6 and rel_err(lse, aux) < 1e-6
    # float32 on the cpu backend, the blocks from flexc's own create_block_mask
    fbm = None if mask_mod is None else ft.create_block_mask(
        mask_mod, B, H, mod.q_len, mod.kv_len, BLOCK_SIZE=64)
    out, lse = ft.flex_attention(q.float(), k.float(), v.float(), score_mod=score_mod,
                                 block_mask=fbm, return_lse=True)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) < 1e-4 and rel_err(lse, aux) < 1e-4


@pytest.mark.parametrize("mod", [m for m in MODS if m.make(1, 1, m.q_len, m.kv_len,
                                                            torch.Generator())[1] is not None],
                         ids=lambda m: m.name)
def test_create_block_mask_lists_torch_blocks(mod):
    score_mod, mask_mod, _, _, _ = _setup(mod)
    theirs = _torch_block_mask(mask_mod, mod)
    ours = ft.create_block_mask(mask_mod, B, H, mod.q_len, mod.kv_len, BLOCK_SIZE=BLOCK)
    assert ours.mask_mod is mask_mod and ours.BLOCK_SIZE == (BLOCK, BLOCK)
    # PyTorch pads the last row and column of blocks with masked elements, so
    # it lists such a block partial where flexc, which classifies a block by
    # its real elements, may list it full; every other block is classified
    # alike, and the same blocks are visited.
    rows, cols = -(-mod.q_len // BLOCK), -(-mod.kv_len // BLOCK)
    padded = {(side, r, c) for side in ("kv", "q") for r in range(max(rows, cols))
              for c in range(max(rows, cols))
              if (mod.q_len % BLOCK and (r if side == "kv" else c) == rows - 1)
              or (mod.kv_len % BLOCK and (c if side == "kv" else r) == cols - 1)}
    for side in ("kv", "q"):
        got, want = {}, {}
        for full in ("", "full_"):
            num, idx = full + side + "_num_blocks", full + side + "_indices"
            got[full] = _blocks(getattr(ours, num), getattr(ours, idx))
            want[full] = _blocks(getattr(theirs, num), getattr(theirs, idx))
            inner = {x for x in want[full] | got[full] if (side, x[2], x[3]) not in padded}
            assert {x for x in got[full] if x in inner} == {x for x in want[full] if x in inner}, \
                (side, full)
        assert got[""] | got["full_"] == want[""] | want["full_"], side
    # Converted to PyTorch's BlockMask, it drives PyTorch's flex_attention.
    tb = ours.as_torch()
    assert tb.mask_mod is mask_mod


def _blocks(num, idx):
    """(b, h, row, block) listed, with b and h spread over B and H where a
    mask stores 1 for 'every batch / head'."""
    num, idx = torch.as_tensor(num), torch.as_tensor(idx)
    out = set()
    for b in range(B):
        for h in range(H):
            n = num[b % num.shape[0], h % num.shape[1]]
            ix = idx[b % idx.shape[0], h % idx.shape[1]]
            for r in range(n.shape[0]):
                out.update((b, h, r, int(c)) for c in ix[r, :int(n[r])])
    return out


def _grads_match(mod, backend, dtype, tol):
    score_mod, mask_mod, leaves, (q, k, v), g = _setup(mod, dtype=dtype, grad=True)
    learn = [leaves[n] for n in mod.learn]
    bm = _torch_block_mask(mask_mod, mod, BLOCK if backend == "reference" else 64)
    out, lse = ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, backend=backend,
                                 return_lse=True)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    dlse = torch.randn(lse.shape, generator=g, dtype=torch.float64)

    def loss(o, lse_):
        return (o.double() * dout).sum() + (lse_.double().where(torch.isfinite(lse_), 0) * dlse).sum()
    got = torch.autograd.grad(loss(out, lse), [q, k, v] + learn)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out64, lse64 = dense_mods(*wide, score_mod, mask_mod)
    want = torch.autograd.grad(loss(out64, lse64), wide + learn)
    for name, a, w in zip(["dq", "dk", "dv"] + list(mod.learn), got, want):
        assert a.dtype == (dtype if name in ("dq", "dk", "dv") else w.dtype), name
        assert rel_err(a, w) < tol, (name, rel_err(a, w))


@pytest.mark.parametrize("mod", MODS, ids=ids)
def test_gradients_match_dense_float64_autograd(mod):
    _grads_match(mod, "cpu" if ft._HOST_BACKEND == "cpu" else "reference", torch.float32, 1e-3)
    _grads_match(mod, "reference", torch.float64, 1e-6)


BF16 = ["alibi", "softcap", "graphormer_spatial", "document", "natten", "rel_pos_3d_transposed",
        "euclidean_dist", "module_method"]


@pytest.mark.parametrize("name", BF16)
def test_bfloat16_within_tolerance(name):
    mod = next(m for m in MODS if m.name == name)
    eager_only()
    score_mod, mask_mod, _, (q, k, v), _ = _setup(mod)
    bm = _torch_block_mask(mask_mod, mod, 64)
    with torch.no_grad():
        ref = torch_flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)
    out = ft.flex_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), score_mod=score_mod,
                            block_mask=bm)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 3e-2
    _grads_match(mod, ft._HOST_BACKEND, torch.bfloat16, 6e-2)


def test_traced_once_per_function():
    """A training step pays no tracing or compiling after the first call:
    closures made anew each step (same code, new captured tensors) reuse
    the trace and the kernel."""
    mod = next(m for m in MODS if m.name == "graphormer_spatial")
    before = None
    for step in range(3):
        score_mod, _, leaves, (q, k, v), _ = _setup(mod)
        ft.flex_attention(q.float(), k.float(), v.float(), score_mod=score_mod)
        if before is None:
            before = dict(_mods.stats)
    assert _mods.stats == before
