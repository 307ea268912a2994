#pragma once
// skim's CUDA umbrella: include this (not skim/skim.hpp) from .cu files, and link skim::cuda.
//
// It brings in every host header (skim/skim.hpp) and, as they arrive, the CUDA executors and
// the GPU summarize/score/select kernels, which live in include/skim/exec/cuda/ (one header
// per policy and architecture, sm80 and sm90). Needs nvcc (CUDA C++20); the host header
// self-check does not compile this file.

#if !defined(__CUDACC__)
#error "skim/cuda.cuh needs a CUDA compiler; host code includes skim/skim.hpp"
#endif

#include "skim/skim.hpp"
