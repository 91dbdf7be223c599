// The reductions of reduce_kernels.cpp with their folds built for AVX2 (x86-64 only;
// collectives/CMakeLists.txt adds it there): GCC vectorises the same loops 8 floats wide instead
// of 4. On 2 ranks, reduce of private buffers at 32-256 KiB 1.12-1.19x the baseline's speed (the
// root's fold is most of the call; bench/results/2026-11-28-linear-reduce.md).
#define NODAL_REDUCE_ISA avx2
#define NODAL_REDUCE_TARGET [[gnu::target("avx2")]]
#include "reduce_kernels.cpp"  // NOLINT(bugprone-suspicious-include): the same folds, another ISA
