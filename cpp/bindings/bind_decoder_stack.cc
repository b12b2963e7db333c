// pagedcore._core.DecoderStack (cpp/kernels/decoder_stack.h): every decoder layer's weight pointers,
// bound once at load by pagedcore.layers.decoder_stack; run() takes one step's buffers and metadata.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>
#include <vector>

#include "bindings/bind_common.h"
#include "kernels/decoder_stack.h"

namespace pagedcore {
namespace bindings {

// A linear's weight run after its first (kernels::StackLinearRun): weight pointer, format, scales pointer, rows.
using LinearRun = std::tuple<uintptr_t, kernels::WeightFormat, uintptr_t, int64_t>;

void bind_decoder_stack(py::module_& m) {
  py::class_<kernels::DecoderStack>(
      m, "DecoderStack", "Weight pointers of every decoder layer (pagedcore.layers.decoder_stack builds it).")
      .def(py::init([](const std::vector<std::vector<uintptr_t>>& layer_ptrs, int64_t hidden_size, int64_t num_heads,
                       int64_t num_kv_heads, int64_t head_dim, int64_t intermediate_size, double rms_norm_eps,
                       double attn_scale, int32_t dtype, int32_t isa,
                       const std::optional<std::vector<std::vector<std::optional<kernels::WeightFormat>>>>& formats,
                       const std::optional<std::vector<std::vector<uintptr_t>>>& scales,
                       const std::optional<std::vector<std::vector<std::optional<std::vector<int64_t>>>>>& lora,
                       const std::optional<std::vector<std::vector<uintptr_t>>>& input_perms,
                       const std::optional<std::vector<std::vector<int64_t>>>& block_k,
                       const std::optional<std::vector<std::vector<std::vector<LinearRun>>>>& runs) {
             kernels::DecoderStack s;
             const size_t num_layers = layer_ptrs.size();
             if ((formats && formats->size() != num_layers) || (scales && scales->size() != num_layers) ||
                 (lora && lora->size() != num_layers) || (input_perms && input_perms->size() != num_layers) ||
                 (block_k && block_k->size() != num_layers) || (runs && runs->size() != num_layers))
               throw py::value_error("linear_formats, linear_scales, lora_stacks, linear_input_perms, "
                                     "linear_block_k and linear_runs need one entry per layer");
             for (size_t l = 0; l < num_layers; ++l) {
               const auto& v = layer_ptrs[l];
               if (v.size() != 9)
                 throw py::value_error("each layer needs 9 pointers: input_norm, post_norm, q_norm, k_norm, qkv, "
                                       "qkv_bias, o_proj, gate_up, down");
               kernels::DecoderLayerWeights w;
               w.input_norm = ptr<const void>(v[0]);
               w.post_norm = ptr<const void>(v[1]);
               w.q_norm = ptr<const void>(v[2]);
               w.k_norm = ptr<const void>(v[3]);
               w.qkv = ptr<const void>(v[4]);
               w.qkv_bias = ptr<const void>(v[5]);
               w.o_proj = ptr<const void>(v[6]);
               w.gate_up = ptr<const void>(v[7]);
               w.down = ptr<const void>(v[8]);
               // Per linear (qkv, o_proj, gate_up, down): its weight format (None: dense, the stack's
               // dtype) and the fp32 per-row scales of an int8_per_channel or fp8 weight (0: none).
               for (int i = 0; i < kernels::kNumStackLinears; ++i) {
                 if (formats) {
                   if ((*formats)[l].size() != kernels::kNumStackLinears)
                     throw py::value_error("each layer's linear_formats has 4 entries: qkv, o_proj, gate_up, down");
                   w.format[i] = (*formats)[l][i];
                 }
                 if (scales) {
                   if ((*scales)[l].size() != kernels::kNumStackLinears)
                     throw py::value_error("each layer's linear_scales has 4 entries: qkv, o_proj, gate_up, down");
                   w.scales[i] = ptr<const float>((*scales)[l][i]);
                 }
                 // fp8x16 with block-wise scales: inputs per block (the scales are then [N/16][KB]); 0: none.
                 if (block_k) {
                   if ((*block_k)[l].size() != kernels::kNumStackLinears)
                     throw py::value_error("each layer's linear_block_k has 4 entries: qkv, o_proj, gate_up, down");
                   w.block_k[i] = (*block_k)[l][i];
                 }
                 // Rows of other formats after the first run: (weight, format, scales or 0, rows) each.
                 if (runs) {
                   if ((*runs)[l].size() != kernels::kNumStackLinears)
                     throw py::value_error("each layer's linear_runs has 4 entries: qkv, o_proj, gate_up, down");
                   const std::vector<LinearRun>& later = (*runs)[l][i];
                   if (later.size() > static_cast<size_t>(kernels::kMaxStackLinearRuns))
                     throw py::value_error("a linear has at most 3 later weight runs");
                   w.num_later_runs[i] = static_cast<int>(later.size());
                   for (size_t r = 0; r < later.size(); ++r) {
                     kernels::StackLinearRun& run = w.later_runs[i][r];
                     run.weight = ptr<const void>(std::get<0>(later[r]));
                     run.format = std::get<1>(later[r]);
                     run.scales = ptr<const float>(std::get<2>(later[r]));
                     run.rows = std::get<3>(later[r]);
                   }
                 }
                 // An act-order layer's int64 [K] input order (0: inputs as they come); Python checks it.
                 if (input_perms) {
                   if ((*input_perms)[l].size() != kernels::kNumStackLinears)
                     throw py::value_error("each layer's linear_input_perms has 4 entries: qkv, o_proj, gate_up, "
                                           "down");
                   w.input_perm[i] = ptr<const int64_t>((*input_perms)[l][i]);
                 }
                 // Its LoRA slot stacks (None: no adapter hook): a_t, b_t, ranks, slice_starts pointers,
                 // then num_slots, num_slices, max_rank.
                 if (lora) {
                   if ((*lora)[l].size() != kernels::kNumStackLinears)
                     throw py::value_error("each layer's lora_stacks has 4 entries: qkv, o_proj, gate_up, down");
                   const auto& entry = (*lora)[l][i];
                   if (entry) {
                     const std::vector<int64_t>& v = *entry;
                     if (v.size() != 7)
                       throw py::value_error("a lora_stacks entry is (a_t, b_t, ranks, slice_starts, num_slots, "
                                             "num_slices, max_rank)");
                     kernels::LoRAStacks& st = w.lora[i];
                     st.a_t = ptr<const float>(static_cast<uintptr_t>(v[0]));
                     st.b_t = ptr<const float>(static_cast<uintptr_t>(v[1]));
                     st.ranks = ptr<const int32_t>(static_cast<uintptr_t>(v[2]));
                     st.slice_starts = ptr<const int32_t>(static_cast<uintptr_t>(v[3]));
                     st.num_slots = v[4];
                     st.num_slices = v[5];
                     st.max_rank = v[6];
                   }
                 }
               }
               s.layers.push_back(w);
             }
             s.sizes.hidden_size = hidden_size;
             s.sizes.num_heads = num_heads;
             s.sizes.num_kv_heads = num_kv_heads;
             s.sizes.head_dim = head_dim;
             s.sizes.intermediate_size = intermediate_size;
             s.sizes.rms_norm_eps = static_cast<float>(rms_norm_eps);
             s.sizes.attn_scale = static_cast<float>(attn_scale);
             s.sizes.dtype = to_dtype(dtype);
             s.isa = to_isa(isa);
             return s;
           }),
           py::arg("layer_ptrs"), py::arg("hidden_size"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("intermediate_size"), py::arg("rms_norm_eps"), py::arg("attn_scale"),
           py::arg("dtype"), py::arg("isa") = -1, py::arg("linear_formats") = py::none(),
           py::arg("linear_scales") = py::none(), py::arg("lora_stacks") = py::none(),
           py::arg("linear_input_perms") = py::none(), py::arg("linear_block_k") = py::none(),
           py::arg("linear_runs") = py::none())
      .def(
          "run",
          [](kernels::DecoderStack& s, uintptr_t hidden, uintptr_t residual, int64_t num_tokens, uintptr_t cos_sin,
             uintptr_t kv_cache, int32_t cache_dtype, int64_t num_blocks, int64_t block_size, uintptr_t slot_mapping,
             uintptr_t block_tables, uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs,
             int64_t max_blocks_per_seq, int64_t max_query_len, int64_t max_seq_len, int64_t num_actual_tokens,
             uintptr_t lora_token_indices, uintptr_t lora_segment_slots, uintptr_t lora_segment_starts,
             int64_t lora_num_segments, int64_t kv_stride_layer, int64_t kv_stride_kv, int64_t kv_stride_block) {
            kernels::DecoderStackParams step;
            step.kv_stride_layer = kv_stride_layer;
            step.kv_stride_kv = kv_stride_kv;
            step.kv_stride_block = kv_stride_block;
            step.hidden = ptr<void>(hidden);
            step.residual = ptr<void>(residual);
            step.num_tokens = num_tokens;
            step.cos_sin = ptr<const void>(cos_sin);
            step.kv_cache = ptr<void>(kv_cache);
            step.cache_dtype = to_cache_dtype(cache_dtype);
            step.num_blocks = num_blocks;
            step.block_size = block_size;
            step.slot_mapping = ptr<const int64_t>(slot_mapping);
            step.block_tables = ptr<const int32_t>(block_tables);
            step.seq_lens = ptr<const int32_t>(seq_lens);
            step.query_start_loc = ptr<const int32_t>(query_start_loc);
            step.num_seqs = num_seqs;
            step.max_blocks_per_seq = max_blocks_per_seq;
            step.max_query_len = max_query_len;
            step.max_seq_len = max_seq_len;
            step.num_actual_tokens = num_actual_tokens;
            step.lora.token_indices = ptr<const int32_t>(lora_token_indices);
            step.lora.segment_slots = ptr<const int32_t>(lora_segment_slots);
            step.lora.segment_starts = ptr<const int32_t>(lora_segment_starts);
            step.lora.num_segments = lora_num_segments;
            kernels::Status status;
            {
              py::gil_scoped_release release;
              status = s.run(step);
            }
            raise_if_error(status);
          },
          py::arg("hidden"), py::arg("residual"), py::arg("num_tokens"), py::arg("cos_sin"), py::arg("kv_cache"),
          py::arg("cache_dtype"), py::arg("num_blocks"), py::arg("block_size"), py::arg("slot_mapping"),
          py::arg("block_tables"), py::arg("seq_lens"), py::arg("query_start_loc"), py::arg("num_seqs"),
          py::arg("max_blocks_per_seq"), py::arg("max_query_len"), py::arg("max_seq_len"),
          py::arg("num_actual_tokens"), py::arg("lora_token_indices") = 0, py::arg("lora_segment_slots") = 0,
          py::arg("lora_segment_starts") = 0, py::arg("lora_num_segments") = 0, py::arg("kv_stride_layer") = 0,
          py::arg("kv_stride_kv") = 0, py::arg("kv_stride_block") = 0,
          "One step through every layer (raw pointers; checked by the caller). kv_stride_*: the cache's first "
          "three strides in elements (all 0: contiguous). lora_*: the step's adapter rows "
          "grouped by slot (lora_kernel.h; 0 segments: none).")
      .def_readonly("lora_steps", &kernels::DecoderStack::lora_steps, "Steps run with adapter rows.")
      .def_readwrite("profiling", &kernels::DecoderStack::profiling, "Accumulate seconds per op (see profile()).")
      .def(
          "profile",
          [](kernels::DecoderStack& s, bool reset) {
            py::dict d;
            for (int op = 0; op < kernels::kNumStackOps; ++op) {
              d[kernels::stack_op_name(op)] = s.op_seconds[op];
              if (reset) s.op_seconds[op] = 0.0;
            }
            return d;
          },
          py::arg("reset") = false, "Seconds per op accumulated while profiling was on.");
}

}  // namespace bindings
}  // namespace pagedcore
