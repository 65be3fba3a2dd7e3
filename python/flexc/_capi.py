"""ctypes declarations of runtime/flex.h, and loading libflexc.

One declaration per C struct and function, in flex.h's order. The library
is found, in order: $FLEXC_LIBRARY (a path), the copy bundled in this
package (flexc/lib/libflexc.so.0, what `pip install` puts there), then the
system's library path (libflexc.so.0 from `cmake --install`).

A function flex.h declares but the loaded library lacks (an older build)
raises FlexError naming it when called, not when the package is imported.
"""
import ctypes
import os

MAX_DIMS = 8  # FLEX_MAX_DIMS

# flex_status
OK, ERR_INVALID, ERR_NO_DEVICE, ERR_COMPILE, ERR_RUNTIME, ERR_UNSUPPORTED, ERR_NOMEM = range(7)
STATUS_NAMES = {
    ERR_INVALID: "invalid", ERR_NO_DEVICE: "no device", ERR_COMPILE: "compile",
    ERR_RUNTIME: "runtime", ERR_UNSUPPORTED: "unsupported", ERR_NOMEM: "out of memory",
}

# flex_backend
BACKENDS = {"reference": 0, "emu": 1, "cuda": 2, "cpu": 3}

# DLDeviceType and DLDataTypeCode
kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool = 0, 1, 2, 4, 6

# flex_type and feature bits
TYPE_NAMES = {0: "bool", 1: "int", 2: "float"}
FEATURES = {
    "score": 1 << 0, "mask": 1 << 1, "grad_buffers": 1 << 2,
    "implicit_mask": 1 << 3, "ds_is_dt": 1 << 4, "sink": 1 << 5,
}

# flex_target
TARGETS = {"cuda": 0, "ptx": 1, "cubin": 2}


class FlexError(RuntimeError):
    """A flexc call failed: `status` is the flex_status name, the message is
    flex_last_error()'s."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = STATUS_NAMES.get(status, str(status))


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


PDL = ctypes.POINTER(DLTensor)


class ParamInfo(ctypes.Structure):  # flex_param_info
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int),
                ("has_default", ctypes.c_bool), ("default_value", ctypes.c_double)]


class BufferInfo(ctypes.Structure):  # flex_buffer_info
    _fields_ = [
        ("name", ctypes.c_char_p), ("dtype", DLDataType), ("ndim", ctypes.c_int),
        ("extent", ctypes.c_int64 * MAX_DIMS), ("dim_name", ctypes.c_char_p * MAX_DIMS),
        ("grad", ctypes.c_bool), ("sorted", ctypes.c_bool), ("used", ctypes.c_bool),
    ]


class KernelInfo(ctypes.Structure):  # flex_kernel_info
    _fields_ = [
        ("name", ctypes.c_char_p), ("file", ctypes.c_char_p), ("score", ctypes.c_char_p),
        ("mask", ctypes.c_char_p), ("features", ctypes.c_uint),
        ("nparams", ctypes.c_int), ("params", ctypes.POINTER(ParamInfo)),
        ("nbuffers", ctypes.c_int), ("buffers", ctypes.POINTER(BufferInfo)),
        ("sink", ctypes.c_char_p),
    ]


class Param(ctypes.Structure):  # flex_param
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class Buffer(ctypes.Structure):  # flex_buffer
    _fields_ = [("name", ctypes.c_char_p), ("tensor", PDL), ("grad", PDL)]


MASK_ARRAYS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
               "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


class BlockMask(ctypes.Structure):  # flex_block_mask
    _fields_ = [("block_q", ctypes.c_int), ("block_kv", ctypes.c_int)] + [
        (name, PDL) for name in MASK_ARRAYS]


class Args(ctypes.Structure):  # flex_args
    _fields_ = [
        ("backend", ctypes.c_int),
        ("q", PDL), ("k", PDL), ("v", PDL),
        ("out", PDL), ("lse", PDL),
        ("dout", PDL), ("dlse", PDL),
        ("dq", PDL), ("dk", PDL), ("dv", PDL),
        ("scale", ctypes.c_double),
        ("params", ctypes.POINTER(Param)), ("nparams", ctypes.c_int),
        ("buffers", ctypes.POINTER(Buffer)), ("nbuffers", ctypes.c_int),
        ("block_mask", ctypes.POINTER(BlockMask)),
        ("stream", ctypes.c_void_p),
        ("check_bounds", ctypes.c_bool),
        ("fast_math", ctypes.c_bool),
        ("trust_sorted", ctypes.c_bool),
        ("cu_seqlens_q", PDL), ("cu_seqlens_kv", PDL),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64),
        ("page_table", PDL), ("kv_lens", PDL),
        ("kv_splits", ctypes.c_int),
        ("deterministic", ctypes.c_bool),
        ("arch", ctypes.c_char_p),
        ("q_offset", ctypes.c_int64), ("kv_offset", ctypes.c_int64),
        ("q_len_total", ctypes.c_int64), ("kv_len_total", ctypes.c_int64),
    ]


class MaskStats(ctypes.Structure):  # flex_mask_stats
    _fields_ = [(n, ctypes.c_int64) for n in
                ("total", "full", "partial", "empty", "undecided", "refined", "evaluated")] + [
        ("decidable", ctypes.c_bool), ("implicit", ctypes.c_bool)]


class EmitOptions(ctypes.Structure):  # flex_emit_options
    _fields_ = [
        ("target", ctypes.c_int), ("arch", ctypes.c_char_p), ("dtype", DLDataType),
        ("head_dim", ctypes.c_int), ("head_dim_v", ctypes.c_int),
        ("forward_only", ctypes.c_bool), ("fast_math", ctypes.c_bool),
        ("resource_usage", ctypes.c_bool), ("dropout", ctypes.c_bool),
        ("deterministic", ctypes.c_bool),
    ]


_p, _i, _st = ctypes.c_void_p, ctypes.c_int, ctypes.c_int
_sz, _b, _cs = ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p
_PROTOTYPES = {
    "flex_last_error": (_cs, []),
    "flex_backend_name": (_cs, [_i]),
    "flex_backend_parse": (_b, [_cs, ctypes.POINTER(_i)]),
    "flex_backend_available": (_b, [_i]),
    "flex_kernel_load": (_st, [ctypes.POINTER(_p), _cs, _cs]),
    "flex_kernel_from_source": (_st, [ctypes.POINTER(_p), _cs, _cs, _sz, _cs]),
    "flex_kernel_free": (None, [_p]),
    "flex_kernel_get_info": (_st, [_p, ctypes.POINTER(KernelInfo)]),
    "flex_tensor_alloc": (_st, [ctypes.POINTER(PDL), _i, DLDataType, _i,
                                ctypes.POINTER(ctypes.c_int64), _p]),
    "flex_tensor_free": (None, [PDL]),
    "flex_tensor_copy": (_st, [PDL, PDL, _p]),
    "flex_device_name": (_st, [_i, ctypes.c_char_p, _sz]),
    "flex_sync": (_st, [_i, _p]),
    "flex_npy_load": (_st, [ctypes.POINTER(PDL), _cs]),
    "flex_npy_save": (_st, [_cs, PDL]),
    "flex_block_mask_create": (_st, [ctypes.POINTER(ctypes.POINTER(BlockMask)), _p,
                                     ctypes.POINTER(Args), _i, _i, _i, _i, _i, _i,
                                     ctypes.POINTER(MaskStats)]),
    "flex_block_mask_free": (None, [ctypes.POINTER(BlockMask)]),
    "flex_mask_explain": (_st, [_p, ctypes.POINTER(_i), ctypes.POINTER(_p)]),
    "flex_mask_classify": (_st, [_p, ctypes.POINTER(Args), _i, _i, _i, _i, ctypes.POINTER(_i)]),
    "flex_check_file": (_st, [_cs]),
    "flex_ir_text": (_st, [ctypes.POINTER(_p), _cs, _cs, _b, _cs]),
    "flex_ir_pass_names": (_cs, []),
    "flex_emit": (_st, [_p, ctypes.POINTER(EmitOptions), ctypes.POINTER(_p),
                        ctypes.POINTER(_sz), ctypes.POINTER(_p)]),
    "flex_free": (None, [_p]),
    "flex_forward": (_st, [_p, ctypes.POINTER(Args)]),
    "flex_backward": (_st, [_p, ctypes.POINTER(Args)]),
}


def _library_path():
    env = os.environ.get("FLEXC_LIBRARY")
    if env:
        return env
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libflexc.so.0")
    if os.path.exists(bundled):
        return bundled
    return "libflexc.so.0"


class _Missing:
    """Stands for a function flex.h declares that this library lacks."""

    def __init__(self, name, path):
        self.name, self.path = name, path

    def __call__(self, *args):
        raise FlexError(ERR_UNSUPPORTED, f"{self.path} has no {self.name} "
                        "(the library predates it: rebuild flexc)")


class _Lib:
    """The loaded library: one attribute per flex.h function."""

    def __init__(self):
        self.path = _library_path()
        try:
            self.dll = ctypes.CDLL(self.path)
        except OSError as e:
            raise ImportError(
                f"flexc: cannot load the flexc library ({self.path}): {e}. Install the "
                "package with `pip install ./python`, or set FLEXC_LIBRARY to a libflexc.so") from e
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(self.dll, name, None)
            if fn is None:
                setattr(self, name, _Missing(name, self.path))
                continue
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)

    def has(self, name):
        return not isinstance(getattr(self, name), _Missing)

    def check(self, status):
        """Raises FlexError with the thread's last message unless OK."""
        if status != OK:
            raise FlexError(status, self.flex_last_error().decode("utf-8", "replace"))


lib = _Lib()
