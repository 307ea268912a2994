#pragma once
// skim's CUDA umbrella: include this (not skim/skim.hpp) from .cu files, and link skim::cuda.
//
// It brings in every host header (skim/skim.hpp) and the CUDA policies, each beside its CPU stage
// under include/skim/<stage>/cuda/, all in namespace skim::cuda:
//   core/cuda/       the device-side problem, K/V sources, views, the error word; launches
//   index/cuda/      the device indices (stored tables and CSR, sink, sliding window, causal_all, unions)
//   summarize/cuda/  max_bound and multi_centroid summaries: batch build, per-step append
//   route/cuda/      decode_router (score kernel) — select/cuda/: its select kernel
//   exec/cuda/       the decode and prefill executors, and token_decode over a token list
//   decode_step.cuh  an engine's routed decode step in one object
// Needs nvcc (CUDA C++20); the host header self-check does not compile this file.

#if !defined(__CUDACC__)
#error "skim/cuda.cuh needs a CUDA compiler; host code includes skim/skim.hpp"
#endif

#include "skim/skim.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/launch.cuh"
#include "skim/index/cuda/device_index.cuh"
#include "skim/summarize/cuda/max_bound.cuh"
#include "skim/summarize/cuda/multi_centroid.cuh"
#include "skim/route/cuda/decode_router.cuh"
#include "skim/select/cuda/select_kernel.cuh"
#include "skim/exec/cuda/prefill.cuh"
#include "skim/exec/cuda/decode.cuh"
#include "skim/exec/cuda/token_decode.cuh"
#include "skim/decode_step.cuh"
