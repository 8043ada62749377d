# module variants timed in turns beside FlashAttention-4 and cuDNN (installed by setup.sh in an earlier call)
OUT=${OUT:-out}; mkdir -p $OUT
export PYTHONPATH=. NEPTUNE_EQSAT_COMPILE_AHEAD=0
G=bench/generated
python3 bench/experiments/2026-11-28-prefill-boundary/ablations.py time --ops ${OPS:-gqa_pf,causal_pf,global_pf,window_pf} \
  --seqs ${SEQS:-1024,4096,16384} --rounds ${ROUNDS:-5} --systems fa4,sdpa_cudnn \
  --variants "${VARIANTS:-before=$G/before;after=$G/after}" 2>&1 | grep -v Warning > $OUT/${NAME:-fa4_same_run}.txt
grep " / this" $OUT/${NAME:-fa4_same_run}.txt
