"""flexc: attention score modifiers and block-sparse masks written in the
.score language, compiled to fused attention kernels.

    import flexc
    k = flexc.compile("samples/softcap.score")      # or .score source text
    out = k(q, k_, v, params={"softcap": 30.0})     # torch tensors or NumPy arrays
    out, lse = k(q, k_, v, return_lse=True, backend="reference")

flexc.torch.flex_attention mirrors torch.nn.attention.flex_attention with
autograd and torch.compile support.
"""
from ._capi import FlexError
from ._kernel import (BlockMask, BufferInfo, Grads, Kernel, KernelInfo, ParamInfo,
                      backend_available, backends, check, compile, default_backend, ir)

__version__ = "0.1.0"

__all__ = ["BlockMask", "BufferInfo", "FlexError", "Grads", "Kernel", "KernelInfo",
           "ParamInfo", "backend_available", "backends", "check", "compile",
           "default_backend", "ir", "__version__"]
