"""The systems bench.suite.attention compares: each builder takes a Case and returns a zero-argument call, or None
where the system cannot express the op (BUILDERS, by system name). Also the decode shapes' ceilings, timed like
the systems: a copy of the same bytes and a kernel that only reads K and V.
"""
import functools
from dataclasses import dataclass

from bench import common
from bench.suite.attention_ops import Op, attention_math, keep, score_mod

try:
    import torch
except ImportError:  # --help still works; running says what is missing
    torch = None

# ---------------------------------------------------------------- systems: each returns a zero-argument call, or None where it cannot express the op

@dataclass
class Case:
    op: Op
    q: "torch.Tensor"
    k: "torch.Tensor"
    v: "torch.Tensor"
    slopes: "torch.Tensor"
    device: str
    module: object = None       # the loaded neptune module
    module_error: str = None    # why it could not be loaded


def neptune(case):
    if case.module is None:
        raise RuntimeError(case.module_error or "no module")
    forward, q, k, v = case.module.forward, case.q, case.k, case.v
    if case.op.mod == "alibi":
        return lambda: forward(q, k, v, case.slopes)
    return lambda: forward(q, k, v)


def flex_args(case):
    """FlexAttention's score_mod, block_mask and enable_gqa for the case."""
    from torch.nn.attention.flex_attention import create_block_mask
    op, slopes = case.op, case.slopes
    Sq, Skv = case.q.shape[2], case.k.shape[2]
    off = Skv - Sq   # flex numbers query rows from 0
    mod = None if op.mod is None else (lambda s, b, h, i, j: score_mod(op.mod, s, slopes[h], i + off, j))
    block_mask = None if op.mask is None else create_block_mask(
        lambda b, h, i, j: keep(op.mask, i + off, j), None, None, Sq, Skv, device=case.device)
    return mod, block_mask, case.q.shape[1] != case.k.shape[1]


def api_callables(op, slopes, offset):
    """score_mod and mask_mod for neptune_eqsat.flex_attention: FlexAttention's, with the query's position
    i + offset read from a captured 0-d tensor (so one kernel serves every KV length)."""
    mod = None if op.mod is None else (lambda s, b, h, i, j: score_mod(op.mod, s, slopes[h], i + offset, j))
    mask = None if op.mask is None else (lambda b, h, i, j: keep(op.mask, i + offset, j))
    return mod, mask


def import_package():
    """neptune_eqsat from this checkout (also without the package installed)."""
    return common.import_package()


def neptune_api(case):
    api = import_package().flex_attention
    offset = case.k.shape[2] - case.q.shape[2]
    if offset:   # decode: a captured position, so that one kernel serves every KV length
        offset = torch.tensor(offset, device=case.device)
    mod, mask = api_callables(case.op, case.slopes, offset)
    q, k, v, gqa = case.q, case.k, case.v, case.q.shape[1] != case.k.shape[1]
    return lambda: api(q, k, v, score_mod=mod, mask_mod=mask, enable_gqa=gqa)


def flex(case):
    from torch.nn.attention.flex_attention import flex_attention
    mod, block_mask, gqa = flex_args(case)
    compiled, q, k, v = torch.compile(flex_attention, dynamic=False), case.q, case.k, case.v
    return lambda: compiled(q, k, v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa)


def inductor(case):
    compiled = torch.compile(functools.partial(attention_math, case.op), dynamic=False)
    q, k, v, slopes = case.q, case.k, case.v, case.slopes
    return lambda: compiled(q, k, v, slopes)


def eager(case):
    op, q, k, v, slopes = case.op, case.q, case.k, case.v, case.slopes
    return lambda: attention_math(op, q, k, v, slopes)


def sdpa(backend, case):
    if case.op.mod is not None or case.op.mask not in (None, "causal"):
        return None
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend)
    q, k, v = case.q, case.k, case.v
    causal = case.op.mask == "causal" and q.shape[2] == k.shape[2]   # a decode row sees every key anyway
    gqa = q.shape[1] != k.shape[1]

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return call


def fa4(case):
    """FlashAttention-4 (flash-attn-4, CuTe DSL; on Hopper its forward is FlashAttention-3's algorithm): causal
    (aligned to the last key, as ours), sliding windows and soft-capping, grouped-query heads; no ALiBi. It
    takes [B, S, H, D]: the inputs are laid out so once, outside the timed call, and its output is viewed back."""
    if case.op.mod == "alibi":
        return None
    from bench.suite.attention_ops import CAP, WINDOW
    from flash_attn.cute import flash_attn_func
    q, k, v = (x.transpose(1, 2).contiguous() for x in (case.q, case.k, case.v))
    causal = case.op.mask in ("causal", "window") and q.shape[1] > 1   # a decode row sees every key anyway
    window = (WINDOW - 1, 0) if case.op.mask == "window" else (None, None)
    softcap = CAP if case.op.mod == "softcap" else 0.0

    def call():
        out = flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return call


BUILDERS = {
    "neptune": neptune, "neptune_api": neptune_api, "flex": flex, "inductor": inductor, "eager": eager,
    "sdpa_cudnn": functools.partial(sdpa, "CUDNN_ATTENTION"),
    "sdpa_flash": functools.partial(sdpa, "FLASH_ATTENTION"),
    "sdpa_mem_eff": functools.partial(sdpa, "EFFICIENT_ATTENTION"),
    "fa4": fa4,
}


# ---------------------------------------------------------------- the decode shapes' ceilings

COPY_ROW = "same_bytes_copy"   # not a system: the copy ceiling of a decode shape, timed like the systems
READ_ROW = "same_bytes_read"   # not a system: reading the shape's K and V alone, timed like the systems


def same_bytes_copy(nbytes):
    """A device-to-device copy moving the decode shape's bytes (half read, half written), for the same timer:
    the ceiling at this size, where the timer's cache flush before every call weighs as much as on the op."""
    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float16).normal_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


@functools.cache
def _read_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read(k_ptr, v_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        total = tl.load(k_ptr + offs, mask=keep, other=0.0, eviction_policy="evict_first").to(tl.float32)
        total += tl.load(v_ptr + offs, mask=keep, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + tl.program_id(0), tl.sum(total))
    return read


def read_only(k, v, block=8192, num_warps=4):
    """A kernel that reads K and V once (16 KB blocks per program, read-once hint) and writes a sum per block:
    what reading the decode shape's bytes alone reaches under the same timer (copies write half their bytes, and
    writes can still sit in the cache when the timer stops, so a copy can beat a pure read of its size)."""
    programs = -(-k.numel() // block)
    sums = torch.empty(programs, device=k.device)
    return lambda: _read_kernel()[(programs,)](k, v, sums, k.numel(), BLOCK=block, num_warps=num_warps)
