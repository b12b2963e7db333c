// The scheduler's knobs, validated once at construction.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace pagedcore {

enum class PreemptionMode : int32_t { kRecompute = 0, kSwap = 1 };
enum class SchedulingPolicy : int32_t { kFcfs = 0, kPriority = 1 };

struct SchedulerConfig {
  int32_t num_gpu_blocks = 0;            // device KV blocks
  int32_t num_cpu_blocks = 0;            // swap space (0: swap preemption falls back to recompute)
  int32_t block_size = 16;               // tokens per block
  int32_t max_num_batched_tokens = 2048; // the token budget of one step
  int32_t max_num_seqs = 256;            // sequences in one step
  int32_t max_model_len = 2048;          // prompt + output tokens of one sequence
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;    // off: a prompt is prefilled in one step or waits
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  bool enable_trace = false;             // per-step event record (free when off)
  int32_t max_loras = 0;                 // distinct LoRA adapters (adapter_id != 0) in one step; 0: no cap

  void validate() const {
    auto fail = [](const std::string& msg) { throw std::invalid_argument(msg); };
    if (block_size <= 0 || (block_size & (block_size - 1)) != 0) {
      fail("block_size must be a positive power of two (8, 16, 32, ...), got " + std::to_string(block_size));
    }
    if (num_gpu_blocks <= 0) {
      fail("num_gpu_blocks must be > 0, got " + std::to_string(num_gpu_blocks) +
           "; give the KV cache more memory");
    }
    if (num_cpu_blocks < 0) fail("num_cpu_blocks must be >= 0, got " + std::to_string(num_cpu_blocks));
    if (max_num_seqs <= 0) fail("max_num_seqs must be > 0, got " + std::to_string(max_num_seqs));
    if (max_loras < 0) fail("max_loras must be >= 0 (0: no cap), got " + std::to_string(max_loras));
    if (max_model_len <= 0) fail("max_model_len must be > 0, got " + std::to_string(max_model_len));
    if (max_num_batched_tokens <= 0) {
      fail("max_num_batched_tokens must be > 0, got " + std::to_string(max_num_batched_tokens));
    }
    if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
      fail("without chunked prefill a whole prompt must fit one step: max_num_batched_tokens (" +
           std::to_string(max_num_batched_tokens) + ") must be >= max_model_len (" +
           std::to_string(max_model_len) + "); raise it, lower max_model_len or enable chunked prefill");
    }
  }
};

}  // namespace pagedcore
