"""flexc.torch.create_block_mask against PyTorch's create_block_mask, on the
CPU: a causal mask, and a sliding window, at growing lengths (B = H = 1,
128 x 128 blocks). Prints the median of --repeat calls (after one warm-up
call that traces and compiles). PyTorch's builds a dense Q_LEN x KV_LEN
mask first, so it runs only up to --torch-max tokens.

    FLEXC_LIBRARY=build-rel/libflexc.so.0 PYTHONPATH=python \\
        build/venv/bin/python bench/bench_create_block_mask.py [--torch-max 32768]
"""
import argparse
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

import flexc.torch as ft


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


WINDOW = 4096


def sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


def median_seconds(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="8192,32768,131072")
    ap.add_argument("--torch-max", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print("| mask | tokens | flexc (ms) | PyTorch (ms) |")
    print("| --- | --- | --- | --- |")
    for name, mod in (("causal", causal), ("sliding window 4096", sliding)):
        for n in (int(x) for x in a.lengths.split(",")):
            ours = median_seconds(lambda: ft.create_block_mask(mod, None, None, n, n), a.repeat)
            theirs = "not run (dense mask)"
            if n <= a.torch_max:
                t = median_seconds(lambda: torch_create_block_mask(mod, None, None, n, n,
                                                                   device="cpu"), 1)
                theirs = f"{t * 1e3:.0f}"
            print(f"| {name} | {n} | {ours * 1e3:.1f} | {theirs} |", flush=True)


if __name__ == "__main__":
    main()
