#!/bin/sh
# An nvcc that says it is CUDA 12.4 (older than nodal's minimum): packaging.cuda_minimum configures
# with it and expects configure to stop, naming the minimum.
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release 12.4, V12.4.131"
