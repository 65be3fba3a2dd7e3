"""Block masks: PyTorch's own BlockMask (create_block_mask) passed to
flexc gives what flexc's own block handling gives, and what PyTorch's
flex_attention gives with the same BlockMask; flexc's BlockMask
(Kernel.block_mask) lists the same blocks as PyTorch's."""
import numpy as np
import pytest
import torch
from cases import BY_NAME, Case
from conftest import compiled, make_inputs
from oracle import TOL, dense, rel_err, torch_mods, torch_reference
from torch.nn.attention.flex_attention import create_block_mask

import flexc
from flexc._capi import lib
from flexc.torch import flex_attention

MASKED = ["causal", "causal_lower_right", "sliding_window", "document", "natten", "prefix_lm",
          "gemma2", "dilated", "head_temperature", "softcap_sliding_window"]
BLOCK = 16


def torch_block_mask(case, q, k, bufs, per_batch_head=False):
    _, mask_mod = torch_mods(case, bufs, q, k)
    B, H = (q.shape[0], q.shape[1]) if per_batch_head else (None, None)
    return create_block_mask(mask_mod, B, H, q.shape[2], k.shape[2], device="cpu",
                             BLOCK_SIZE=BLOCK)


@pytest.mark.parametrize("name", MASKED)
def test_torch_block_mask_gives_flexc_own_result(name):
    case = BY_NAME[name]
    # float64 on the reference: both runs are exact, so they must agree to rounding.
    q, k, v, bufs = make_inputs(case, torch.float64, grad=True)
    bm = torch_block_mask(case, q, k, bufs, per_batch_head=name == "head_temperature")
    assert bm.kv_num_blocks.sum() < bm.kv_num_blocks.numel() * bm.kv_indices.shape[-1] or \
        name == "head_temperature", "the mask should skip some blocks"
    kern = compiled(case)
    call = dict(score_mod=kern, params=case.params, buffers=bufs, return_lse=True,
                backend="reference")
    out, lse = flex_attention(q, k, v, block_mask=bm, **call)
    own_out, own_lse = flex_attention(q, k, v, **call)
    assert rel_err(out, own_out) < 1e-12 and rel_err(lse, own_lse) < 1e-12
    # Gradients through the block mask's q side too.
    (out.sum() + lse.where(torch.isfinite(lse), 0).sum()).backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (own_out.sum() + own_lse.where(torch.isfinite(own_lse), 0).sum()).backward()
    for g, t in zip(grads, (q, k, v)):
        assert rel_err(g, t.grad) < 1e-12


@pytest.mark.parametrize("name", ["causal", "document", "natten"])
def test_torch_block_mask_matches_torch_flex_attention(name):
    case = BY_NAME[name]
    q, k, v, bufs = make_inputs(case, torch.float32)
    bm = torch_block_mask(case, q, k, bufs)
    out, lse = flex_attention(q, k, v, score_mod=compiled(case), block_mask=bm,
                              params=case.params, buffers=bufs, return_lse=True)
    ref_out, ref_lse = torch_reference(case, q, k, v, bufs, block_mask=bm)
    assert rel_err(out, ref_out) < TOL[torch.float32][0]
    assert rel_err(lse, ref_lse) < TOL[torch.float32][0]


def test_block_mask_decides_which_blocks_are_visited():
    # A BlockMask is part of a call's meaning: blocks it leaves out are
    # masked even where the kernel's mask would keep them. The causal block
    # lists without a mask_mod (PyTorch's noop_mask) keep exactly the
    # diagonal blocks' whole area; with the causal mask_mod (traced), the
    # causal elements, as PyTorch's flex_attention gives.
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask
    q = torch.randn(1, 1, 64, 16, dtype=torch.float64)
    k, v = torch.randn_like(q), torch.randn_like(q)
    bm = create_block_mask(lambda b, h, i, j: i >= j, None, None, 64, 64, device="cpu",
                           BLOCK_SIZE=BLOCK)
    blocks = TorchBlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                           bm.full_kv_indices, BLOCK_SIZE=BLOCK)
    out = flex_attention(q, k, v, block_mask=blocks, backend="reference")
    block_causal = Case("block_causal", "", None, lambda b, h, i, j, u, p: i // BLOCK >= j // BLOCK)
    ref, _ = dense(block_causal, q, k, v, {})
    assert rel_err(out, ref) < 1e-12
    out = flex_attention(q, k, v, block_mask=bm, backend="reference")
    ref, _ = dense(BY_NAME["causal"], q, k, v, {})
    assert rel_err(out, ref) < 1e-12


needs_create = pytest.mark.skipif(
    not lib.has("flex_block_mask_create"),
    reason=f"{lib.path} has no flex_block_mask_create (built before the runtime added it)")


def _blocks(num, idx):
    """The set of (b, h, row, block) a BlockMask side lists."""
    num, idx = np.asarray(num), np.asarray(idx)
    out = set()
    for b, h, r in np.ndindex(*num.shape):
        out.update((b, h, r, int(c)) for c in idx[b, h, r, :num[b, h, r]])
    return out


@needs_create
@pytest.mark.parametrize("name", ["causal", "sliding_window", "document", "natten", "prefix_lm"])
def test_flexc_block_mask_lists_torch_blocks(name):
    case = BY_NAME[name]
    q, k, v, bufs = make_inputs(case, torch.float32)
    tbm = torch_block_mask(case, q, k, bufs)
    fbm = compiled(case).block_mask(2, 4, case.q_len, case.kv_len, block_size=BLOCK,
                                    params=case.params, buffers=bufs)
    assert isinstance(fbm, flexc.BlockMask) and fbm.BLOCK_SIZE == (BLOCK, BLOCK)
    # B and H are 1 in both when the mask reads neither.
    for side in ("kv", "q"):
        for full in ("", "full_"):
            num, idx = full + side + "_num_blocks", full + side + "_indices"
            assert _blocks(getattr(fbm, num), getattr(fbm, idx)) == \
                _blocks(getattr(tbm, num), getattr(tbm, idx)), (side, full)
    out = flex_attention(q, k, v, score_mod=compiled(case), block_mask=fbm,
                         params=case.params, buffers=bufs)
    own = flex_attention(q, k, v, score_mod=compiled(case), params=case.params, buffers=bufs)
    assert rel_err(out, own) < 1e-6
    # flexc's mask drives PyTorch's own flex_attention as PyTorch's does.
    tmask = torch_mods(case, bufs, q, k)[1]
    theirs, _ = torch_reference(case, q, k, v, bufs, block_mask=fbm.as_torch(tmask))
    assert rel_err(theirs, own) < TOL[torch.float32][0]
    # The same mask object works through the Kernel call on NumPy arrays.
    npo = compiled(case)(q.numpy(), k.numpy(), v.numpy(), params=case.params,
                         buffers={n: t.numpy() for n, t in bufs.items()}, block_mask=fbm)
    assert rel_err(torch.from_numpy(npo), own) < 1e-6
