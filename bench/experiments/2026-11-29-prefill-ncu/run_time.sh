source bench/experiments/2026-11-29-prefill-ncu/setup.sh
# the variants of the change one by one (EVEN, then sharing, then predicated selects), after the modules before
NAME=time OPS=${OPS:-gqa_pf,causal_pf,global_pf} VARIANTS="${VARIANTS:-now=$G/now;even=$G/even;share=$G/share;asm=$G/asm}" \
  bash bench/experiments/2026-11-29-prefill-ncu/run_fa4.sh
