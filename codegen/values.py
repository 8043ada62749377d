"""What a kernel writer's values are: a Triton expression over tile axes (`Val`), the block and states an
expression is emitted under (`Context`), and the Triton spellings of the registry's ops, dtypes and identities."""
from __future__ import annotations

from dataclasses import dataclass, field

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term

DTYPE_NAMES = {**ir.TORCH_NAMES, "bool": "int1"}   # Triton's names are torch's but for its truth values


def _in_gluon(template: str) -> str:
    """A Triton lowering in Gluon's namespace (the same functions, math's among them, under gl)."""
    return template.replace("tl.math.", "gl.").replace("tl.", "gl.")


# each target's lowering of every op of the registry: Gluon takes an op's own where the registry gives one
OP_CODE = {
    "tl": {kind: {name: op.triton for name, op in table.items()} for kind, table in ops.OPS.items()},
    "gl": {kind: {name: op.gluon if op.gluon not in (None, ops.NO_GLUON) else _in_gluon(op.triton)
                  for name, op in table.items()} for kind, table in ops.OPS.items()},
}


def dtype_code(lang: str, dtype: str) -> str:
    """A spec dtype in the target's language: dtype_code("tl", "bf16") is tl.bfloat16."""
    return f"{lang}.{DTYPE_NAMES[dtype]}"


# An fp32 tile rounded to 16 bits two elements at a time (cvt.rn.f16x2.f32, cvt.rn.bf16x2.f32), for a rounded
# tile read again in fp32 (a factor of a product the spec rounds, as a gradient's tanh factor). Triton converts
# such a tile element by element: ptxas makes a lone fp32 -> bf16 conversion an F2F, a quarter-rate
# instruction, and with either dtype the packed pairs are formed late, after the fp32 values were held. Packed at
# once, the soft-capped and windowed gradient kernels' spilled stack fell from 400 / 464 bytes to 280 / 200 in
# bf16, from 328 to 176 bytes (windowed) in fp16 (sm_90). A tile only multiplied or stored in 16 bits keeps
# Triton's conversion, which packs it already.
PACKED = {"f16": ("f16x2", "float16"), "bf16": ("bf16x2", "bfloat16")}
PACKED_SOURCE = {
    "tl": '''
@triton.jit
def _packed_{dtype}_tl(x):
    if PACKED_CONVERSIONS and tl.target_info.cuda_capability_geq(8):   # the GPU the kernel compiles for
        return tl.inline_asm_elementwise("cvt.rn.{ptx}.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.{name},
                                         is_pure=True, pack=2)
    else:   # Triton's interpreter runs no PTX, a GPU before sm_80 (or not NVIDIA's) not this
        return x.to(tl.{name})
''',
    "gl": '''
@gluon.jit
def _packed_{dtype}_gl(x):
    return gl.inline_asm_elementwise("cvt.rn.{ptx}.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.{name},
                                     is_pure=True, pack=2)
''',
}


# The packed conversions are PTX of sm_80 on: a Triton kernel, which may run on any GPU, takes them when it is
# compiled for an NVIDIA GPU of compute capability 8 or more (Triton's target when it compiles, so that no
# import asks torch for the GPUs' capability, which would initialize CUDA in the importing process: a process
# that forks workers after importing a module could then use CUDA in none of them). The Gluon kernels run on
# Hopper alone.
PACKED_FLAG = '''

PACKED_CONVERSIONS = tl.constexpr(not _INTERPRETED)
'''


def packed_cast(lang: str, code: str, source: str, axes: tuple, dtype: str) -> str | None:
    """A 2-d fp32 tile (`code`) rounded to 16-bit `dtype` through PACKED, else None (a smaller tile may hold one
    element a thread, which the packed conversion cannot take alone)."""
    if dtype in PACKED and source == "f32" and len(axes) == 2:
        return f"_packed_{dtype}_{lang}({code})"
    return None


def packed_helpers(kernels: str) -> str:
    """The PACKED helpers the kernels' source calls, and the flag the Triton ones read."""
    found = [(dtype, lang) for dtype in PACKED for lang in PACKED_SOURCE if f"_packed_{dtype}_{lang}(" in kernels]
    src = "".join(PACKED_SOURCE[lang].format(dtype=dtype, ptx=PACKED[dtype][0], name=PACKED[dtype][1])
                  for dtype, lang in found)
    flag = PACKED_FLAG if any(lang == "tl" for _, lang in found) else ""
    return src + flag


def value_dtype(spec_dtype: str) -> str:
    """The dtype of a value read from an input of `spec_dtype`: integers of any width are "int" (read exactly as
    stored, like positions), truth values "bool", floats their own."""
    return "bool" if spec_dtype == "bool" else "int" if spec_dtype in ir.INT_DTYPES else spec_dtype


BIT_OPS = ops.named("bin", bitwise=True)
IDENTITY_CODE = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}


@dataclass
class Val:
    code: str
    axes: tuple[str, ...]   # tile axes, canonical order
    dtype: str              # f16, bf16, f32, int, bool


@dataclass
class Context:
    body: str                          # block for values that vary per block or read running states
    pre: str                           # block for values that only read finished reductions
    complete: set = field(default_factory=set)
    running: set = field(default_factory=set)
    masked: bool = True
    acc: Val | None = None


def nonnegative(t: Term) -> bool:
    """Is t never negative (positions, sizes and what sums, products and quotients of them give)?"""
    if t.op in ("axis", "dim"):
        return True
    if t.op == "const":
        return t.attrs[0] >= 0
    if t.op == "cast":
        return nonnegative(t.args[0])
    if t.op == "bin" and ops.BIN[t.attrs[0]].keeps_nonnegative:
        return all(nonnegative(a) for a in t.args)
    if t.op == "where":
        return nonnegative(t.args[1]) and nonnegative(t.args[2])
    return False


def rounded_to(t: Term, dtype: str) -> bool:
    """Is t a product whose every factor is a cast to `dtype` (under a mask selecting it or a zero)?"""
    if t.op == "bin" and t.attrs[0] == "mul":
        return all(rounded_to(a, dtype) for a in t.args)
    if t.op == "where" and t.args[2] == ir.const(0.0):
        return rounded_to(t.args[1], dtype)
    return t.op == "cast" and t.attrs[0] == dtype


def pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())
