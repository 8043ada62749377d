OUT=${OUT:-out}; mkdir -p $OUT ${WHEELS:-wheels}
set -x
cp .fa4/p1/* ${WHEELS:-wheels}/ && cat ${WHEELS:-wheels}/cu13.part.aa ${WHEELS:-wheels}/cu13.part.ab ${WHEELS:-wheels}/cu13.part.ac > ${WHEELS:-wheels}/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm ${WHEELS:-wheels}/cu13.part.*
python3 -m pip install -q --no-deps --no-index ${WHEELS:-wheels}/*.whl 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
export PYTHONPATH=.
for sys in neptune fa4; do for op in global_pf gqa_pf; do
  timeout 200 ncu --profile-from-start off --set full --launch-count 3 python3 bench/experiments/2026-11-29-prefill-ncu/one_call.py --system $sys --op $op --seq 4096 > $OUT/ncu_${sys}_${op}_4k.txt 2>&1
  tail -3 $OUT/ncu_${sys}_${op}_4k.txt
done; done
