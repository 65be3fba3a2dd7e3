"""Attention sinks from Python (docs/language.md "Attention sinks"):
flex_attention(..., sinks=) with one learnable logit per query head, a
traced Python sink function, and a .score kernel with a sink, against a
dense float64 softmax over the keys plus the sink column (then dropped):
forward, LSE and the gradients of q, k, v and the sink logits."""
import math

import pytest
import torch

import flexc
from flexc.torch import flex_attention

B, H, HKV, L, E = 2, 4, 2, 40, 16
BACKENDS = [b for b in ("reference", "cpu") if b in flexc.backends()]
TOL = {"reference": (1e-10, 1e-9), "cpu": (1e-4, 1e-3)}


def causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def dense(q, k, v, col, window=None):
    """(out, lse) with a sink column col [B or 1, H, L, 1]."""
    k = k.repeat_interleave(H // HKV, 1)
    v = v.repeat_interleave(H // HKV, 1)
    t = q @ k.transpose(-1, -2) / math.sqrt(E)
    i = torch.arange(L)
    keep = i[:, None] >= i[None, :]
    if window is not None:
        keep = keep & (i[:, None] - i[None, :] < window)
    t = t.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(torch.cat([t, col.expand(t.shape[0], H, L, 1)], -1), -1)
    return torch.exp(t - lse[..., None]) @ v, lse


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, HKV, L, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, HKV, L, E, generator=g, dtype=torch.float64)
    return q, k, v, torch.rand(H, generator=g) * 4 - 1, torch.randn(B, H, L, E, generator=g)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm()).item()


def check(backend, run, col_fn, leaves64, window=None):
    """run(q, k, v) -> (out, lse) with autograd, in the backend's dtype;
    col_fn(leaves) -> the sink column; compared with dense float64."""
    dt = torch.float64 if backend == "reference" else torch.float32
    q, k, v, sk, dout = leaves64
    mine = [x.detach().to(dt).requires_grad_() for x in (q, k, v)]
    sk_m = sk.detach().clone().requires_grad_()
    out, lse = run(*mine, sk_m)
    ((out * dout.to(dt)).sum() + lse.sum()).backward()
    ref = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    sk_r = sk.detach().clone().requires_grad_()
    o2, l2 = dense(*ref, col_fn(sk_r), window)
    ((o2 * dout.double()).sum() + l2.sum()).backward()
    ftol, gtol = TOL[backend]
    assert rel(out, o2) < ftol and rel(lse, l2) < ftol
    for a, b in zip(mine + [sk_m], ref + [sk_r]):
        assert rel(a.grad, b.grad) < gtol


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_head_sinks_tensor(backend):
    leaves = inputs(1)

    def run(q, k, v, sk):
        return flex_attention(q, k, v, score_mod=causal, sinks=sk, return_lse=True,
                              backend=backend)
    check(backend, run, lambda s: s.double().view(1, H, 1, 1).expand(1, H, L, 1), leaves)


@pytest.mark.parametrize("backend", BACKENDS)
def test_traced_sink_function(backend):
    leaves = inputs(2)

    def run(q, k, v, sk):
        def per_query(b, h, q_idx):
            return sk[h] + 0.25 * torch.log((q_idx + 1).float())
        return flex_attention(q, k, v, score_mod=causal, sinks=per_query, return_lse=True,
                              backend=backend)

    def col(s):
        # the reference evaluates the language's float ops in binary64
        qs = torch.log(torch.arange(1, L + 1, dtype=torch.float64)) * 0.25
        return (s.double().view(1, H, 1, 1) + qs.view(1, 1, L, 1))
    check(backend, run, col, leaves)


@pytest.mark.parametrize("backend", BACKENDS)
def test_score_file_with_sink_and_window(backend):
    leaves = inputs(3)
    k = flexc.compile("samples/sink_window.score")
    assert k.info().sink == "per_head" and "sink" in k.info().features

    def run(q, kk, v, sk):
        return flex_attention(q, kk, v, score_mod=k, params={"window": 6},
                              buffers={"sinks": sk}, return_lse=True, backend=backend)
    check(backend, run, lambda s: s.double().view(1, H, 1, 1).expand(1, H, L, 1), leaves, 6)


def test_to_score_shows_the_sink():
    sk = torch.zeros(H)
    text = flexc.torch.to_score(causal, None, lambda b, h, q_idx: sk[h])
    assert "sink " in text and "f32[4]" in text


def test_sinks_refused_where_the_kernel_has_one():
    k = flexc.compile("samples/sink_gptoss.score")
    q = torch.randn(1, H, 8, E)
    with pytest.raises(ValueError, match="has a sink function of its own"):
        flex_attention(q, q[:, :HKV], q[:, :HKV], score_mod=k, buffers={"sinks": torch.zeros(H)},
                       sinks=torch.zeros(H))


def test_sinks_shape_checked():
    q = torch.randn(1, H, 8, E)
    with pytest.raises(ValueError, match=r"one logit\s+per query head"):
        flex_attention(q, q, q, sinks=torch.zeros(H + 1))
