#!/usr/bin/env bash
# scripts/gpu-check.sh where no GPU check can run (CI, this machine): it stops at once with one
# line saying why and exit 3, for each reason, with fakes of nvidia-smi and nvcc standing in for
# the driver and the toolkit; and its step machinery (summary, a failing step stops the rest)
# with a fake GPU. Prints "N passed, M failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../../scripts/gpu-check.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# fake_smi NAME EXIT LINE: an nvidia-smi that answers --query-gpu with LINE (none when empty).
fake_smi() {
  cat > "$work/$1" <<FAKE
#!/bin/sh
case "\$*" in
  *--query-gpu=memory.used*) echo "0 MiB" ;;
  *--query-gpu=*) [ -n "$3" ] && echo "$3" ;;
  *) echo "fake nvidia-smi" ;;
esac
[ $2 -eq 0 ] || echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
exit $2
FAKE
  chmod +x "$work/$1"
}
cat > "$work/nvcc" <<'FAKE'
#!/bin/sh
echo "Cuda compilation tools, release 13.0, V13.0.88"
FAKE
chmod +x "$work/nvcc"

# check NAME EXPECTED_EXIT EXPECTED_OUTPUT_REGEX ENV... -- ARGS...
check() {
  local name=$1 want_rc=$2 want=$3
  shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local start=$SECONDS
  local output
  output=$(env "${envs[@]}" bash "$script" "$@" 2>&1)
  local rc=$? took=$((SECONDS - start))
  if [ $rc -eq "$want_rc" ] && echo "$output" | grep -qE -- "$want" && [ $took -le 20 ]; then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAIL: $name: exit $rc (want $want_rc), ${took}s, output:"
    echo "$output" | sed 's/^/    /'
  fi
}

fake_smi smi-broken 9 ""
fake_smi smi-none 0 ""
fake_smi smi-old 0 "0, NVIDIA H100 80GB HBM3, 550.54.15, Default"
fake_smi smi-new 0 "0, NVIDIA H100 80GB HBM3, 580.159.04, Default"

check "no driver: one line, exit 3" 3 '^gpu-check: no NVIDIA driver on this machine \(nvidia-smi not found\): no GPU check can run here$' \
  NVIDIA_SMI="$work/absent" CUDACXX="$work/nvcc" --
check "a broken driver" 3 "^gpu-check: nvidia-smi failed \(NVIDIA-SMI has failed because it couldn't communicate" \
  NVIDIA_SMI="$work/smi-broken" CUDACXX="$work/nvcc" --
check "no GPU listed" 3 '^gpu-check: no GPU: nvidia-smi lists none$' NVIDIA_SMI="$work/smi-none" CUDACXX="$work/nvcc" --
check "a driver too old for the toolkit" 3 \
  '^gpu-check: the NVIDIA driver 550.54.15 is too old for CUDA 13.0 \(.*nvcc\): it needs r580 or newer$' \
  NVIDIA_SMI="$work/smi-old" CUDACXX="$work/nvcc" --
out=$(NVIDIA_SMI="$work/absent" bash "$script" 2>&1)
if [ "$(echo "$out" | wc -l)" -eq 1 ]; then passed=$((passed + 1)); echo "ok: exactly one line"; else
  failed=$((failed + 1)); echo "FAIL: more than one line: $out"; fi
check "--help lists every step" 0 'tests-more +4-8 min' NVIDIA_SMI="$work/absent" -- --help
check "an unknown step" 2 "unknown step 'nope'" NVIDIA_SMI="$work/smi-new" -- nope

export NODAL_GPU_BUILD="$work/build"  # the steps' build and scratch, not the source tree's

# The step machinery on a fake GPU: env passes and is summarised; a build whose configure fails
# stops the steps after it.
mkdir -p "$work/bin"
printf '#!/bin/sh\necho "CMake Error: fake cmake fails"\nexit 1\n' > "$work/bin/cmake"
chmod +x "$work/bin/cmake"
check "env on a fake GPU: summary says passed" 0 '^env +passed ' \
  NVIDIA_SMI="$work/smi-new" CUDACXX="$work/nvcc" OUT="$work/out1" -- env
[ -f "$work/out1/summary.txt" ] && [ -f "$work/out1/env.log" ] && passed=$((passed + 1)) ||
  { failed=$((failed + 1)); echo "FAIL: env left no summary.txt/env.log in OUT"; }
check "a failing build stops the rest" 1 'smoke +not run +- +an earlier step failed' \
  NVIDIA_SMI="$work/smi-new" CUDACXX="$work/nvcc" OUT="$work/out2" PATH="$work/bin:$PATH" -- build smoke
grep -qE '^build +FAILED ' "$work/out2/summary.txt" 2>/dev/null && passed=$((passed + 1)) ||
  { failed=$((failed + 1)); echo "FAIL: summary.txt does not say build FAILED"; cat "$work/out2/summary.txt"; }

# NODAL_GPU_PREBUILT: the build step unpacks a pack (scripts/gpu-pack.sh) instead of building,
# and links the checkout's path of the pack to this checkout. Run from a copy of the script in a
# scratch checkout, so that nothing touches this build.
mkdir -p "$work/repo/scripts" "$work/pack/stage/gpu/launcher" "$work/pack/lib"
cp "$script" "$work/repo/scripts/gpu-check.sh"
printf '#!/bin/sh\nexit 0\n' > "$work/pack/stage/gpu/launcher/nodalrun"
chmod +x "$work/pack/stage/gpu/launcher/nodalrun"
tar -C "$work/pack/stage" -czf "$work/pack/build-gpu.tar.gz" gpu
echo "$work/elsewhere/checkout" > "$work/pack/source-dir"
out=$(env -u NODAL_GPU_BUILD NVIDIA_SMI="$work/smi-new" CUDACXX="$work/nvcc" OUT="$work/out3" NODAL_GPU_PREBUILT="$work/pack" \
  bash "$work/repo/scripts/gpu-check.sh" build 2>&1)
if grep -qE '^build +passed ' "$work/out3/summary.txt" && [ -x "$work/repo/build/gpu/launcher/nodalrun" ] &&
  [ "$(readlink "$work/elsewhere/checkout")" = "$work/repo" ] && grep -q 'prebuilt: ' "$work/out3/summary.txt"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL: NODAL_GPU_PREBUILT did not unpack and link: $out"
  cat "$work/out3/summary.txt" "$work/out3/build.log" 2>/dev/null
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
