#!/usr/bin/env bash
# The CTest gpu_bundle (tests/bundle/bundle.cmake says what and why).
# Usage: run.sh SOURCE_DIR WORK_DIR
set -u
src=$1 work=$2
mkdir -p "$work"
work=$(cd "$work" && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
t0=$(date +%s)

# The tools the GPU machine's image has that a run may use (docs/cuda.md);
# flex, bison, pkg-config, LLVM, Check and a package registry it lacks, and
# the run must not need CMake, a compiler or git either.
gpu_tools="bash sh env true date timeout dirname basename mktemp touch sha256sum cat cut sort uniq head tail wc tr tee mkdir rm cp mv ls find xargs nproc grep sed awk ldd python3 nvidia-smi compute-sanitizer cuda-gdb"
absent="flex bison pkg-config llvm-config cmake ninja make cc gcc c++ g++ clang nvcc git"

# 1. The bundle: one line's kernels in its cache (the full fill is
# scripts/gpu_bundle.sh's job), or none where this machine has no NVRTC.
nvrtc=yes
ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1 || ldconfig -p 2>/dev/null | grep -q libnvrtc || nvrtc=no
fillopt="--fill-only memcheck"
[ $nvrtc = yes ] || { fillopt=--no-fill; echo "no NVRTC here: the bundle gets no kernel cache"; }
# shellcheck disable=SC2086
"$src/scripts/gpu_bundle.sh" --out "$work/bundle" --tree "$work/tree" $fillopt --jobs 2 >"$work/bundle.log" 2>&1
rc=$?
cat "$work/bundle.log"
[ $rc -eq 0 ] || { fail "scripts/gpu_bundle.sh exited $rc"; exit 1; }
b=$work/bundle

# 2. Its size, and every program's and library's closure: the C runtime
# alone, and glibc symbols no newer than 2.34 (Ubuntu 22.04 has 2.35).
size=$(du -sb "$b" | cut -f1)
[ "$size" -lt $((64 * 1024 * 1024)) ] && ok "size $size bytes, under 64 MiB" || fail "size $size bytes"
for f in "$b"/bin/* "$b"/lib/*; do
  extra=$(ldd "$f" 2>&1 | grep -v -E '^\s*(linux-vdso\.so|/lib64/ld-linux|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so\.[0-9]+ =>)')
  [ -z "$extra" ] || fail "${f#"$b"/} needs: $extra"
  if command -v objdump >/dev/null; then
    newest=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    [ "$(printf '%s\nGLIBC_2.34\n' "$newest" | sort -V | tail -1)" = GLIBC_2.34 ] ||
      fail "${f#"$b"/} needs $newest (newer than 2.34)"
  fi
done
ok "ldd closure of $(ls "$b"/bin "$b"/lib | wc -l) programs and libraries checked"
grep -rlF "$src" "$b" >/dev/null && fail "the bundle names $src: $(grep -rlF "$src" "$b" | head -3)"

# 3. The checkout (what the device tool carries: tracked and untracked files
# git does not ignore) and the bundle, copied where no ../shared is.
scratch=$work/scratch
rm -rf "$scratch"
mkdir -p "$scratch/checkout" "$scratch/tools"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$scratch/checkout")
else
  (cd "$src" && tar cf - --exclude='./build*' .) | (cd "$scratch/checkout" && tar xf -)
fi
cp -r "$b" "$scratch/checkout/build-gpu"
[ ! -e "$scratch/shared" ] || fail "$scratch/shared exists"
# A PATH of the GPU machine's tools that this machine has, and nothing else.
# (python3 as the interpreter itself: a version manager's shim needs more)
for t in $gpu_tools; do
  p=$(type -P "$t") || continue
  [ "$t" = python3 ] && p=$(python3 -c 'import sys; print(sys.executable)')
  ln -s "$p" "$scratch/tools/$t"
done
for t in $absent; do [ ! -e "$scratch/tools/$t" ] || fail "$t is on the scratch PATH"; done
# run_gpu.sh declares every tool it uses; each must be one the GPU machine has.
declared=$(sed -n 's/^tools="\(.*\)"$/\1/p' "$src/bench/run_gpu.sh")
[ -n "$declared" ] || fail "bench/run_gpu.sh declares no tools"
for t in $declared; do
  case " $gpu_tools " in *" $t "*) ;; *) fail "bench/run_gpu.sh needs $t, which the GPU machine may not have" ;; esac
done
clean_env=(env -i PATH="$scratch/tools" HOME="$scratch" TMPDIR="${TMPDIR:-/tmp}" LANG=C)

# 4. The run: every pre-flight step passes, then exit 77 at stage 1.
(cd "$scratch/checkout" && "${clean_env[@]}" bash bench/run_gpu.sh --bundle build-gpu --out results) \
  >"$work/run.log" 2>&1
rc=$?
cat "$work/run.log"
[ $rc -eq 77 ] && ok "run_gpu.sh exits 77 without a device" || fail "run_gpu.sh exited $rc, not 77"
steps=$(grep -c '^preflight: ok: ' "$work/run.log")
[ "$steps" -eq 8 ] && ok "8 pre-flight steps passed" || fail "$steps of 8 pre-flight steps passed"
grep -q 'no CUDA device' "$scratch/checkout/results/1-env.txt" 2>/dev/null || fail "1-env.txt does not say 'no CUDA device'"
# (the driver's own "No such file" on the device= line is the expected one)
grep -v '^device=' "$work/run.log" | grep -q 'command not found\|No such file\|FAILED\|warning' &&
  fail "the run reported a problem (above)"

# 5. The dry run: every stage's own work (commands printed, not run).
(cd "$scratch/checkout" && "${clean_env[@]}" bash bench/run_gpu.sh --bundle build-gpu --out dry --dry-run) \
  >"$work/dry.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "the dry run went through every stage" || { cat "$work/dry.log"; fail "the dry run exited $rc"; }
for f in 1-env.txt 2-correctness.log 3-table.md 4-sweep.md summary.md; do
  [ -s "$scratch/checkout/dry/$f" ] || fail "the dry run wrote no $f"
done
grep -rq 'command not found\|No such file' "$work/dry.log" "$scratch/checkout/dry" &&
  fail "the dry run needed something missing: $(grep -rh 'command not found\|No such file' "$work/dry.log" "$scratch/checkout/dry" | head -3)"

# 6. The moved bundle's cache serves its programs: the memcheck line's case
# over the stand-in driver (as an H100) finds both its kernels.
if [ $nvrtc = yes ]; then
  bb=$scratch/checkout/build-gpu
  rm -f "$work/moved.log"
  [ -d "$bb/cache" ] || fail "the run's pre-flight did not unpack the moved bundle's cache"
  (cd "$bb" && FLEXC_LIBCUDA="$bb/lib/mockcuda.so" MOCKCUDA_CC=9.0 MOCKCUDA_SMS=132 FLEXC_CACHE_DIR=cache \
    FLEXC_CACHE_LOG="$work/moved.log" bin/check_emu_kernels --cuda --one) >"$work/moved.out" 2>&1
  hits=$(grep -c '^disk-hit ' "$work/moved.log" 2>/dev/null) misses=$(grep -c '^miss ' "$work/moved.log" 2>/dev/null)
  [ "${hits:-0}" -ge 2 ] && [ "${misses:-0}" -eq 0 ] && ok "the moved cache served ${hits} kernels, 0 misses" ||
    fail "the moved cache: ${hits:-0} hits, ${misses:-0} misses: $(head -3 "$work/moved.log" 2>/dev/null)"
fi

echo "gpu_bundle test: $fails failures, $(( $(date +%s) - t0 )) s"
[ $fails -eq 0 ]
