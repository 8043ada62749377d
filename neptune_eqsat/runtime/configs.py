"""The run-time choice of a config, shared by the generated modules (which carry a copy of this file), the
planner's cost model and the tuning database: the shape bucket that keys measured configs, the chunk count of
a split plan, and the tunables only the warp-specialized Gluon kernel reads. Imports nothing."""

# ---- copied into every generated module from here on
GLUON_KEYS = ("WS_BLOCK_J", "WS_STAGES", "WS_PERSISTENT", "WS_ORDER", "WS_SPLIT", "WS_OUT_BUF")   # tunables of the warp-specialized Gluon kernel alone


def bucket(sizes):
    """The shape bucket of a call: each size rounded up to a power of two."""
    return ",".join(f"{k}={1 << max(0, (int(v) - 1).bit_length())}" for k, v in sorted(sizes.items()))


def split_count(programs, blocks, slots):
    """Chunks to split a loop of `blocks` key blocks into, when `programs` programs run it and the device runs
    `slots` programs at a time: the count minimizing waves x (blocks per chunk + one block of overhead for
    the chunk's start and its partial results)."""
    best, best_time = 1, None
    for chunks in range(1, max(1, min(blocks, 4 * slots)) + 1):
        waves = -(-programs * chunks // slots)
        time = waves * (-(-blocks // chunks) + 1)
        if best_time is None or time < best_time:
            best, best_time = chunks, time
    return best
