"""A split plan's two halves as entry points of its module, for a reduction split across processes
(`neptune_eqsat/distributed.py`: the chunks of the split axis held by several ranks).

    forward_partials(*inputs)           the partial-results kernel alone: each split reduction's partials, the
                                        chunk axis first (PARTIALS names them and their reducers)
    combine(*inputs, partials=, sizes=) the combine kernel over partials gathered from anywhere, with the sizes
                                        of the whole split axis (a mean divides by the whole count)

A chunk that holds nothing (an empty shard, a padded one) carries each reducer's identity, which the derived
repairs keep (proved with each split rule), so adding such chunks changes nothing.
"""
from __future__ import annotations

from neptune_eqsat.plan.combine import Combine

IDENTITY = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}


def entry_points(launch: list[str], combine_launch: list[str], comb: Combine, out_alloc: str) -> str:
    """Source of PARTIALS, forward_partials and combine (module.py fills in @ARGS@, @DIMS@ and @SIZES@). `launch` is
    forward's launch code without the combine's launch, `combine_launch` the combine kernel's launch."""
    names = [p.name for p in comb.partials]
    table = tuple((p.name, p.reduction.attrs[0]) for p in comb.partials)
    # the partial results only: no combine inside the kernel
    own = [x if "in_kernel = combine_cfg.pop(" not in x else "    combine_cfg.pop('in_kernel', None)\n    in_kernel = 0"
           for x in launch]
    parts = ", ".join(names)
    return "\n".join([
        "",
        "",
        "# A split reduction's partial results (the workspaces forward_partials returns, chunk axis first) and the",
        "# value of a chunk that holds nothing (the reducer's identity)",
        f"PARTIALS = {tuple((n, r, IDENTITY[r]) for n, r in table)!r}",
        "",
        "",
        "def forward_partials(@ARGS@, *, config=None):",
        f'    """Each split reduction\'s partial results over the chunks of {comb.chunk_axis[:-len("_chunk")]}, '
        f'as ({parts},): what combine() reduces."""',
        "    sizes, device, cfg, rec = _setup(INPUTS, CONFIG, INTERPRETER_CONFIG, TUNED, TUNED_FOR, (@ARGS@,), config)",
        "    rec = None",
        "@DIMS@",
        *own,
        f"    return ({parts},)",
        "",
        "",
        "def combine(@ARGS@, *, partials, sizes=None, config=None):",
        '    """The output from partial results gathered along the chunk axis (from several forward_partials calls,',
        "    on several ranks); `sizes` gives run-time sizes of the whole problem where they differ from the inputs'",
        '    (the length of the split axis)."""',
        "    bound, device, cfg, rec = _setup(INPUTS, CONFIG, INTERPRETER_CONFIG, TUNED, TUNED_FOR, (@ARGS@,), config)",
        "    rec = None",
        "    sizes = {**bound, **(sizes or {})}",
        "@SIZES@",   # (no index guards: the combine reads partial results, not the inputs at computed indices)
        f"    {parts}, = partials",
        f"    {comb.chunk_dim} = {names[0]}.shape[0]",
        out_alloc,
        "    combine_cfg = dict(cfg['COMBINE'])",
        "    combine_cfg.pop('in_kernel', None)",
        *combine_launch,
        "    return out",
        "",
    ])
