#!/usr/bin/env python3
"""kernel_model.py: a static model of the compiled tensor-core kernels.

Compiles a .score file (forward and backward) to a cubin with `flexc emit`,
disassembles it with cuobjdump (SASS), finds each kernel's steady-state
loop and prints, per kernel, what one iteration of that loop costs:

  instr     SASS instructions per iteration: the loop body once, each inner
            loop times its trip count (see below)
  HMMA      mma.sync instructions (HMMA.16816: 4096 FLOP each, per warp)
  HGMMA     wgmma instructions (sm_90a; HGMMA.64xNx16: 2 * 64 * N * 16 FLOP
            per warpgroup, a quarter of it per warp), printed on a line of
            their own with i/HGMMA, whether they take A from shared memory
            (SS) or registers (RS), and whether ptxas serialised them
  LDSM      ldmatrix instructions and the shared bytes they read (x4 = 512 B
            per warp, x2 = 256, x1 = 128)
  LDS/STS   other shared loads and stores, bytes per warp
  LDGSTS    cp.async (global -> shared), LDG global loads
  i/HMMA    instructions per HMMA;  B/HMMA: shared bytes read per HMMA
            (LDSM + LDS; the figure the issue tracks). With wgmma, per
            4096 FLOP (an HMMA's worth), so the two archs compare
  serial    1 when ptxas reports that it serialised the kernel's wgmma
            (advisory C7514 and kin: each wgmma waits for the one before,
            which no static count shows); from flexc emit --resource-usage
  regs      registers (cuobjdump -res-usage REG)
  spill     ptxas's spill store + load bytes (from flexc emit --resource-usage)
  stack     local memory bytes per thread (STACK + LOCAL: spills, call frames
            of out-of-line helpers, arrays indexed at run time); lmem:
            STL/LDL instructions in the loop
  ceilings  issue-bound and smem-bound TFLOP/s on an H100 SXM

The steady-state loop is the innermost backward branch (a BRA whose target
is at or before it) whose range holds the most HMMAs of the kernel. Inner
loops inside it: those holding HMMAs run ceil(E / 16) times (the only such
loop is a loop over the head dim's 16-column groups); any other inner loop
(walk span skipping, element-wise loads of unaligned tiles, runtime-trip
cp.async loops) is counted once, and listed, so a figure with inner loops is
a lower bound. Branches inside the body are not followed: cold paths count
too, which is what the issue means by "the loop body once".

Ceiling assumptions (H100 SXM, stated, not measured): 132 SMs, 1.83 GHz
boost, 4 schedulers per SM each issuing 1 warp-instruction per clock,
HMMA m16n8k16 = 16*8*16*2 = 4096 FLOP, shared memory 128 B/clock/SM. Issue
ceiling = SMs * clock * 4 / (instr per HMMA) * 4096; smem ceiling = SMs *
clock * 128 / (shared bytes per HMMA, loads and stores) * 4096. A wgmma's
shared-memory operands (A for SS, and B: 2 bytes an element) count as
shared bytes read, a quarter per warp. Neither ceiling includes the tensor
pipe's own limit, latency or occupancy.

Usage (from the repository root):
  python3 bench/kernel_model.py FILE.score [--arch sm_80] [--dtype bf16]
      [--head-dim 128] [--flexc build/flexc] [--install] [--json]
      [--tiles fwd=..,bwd=..] [--cubin X.cubin]
cuobjdump (and the nvdisasm it runs) come from PATH, $FLEXC_CUOBJDUMP, or
build/model-venv; --install creates that venv with pip (packages
nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm). Exit 77 when no cuobjdump.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

SMS, CLOCK, SCHED, HMMA_FLOP, SMEM_BPC = 132, 1.83e9, 4, 4096, 128

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")


def find_cuobjdump(root, install):
    venv = os.path.join(root, "build", "model-venv")
    cands = [os.environ.get("FLEXC_CUOBJDUMP")]
    cands += glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "nvidia", "*", "bin",
                                    "cuobjdump"))
    cands.append(shutil.which("cuobjdump"))
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    if not install:
        return None
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = os.path.join(venv, "bin", "pip")
    r = subprocess.run([pip, "install", "-q", "--timeout", "30", "--retries", "1",
                        "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"])
    if r.returncode:
        return None
    return find_cuobjdump(root, False)


def sass_functions(cuobjdump, cubin):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
    out = subprocess.run([cuobjdump, "-sass", cubin], env=env, check=True, capture_output=True,
                         text=True).stdout
    res = subprocess.run([cuobjdump, "-res-usage", cubin], env=env, check=True,
                         capture_output=True, text=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), {"insts": []})
            continue
        m = LINE.search(line)
        if m and cur is not None:
            cur["insts"].append((int(m.group(1), 16), m.group(3), m.group(4).strip()))
    name = None
    for line in res.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+).*LOCAL:(\d+)", line)
        if m and name in funcs:
            funcs[name]["regs"] = int(m.group(1))
            funcs[name]["stack"] = int(m.group(2)) + int(m.group(3))
    return funcs


def loops(insts):
    """(start, end) address ranges of backward branches."""
    out = []
    for addr, op, args in insts:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", args)
            if m and int(m.group(1), 16) <= addr:
                out.append((int(m.group(1), 16), addr))
    return out


def is_hmma(op):
    return op.startswith("HMMA")


def hgmma(op, args):
    """(FLOP per warp, shared operand bytes per warp, SS) of an HGMMA, else None."""
    m = re.match(r"HGMMA\.64x(\d+)x16", op)
    if not m:
        return None
    n = int(m.group(1))
    ops = [a.strip() for a in args.split(",")]
    ss = len(ops) > 1 and ops[1].startswith("gdesc")
    return 2 * 64 * n * 16 / 4, ((64 * 16 if ss else 0) + n * 16) * 2 / 4, ss


def is_mma(op):
    return op.startswith(("HMMA", "HGMMA"))


def shared_width(op):
    """Bytes per thread of an LDS/STS variant."""
    for suf, w in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if suf in op:
            return w
    return 4


def count(insts, lo, hi):
    c = {"instr": 0, "hmma": 0, "ldsm": 0, "ldsm_b": 0, "lds": 0, "lds_b": 0, "sts": 0,
         "sts_b": 0, "ldgsts": 0, "ldg": 0, "local": 0, "hgmma": 0, "hgmma_ss": 0, "flop": 0,
         "gdesc_b": 0}
    for addr, op, args in insts:
        if not lo <= addr <= hi or op == "NOP":
            continue
        c["instr"] += 1
        g = hgmma(op, args)
        if g:
            c["hgmma"] += 1
            c["hgmma_ss"] += g[2]
            c["flop"] += g[0]
            c["gdesc_b"] += g[1]
        elif is_hmma(op):
            c["hmma"] += 1
            c["flop"] += HMMA_FLOP
        elif op.startswith("LDSM"):
            n = 4 if ".4" in op else 2 if ".2" in op else 1
            c["ldsm"] += 1
            c["ldsm_b"] += 128 * n
        elif op.startswith("LDS"):
            c["lds"] += 1
            c["lds_b"] += 32 * shared_width(op)
        elif op.startswith("STS"):
            c["sts"] += 1
            c["sts_b"] += 32 * shared_width(op)
        elif op.startswith("LDGSTS"):
            c["ldgsts"] += 1
        elif op.startswith("LDG"):
            c["ldg"] += 1
        elif op.startswith(("STL", "LDL")):
            c["local"] += 1
    return c


def model(fn, e_pad):
    insts = fn["insts"]
    ls = loops(insts)
    if not ls or not any(is_mma(op) for _, op, _ in insts):
        return None
    best = max(ls, key=lambda r: (count(insts, *r)["flop"], -(r[1] - r[0])))
    c = count(insts, *best)
    inner = [r for r in ls if r != best and best[0] <= r[0] and r[1] <= best[1]]
    # Only the outermost inner loops; nested ones are inside those ranges.
    inner = [r for r in inner if not any(o != r and o[0] <= r[0] and r[1] <= o[1] for o in inner)]
    listed = []
    for r in inner:
        ic = count(insts, *r)
        trip = math.ceil(e_pad / 16) if ic["hmma"] or ic["hgmma"] else 1
        for k in c:
            c[k] += (trip - 1) * ic[k]
        listed.append({"range": "0x%x-0x%x" % r, "instr": ic["instr"], "hmma": ic["hmma"],
                       "hgmma": ic["hgmma"],
                       "trip": trip})
    h = max(c["flop"] / HMMA_FLOP, 1e-9)  # HMMAs, or their worth of FLOP
    smem_read = c["ldsm_b"] + c["lds_b"] + c["gdesc_b"]
    smem_all = smem_read + c["sts_b"] + 512 * c["ldgsts"]
    ipH, bpH = c["instr"] / h, smem_read / h
    return dict(c, loop="0x%x-0x%x" % best, inner=listed, i_per_hmma=ipH, b_per_hmma=bpH,
                b_all_per_hmma=smem_all / h, regs=fn.get("regs"),
                stack=fn.get("stack", 0), spill=fn.get("spill", 0),
                i_per_hgmma=c["instr"] / c["hgmma"] if c["hgmma"] else 0,
                serial=fn.get("serial", 0),
                issue_tflops=SMS * CLOCK * SCHED / ipH * HMMA_FLOP / 1e12,
                smem_tflops=SMS * CLOCK * SMEM_BPC / max(smem_all / h, 1e-9) * HMMA_FLOP / 1e12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--arch", default="sm_80")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--flexc", default="build/flexc")
    ap.add_argument("--cubin", help="model this cubin instead of compiling FILE")
    ap.add_argument("--tiles", help="FLEXC_TILES override for the compile")
    ap.add_argument("--dropout", action="store_true", help="model the kernels with dropout")
    ap.add_argument("--install", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--max", action="append", default=[], metavar="KERNEL:FIELD=V",
                    help="fail (exit 1) when KERNEL's FIELD (i_per_hmma, b_per_hmma, stack, "
                    "local, regs, serial, i_per_hgmma, ...) is above V; also fails when a kernel "
                    "has no HMMA or HGMMA loop")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cuobjdump = find_cuobjdump(root, a.install)
    if not cuobjdump:
        print("kernel_model: no cuobjdump (pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm, or run with --install)", file=sys.stderr)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        cubin = a.cubin
        if not cubin:
            cubin = os.path.join(tmp, "k.cubin")
            env = dict(os.environ)
            if a.tiles:
                env["FLEXC_TILES"] = a.tiles
            r = subprocess.run([a.flexc, "emit", a.file, "--target", "cubin", "--arch", a.arch,
                                "--dtype", a.dtype, "--head-dim", str(a.head_dim), "-o", cubin,
                                "--resource-usage"] + (["--dropout"] if a.dropout else []), check=True, env=env, capture_output=True,
                               text=True)
            usage = r.stdout + r.stderr
        funcs = sass_functions(cuobjdump, cubin)
        if not a.cubin:
            # ptxas's own count: spilled registers, as opposed to call frames.
            for m in re.finditer(r"(\w+): \d+ registers, (\d+) bytes spill stores, (\d+) bytes "
                                 r"spill loads.*", usage):
                if m.group(1) in funcs:
                    funcs[m.group(1)]["spill"] = int(m.group(2)) + int(m.group(3))
                    funcs[m.group(1)]["serial"] = int("wgmma serialized" in m.group(0))
    e_pad = (a.head_dim + 15) // 16 * 16
    rows = {}
    for name in sorted(funcs):
        m = model(funcs[name], e_pad)
        if m:
            rows[name] = m
    bad = check(rows, a.max)
    if a.json:
        print(json.dumps({"file": a.file, "arch": a.arch, "dtype": a.dtype,
                          "head_dim": a.head_dim, "kernels": rows}, indent=1))
        return 1 if bad else 0
    print("%s, %s, %s, E=%d (steady-state loop, per warp and iteration)" %
          (a.file, a.arch, a.dtype, a.head_dim))
    print("%-9s %6s %5s %5s %7s %4s %6s %4s %6s %6s %4s %6s %6s %4s %5s %5s %4s %8s %8s" %
          ("kernel", "instr", "HMMA", "LDSM", "bytes", "LDS", "bytes", "STS", "bytes", "LDGSTS",
           "LDG", "i/HMMA", "B/HMMA", "regs", "spill", "stack", "lmem", "issue-TF", "smem-TF"))
    for name, m in rows.items():
        print("%-9s %6d %5d %5d %7d %4d %6d %4d %6d %6d %4d %6.2f %6.1f %4s %5d %5d %4d %8.0f %8.0f" %
              (name, m["instr"], m["hmma"], m["ldsm"], m["ldsm_b"], m["lds"], m["lds_b"],
               m["sts"], m["sts_b"], m["ldgsts"], m["ldg"], m["i_per_hmma"], m["b_per_hmma"],
               m["regs"], m["spill"], m["stack"], m["local"], m["issue_tflops"], m["smem_tflops"]))
        if m["hgmma"]:
            print("  wgmma: %d HGMMA (%d SS, %d RS), %.2f i/HGMMA, %.0f shared operand B per warp, "
                  "serialized by ptxas: %s" %
                  (m["hgmma"], m["hgmma_ss"], m["hgmma"] - m["hgmma_ss"], m["i_per_hgmma"],
                   m["gdesc_b"], "YES" if m["serial"] else "no"))
        for r in m["inner"]:
            print("  inner loop %s: %d instr, %d HMMA, counted x%d" %
                  (r["range"], r["instr"], r["hmma"] + r["hgmma"], r["trip"]))
    for b in bad:
        print("kernel_model: FAIL: " + b)
    return 1 if bad else 0


def check(rows, limits):
    """The --max limits that fail; flex_fwd and flex_bwd must have an HMMA loop."""
    bad = ["%s: no steady-state HMMA loop" % k for k in ("flex_fwd", "flex_bwd") if k not in rows]
    for lim in limits:
        m = re.fullmatch(r"(\w+):(\w+)=([0-9.]+)", lim)
        if not m:
            bad.append("bad --max %r" % lim)
        elif m.group(1) in rows and rows[m.group(1)].get(m.group(2), 0) > float(m.group(3)):
            bad.append("%s %s = %g > %s" % (m.group(1), m.group(2),
                                             rows[m.group(1)][m.group(2)], m.group(3)))
    return bad


if __name__ == "__main__":
    sys.exit(main())
