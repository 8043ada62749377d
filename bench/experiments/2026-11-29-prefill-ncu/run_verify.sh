source bench/experiments/2026-11-29-prefill-ncu/setup.sh
# the ten operators after the change: checked against float64 (odd lengths and multiples of the blocks), then
# timed against the modules before, in turns
python3 -m bench.tools.check_kernels --specs specs --modules $G/after_pf --shapes "B=2,S=333;B=1,S=1024;B=1,S=4096" 2>&1 | grep -v Warn > $OUT/check_prefill.txt
python3 -m bench.tools.check_kernels --specs specs --modules $G/after_dc --shapes "B=2,SKV=333,Q=1;B=1,SKV=4096,Q=1" 2>&1 | grep -v Warn > $OUT/check_decode.txt
tail -1 $OUT/check_prefill.txt $OUT/check_decode.txt; grep FAIL $OUT/check_*.txt | head
python3 -m bench.tools.compare_modules --before $G/before --after $G/after --ops global_pf,causal_pf,gqa_pf,alibi_pf,softcap_pf,window_pf,causal_dc,gqa_dc,alibi_dc,softcap_dc --seqs 4096 --kv 4096,32768 --rounds 3 2>&1 | grep -v Warn > $OUT/compare_modules.txt
tail -14 $OUT/compare_modules.txt
