"""Arrays (torch tensors, NumPy arrays) seen as DLPack DLTensors, no copies.

A DLTensor built here points at the array's own memory (data_ptr / the
NumPy buffer, its shape and strides in elements, its device); it keeps the
array and its shape and stride arrays alive as long as the DLTensor is. An
input whose layout flexc cannot read (a last dimension of stride other than
1, a negative stride) is copied into a compact one first; everything else,
outputs included, is passed as it is.
"""
import ctypes

from . import _capi as C

_DL = {  # (code, bits) -> name, shared by torch and NumPy names
    (C.kDLFloat, 16): "float16", (C.kDLFloat, 32): "float32", (C.kDLFloat, 64): "float64",
    (C.kDLBfloat, 16): "bfloat16", (C.kDLInt, 32): "int32", (C.kDLInt, 64): "int64",
    (C.kDLUInt, 8): "uint8", (C.kDLBool, 8): "bool",
}
_CODE = {name: code for code, name in _DL.items()}


_is_torch = {}  # type -> whether it is a torch tensor (asked on every call: cached)


def is_torch(x):
    t = type(x)
    r = _is_torch.get(t)
    if r is None:
        r = _is_torch[t] = t.__module__.startswith("torch") and hasattr(t, "data_ptr")
    return r


_dtype_names = {}  # torch or NumPy dtype -> 'float32', 'bfloat16', ...


def dtype_name(x):
    """'float32', 'bfloat16', ... for a torch tensor or NumPy array."""
    d = x.dtype
    n = _dtype_names.get(d)
    if n is None:
        n = _dtype_names[d] = str(d).replace("torch.", "") if is_torch(x) else d.name
    return n


def device_of(x):
    """(DLDeviceType, index): CUDA tensors are kDLCUDA, everything else the host."""
    if is_torch(x) and x.device.type == "cuda":
        return C.kDLCUDA, x.device.index or 0
    if is_torch(x) and x.device.type != "cpu":
        raise ValueError(f"flexc: tensors on {x.device} are not supported (cpu or cuda)")
    return C.kDLCPU, 0


def _layout(x):
    """(data pointer, shape, strides in elements) of x."""
    if is_torch(x):
        return x.data_ptr(), tuple(x.shape), tuple(x.stride())
    size = x.dtype.itemsize
    if any(s % size for s in x.strides):
        return None
    return x.ctypes.data, tuple(x.shape), tuple(s // size for s in x.strides)


def readable(x):
    """x, or a compact copy when its layout is one flexc refuses for inputs
    (last-dim stride not 1, negative strides, strides not in elements)."""
    lay = _layout(x)
    if lay is not None:
        _, shape, strides = lay
        if all(st >= 0 or n <= 1 for n, st in zip(shape, strides)) and (
                not shape or shape[-1] <= 1 or strides[-1] == 1):
            return x
    if is_torch(x):
        return x.contiguous()
    import numpy as np
    return np.ascontiguousarray(x)


class DL:
    """A DLTensor over x (kept alive with it); .ptr is what flex_args takes."""

    def __init__(self, x):
        name = dtype_name(x)
        if name not in _CODE:
            raise TypeError(f"flexc: dtype {name} has no DLPack equivalent flexc reads")
        lay = _layout(x)
        if lay is None:
            raise ValueError("flexc: array strides are not a multiple of its element size")
        data, shape, strides = lay
        self.x = x
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = (ctypes.c_int64 * max(len(shape), 1))(*strides)
        code, bits = _CODE[name]
        dev_type, dev_id = device_of(x)
        self.t = C.DLTensor(data=data, device=C.DLDevice(dev_type, dev_id), ndim=len(shape),
                            dtype=C.DLDataType(code, bits, 1), shape=self.shape,
                            strides=self.strides, byte_offset=0)
        self.ptr = ctypes.pointer(self.t)


def ptr(x, keep):
    """A DLTensor pointer for x (None -> NULL); `keep` holds it alive."""
    if x is None:
        return None
    d = DL(x)
    keep.append(d)
    return d.ptr


def empty(like, shape, dtype):
    """A new array of `shape` and dtype name `dtype`, in like's library and
    on like's device."""
    if is_torch(like):
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    import numpy as np
    return np.empty(shape, dtype=dtype)


def zeros(like, shape, dtype):
    if is_torch(like):
        import torch
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=like.device)
    import numpy as np
    return np.zeros(shape, dtype=dtype)


def current_stream(x):
    """The CUstream PyTorch's current stream on x's device, or None."""
    if is_torch(x) and x.device.type == "cuda":
        import torch
        return torch.cuda.current_stream(x.device).cuda_stream or None
    return None


