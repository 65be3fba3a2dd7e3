"""PyTorch on the CPU, for bench_cpu to be compared with (bench/cpu_vs_torch.sh).

fp32, B=1, H=8, L=S in --L, E in --E: torch.compile(flex_attention) forward
(no mask; causal and softcap + causal with a BlockMask from
create_block_mask); FlexAttention has no CPU backward, so the backward
beside ours is dense eager autograd (S = QK^T materialised, softcap, mask,
softmax, PV; forward + backward timed); and torch.mm at 2*L*L*E FLOPs. Best of --reps after a warm-up (compilation not
timed). Prints one line per measurement, in the units bench_cpu prints.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


STAT = "best"


def timed(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    if STAT == "median":  # as bench_cpu --ratios prints
        ts.sort()
        n = len(ts)
        return ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
    return min(ts)  # best of: on a shared machine the others measure the neighbours


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", default="2048,4096")
    ap.add_argument("--E", default="64,128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--median", action="store_true", help="median of --reps instead of the best")
    a = ap.parse_args()
    global STAT
    STAT = "median" if a.median else "best"
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}; B=1 H=8 fp32, {STAT} of {a.reps}")
    # Every shape and score_mod is a recompilation; past dynamo's limit
    # flex_attention would silently run unfused, so raise the limit and
    # make hitting it an error.
    for name, value in (("recompile_limit", 256), ("cache_size_limit", 256),
                        ("accumulated_recompile_limit", 4096), ("fail_on_recompile_limit_hit", True)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)
    flex = torch.compile(flex_attention, dynamic=False)
    B, H = 1, 8

    def causal(b, h, q, kv):
        return q >= kv

    def softcap(score, b, h, q, kv):
        return 20.0 * torch.tanh(score / 20.0)

    for L in [int(x) for x in a.L.split(",")]:
        for E in [int(x) for x in a.E.split(",")]:
            g = torch.Generator().manual_seed(L * 131 + E)
            q, k, v = (torch.rand(B, H, L, E, generator=g) * 2 - 1 for _ in range(3))
            x = torch.rand(L, L, generator=g)
            y = torch.rand(L, E, generator=g)
            tmm = timed(lambda: torch.mm(x, y), a.reps)  # 2*L*L*E flops
            print(f"\nL=S={L} E={E}: torch.mm {2.0 * L * L * E / tmm / 1e9:.1f} GFLOP/s")
            bm = create_block_mask(causal, None, None, L, L, device="cpu")
            cases = [("none", None, None), ("causal", None, bm), ("softcap", softcap, bm)]
            for name, mod, mask in cases:
                flops = 4.0 * B * H * L * L * E * (0.5 if mask is not None else 1.0)
                tf = timed(lambda: flex(q, k, v, score_mod=mod, block_mask=mask), a.reps)
                print(f"  {name:8s} flex forward  {tf * 1e3:8.1f} ms  {flops / tf / 1e9:6.1f} GFLOP/s"
                      f"  {tf / (B * H * L) * 1e6:6.2f} us/row")
                if a.no_bwd:
                    continue
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                do = torch.randn(B, H, L, E, generator=g)
                tri = torch.ones(L, L, dtype=torch.bool).tril()

                def dense():
                    s = (qg @ kg.transpose(-1, -2)) * (E ** -0.5)
                    if mod is not None:
                        s = 20.0 * torch.tanh(s / 20.0)
                    if mask is not None:
                        s = s.masked_fill(~tri, float("-inf"))
                    o = torch.softmax(s, dim=-1) @ vg
                    o.backward(do)

                tdb = timed(dense, max(1, a.reps - 1))
                print(f"  {name:8s} dense eager fwd+bwd {tdb * 1e3:8.1f} ms (autograd)")

if __name__ == "__main__":
    main()
