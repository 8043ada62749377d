# sourced by the run scripts: the output folder, FlashAttention-4's wheels installed (from .fa4/p1 and the
# parts of the largest wheel copied into WHEELS before), the GPU's name, the environment
OUT=${OUT:-out}; WHEELS=${WHEELS:-wheels}; mkdir -p $OUT $WHEELS
cp .fa4/p1/* $WHEELS/ && cat $WHEELS/cu13.part.aa $WHEELS/cu13.part.ab $WHEELS/cu13.part.ac \
  > $WHEELS/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm $WHEELS/cu13.part.*
python3 -m pip install -q --no-deps --no-index $WHEELS/*.whl 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
export PYTHONPATH=. NEPTUNE_EQSAT_COMPILE_AHEAD=0
G=bench/generated
