"""The oracles: PyTorch's own flex_attention, and a dense float64
attention written with torch ops whose gradients come from torch autograd
(docs/language.md's "Semantics", materialised)."""
import math

import torch
from torch.nn.attention.flex_attention import AuxRequest
from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention

TOL = {  # relative norm error: forward (out, LSE), gradients
    torch.float32: (1e-4, 1e-3),
    torch.bfloat16: (3e-2, 6e-2),
    torch.float16: (3e-2, 6e-2),
}


def eager_only():
    """PyTorch's eager flex_attention as plain PyTorch code: without this it
    runs its functions through torch.compile, whose automatic dynamic
    shapes fail on the second of two calls of different sizes (seen with
    PyTorch 2.15)."""
    import torch.nn.attention.flex_attention as fa
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True


def rel_err(a, b):
    """||a - b|| / ||b|| in float64 over the entries where b is finite;
    infinities must sit in the same places."""
    a, b = a.detach().double(), b.detach().double()
    fin = torch.isfinite(b)
    assert torch.equal(fin, torch.isfinite(a)), "non-finite entries differ"
    assert torch.equal(a[~fin], b[~fin]), "infinities differ"
    return ((a[fin] - b[fin]).norm() / b[fin].norm().clamp_min(1e-30)).item()


def sizes(q, k):
    B, H, QL, _ = q.shape
    return {"B": B, "H": H, "HKV": k.shape[1], "Q_LEN": QL, "KV_LEN": k.shape[2]}


def torch_mods(case, bufs, q, k):
    """case's score and mask as flex_attention's score_mod and mask_mod."""
    p = dict(sizes(q, k), **case.params)
    score_mod = None if case.score is None else (
        lambda s, b, h, qi, kv: case.score(s, b, h, qi, kv, bufs, p))
    mask_mod = None if case.mask is None else (
        lambda b, h, qi, kv: case.mask(b, h, qi, kv, bufs, p))
    return score_mod, mask_mod


def torch_reference(case, q, k, v, bufs, block_mask=None):
    """(out, lse) from torch.nn.attention.flex_attention (eager, no grad)."""
    from torch.nn.attention.flex_attention import create_block_mask
    score_mod, mask_mod = torch_mods(case, bufs, q, k)
    eager_only()
    if block_mask is None and mask_mod is not None:
        block_mask = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2],
                                       device=str(q.device), BLOCK_SIZE=16)
    with torch.no_grad():
        out, aux = torch_flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                        enable_gqa=q.shape[1] != k.shape[1],
                                        return_aux=AuxRequest(lse=True))
    return out, aux.lse


def dense(case, q, k, v, bufs, scale=None):
    """(out, lse) of docs/language.md's semantics, materialised, differentiable."""
    B, H, QL, E = q.shape
    G = H // k.shape[1]
    p = dict(sizes(q, k), **case.params)
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    scale = 1 / math.sqrt(E) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(QL).view(1, 1, QL, 1)
    kv = torch.arange(k.shape[2]).view(1, 1, 1, -1)
    t = s if case.score is None else case.score(s, b, h, qi, kv, bufs, p)
    if case.mask is not None:
        keep = case.mask(b, h, qi, kv, bufs, p).expand_as(t)
        t = t.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(t, dim=-1)
    live = torch.isfinite(lse)
    P = torch.where(live[..., None], torch.exp(t - lse.where(live, 0)[..., None]), 0)
    return P @ v, lse


def dense_mods(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """(out, lse) of Python score_mod and mask_mod functions over every
    (b, h, q_idx, kv_idx), evaluated the way PyTorch's own eager
    FlexAttention does (torch.vmap over each index), then docs/language.md's
    semantics materialised: differentiable with respect to q, k, v and
    every tensor the functions capture. (PyTorch's eager path also turns
    `t[i]` into its own index op, whose backward fails under vmap for
    chained indexing such as `bias[b][q_idx]`; plain vmap indexing gives
    the same values and working gradients.)"""
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv
    B, H, QL, E = q.shape
    G = H // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    scale = 1 / math.sqrt(E) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    idx = [torch.arange(n, dtype=torch.int32) for n in (B, H, QL, k.shape[2])]
    t = s if score_mod is None else _vmap_for_bhqkv(score_mod, prefix=(0,))(s, *idx)
    if mask_mod is not None:
        keep = _vmap_for_bhqkv(mask_mod, prefix=())(*idx).expand_as(t)
        t = t.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(t, dim=-1)
    live = torch.isfinite(lse)
    P = torch.where(live[..., None], torch.exp(t - lse.where(live, 0)[..., None]), 0)
    return (P @ v).to(q.dtype), lse
