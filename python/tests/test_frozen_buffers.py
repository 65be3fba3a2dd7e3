"""A buffer declared `grad` but passed without requires_grad (a frozen
bias table): the backward computes q, k and v gradients, never the
buffer's, and must neither crash nor write anywhere (the call runs a joint
without the buffer's gradient adds)."""
import pytest
import torch
from cases import CASES
from conftest import compiled, make_inputs
from oracle import TOL, dense, rel_err

import flexc
from flexc.torch import flex_attention

FROZEN = [c for c in CASES if c.name in ("relpos_bias", "head_temperature")]


@pytest.mark.parametrize("backend", ["cpu", "reference", "emu"])
@pytest.mark.parametrize("case", FROZEN, ids=[c.name for c in FROZEN])
def test_frozen_grad_buffer(case, backend):
    if backend not in flexc.backends():
        pytest.skip(f"no {backend} backend in this build")
    q, k, v, bufs = make_inputs(case, torch.float32, grad=True)
    for t in bufs.values():
        t.requires_grad_(False)
    assert compiled(case).grad_buffers  # the case does declare a `grad` buffer
    out = flex_attention(q, k, v, score_mod=compiled(case), params=case.params, buffers=bufs,
                         backend=backend)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * dout).sum().backward()
    wide = {n: t.detach().double().requires_grad_() for n, t in (("q", q), ("k", k), ("v", v))}
    out64, _ = dense(case, wide["q"], wide["k"], wide["v"], bufs)
    (out64 * dout.double()).sum().backward()
    for n, t in (("q", q), ("k", k), ("v", v)):
        assert rel_err(t.grad, wide[n].grad) < TOL[torch.float32][1], n
    assert all(t.grad is None for t in bufs.values())
