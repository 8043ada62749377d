source bench/experiments/2026-11-29-prefill-ncu/setup.sh
set -x
for sys in neptune fa4; do for op in global_pf gqa_pf; do
  timeout 200 ncu --profile-from-start off --set full --launch-count 3 python3 bench/experiments/2026-11-29-prefill-ncu/one_call.py --system $sys --op $op --seq 4096 > $OUT/ncu_${sys}_${op}_4k.txt 2>&1
  tail -3 $OUT/ncu_${sys}_${op}_4k.txt
done; done
