OUT=${OUT:-out}; mkdir -p $OUT ${WHEELS:-wheels}
# FlashAttention-4's wheels from .fa4/p1 plus the parts copied before, then the variants timed in turns
cp .fa4/p1/* ${WHEELS:-wheels}/ && cat ${WHEELS:-wheels}/cu13.part.aa ${WHEELS:-wheels}/cu13.part.ab ${WHEELS:-wheels}/cu13.part.ac > ${WHEELS:-wheels}/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm ${WHEELS:-wheels}/cu13.part.*
python3 -m pip install -q --no-deps --no-index ${WHEELS:-wheels}/*.whl 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
export PYTHONPATH=. NEPTUNE_EQSAT_COMPILE_AHEAD=0
G=bench/generated
python3 bench/experiments/2026-11-28-prefill-boundary/ablations.py time --ops ${OPS:-gqa_pf,causal_pf,global_pf} \
  --seqs ${SEQS:-1024,4096,16384} --rounds ${ROUNDS:-5} --systems fa4,sdpa_cudnn \
  --variants "${VARIANTS:-now=$G/now;even=$G/even;share=$G/share;asm=$G/asm}" 2>&1 | grep -v Warning | tee $OUT/time.txt
