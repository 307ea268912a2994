#pragma once
// skim's CUDA umbrella: include this (not skim/skim.hpp) from .cu files, and link skim::cuda.
//
// It brings in every host header (skim/skim.hpp) and the CUDA policies under
// include/skim/exec/cuda/: the device-side problem and sources (common.cuh), the device indices
// (index.cuh: stored tables and CSR, sink, sliding window, causal_all and unions), and, one header
// per policy, the decode and prefill executors and the GPU summarize/score/select kernels.
// Needs nvcc (CUDA C++20); the host header self-check does not compile this file.

#if !defined(__CUDACC__)
#error "skim/cuda.cuh needs a CUDA compiler; host code includes skim/skim.hpp"
#endif

#include "skim/skim.hpp"
#include "skim/exec/cuda/common.cuh"
#include "skim/exec/cuda/index.cuh"
#include "skim/exec/cuda/ptx.cuh"
#include "skim/exec/cuda/summarize.cuh"
#include "skim/exec/cuda/summarize_centroids.cuh"
#include "skim/exec/cuda/route.cuh"
#include "skim/exec/cuda/prefill.cuh"
#include "skim/exec/cuda/decode.cuh"
