"""Context parallelism on the host (flexc.torch.distributed, gloo, the cpu
backend): what splitting a causal attention over W processes costs and
saves, measured.

For each length: one process with W threads running the unsharded call
(flexc.torch.flex_attention, FLEXC_THREADS=W) against W processes with
one thread each (FLEXC_THREADS and torch.set_num_threads) running
context_parallel_attention (ring and all-gather,
with and without load balancing), forward and forward + backward (median
of --repeat after a warm-up; a sharded step is timed from a barrier to a
barrier, so it is the slowest rank's). Beside the times, from
flexc.torch.distributed.stats on every rank: shard pairs launched and
skipped (a causal mask rules out the upper triangle: about half), the
rows x keys launched (the work a rank's kernels are given; max / mean
over ranks is the imbalance), and the K/V/dK/dV bytes that reached each
rank, as a multiple of one rank's K and V shard. --counts-only skips the
timing and prints the counts for each world size of --worlds (cheap at
any W: small lengths suffice, the ratios do not depend on L).

    FLEXC_LIBRARY=build-rel/libflexc.so PYTHONPATH=python \\
        build/venv/bin/python bench/bench_context_parallel.py --lengths 8192,16384 --world 2
    ... bench/bench_context_parallel.py --counts-only --worlds 2,4,8 --lengths 4096

No GPU figure comes from here: docs/context-parallel.md models GPUs.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


CONFIGS = [("ring", True), ("ring", False), ("allgather", True), ("allgather", False)]


def inputs(a, L):
    g = torch.Generator().manual_seed(a.seed)
    q = torch.randn(1, a.heads, L, a.dim, generator=g)
    k = torch.randn(1, a.kv_heads, L, a.dim, generator=g)
    v = torch.randn(1, a.kv_heads, L, a.dim, generator=g)
    return q, k, v


def median_of(fn, repeat):
    fn()  # warm-up: traces, compiles, fills caches
    times = []
    for _ in range(repeat):
        times.append(fn())
    return statistics.median(times)


def unsharded(a, L, out):
    """One process, W threads: the unsharded forward and forward + backward."""
    os.environ["FLEXC_THREADS"] = str(a.world)
    torch.set_num_threads(a.world)
    from flexc.torch import create_block_mask, flex_attention
    q, k, v = inputs(a, L)
    bm = create_block_mask(causal, 1, 1, L, L)

    def fwd():
        t0 = time.perf_counter()
        with torch.no_grad():
            flex_attention(q, k, v, block_mask=bm)
        return time.perf_counter() - t0

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def step():
        t0 = time.perf_counter()
        o = flex_attention(*leaves, block_mask=bm)
        o.backward(torch.ones_like(o))
        return time.perf_counter() - t0
    torch.save({"fwd": median_of(fwd, a.repeat), "step": median_of(step, a.repeat)}, out)


def sharded(rank, world, rendezvous, a, L, out_dir, timed):
    os.environ["FLEXC_THREADS"] = "1"
    torch.set_num_threads(1)  # PyTorch's own ops (the merge) too, as torchrun sets it
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=1800))
    import flexc.torch.distributed as cp
    q, k, v = inputs(a, L)
    got = {}
    for method, lb in CONFIGS:
        sq, sk, sv = (cp.shard(x, load_balance=lb).contiguous() for x in (q, k, v))
        leaves = [x.clone().requires_grad_() for x in (sq, sk, sv)]

        def fwd():
            dist.barrier()
            t0 = time.perf_counter()
            with torch.no_grad():
                cp.context_parallel_attention(sq, sk, sv, mask_mod=causal, method=method,
                                              load_balance=lb)
            dist.barrier()
            return time.perf_counter() - t0

        def step():
            dist.barrier()
            t0 = time.perf_counter()
            o = cp.context_parallel_attention(*leaves, mask_mod=causal, method=method,
                                              load_balance=lb)
            o.backward(torch.ones_like(o))
            dist.barrier()
            return time.perf_counter() - t0
        before = dict(cp.stats)
        step()  # one forward and backward: the counts
        counts = {n: cp.stats[n] - before[n] for n in cp.stats}
        res = {"counts": counts, "shard_bytes": sk.numel() * sk.element_size() * 2}
        if timed:
            res["fwd"], res["step"] = median_of(fwd, a.repeat), median_of(step, a.repeat)
        got[(method, lb)] = res
    torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def run_sharded(a, W, L, timed):
    import torch.multiprocessing as mp
    d = tempfile.mkdtemp(prefix="cpbench")
    mp.spawn(sharded, args=(W, os.path.join(d, "rdv"), a, L, d, timed), nprocs=W)
    return [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(W)]


def run_unsharded(a, L):
    import torch.multiprocessing as mp
    d = tempfile.mkdtemp(prefix="cpbench")
    p = mp.get_context("spawn").Process(target=unsharded, args=(a, L, os.path.join(d, "u.pt")))
    p.start()
    p.join()
    if p.exitcode:
        sys.exit(f"the unsharded run failed (exit {p.exitcode})")
    return torch.load(os.path.join(d, "u.pt"), weights_only=False)


def counts_rows(W, L, ranks):
    rows = []
    for method, lb in CONFIGS:
        cs = [r[(method, lb)]["counts"] for r in ranks]
        shard = max(r[(method, lb)]["shard_bytes"] for r in ranks)
        pairs = sum(c["forward_pairs"] for c in cs)
        skipped = sum(c["forward_skipped"] for c in cs)
        fa = [c["forward_area"] for c in cs]
        ba = [c["backward_area"] for c in cs]
        fb = max(c["forward_bytes_in"] for c in cs)
        bb = max(c["backward_bytes_in"] for c in cs)
        rows.append((method, "balanced" if lb else "contiguous", W, L,
                     f"{pairs - skipped}/{pairs} ({skipped / pairs:.0%} skipped)",
                     f"{max(fa) / (sum(fa) / W):.2f}", f"{max(ba) / (sum(ba) / W):.2f}",
                     f"{max(fa) / (L * L / 2):.3f}",
                     f"{fb / shard:.2f}", f"{bb / shard:.2f}"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("--world", type=int, default=2, help="processes of the timed runs")
    ap.add_argument("--worlds", default="2,4,8", help="world sizes of --counts-only")
    ap.add_argument("--counts-only", action="store_true")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    print(f"causal, B=1, H={a.heads}, HKV={a.kv_heads}, E={a.dim}, float32, gloo, cpu backend")
    head = ("| method | layout | W | L | pairs launched | fwd work max/mean | bwd work max/mean "
            "| fwd work max / (L^2/2) | fwd bytes in / shard | bwd bytes in / shard |")
    if a.counts_only:
        print(head)
        print("|" + " --- |" * 10)
        for W in (int(x) for x in a.worlds.split(",")):
            for L in lengths:
                for row in counts_rows(W, L, run_sharded(a, W, L, timed=False)):
                    print("| " + " | ".join(str(x) for x in row) + " |")
        return
    W = a.world
    timing = []
    counts = []
    for L in lengths:
        u = run_unsharded(a, L)
        ranks = run_sharded(a, W, L, timed=True)
        timing.append(("unsharded", f"1 x {W} threads", L, u["fwd"], u["step"], 1.0, 1.0))
        for method, lb in CONFIGS:
            f = ranks[0][(method, lb)]["fwd"]
            s = ranks[0][(method, lb)]["step"]
            timing.append((method, f"{W} x 1 thread, {'balanced' if lb else 'contiguous'}", L,
                           f, s, f / u["fwd"], s / u["step"]))
        counts += counts_rows(W, L, ranks)
    print("| method | processes x threads | L | forward (ms) | forward + backward (ms) "
          "| forward / unsharded | step / unsharded |")
    print("|" + " --- |" * 7)
    for m, how, L, f, s, rf, rs in timing:
        print(f"| {m} | {how} | {L} | {f * 1e3:.0f} | {s * 1e3:.0f} | {rf:.2f} | {rs:.2f} |")
    print()
    print(head)
    print("|" + " --- |" * 10)
    for row in counts:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
