"""The ctypes layer itself: loading kernels from files and text, errors,
DLTensors that point at the caller's memory, NumPy arrays, backends,
kernel info, and the compiler entry points."""
import os
import pathlib

import numpy as np
import pytest
import torch
from cases import BY_NAME, SAMPLES
from oracle import dense, rel_err

import flexc
from flexc import _tensor as T
from flexc._capi import lib

GEMMA = os.path.join(SAMPLES, "gemma2.score")


def needs(fn):
    return pytest.mark.skipif(not lib.has(fn), reason=f"{lib.path} has no {fn} "
                              "(built before the runtime added it)")


def test_compile_from_path_pathlike_and_source():
    text = open(GEMMA).read()
    for src in (GEMMA, pathlib.Path(GEMMA), text):
        k = flexc.compile(src)
        assert isinstance(k, flexc.Kernel)
    assert flexc.compile(GEMMA).origin == GEMMA
    assert flexc.compile(text).origin == "<source>"


def test_diagnostics_are_rendered():
    with pytest.raises(flexc.FlexError) as e:
        flexc.compile("mask m(b, h, q, kv) { return q >= kv and true; }")
    msg = str(e.value)
    assert e.value.status == "invalid"
    assert "<source>:1:38: error:" in msg and "^" in msg
    with pytest.raises(flexc.FlexError, match="nokernel"):
        flexc.compile(GEMMA, kernel="nokernel")
    with pytest.raises(flexc.FlexError):
        flexc.compile(pathlib.Path(SAMPLES) / "missing.score")
    with pytest.raises(flexc.FlexError, match="missing.score") as e:
        flexc.compile("samples/missing.score")  # a missing file, not source text
    assert "unexpected" not in str(e.value)


def test_dltensor_points_at_the_callers_memory():
    x = torch.randn(2, 16, 4, 8).transpose(1, 2)  # [2, 4, 16, 8], strided
    assert T.readable(x) is x
    d = T.DL(x)
    assert d.t.data == x.data_ptr() and d.t.ndim == 4
    assert [d.t.shape[i] for i in range(4)] == list(x.shape)
    assert [d.t.strides[i] for i in range(4)] == list(x.stride())
    assert (d.t.dtype.code, d.t.dtype.bits, d.t.device.device_type) == (2, 32, 1)
    y = x[:, :, 3:]  # a view with a storage offset
    assert T.DL(y).t.data == y.data_ptr()
    a = np.zeros((3, 5, 7), np.float32)[:, 1:, ::1]
    assert T.readable(a) is a and T.DL(a).t.data == a.ctypes.data
    assert [T.DL(a).t.strides[i] for i in range(3)] == [35, 7, 1]
    # A last dimension that is not contiguous is copied once, for inputs.
    xt = torch.randn(4, 8).t()
    assert T.readable(xt) is not xt and T.readable(xt).is_contiguous()
    bf = T.DL(torch.zeros(2, dtype=torch.bfloat16)).t.dtype
    assert (bf.code, bf.bits) == (4, 16)


def test_outputs_written_in_place_of_strided_views():
    case = BY_NAME["softcap"]
    k = flexc.compile(case.path_or_source)
    g = torch.Generator().manual_seed(0)
    q, kk, v = (torch.randn(1, 32, 2, 8, generator=g).transpose(1, 2) for _ in range(3))
    out, lse = k(q, kk, v, params=case.params, return_lse=True)
    ref, ref_lse = dense(case, q.double(), kk.double(), v.double(), {})
    assert rel_err(out, ref) < 1e-6 and rel_err(lse, ref_lse) < 1e-6


def test_numpy_arrays_forward_and_backward():
    case = BY_NAME["alibi"]
    k = flexc.compile(case.path_or_source)
    rng = np.random.default_rng(0)
    q, kk, v = (rng.standard_normal((2, 2, 24, 8)).astype(np.float32) for _ in range(3))
    slopes = np.array([0.5, 0.25], np.float32)
    out, lse = k(q, kk, v, buffers={"slopes": slopes}, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and lse.dtype == np.float32
    # Causal: query 0 sees key 0 only.
    np.testing.assert_allclose(out[:, :, 0], v[:, :, 0], rtol=1e-6)
    t = [torch.from_numpy(x).double().requires_grad_() for x in (q, kk, v)]
    ref, ref_lse = dense(case, *t, {"slopes": torch.from_numpy(slopes)})
    assert rel_err(torch.from_numpy(out), ref) < 1e-6
    assert rel_err(torch.from_numpy(lse), ref_lse) < 1e-6
    dout = rng.standard_normal(out.shape).astype(np.float32)
    g = k.backward(q, kk, v, out, lse, dout, buffers={"slopes": slopes})
    (ref * torch.from_numpy(dout).double()).sum().backward()
    for mine, x in zip((g.dq, g.dk, g.dv), t):
        assert isinstance(mine, np.ndarray) and mine.dtype == np.float32
        assert rel_err(torch.from_numpy(mine), x.grad) < 1e-5
    assert g.buffers == {}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_buffer_gradients_from_kernel_backward(backend):
    # float64 runs on the reference only: the cpu backend refuses it by
    # name and takes the same call in float32.
    if not flexc.backend_available(backend):
        pytest.skip(f"no {backend} backend in this build")
    case = BY_NAME["relpos_bias"]
    k = flexc.compile(case.path_or_source)
    g = torch.Generator().manual_seed(0)
    q, kk, v = (torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64) for _ in range(3))
    table = (0.5 * torch.randn(2, 16, generator=g)).requires_grad_()
    dout = torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64)
    ref, _ = dense(case, q, kk, v, {"rel_bias": table})
    (ref * dout).sum().backward()
    bufs = {"rel_bias": table.detach()}
    if backend == "cpu":
        with pytest.raises(flexc.FlexError, match="float64"):
            k(q, kk, v, buffers=bufs, backend="cpu")
        q, kk, v, dout = q.float(), kk.float(), v.float(), dout.float()
    out, lse = k(q, kk, v, buffers=bufs, return_lse=True, backend=backend)
    grads = k.backward(q, kk, v, out, lse, dout, buffers=bufs, buffer_grads=["rel_bias"],
                       backend=backend)
    assert grads.buffers["rel_bias"].dtype == torch.float32
    tol = 1e-6 if backend == "reference" else 1e-4
    assert rel_err(grads.buffers["rel_bias"], table.grad) < tol


def test_emu_backend_matches_the_reference():
    # The generated CUDA run on the CPU: tiny shapes only.
    case = BY_NAME["gemma2"]
    k = flexc.compile(case.path_or_source)
    g = torch.Generator().manual_seed(0)
    q, kk, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))
    call = dict(params=case.params, buffers=case.buffers(1, 2, 40, 40, g), return_lse=True)
    out, lse = k(q, kk, v, backend="emu", **call)
    ref, ref_lse = k(q, kk, v, backend="reference", **call)
    assert rel_err(out, ref) < 1e-4 and rel_err(lse, ref_lse) < 1e-4
    dout = torch.randn(out.shape, generator=g)
    ge = k.backward(q, kk, v, out, lse, dout, backend="emu", buffers=call["buffers"],
                    params=case.params)
    gr = k.backward(q, kk, v, out, lse, dout, backend="reference", buffers=call["buffers"],
                    params=case.params)
    for a, b in zip((ge.dq, ge.dk, ge.dv), (gr.dq, gr.dk, gr.dv)):
        assert rel_err(a, b) < 1e-3


def test_dropout_forward_and_backward():
    # dropout_p / dropout_seed / dropout_offset reach the library: the same
    # seed gives the same output, p = 0 the output without dropout, the emu
    # draws the reference's bits, the backward takes the same three, and a
    # p outside [0, 1) is refused naming the field.
    k = flexc.compile(os.path.join(SAMPLES, "causal.score"))
    g = torch.Generator().manual_seed(1)
    q, kk, v = (torch.randn(1, 2, 24, 16, generator=g, dtype=torch.float64) for _ in range(3))
    drop = dict(dropout_p=0.3, dropout_seed=2**64 - 5, dropout_offset=9)
    out, lse = k(q, kk, v, return_lse=True, **drop)
    again = k(q, kk, v, **drop)
    plain, plain_lse = k(q, kk, v, return_lse=True)
    assert torch.equal(out, again) and not torch.equal(out, plain)
    assert torch.equal(lse, plain_lse)  # LSE is before dropout
    assert torch.equal(k(q, kk, v, dropout_p=0.0, dropout_seed=3), plain)
    emu = k(q.float(), kk.float(), v.float(), backend="emu", **drop)
    assert rel_err(emu.double(), out) < 1e-4
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    gd = k.backward(q, kk, v, out, lse, dout, **drop)
    gp = k.backward(q, kk, v, plain, plain_lse, dout)
    assert not torch.equal(gd.dv, gp.dv)
    with pytest.raises(flexc.FlexError, match="dropout_p"):
        k(q, kk, v, dropout_p=1.0)
    with pytest.raises(flexc.FlexError, match="dropout_p"):
        k(q, kk, v, dropout_p=float("nan"))
    with pytest.raises(ValueError, match="dropout_seed"):
        k(q, kk, v, dropout_p=0.1, dropout_seed=-1)


def test_kv_splits_reaches_the_library():
    # kv_splits (docs/decoding.md): a decoding call on the emulator split 1
    # (never), 3 and 0 (automatic) ways agrees with the reference, the
    # reference accepts and ignores it, and a negative count is refused.
    k = flexc.compile(os.path.join(SAMPLES, "causal_lower_right.score"))
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 1, 16, generator=g)
    kk, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(2))
    ref, ref_lse = k(q, kk, v, backend="reference", return_lse=True, kv_splits=5)
    for n in (1, 3, 0):
        out, lse = k(q, kk, v, backend="emu", return_lse=True, kv_splits=n)
        assert rel_err(out, ref) < 1e-4 and rel_err(lse, ref_lse) < 1e-4
    with pytest.raises(flexc.FlexError, match="kv_splits"):
        k(q, kk, v, backend="emu", kv_splits=-1)


def test_deterministic_backward():
    # deterministic= reaches the library: the emulator's CTAs in two seeded
    # orders give bitwise the same gradients (dQ and a relative-position
    # table's gradient would otherwise be float atomics), within tolerance
    # of the reference.
    k = flexc.compile(os.path.join(SAMPLES, "relpos_bias.score"))
    g = torch.Generator().manual_seed(2)
    q, dout = (torch.randn(1, 4, 64, 16, generator=g) for _ in range(2))
    kk, v = (torch.randn(1, 2, 96, 16, generator=g) for _ in range(2))
    bufs = {"rel_bias": 0.5 * torch.randn(4, 33, generator=g)}
    out, lse = k(q, kk, v, buffers=bufs, return_lse=True, backend="reference")
    runs = []
    for shuffle in ("3", "5"):
        os.environ["FLEXC_EMU_SHUFFLE"] = shuffle
        try:
            runs.append(k.backward(q, kk, v, out, lse, dout, buffers=bufs, backend="emu",
                                   buffer_grads=("rel_bias",), deterministic=True))
        finally:
            del os.environ["FLEXC_EMU_SHUFFLE"]
    ref = k.backward(q, kk, v, out, lse, dout, buffers=bufs, backend="reference",
                     buffer_grads=("rel_bias",))
    a, b = runs
    for name in ("dq", "dk", "dv"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert rel_err(getattr(a, name), getattr(ref, name)) < 1e-3, name
    assert torch.equal(a.buffers["rel_bias"], b.buffers["rel_bias"])
    assert rel_err(a.buffers["rel_bias"], ref.buffers["rel_bias"]) < 1e-3


def test_backends_and_defaults():
    names = flexc.backends()
    assert "reference" in names and "emu" in names
    x = torch.zeros(1)
    assert flexc.default_backend(x) == ("cpu" if flexc.backend_available("cpu") else "reference")
    assert flexc.default_backend(np.zeros(1, np.float32)) == flexc.default_backend(x)
    # float64 runs in float64 on the reference, the one backend that has it
    assert flexc.default_backend(np.zeros(1)) == "reference"
    assert flexc.default_backend(torch.zeros(1, dtype=torch.float64)) == "reference"
    with pytest.raises(ValueError, match="unknown backend"):
        flexc.backend_available("tpu")
    k = flexc.compile("")
    q = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="unknown backend"):
        k(q, q, q, backend="tpu")
    if "cuda" not in names:
        with pytest.raises(flexc.FlexError) as e:
            k(q, q, q, backend="cuda")
        assert e.value.status in ("no device", "invalid")


def test_call_errors():
    case = BY_NAME["gemma2"]
    k = flexc.compile(case.path_or_source)
    q = torch.randn(1, 2, 8, 8)
    slopes = torch.ones(2)
    with pytest.raises(flexc.FlexError, match="window"):
        k(q, q, q, buffers={"slopes": slopes}, params={"window": 2.5})
    with pytest.raises(flexc.FlexError, match="nosuch"):
        k(q, q, q, buffers={"slopes": slopes}, params={"nosuch": 1})
    with pytest.raises(flexc.FlexError, match="slopes"):
        k(q, q, q, buffers={"slopes": torch.ones(3)})
    with pytest.raises(flexc.FlexError, match="q, k and v"):
        k(q, q.double(), q, buffers={"slopes": slopes})
    with pytest.raises(TypeError, match="complex64"):
        k(q, q, q, buffers={"slopes": torch.ones(2, dtype=torch.complex64)})


def test_check_bounds_reports_the_read():
    src = "buffer t: f32[4];\nscore sc(s, b, h, q, kv) { return s + t[kv]; }\n"
    k = flexc.compile(src)
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(flexc.FlexError, match="out-of-range read of buffer 't'") as e:
        k(q, q, q, buffers={"t": torch.zeros(4)}, check_bounds=True)
    assert e.value.status == "runtime"


@needs("flex_kernel_get_info")
def test_info():
    info = flexc.compile(GEMMA).info()
    assert (info.name, info.score, info.mask) == ("gemma", "alibi_softcap", "causal && local") or \
        (info.name, info.score) == ("gemma", "alibi_softcap")
    assert [(p.name, p.type, p.default) for p in info.params] == \
        [("softcap", "float", 50.0), ("window", "int", 4096)]
    (b,) = info.buffers
    assert (b.name, b.dtype, b.shape, b.grad, b.used) == ("slopes", "float32", ("H",), False, True)
    assert {"score", "mask"} <= info.features
    rel = flexc.compile(os.path.join(SAMPLES, "relpos_bias.score")).info()
    assert rel.buffers[0].shape == ("H", "NB") and rel.buffers[0].grad
    assert "grad_buffers" in rel.features
    doc = flexc.compile(os.path.join(SAMPLES, "document.score")).info()
    assert doc.buffers[0].sorted and doc.buffers[0].dtype == "int32"
    assert flexc.compile("").info().name == "default"


@needs("flex_check_file")
def test_check_and_ir(tmp_path):
    flexc.check(GEMMA)
    bad = tmp_path / "bad.score"
    bad.write_text("mask m(b, h, q, kv) { return q >= ; }\n")
    with pytest.raises(flexc.FlexError, match="bad.score:1:"):
        flexc.check(bad)
    text = flexc.ir(GEMMA, grad=True)
    assert "tanh" in text


@needs("flex_emit")
def test_emit_cuda_source():
    src = flexc.compile(GEMMA).emit(target="cuda", arch="sm_80", dtype="float16", head_dim=64)
    assert "__global__" in src


@pytest.mark.parametrize("readme", ["README.md", "python/README.md"])
def test_readme_example_runs(readme, monkeypatch):
    from cases import ROOT
    text = open(os.path.join(ROOT, readme)).read()
    monkeypatch.chdir(ROOT)
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks
    for code in blocks:  # each example on its own; those that train, checked
        scope = {}
        exec(compile(code, readme, "exec"), scope)
        if "out" in scope and "q" in scope:
            assert scope["out"].shape == (2, 8, 256, 64) and scope["q"].grad is not None
        if "out2" in scope:
            assert torch.equal(scope["out2"], scope["out"].detach())
        if "bias" in scope:
            assert scope["bias"].grad is not None and scope["bias"].grad.abs().sum() > 0


# The C declarations the ctypes layer mirrors: every struct, field by field.
_STRUCTS = {
    "DLDevice": "DLDevice", "DLDataType": "DLDataType", "DLTensor": "DLTensor",
    "ParamInfo": "flex_param_info", "BufferInfo": "flex_buffer_info",
    "KernelInfo": "flex_kernel_info", "Param": "flex_param", "Buffer": "flex_buffer",
    "BlockMask": "flex_block_mask", "Args": "flex_args", "MaskStats": "flex_mask_stats",
    "EmitOptions": "flex_emit_options",
}


def test_ctypes_structs_match_flex_h(tmp_path):
    import ctypes
    import re
    import subprocess

    from cases import ROOT

    from flexc import _capi as C
    lines, expect = [], []
    for py, c in _STRUCTS.items():
        st = getattr(C, py)
        lines.append(f'printf("%zu\\n", sizeof({c}));')
        expect.append(ctypes.sizeof(st))
        for name, *_ in st._fields_:
            lines.append(f'printf("%zu\\n", offsetof({c}, {name}));')
            expect.append(getattr(st, name).offset)
    src = tmp_path / "abi.c"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "flex.h"\nint main(void) {\n'
                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=c11", "-I", os.path.join(ROOT, "runtime"), str(src), "-o", str(exe)],
                   check=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    assert got == expect
    # Every function flex.h declares has a prototype here, with its arity.
    text = re.sub(r"/\*.*?\*/", "", open(os.path.join(ROOT, "runtime", "flex.h")).read(), flags=re.S)
    decls = {m.group(1): m.group(2) for m in
             re.finditer(r"\b(flex_\w+)\s*\(([^()]*)\)\s*;", text)}
    assert set(decls) == set(C._PROTOTYPES)
    for name, params in decls.items():
        n = 0 if params.strip() in ("", "void") else params.count(",") + 1
        assert n == len(C._PROTOTYPES[name][1]), name


@pytest.mark.parametrize("backend", ["reference", "cpu", "emu"])
def test_packed_call_matches_each_sequence_alone(backend):
    # cu_seqlens: a packed batch gives what each sequence gives alone, an
    # empty sequence and a one-token sequence included; backward too.
    if not flexc.backend_available(backend):
        pytest.skip(f"no {backend} backend in this build")
    k = flexc.compile(BY_NAME["causal_lower_right"].path_or_source)
    g = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, (1,))))
    lq, lkv = [5, 0, 17, 1], [9, 3, 17, 4]
    cq = torch.tensor([0] + list(np.cumsum(lq)), dtype=torch.int32)
    ckv = torch.tensor([0] + list(np.cumsum(lkv)), dtype=torch.int32)
    q = torch.randn(sum(lq), 2, 8, generator=g)
    kk, v = (torch.randn(sum(lkv), 1, 8, generator=g) for _ in range(2))
    dout = torch.randn(sum(lq), 2, 8, generator=g)
    out, lse = k(q, kk, v, cu_seqlens_q=cq, cu_seqlens_kv=ckv, return_lse=True, backend=backend)
    assert out.shape == (sum(lq), 2, 8) and lse.shape == (2, sum(lq))
    grads = k.backward(q, kk, v, out, lse, dout, cu_seqlens_q=cq, cu_seqlens_kv=ckv,
                       backend=backend)
    for b in range(len(lq)):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ckv[b]), int(ckv[b + 1]))
        if lq[b] == 0:
            continue
        one = lambda x, s: x[s].permute(1, 0, 2)[None].contiguous()  # noqa: E731
        o1, l1 = k(one(q, qs), one(kk, ks), one(v, ks), return_lse=True, backend="reference")
        assert rel_err(out[qs], o1[0].permute(1, 0, 2)) < 1e-4
        assert rel_err(lse[:, qs], l1[0]) < 1e-4
        g1 = k.backward(one(q, qs), one(kk, ks), one(v, ks), o1, l1, one(dout, qs),
                        backend="reference")
        assert rel_err(grads.dq[qs], g1.dq[0].permute(1, 0, 2)) < 1e-3
        assert rel_err(grads.dk[ks], g1.dk[0].permute(1, 0, 2)) < 1e-3
        assert rel_err(grads.dv[ks], g1.dv[0].permute(1, 0, 2)) < 1e-3
    with pytest.raises(ValueError, match="both cu_seqlens_q and cu_seqlens_kv"):
        k(q, kk, v, cu_seqlens_q=cq)


def test_emit_takes_the_cli_dtype_spellings():
    k = flexc.compile(GEMMA)
    bf16 = k.emit(dtype="bfloat16")
    for spelling in ("bf16", torch.bfloat16, "torch.bfloat16"):
        assert k.emit(dtype=spelling) == bf16
    assert k.emit(dtype="fp16") == k.emit(dtype="float16") == k.emit()
    assert k.emit(dtype="fp32") == k.emit(dtype=torch.float32) != bf16
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        k.emit(dtype="int8")
    with pytest.raises(ValueError, match="cuda, ptx, cubin"):
        k.emit(target="sass")
