"""The order in which a warp-specialized Gluon kernel's programs run their tiles: which tile a loop slot is,
and which slots a program runs."""


def tile_lines(row_blocks: str, grid_tiles: str, tiles: str, ordered: bool) -> list[str]:
    """Lines giving the tile (pid_row, pid_grid) that a program runs in its loop slot `slot`.

    Without a mask that makes later row blocks longer, tiles go one grid index after another (the blocks of one
    index share their loop-axis operands in cache). With one (`ordered`: a causal mask), the longest row blocks
    run first, so the last wave is short: ORDER 1 takes the grid indices one after another, each longest first;
    ORDER 2 takes the longest row block of every grid index first, and persistent programs run alternate rounds
    backwards, so that each program's tiles add up to about the same work (program p of P runs tiles p,
    2P - 1 - p, 2P + p, ...; a last round that does not fill every program runs forwards); ORDER 3 takes GROUP
    grid indices at a time (the launcher's _group_size: those one wave's row blocks cover), longest first across
    the group, so a wave reads the loop operands of a few grid indices, which stay in the L2 cache. ORDER 4 is
    ORDER 3 run by persistent programs (the launcher passes it): slot k is position tile_plan[programs + 1 + k]
    of that order (slot_loop)."""
    if not ordered:
        return ["tile = slot", f"pid_row = tile % {row_blocks}", f"pid_grid = tile // {row_blocks}"]
    return ["tile = slot",
            "if ORDER == 4:",
            "    tile = gl.load(tile_plan_ptr + gl.num_programs(0) + 1 + slot)",
            "if ORDER >= 3:",
            f"    first = tile // ({row_blocks} * GROUP) * GROUP   # the group's first grid index",
            f"    members = gl.minimum(GROUP, {grid_tiles} - first)",
            f"    pid_row = {row_blocks} - 1 - (tile - first * {row_blocks}) // members",
            f"    pid_grid = first + (tile - first * {row_blocks}) % members",
            "elif ORDER == 2:",
            "    rnd = slot // gl.num_programs(0)",
            f"    if rnd % 2 == 1 and (rnd + 1) * gl.num_programs(0) <= {tiles}:",
            "        tile = (2 * rnd + 1) * gl.num_programs(0) - 1 - slot",
            f"    pid_row = {row_blocks} - 1 - tile // ({grid_tiles})",
            f"    pid_grid = tile % ({grid_tiles})",
            "else:",
            f"    pid_row = {row_blocks} - 1 - tile % {row_blocks}",
            f"    pid_grid = tile // {row_blocks}"]


def slot_loop(tiles: str, ordered: bool) -> list[str]:
    """The loop over the slots a program runs: p, p + programs, ... below the tile count; under ORDER 4 (ORDER 3
    with fewer programs than tiles) those the launcher planned for it (runtime/launch.py _tile_plan: slots
    tile_plan[p] .. tile_plan[p + 1] - 1, given out as a GPU that starts a program on each free multiprocessor
    would, so persistent programs are as balanced as a program per tile and still load a tile's first blocks
    while the last one finishes)."""
    loop = f"for slot in range(gl.program_id(0), {tiles}, gl.num_programs(0)):"
    if not ordered:
        return [loop]
    return ["slot_lo = gl.program_id(0)", f"slot_hi = {tiles}", "slot_step = gl.num_programs(0)",
            "if ORDER == 4:", "    slot_lo = gl.load(tile_plan_ptr + gl.program_id(0))",
            "    slot_hi = gl.load(tile_plan_ptr + gl.program_id(0) + 1)", "    slot_step = 1",
            "for slot in range(slot_lo, slot_hi, slot_step):"]
