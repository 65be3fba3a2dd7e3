#!/usr/bin/env python3
"""The Python package on CUDA tensors (bench/run_gpu.sh, stage 2).

flexc.torch.flex_attention forward and backward against PyTorch's own
flex_attention on the same GPU, for three mods: a tanh softcap (a score),
causal (a mask, given as PyTorch's BlockMask from create_block_mask), and
ALiBi with a causal mask (a score reading a buffer). Everything runs on a
side stream made current with torch.cuda.stream(): flexc must launch on
PyTorch's current stream. The oracle is PyTorch's flex_attention in
float64 (eager; float32 if it refuses float64, which the line then says) on
the same inputs; flexc runs in bf16 (every mod) and
fp16 (softcap), and out, lse, dq, dk and dv are compared by relative norm
error with the project's tolerances (fp16 5e-3 / 2e-2, bf16 3e-2 / 6e-2).
Fresh random inputs every run (the seed is printed; FLEXC_SEED repeats
one). Prints one line per check; exits 1 if any fails, 77 without a CUDA
device.

Run from the GPU bundle's root (samples/ found relative to it; the
kernel's source path is part of the kernel cache's key):
    python3 bench/gpu_python_check.py

--fill makes the same flexc calls on host tensors with the `cuda` backend
named explicitly and the device type of every tensor reported as CUDA:
over the stand-in driver (tests/cuda/mockcuda.c, device memory is host
memory, no kernel runs), that compiles exactly the kernels this check will
ask for, into $FLEXC_CACHE_DIR (scripts/gpu_bundle.sh fills the bundle's
kernel cache so). Nothing is compared then.
"""
import argparse
import os
import sys
import time

import torch

import flexc
from flexc.torch import flex_attention

B, H, L, E = 2, 4, 300, 64  # 300: no multiple of any tile
TOL = {torch.float16: (5e-3, 2e-2), torch.bfloat16: (3e-2, 6e-2)}


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(x), finite) or not torch.equal(x[~finite], ref[~finite]):
        return float("inf")  # NaN never passes; infinities must match
    den = ref[finite].norm().item()
    return (x[finite] - ref[finite]).norm().item() / den if den > 0 else float("inf")


def mods(device):
    """(name, flexc kernel, its params and buffers, torch score_mod, torch mask_mod)."""
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=device, dtype=torch.float32) / H)

    def softcap(s, b, h, q, kv):
        return 20.0 * torch.tanh(s / 20.0)

    def alibi(s, b, h, q, kv):
        return s + slopes[h].to(s.dtype) * (kv - q).to(s.dtype)

    def causal(b, h, q, kv):
        return q >= kv

    return [
        ("softcap", flexc.compile("samples/softcap.score"), {"softcap": 20.0}, {}, softcap, None),
        ("causal", flexc.compile("samples/causal.score"), {}, {}, None, causal),
        ("alibi+causal", flexc.compile("samples/alibi.score"), {}, {"slopes": slopes}, alibi, causal),
    ]


def run_flexc(kern, params, bufs, q, k, v, dout, block_mask, backend=None):
    """flexc's out, lse and (dq, dk, dv)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = flex_attention(q, k, v, score_mod=kern, block_mask=block_mask, params=params,
                              buffers=bufs, return_lse=True, backend=backend)
    out.backward(dout)
    return out.detach(), lse.detach(), (q.grad, k.grad, v.grad)


def run_torch(score_mod, block_mask, q, k, v, dout):
    """PyTorch's flex_attention (eager) in float64, or float32 where float64
    is refused: out, lse, (dq, dk, dv), and the dtype it ran in."""
    from torch.nn.attention.flex_attention import flex_attention as torch_flex
    last = None
    for wide in (torch.float64, torch.float32):
        try:
            x = [t.detach().to(wide).requires_grad_() for t in (q, k, v)]
            out, lse = torch_flex(*x, score_mod=score_mod, block_mask=block_mask, return_lse=True)
            out.backward(dout.to(wide))
            return out.detach(), lse.detach(), tuple(t.grad for t in x), wide
        except Exception as e:  # noqa: BLE001 (said below, and the next dtype tried)
            last = e
            print(f"  torch flex_attention in {wide}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    raise last


def fill():
    """The flexc calls of check() on host tensors named CUDA (see the module's doc)."""
    from flexc import _capi, _mods, _tensor
    _tensor.device_of = lambda x: (_capi.kDLCUDA, 0)
    # the agreement of alibi's own mask with the BlockMask is checked on the
    # host (the reference backend; no CUDA kernel), which this patch would
    # send host tensors named CUDA: the real run checks it
    _mods._check_agree = lambda *args: None
    g = torch.Generator().manual_seed(0)
    for name, kern, params, bufs, _, mask_mod in mods("cpu"):
        for dtype in (torch.bfloat16, torch.float16) if name == "softcap" else (torch.bfloat16,):
            q, k, v, dout = (torch.randn(B, H, L, E, generator=g).to(dtype) for _ in range(4))
            bm = None
            if mask_mod is not None:
                from torch.nn.attention.flex_attention import create_block_mask
                bm = create_block_mask(mask_mod, None, None, L, L, device="cpu")
            try:
                run_flexc(kern, params, bufs, q, k, v, dout, bm, backend="cuda")
            except Exception as e:  # no kernel ran: numbers are garbage, compiles are not
                print(f"fill {name} {dtype}: {type(e).__name__}: {e}")
            print(f"fill {name} {str(dtype).replace('torch.', '')}: compiled", flush=True)
    return 0


def check():
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        return 77
    from torch.nn.attention.flex_attention import create_block_mask
    seed = int(os.environ.get("FLEXC_SEED", time.time_ns() % (1 << 31)))
    print(f"seed: FLEXC_SEED={seed}; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    g = torch.Generator(device="cuda").manual_seed(seed)
    side = torch.cuda.Stream()
    fails = 0
    with torch.cuda.stream(side):  # flexc must follow PyTorch's current stream
        for name, kern, params, bufs, score_mod, mask_mod in mods("cuda"):
            bm = create_block_mask(mask_mod, None, None, L, L, device="cuda") if mask_mod else None
            for dtype in (torch.bfloat16, torch.float16) if name == "softcap" else (torch.bfloat16,):
                q, k, v, dout = (torch.randn(B, H, L, E, device="cuda", generator=g).to(dtype)
                                 for _ in range(4))
                got = run_flexc(kern, params, bufs, q, k, v, dout, bm)
                want = run_torch(score_mod, bm, q, k, v, dout)
                oracle = str(want[3]).replace("torch.", "")
                side.synchronize()
                errs = {"out": rel_err(got[0], want[0]), "lse": rel_err(got[1], want[1])}
                errs.update({n: rel_err(a, b) for n, a, b in zip(("dq", "dk", "dv"), got[2], want[2])})
                tol = TOL[dtype]
                bad = [n for n, e in errs.items() if not e < tol[0 if n in ("out", "lse") else 1]]
                fails += bool(bad)
                print(f"{name:13s} {str(dtype).replace('torch.', ''):8s} vs torch {oracle}: "
                      + " ".join(f"{n} {e:.2e}" for n, e in errs.items())
                      + (f"  FAIL ({', '.join(bad)})" if bad else "  ok"), flush=True)
    print(f"python package on CUDA: {fails} of 4 checks failed")
    return 1 if fails else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fill", action="store_true", help="compile this check's kernels only")
    sys.exit(fill() if ap.parse_args().fill else check())
