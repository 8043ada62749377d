import sys, importlib.util, torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "bench")
from sweep_configs import HEADS, load
from pathlib import Path

def t(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")

for S in (32768, 4096):
    for op in ("gqa_dc", "softcap_dc", "causal_dc"):
        hq, hkv = HEADS[op]
        q = torch.randn(1, hq, 1, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(1, hkv, S, 128, device="cuda", dtype=torch.float16); v = torch.randn_like(k)
        gb = (2 * q.numel() + 2 * k.numel()) * 2 / 1e9
        base, ef = load(Path(f"bench/generated/{op}.py")), load(Path(f"bench/generated/{op}_ef.py"))
        ref = base.forward(q, k, v)
        assert torch.allclose(ef.forward(q, k, v, config={"USE_TMA": 0}), ref, atol=1e-2), op
        row = {}
        for rnd in range(2):
            for name, fn in [("base_tma0", lambda: base.forward(q, k, v, config={"USE_TMA": 0})),
                             ("base_tma1", lambda: base.forward(q, k, v, config={"USE_TMA": 1})),
                             ("evict_first", lambda: ef.forward(q, k, v, config={"USE_TMA": 0})),
                             ("evict_first_c17", lambda: ef.forward(q, k, v, config={"USE_TMA": 0, "CHUNKS": 17})),
                             ("evict_first_bj64", lambda: ef.forward(q, k, v, config={"USE_TMA": 0, "BLOCK_J": 64, "num_stages": 3}))]:
                row.setdefault(name, []).append(gb / t(fn) * 1e3)
            if op != "softcap_dc":
                def cud():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
                row.setdefault("cudnn", []).append(gb / t(cud) * 1e3)
        print(f"{op} KV={S}: " + "  ".join(f"{n} {'/'.join(f'{x:.0f}' for x in xs)}" for n, xs in row.items()), flush=True)
