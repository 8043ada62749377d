"""Tensor descriptors, copied into each generated module with launch.py: the copy engine (TMA, Hopper on)
reads and writes a tensor in blocks through a descriptor built on the host; Gluon kernels take descriptors
that also carry the shared-memory layout their blocks land in."""
import dataclasses
import functools
import math

import torch

# ---- copied into every generated module from here on
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:   # a Triton without host tensor descriptors: kernels load and store through pointers
    TensorDescriptor = None


try:   # Gluon kernels take descriptors that also carry their shared-memory layout
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except ImportError:
    gl = GluonDescriptor = None


@functools.lru_cache(maxsize=None)
def _copy_engine(device):
    return device.type == "cpu" or torch.cuda.get_device_capability(device)[0] >= 9


def _describable(x, block):
    """Can the copy engine read or write x in blocks of `block`? Not on a GPU before Hopper, for an empty tensor,
    the last dimension not contiguous, the base or another stride not 16-byte aligned, a row of a block under
    16 bytes or a block side over 256; nor a bool tensor (Triton types it as 1-bit, a row of 0 whole bytes)."""
    size = x.element_size()
    return _copy_engine(x.device) and not (x.dtype == torch.bool or x.numel() == 0 or x.stride(-1) != 1
                                           or x.data_ptr() % 16 or any(s * size % 16 for s in x.stride()[:-1])
                                           or block[-1] * size < 16 or max(block) > 256)


def _descriptor(x, block):
    """x as the copy engine reads or writes it, in blocks of `block`; None where it cannot (see _describable, or
    a Triton without host descriptors)."""
    if TensorDescriptor is None or not _describable(x, block):
        return None
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block)


def _gluon_descriptor(x, block):
    """As _descriptor, for a Gluon kernel: with the swizzled shared-memory layout its block lands in."""
    dtype = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}.get(x.dtype)
    if GluonDescriptor is None or dtype is None or not _describable(x, block):
        return None
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype))
    return GluonDescriptor(x, list(x.shape), list(x.stride()), block, layout)


_SHARED_BYTES = 227 * 1024   # the shared memory one program may hold on Hopper


def _block_bytes(d):
    return math.prod(d.block_shape) * d.base.element_size()


def _output_buffer(a, b, v, out, wanted, stages, parts):
    """(O_BUF, STAGES) of a warp-specialized kernel asked for an output buffer of its own (`wanted`, the tunable
    WS_OUT_BUF): its output (`parts` blocks of `out`, one a consumer) then takes shared memory beside the row
    tile `a` and the ring of B and V blocks, which keeps as many of its `stages` as fit beside them (2 of 128
    keys, 3 of 64 at D 128 in fp16); where not even 2 fit, or none was asked for, (0, stages): the output
    leaves through A. Each argument but the counts is a Gluon descriptor of one block."""
    if wanted:
        # (a few KB stay free for the barriers and the layout conversions' scratch)
        free = _SHARED_BYTES - 4096 - _block_bytes(a) - parts * _block_bytes(out)
        fit = min(stages, free // (_block_bytes(b) + _block_bytes(v)))
        if fit >= 2:
            return 1, fit
    return 0, stages


def _redescribe(x, block, layout):
    """x described as a recorded launch described a tensor of the same signature (shape, strides, dtype and
    16-byte alignment, what a descriptor's own checks test), built without those checks: a replay builds
    every descriptor of its inputs again at each call, where the checks cost as much as the rest."""
    cls = TensorDescriptor if layout is None else GluonDescriptor
    if not _UNCHECKED:
        return cls(x, list(x.shape), list(x.stride()), block, *(() if layout is None else (layout,)))
    described = cls.__new__(cls)
    described.__dict__.update(base=x, shape=list(x.shape), strides=list(x.stride()), block_shape=block,
                              padding="zero")
    if layout is not None:
        described.layout = layout
    return described


_DESCRIPTORS = tuple(c for c in (TensorDescriptor, GluonDescriptor) if c is not None)
# descriptors are plain dataclasses with these fields (a Triton where they are not is given the checked build)
_UNCHECKED = all("__slots__" not in vars(c) and {f.name for f in dataclasses.fields(c)} <=
                 {"base", "shape", "strides", "block_shape", "padding", "layout"} for c in _DESCRIPTORS)


def _is_descriptor(a):
    return isinstance(a, _DESCRIPTORS)
