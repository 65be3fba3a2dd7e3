"""Shared inputs for the flexc Python tests (run by python/tests/run.sh,
which puts python/ on sys.path and points FLEXC_LIBRARY at the build)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make_inputs(case, dtype, *, B=2, H=4, HKV=2, E=16, EV=16, seed=0, grad=False):
    """q, k, v (leaves in dtype) and the case's buffers; float buffers
    declared `grad` require grad when grad is set."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, case.q_len, E, generator=g).to(dtype)
    k = torch.randn(B, HKV, case.kv_len, E, generator=g).to(dtype)
    v = torch.randn(B, HKV, case.kv_len, EV, generator=g).to(dtype)
    bufs = case.buffers(B, H, case.q_len, case.kv_len, g)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
        kern = compiled(case)
        for n in kern.grad_buffers or ():
            bufs[n].requires_grad_()
    return q, k, v, bufs


_compiled = {}


def compiled(case):
    """flexc.compile of a case, once per run."""
    import flexc
    if case.name not in _compiled:
        _compiled[case.name] = flexc.compile(case.path_or_source, case.kernel)
    return _compiled[case.name]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
