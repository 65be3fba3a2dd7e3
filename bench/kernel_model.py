#!/usr/bin/env python3
"""kernel_model.py: a static model of the compiled tensor-core kernels.

Compiles a .score file (forward and backward) to a cubin with `flexc emit`,
disassembles it with cuobjdump (SASS), finds each kernel's steady-state
loop and prints what one iteration of it costs. The figure is ins/4kF:
static instructions a warp issues in the loop per 4096 FLOP of its own
tensor-core work (an HMMA.16816 is 4096 FLOP per warp; an HGMMA.64xNx16 is
2 * 64 * N * 16 FLOP per warpgroup, a quarter of it per warp), the measure
FlashAttention-2's and -3's own SASS is read with (bench/RESULTS.md).

Loops are natural loops of the control-flow graph (blocks split at
branches and exits, a back edge u -> v where v dominates u, the body the
blocks that reach u without passing v). The candidates are the innermost
loops holding tensor-core instructions (no such loop nested inside them):
  pick  the one with the most MMA, then the fewest instructions: the
        steady state (a causal kernel's peeled diagonal loop is not it)
  all   every candidate together, each counted once (a kernel that splits
        a tile's work over several inner loops pays for all of them)
A loop's instructions are those in its address span (from its header to
its back edge), each counted once: branches are not followed, so cold code
laid out inside the span counts, and an inner loop without MMA (a spin
wait, an element-wise edge load) counts once. An outer loop (a persistent
or warp-specialised kernel's tile loop) or an out-of-line retry stub
jumping back into the body is never the loop measured.

Per kernel (the pick loop unless named otherwise):
  ins4kf     instructions per 4096 FLOP; ins4kf_all: over all candidates
  loops      candidate loops;  instr: instructions in the pick loop
  HMMA/HGMMA mma.sync and wgmma instructions in it
  LDSM       ldmatrix instructions and the shared bytes they read (x4 = 512 B
             per warp, x2 = 256, x1 = 128)
  LDS/STS    other shared loads and stores, bytes per warp
  LDGSTS     cp.async (global -> shared), LDG global loads
  b_per_4kf  shared bytes read per 4096 FLOP (LDSM + LDS, and a wgmma's
             shared operands: A for SS, and B, 2 bytes an element, a quarter
             per warp)
  serial     1 when ptxas reports that it serialised the kernel's wgmma
             (advisory C7514 and kin: each wgmma waits for the one before,
             which no static count shows); from flexc emit --resource-usage
  regs       registers (cuobjdump -res-usage REG)
  spill      ptxas's spill store + load bytes (from flexc emit --resource-usage)
  stack      local memory bytes per thread (STACK + LOCAL: spills, call frames
             of out-of-line helpers, arrays indexed at run time); lmem:
             STL/LDL instructions in the loop
  ceilings   issue-bound and smem-bound TFLOP/s on an H100 SXM

Ceiling assumptions (H100 SXM, stated, not measured): 132 SMs, 1.83 GHz
boost, 4 schedulers per SM each issuing 1 warp-instruction per clock,
shared memory 128 B/clock/SM. Issue ceiling = SMs * clock * 4 / ins4kf *
4096; smem ceiling = SMs * clock * 128 / (shared bytes per 4096 FLOP,
loads and stores) * 4096. Neither includes the tensor pipe's own limit,
latency or occupancy.

Usage (from the repository root):
  python3 bench/kernel_model.py FILE.score [--arch sm_80] [--dtype bf16]
      [--head-dim 128] [--flexc build/flexc] [--install] [--json]
      [--tiles fwd=..,bwd=..] [--cubin X.cubin] [--sass X.sass]
  python3 bench/kernel_model.py --table [--anchors DIR] [--flexc build/flexc]
--table prints issue 23's table (bench/RESULTS.md): our forward and
backward on sm_80 and sm_90a, no mask and causal, bf16, E = 128, beside
FlashAttention-2's and -3's figures (measured in DIR/sass, the output of
../shared/tools/anchor_sass.sh DIR, or as recorded).
cuobjdump (and the nvdisasm it runs) come from PATH, $FLEXC_CUOBJDUMP, or
build/model-venv; --install creates that venv with pip (packages
nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm). Exit 77 when no cuobjdump.
--sass reads a cuobjdump -sass listing instead (any kernel, e.g. the
anchors of bench/RESULTS.md), no cuobjdump needed.
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


def parse_sass(text):
    """{function: {"insts": [(addr, pred, op, args)]}} of a cuobjdump -sass listing."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), {"insts": []})
            continue
        m = LINE.search(line)
        if m and cur is not None:
            pred = (m.group(2) or "").strip() or None
            cur["insts"].append((int(m.group(1), 16), pred, m.group(3), m.group(4).strip()))
    return funcs


def sass_functions(cuobjdump, cubin):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
    out = subprocess.run([cuobjdump, "-sass", cubin], env=env, check=True, capture_output=True,
                         text=True).stdout
    res = subprocess.run([cuobjdump, "-res-usage", cubin], env=env, check=True,
                         capture_output=True, text=True).stdout
    funcs = parse_sass(out)
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


# ---- control flow: blocks, dominators, natural loops ------------------------------------

def branch_target(args):
    m = re.search(r"0x([0-9a-f]+)\s*$", args)
    return int(m.group(1), 16) if m else None


def is_jump_call(op):
    """CALL.REL.NOINC: a jump that pushes no return address. ptxas closes
    some loops with `@P CALL.REL.NOINC exit; BRA head` (the loop's exit
    through it), so it is an edge of the graph like a branch."""
    return op.startswith("CALL.REL.NOINC")


def cfg(insts):
    """Basic blocks (first, last instruction index), successors, block of each instruction."""
    idx = {a: i for i, (a, _, _, _) in enumerate(insts)}
    leaders = {0}
    for i, (_, _, op, args) in enumerate(insts):
        if op.startswith(("BRA", "EXIT", "RET", "BRX", "JMP", "JMX")) or is_jump_call(op):
            if i + 1 < len(insts):
                leaders.add(i + 1)
            t = branch_target(args) if op.startswith(("BRA", "JMP")) or is_jump_call(op) else None
            if t in idx:
                leaders.add(idx[t])
    starts = sorted(leaders)
    blocks = [(s, (starts[k + 1] if k + 1 < len(starts) else len(insts)) - 1)
              for k, s in enumerate(starts)]
    succ = [set() for _ in blocks]
    block_of = {}
    for b, (lo, hi) in enumerate(blocks):
        for i in range(lo, hi + 1):
            block_of[i] = b
    for b, (lo, hi) in enumerate(blocks):
        _, pred, op, args = insts[hi]
        always = pred is None or pred == "@PT"
        fall = hi + 1 < len(insts)
        if (op.startswith(("BRA", "JMP")) or is_jump_call(op)) and pred != "@!PT":
            t = branch_target(args)
            if t in idx:
                succ[b].add(block_of[idx[t]])
            if (not always or op.startswith("BRA.DIV")) and fall:
                succ[b].add(b + 1)
        elif op.startswith(("EXIT", "RET")) and always:
            pass
        elif fall:
            succ[b].add(b + 1)
    return blocks, succ


def dominators(n, succ):
    pred = [set() for _ in range(n)]
    for b in range(n):
        for t in succ[b]:
            pred[t].add(b)
    reach, stack = {0}, [0]
    while stack:
        for t in succ[stack.pop()]:
            if t not in reach:
                reach.add(t)
                stack.append(t)
    dom = [set(reach) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in sorted(reach - {0}):
            ps = [dom[q] for q in pred[b] if q in reach]
            new = (set.intersection(*ps) if ps else set()) | {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom, pred, reach


def natural_loops(insts):
    """One loop per back edge u -> v: header v, body, and the address span [lo, hi]."""
    blocks, succ = cfg(insts)
    dom, pred, reach = dominators(len(blocks), succ)
    out = []
    for u in reach:
        for v in succ[u]:
            if v in dom[u]:
                body, stack = {u, v}, [u]
                while stack:
                    x = stack.pop()
                    if x == v:
                        continue
                    for q in pred[x]:
                        if q in reach and q not in body:
                            body.add(q)
                            stack.append(q)
                out.append({"body": body, "lo": insts[blocks[v][0]][0],
                            "hi": insts[blocks[u][1]][0],
                            "mma": sum(1 for b in body for i in range(blocks[b][0], blocks[b][1] + 1)
                                       if is_mma(insts[i][2]))})
    return out


# ---- counting -----------------------------------------------------------------------------

def is_hmma(op):
    return op.startswith("HMMA")


def is_mma(op):
    return op.startswith(("HMMA", "HGMMA"))


def hmma_flop(op):
    """FLOP per warp of an HMMA: m16n8k16 = 4096, m16n8k8 = 2048."""
    m = re.match(r"HMMA\.1688", op)
    return HMMA_FLOP // 2 if m else HMMA_FLOP


def hgmma(op, args):
    """(FLOP per warp, shared operand bytes per warp, SS) of an HGMMA, else None."""
    m = re.match(r"HGMMA\.64x(\d+)x16", op)
    if not m:
        return None
    n = int(m.group(1))
    ops = [a.strip() for a in args.split(",")]
    ss = len(ops) > 1 and ops[1].startswith("gdesc")
    return 2 * 64 * n * 16 / 4, ((64 * 16 if ss else 0) + n * 16) * 2 / 4, ss


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
    for addr, _, op, args in insts:
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
            c["flop"] += hmma_flop(op)
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


def model(fn):
    """The steady-state figures of one function, or None without an MMA loop."""
    insts = fn["insts"]
    loops = [lp for lp in natural_loops(insts) if lp["mma"]]
    inner = [lp for lp in loops if not any(o is not lp and o["body"] < lp["body"] for o in loops)]
    if not inner:
        return None
    counts = [count(insts, lp["lo"], lp["hi"]) for lp in inner]
    k = min(range(len(inner)), key=lambda i: (-inner[i]["mma"], counts[i]["instr"]))
    c, best = counts[k], inner[k]
    f = max(c["flop"] / HMMA_FLOP, 1e-9)  # HMMAs, or their worth of FLOP
    ins4kf = c["instr"] / f
    ins4kf_all = sum(x["instr"] for x in counts) / max(sum(x["flop"] for x in counts) / HMMA_FLOP, 1e-9)
    smem_read = c["ldsm_b"] + c["lds_b"] + c["gdesc_b"]
    smem_all = smem_read + c["sts_b"] + 512 * c["ldgsts"]
    return dict(c, loop="0x%x-0x%x" % (best["lo"], best["hi"]), loops=len(inner),
                ins4kf=ins4kf, ins4kf_all=ins4kf_all, b_per_4kf=smem_read / f,
                b_all_per_4kf=smem_all / f, regs=fn.get("regs"),
                stack=fn.get("stack", 0), spill=fn.get("spill", 0),
                i_per_hgmma=c["instr"] / c["hgmma"] if c["hgmma"] else 0,
                serial=fn.get("serial", 0),
                issue_tflops=SMS * CLOCK * SCHED / ins4kf * HMMA_FLOP / 1e12,
                smem_tflops=SMS * CLOCK * SMEM_BPC / max(smem_all / f, 1e-9) * HMMA_FLOP / 1e12)


def compile_model(root, cuobjdump, file, arch, dtype, head_dim, flexc, tiles=None, dropout=False,
                  cubin=None):
    """{kernel: model} of FILE compiled by flexc (or of a given cubin)."""
    with tempfile.TemporaryDirectory() as tmp:
        usage = ""
        if not cubin:
            cubin = os.path.join(tmp, "k.cubin")
            env = dict(os.environ)
            if tiles:
                env["FLEXC_TILES"] = tiles
            r = subprocess.run([flexc, "emit", file, "--target", "cubin", "--arch", arch,
                                "--dtype", dtype, "--head-dim", str(head_dim), "-o", cubin,
                                "--resource-usage"] + (["--dropout"] if dropout else []),
                               check=True, env=env, capture_output=True, text=True, cwd=root)
            usage = r.stdout + r.stderr
        funcs = sass_functions(cuobjdump, cubin)
        # ptxas's own count: spilled registers, as opposed to call frames.
        for m in re.finditer(r"(\w+): \d+ registers, (\d+) bytes spill stores, (\d+) bytes "
                             r"spill loads.*", usage):
            if m.group(1) in funcs:
                funcs[m.group(1)]["spill"] = int(m.group(2)) + int(m.group(3))
                funcs[m.group(1)]["serial"] = int("wgmma serialized" in m.group(0))
    return {name: m for name in sorted(funcs) for m in [model(funcs[name])] if m}


# The anchors of issue 23's table (bench/RESULTS.md): the label of each
# anchor_sass.sh listing, and its figures as measured (2026-11-27, this
# counter and ../shared/tools/ins4kf.py agree on every one).
ANCHORS = [  # row, column, label, recorded (pick, all)
    ("sm_80 forward", "FA2 (PyTorch)", "fa2_torch_sm80_fwd", (4.52, 4.52), (4.62, 4.62)),
    ("sm_80 forward", "FA3 repo, Sm80 path", "fa3code_sgl_sm80_fwd", (3.27, 3.27), (3.29, 3.67)),
    ("sm_80 backward", "FA2 (PyTorch)", "fa2_torch_sm80_bwd", (3.19, 3.19), (3.45, 3.45)),
    ("sm_90a forward", "FA3 (Hopper)", "fa3_jax_sm90a_fwd", (1.70, 1.70), (1.88, 2.11)),
    ("sm_90a backward", "FA3 (Hopper)", "fa3_jax_sm90a_bwd", (1.30, 1.30), (1.53, 1.53)),
]
TABLE_ROWS = [("sm_80 forward", "sm_80", "flex_fwd"), ("sm_80 backward", "sm_80", "flex_bwd"),
              ("sm_90a forward", "sm_90a", "flex_fwd"), ("sm_90a backward", "sm_90a", "flex_bwd")]
TABLE_COLS = ["FA2 (PyTorch)", "FA3 repo, Sm80 path", "FA3 (Hopper)"]


def table(root, cuobjdump, a):
    """Issue 23's table: ins/4kF of our forward and backward, sm_80 and
    sm_90a, an identity score (no mask) and a causal mask, bf16, E = 128,
    beside the anchors' (measured from --anchors DIR/sass, else recorded).
    The sm_90a backward is counted over all its inner MMA loops."""
    ours = {}
    for arch in ("sm_80", "sm_90a"):
        for name, file in (("none", "bench/identity.score"), ("causal", "samples/causal.score")):
            ours[arch, name] = compile_model(root, cuobjdump, file, arch, "bf16", 128, a.flexc)
    anchors = {}
    for row, col, label, rec0, rec1 in ANCHORS:
        got = []
        for suffix, rec in (("", rec0), ("_causal", rec1)):
            path = os.path.join(a.anchors, "sass", label + suffix + ".sass") if a.anchors else None
            if path and os.path.exists(path):
                with open(path) as f:
                    ms = [m for fn in parse_sass(f.read()).values() for m in [model(fn)] if m]
                got.append((ms[0]["ins4kf"], ms[0]["ins4kf_all"]) if ms else None)
            else:
                got.append(rec)
        anchors[row, col] = got
    src = "measured in %s" % a.anchors if a.anchors else "recorded (anchor_sass.sh, 2026-11-27)"
    print("ins/4kF, bf16, E = 128, no mask / causal; anchors %s; sm_90a backward over all its "
          "inner MMA loops" % src)
    print("| kernel | " + " | ".join(TABLE_COLS) + " | flexc |")
    print("| --- |" + " --- |" * (len(TABLE_COLS) + 1))
    bad = []
    for row, arch, kernel in TABLE_ROWS:
        key = "ins4kf_all" if row == "sm_90a backward" else "ins4kf"
        idx = 1 if row == "sm_90a backward" else 0
        cells = []
        for col in TABLE_COLS:
            v = anchors.get((row, col))
            cells.append("%.2f / %.2f" % (v[0][idx], v[1][idx]) if v and v[0] and v[1] else "-")
        fig = []
        for name in ("none", "causal"):
            m = ours[arch, name].get(kernel)
            fig.append("%.2f" % m[key] if m else "no loop")
            if not m:
                bad.append("%s %s: no MMA loop" % (row, name))
            elif m["spill"] or m["stack"]:
                bad.append("%s %s: spill %d, stack %d" % (row, name, m["spill"], m["stack"]))
        print("| %s | %s | %s |" % (row, " | ".join(cells), " / ".join(fig)))
    for b in bad:
        print("kernel_model: FAIL: " + b)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", help=".score file (or anything, with --sass)")
    ap.add_argument("--arch", default="sm_80")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--flexc", default="build/flexc")
    ap.add_argument("--cubin", help="model this cubin instead of compiling FILE")
    ap.add_argument("--sass", help="model this cuobjdump -sass listing instead of compiling FILE")
    ap.add_argument("--tiles", help="FLEXC_TILES override for the compile")
    ap.add_argument("--dropout", action="store_true", help="model the kernels with dropout")
    ap.add_argument("--table", action="store_true",
                    help="issue 23's table (sm_80 and sm_90a, forward and backward, no mask and "
                    "causal, bf16, E = 128) beside the anchors'")
    ap.add_argument("--anchors", help="with --table: anchor_sass.sh's OUTDIR, to measure the "
                    "anchors' SASS instead of printing their recorded figures")
    ap.add_argument("--install", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--max", action="append", default=[], metavar="KERNEL:FIELD=V",
                    help="fail (exit 1) when KERNEL's FIELD (ins4kf, ins4kf_all, b_per_4kf, stack, "
                    "local, regs, serial, spill, ...) is above V; also fails when flex_fwd or "
                    "flex_bwd has no MMA loop")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not a.file and not a.table:
        ap.error("a FILE, or --table")
    if a.sass:
        with open(a.sass) as f:
            funcs = parse_sass(f.read())
        rows = {name: m for name in sorted(funcs) for m in [model(funcs[name])] if m}
    else:
        cuobjdump = find_cuobjdump(root, a.install)
        if not cuobjdump:
            print("kernel_model: no cuobjdump (pip install nvidia-cuda-cuobjdump "
                  "nvidia-cuda-nvdisasm, or run with --install)", file=sys.stderr)
            return 77
        if a.table:
            return table(root, cuobjdump, a)
        rows = compile_model(root, cuobjdump, a.file, a.arch, a.dtype, a.head_dim, a.flexc,
                             a.tiles, a.dropout, a.cubin)
    bad = check(rows, a.max, not a.sass)
    if a.json:
        print(json.dumps({"file": a.sass or a.file, "arch": a.arch, "dtype": a.dtype,
                          "head_dim": a.head_dim, "kernels": rows}, indent=1))
        return 1 if bad else 0
    if a.sass:
        print("%s (steady-state loop, per warp and iteration)" % a.sass)
    else:
        print("%s, %s, %s, E=%d (steady-state loop, per warp and iteration)" %
              (a.file, a.arch, a.dtype, a.head_dim))
    print("%-9s %6s %6s %5s %6s %5s %5s %7s %4s %6s %4s %6s %6s %4s %6s %4s %5s %5s %4s %8s %8s" %
          ("kernel", "ins4kF", "all", "loops", "instr", "HMMA", "LDSM", "bytes", "LDS", "bytes",
           "STS", "bytes", "LDGSTS", "LDG", "B/4kF", "regs", "spill", "stack", "lmem", "issue-TF",
           "smem-TF"))
    for name, m in rows.items():
        print("%-9s %6.2f %6.2f %5d %6d %5d %5d %7d %4d %6d %4d %6d %6d %4d %6.1f %4s %5d %5d %4d "
              "%8.0f %8.0f" %
              (name[:9] if a.sass else name, m["ins4kf"], m["ins4kf_all"], m["loops"], m["instr"],
               m["hmma"], m["ldsm"], m["ldsm_b"], m["lds"], m["lds_b"], m["sts"], m["sts_b"],
               m["ldgsts"], m["ldg"], m["b_per_4kf"], m["regs"], m["spill"], m["stack"],
               m["local"], m["issue_tflops"], m["smem_tflops"]))
        if m["hgmma"]:
            print("  wgmma: %d HGMMA (%d SS, %d RS), %.2f i/HGMMA, %.0f shared operand B per warp, "
                  "serialized by ptxas: %s" %
                  (m["hgmma"], m["hgmma_ss"], m["hgmma"] - m["hgmma_ss"], m["i_per_hgmma"],
                   m["gdesc_b"], "YES" if m["serial"] else "no"))
    for b in bad:
        print("kernel_model: FAIL: " + b)
    return 1 if bad else 0


def check(rows, limits, need):
    """The --max limits that fail; flex_fwd and flex_bwd must have an MMA loop (need)."""
    bad = ["%s: no steady-state MMA loop" % k for k in ("flex_fwd", "flex_bwd")
           if need and k not in rows]
    for lim in limits:
        m = re.fullmatch(r"(\w+):(\w+)=([0-9.]+)", lim)
        if not m:
            bad.append("bad --max %r" % lim)
        elif m.group(1) in rows and m.group(2) not in rows[m.group(1)]:
            bad.append("--max %r: no field %s" % (lim, m.group(2)))
        elif m.group(1) in rows and rows[m.group(1)][m.group(2)] > float(m.group(3)):
            bad.append("%s %s = %g > %s" % (m.group(1), m.group(2),
                                             rows[m.group(1)][m.group(2)], m.group(3)))
    return bad


if __name__ == "__main__":
    sys.exit(main())
