#!/usr/bin/env python3
"""PyTorch's compiled flex_attention and SDPA on this GPU: the columns
bench/run_gpu.sh sets beside bench_attention's (stage 3).

    python3 bench/torch_attention.py [--L 8192] [--E 128,64] [--time-limit S]

bf16, B=4, H=16, L=S=8192 by default; variants in bench_attention's
order and with its definitions: `noop` and `causal` at every E (flex and
SDPA), `softcap` (30 tanh(s / 30)) and `document` (16 documents cut at
the same fractions of L as bench_attention's doc_cuts, causal within each,
the BlockMask from create_block_mask outside the timed calls) at the first
E only. flex_attention is compiled (torch.compile, dynamic=False), as its
documentation asks. Kernel time from CUDA events around each call on the
current stream, median of 10 after 3 warm-up calls (compiles happen in
the warm-up); the backward is torch.autograd.grad of the output. FLOPs as
bench_attention counts them: forward 4*B*H*L*S*E times the fraction of
(q, kv) pairs the mask keeps (causal 1/2, document its exact density),
backward 2.5x.

Rows are printed as they are measured, in bench_attention's table format
(| variant | B | H | L | E | impl | fwd TF/s | bwd TF/s | fwd ms | bwd ms |),
so a run stopped by the clock keeps what it measured; --time-limit stops
starting new rows after S seconds. Exits 77 without a CUDA device.
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F

DOC_CUTS = [0.03, 0.11, 0.16, 0.27, 0.31, 0.38, 0.45, 0.52, 0.58, 0.66, 0.71, 0.79, 0.83, 0.91, 0.96]
WARMUP, TIMED = 3, 10


def doc_ids(L, device):
    """Each token's document id, as bench_attention's doc_ids() cuts them."""
    cuts = torch.tensor([int(c * L) for c in DOC_CUTS])
    return torch.bucketize(torch.arange(L), cuts, right=True).to(torch.int32).to(device)


def median_ms(fn):
    times = []
    for i in range(WARMUP + TIMED):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= WARMUP:
            times.append(a.elapsed_time(b))
    times.sort()
    return times[TIMED // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--E", default="128,64", help="head dims, comma-separated")
    ap.add_argument("--time-limit", type=float, default=0, help="seconds (0: none)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_attention: skipped: torch sees no CUDA device")
        return 77
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    start = time.monotonic()
    dev, B, H, L = "cuda", 4, 16, a.L
    flex = torch.compile(flex_attention, dynamic=False)
    ids = doc_ids(L, dev)

    def causal(b, h, q, kv):
        return q >= kv

    def document(b, h, q, kv):
        return (ids[q] == ids[kv]) & (q >= kv)

    def softcap(s, b, h, q, kv):
        return 30.0 * torch.tanh(s / 30.0)

    starts = torch.zeros(L, dtype=torch.int64)  # the first token of each token's document
    ids_host = ids.cpu()
    for i in range(1, L):
        starts[i] = i if ids_host[i] != ids_host[i - 1] else starts[i - 1]
    doc_density = float((torch.arange(L) - starts + 1).sum()) / (L * L)

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bfloat16 inputs", flush=True)
    print("| variant | B | H | L | E | impl | fwd TF/s | bwd TF/s | fwd ms | bwd ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|", flush=True)
    fails = 0
    dims = [int(e) for e in a.E.split(",")]
    for ei, E in enumerate(dims):
        torch.manual_seed(0)
        mk = lambda: torch.randn(B, H, L, E, device=dev, dtype=torch.bfloat16, requires_grad=True)
        q, k, v = mk(), mk(), mk()
        dout = torch.randn(B, H, L, E, device=dev, dtype=torch.bfloat16)
        rows = [("noop", None, None, 1.0), ("causal", None, causal, 0.5)]
        if ei == 0:
            rows += [("softcap", softcap, None, 1.0), ("document", None, document, doc_density)]
        for name, score_mod, mask_mod, density in rows:
            bm = create_block_mask(mask_mod, None, None, L, L, device=dev) if mask_mod else None
            impls = [("flex", lambda: flex(q, k, v, score_mod=score_mod, block_mask=bm))]
            if name in ("noop", "causal"):
                impls.append(("sdpa", lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=(name == "causal"))))
            for impl, fn in impls:
                if a.time_limit and time.monotonic() - start > a.time_limit:
                    print(f"# time limit of {a.time_limit:.0f} s: {name} E={E} {impl} not run", flush=True)
                    continue
                flops = 4.0 * B * H * L * L * E * density
                try:
                    fwd = median_ms(fn)
                    out = fn()
                    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                except Exception as e:  # one failing row is reported, the table goes on
                    print(f"| {name} | {B} | {H} | {L} | {E} | {impl} | failed | failed | | |  "
                          f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                    fails += 1
                    continue
                print(f"| {name} | {B} | {H} | {L} | {E} | {impl} | {flops / fwd / 1e9:.0f} | "
                      f"{2.5 * flops / bwd / 1e9:.0f} | {fwd:.3f} | {bwd:.3f} |", flush=True)
                del out
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
