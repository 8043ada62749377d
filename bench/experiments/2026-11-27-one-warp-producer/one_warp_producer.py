"""Does the warp-specialized Gluon kernel gain from a producer of one warp instead of a warpgroup?

The generated kernels start their producer as the default partition, so it runs in the kernel's 4 warps: one
warp of it on every scheduler of the SM, beside one warp of each consumer, each executing the producer's loop
(waits on the ring's barriers, the copies' bookkeeping). FlashAttention-3/4 keep one producer warp (their SM90
forward's other three exit), 2.25 warps a scheduler. This edit makes consumer 0 the default partition and the
producer a worker of one warp with 24 registers (Triton pads a warpgroup of workers with idle warps, so the
register split stays 240 / 240 / 24):

    PYTHONPATH=. python bench/experiments/2026-11-27-one-warp-producer/one_warp_producer.py MODULE... OUT_DIR

writes OUT_DIR/<module name> for each module, forward or backward (a backward module holds its kernel modules
as source strings: the same edit applies inside them). Imports only the standard library.
"""
import re
import sys
from pathlib import Path

# the warp_specialize call as the generator writes it, with real newlines or, inside a source string, "\n"
CALL = re.compile(r"gl\.warp_specialize\(\[(?P<nl>\n|\\n)(?P<ind> +)\((?P<prod>\w+_producer, \(.*?\))\),(?P=nl)"
                  r"(?P=ind)\((?P<c0>\w+_consumer, \(.*?gl\.constexpr\(0\)\))\),(?P=nl)"
                  r"(?P=ind)\((?P<c1>\w+_consumer, \(.*?gl\.constexpr\(1\)\))\),(?P=nl)"
                  r"(?P<end> *)\], \[4, 4\], \[240, 240\]\)")


def edit(text: str) -> str:
    def one_warp(m):
        nl, ind = m["nl"], m["ind"]
        return (f"gl.warp_specialize([{nl}{ind}({m['c0']}),{nl}{ind}({m['c1']}),{nl}{ind}({m['prod']}),{nl}"
                f"{m['end']}], [4, 1], [240, 24])")
    text, n = CALL.subn(one_warp, text)
    assert n, "no warp-specialized call of the generated form"
    return text


if __name__ == "__main__":
    *modules, out = sys.argv[1:]
    Path(out).mkdir(parents=True, exist_ok=True)
    for path in map(Path, modules):
        (Path(out) / path.name).write_text(edit(path.read_text()))
        print(path.name)
