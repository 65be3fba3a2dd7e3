#!/usr/bin/env bash
# Sets everything up and runs the main job: compile a sample .score file,
# show what flexc makes of it, and run its kernels forward and backward on
# the best backend available (the GPU when there is one, else the CPU
# backend, else the emulator, which runs the generated CUDA on the CPU),
# checked against the float64 reference.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
sample=samples/gemma2.score

echo "== flexc check $sample"
build/flexc check "$sample" && echo "ok"
echo
echo "== flexc ir --grad $sample   (score, mask and the joint backward function)"
build/flexc ir --grad "$sample"
echo
echo "== flexc mask $sample --shape 1,1,8192,8192 --param window=1024   (block sparsity, 128x128 blocks)"
build/flexc mask "$sample" --shape 1,1,8192,8192 --param window=1024
echo
in=build/demo-inputs
mkdir -p "$in"
build/randn "$in/q.npy" 1,4,256,64
build/randn "$in/k.npy" 1,2,256,64
build/randn "$in/v.npy" 1,2,256,64
build/randn "$in/dout.npy" 1,4,256,64
build/randn "$in/slopes.npy" 4 0.1
echo "== flexc run $sample --backend reference   (float64, forward and backward; B=1 H=4 HKV=2 L=S=256 E=64)"
build/flexc run "$sample" --q "$in/q.npy" --k "$in/k.npy" --v "$in/v.npy" --dout "$in/dout.npy" \
  --buffer slopes="$in/slopes.npy" --param window=64 --backend reference --out "$in/out"
ls "$in/out"
echo
echo "== embed $sample   (fp16 forward + backward on the best backend vs the float64 reference)"
build/embed --backend auto --dtype fp16 "$sample"
