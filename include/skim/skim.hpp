#pragma once
// skim — header-only sparse-attention primitives. The umbrella header for host code; include
// single headers instead to keep compile times down. skim/cuda.cuh adds the CUDA parts.
//
// Stages (docs/design.md §1): summarize -> score -> select -> describe (index) -> execute.

#include "skim/config.hpp"

#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/host_buffer.hpp"
#include "skim/core/parallel.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/quantized.hpp"
#include "skim/core/softmax_state.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"

#include "skim/concepts/block_index.hpp"
#include "skim/concepts/evictor.hpp"
#include "skim/concepts/executor.hpp"
#include "skim/concepts/router.hpp"
#include "skim/concepts/selector.hpp"
#include "skim/concepts/summarizer.hpp"

#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/canonicalize.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/dense_block_mask.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/index/order.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "skim/index/token_list.hpp"
#include "skim/index/transpose.hpp"
#include "skim/index/vertical_slash.hpp"

#include "skim/defaults.hpp"
#include "skim/summarize/build.hpp"
#include "skim/summarize/lsh_buckets.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/max_bound16.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "skim/summarize/probe_max.hpp"

#include "skim/route/head_pool.hpp"
#include "skim/route/kmeans.hpp"
#include "skim/route/kmeans_router.hpp"
#include "skim/route/pooled_router.hpp"

#include "skim/select/reserved.hpp"
#include "skim/select/select_all.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"
#include "skim/select/top_tokens.hpp"

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/token_gather.hpp"
#include "skim/exec/cpu/simd.hpp"  // simd<Arch> for the archs this translation unit is compiled for

#include "skim/metrics/cost.hpp"
#include "skim/metrics/quality.hpp"
#include "skim/metrics/tail.hpp"

#include "skim/evict/attention_mass.hpp"
#include "skim/evict/rank.hpp"
#include "skim/evict/recency.hpp"
#include "skim/evict/summary_score.hpp"

#include "skim/decode_step.hpp"
#include "skim/pipeline.hpp"
