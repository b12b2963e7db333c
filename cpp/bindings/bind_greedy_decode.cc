// pagedcore._core.GreedyDecoder (cpp/kernels/greedy_decode.h): the model's token table, rotary
// table, final norm and LM head bound once (pagedcore.models.greedy_decode builds one); run() takes
// one step's arrays as the scheduler made them (numpy, no copies) and returns its tokens: each row's
// argmax, or drawn by sample_rows from the row sampling inputs given.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <optional>
#include <string>

#include "bindings/bind_common.h"
#include "bindings/logit_edits_arg.h"
#include "kernels/decoder_stack.h"
#include "kernels/greedy_decode.h"

namespace pagedcore {
namespace bindings {

namespace {

template <typename T>
using Array = py::array_t<T, py::array::c_style>;  // no forcecast: a wrong dtype is a TypeError, not a copy

void expect_1d(const py::array& a, const char* name, int64_t size) {
  if (a.ndim() != 1 || (size >= 0 && a.shape(0) != size))
    throw py::value_error(std::string("GreedyDecoder.run: ") + name + " must be 1-D" +
                          (size >= 0 ? " of " + std::to_string(size) + " entries" : std::string()) + ", got " +
                          std::to_string(a.ndim()) + "-D of " + std::to_string(a.ndim() ? a.shape(0) : 0));
}

// A step's DecoderStackParams from the scheduler's arrays (shapes checked).
kernels::DecoderStackParams step_params(const Array<int64_t>& input_ids, const Array<int64_t>& positions,
                                        uintptr_t kv_cache, int32_t cache_dtype, int64_t num_blocks,
                                        int64_t block_size, const Array<int64_t>& slot_mapping,
                                        const Array<int32_t>& block_tables, const Array<int32_t>& seq_lens,
                                        const Array<int32_t>& query_start_loc, int64_t max_query_len,
                                        int64_t max_seq_len, const std::array<int64_t, 3>& kv_strides) {
  expect_1d(input_ids, "input_ids", -1);
  const int64_t T = input_ids.shape(0);
  expect_1d(positions, "positions", T);
  expect_1d(slot_mapping, "slot_mapping", T);
  expect_1d(seq_lens, "seq_lens", -1);
  const int64_t num_seqs = seq_lens.shape(0);
  expect_1d(query_start_loc, "query_start_loc", num_seqs + 1);
  if (block_tables.ndim() != 2 || block_tables.shape(0) != num_seqs)
    throw py::value_error("GreedyDecoder.run: block_tables must be [num_seqs, max_blocks] with num_seqs = " +
                          std::to_string(num_seqs));
  kernels::DecoderStackParams step;
  step.num_tokens = T;
  step.kv_cache = ptr<void>(kv_cache);
  step.cache_dtype = to_cache_dtype(cache_dtype);
  step.num_blocks = num_blocks;
  step.block_size = block_size;
  step.kv_stride_layer = kv_strides[0];
  step.kv_stride_kv = kv_strides[1];
  step.kv_stride_block = kv_strides[2];
  step.slot_mapping = slot_mapping.data();
  step.block_tables = block_tables.data();
  step.seq_lens = seq_lens.data();
  step.query_start_loc = query_start_loc.data();
  step.num_seqs = num_seqs;
  step.max_blocks_per_seq = block_tables.shape(1);
  step.max_query_len = max_query_len;
  step.max_seq_len = max_seq_len;
  return step;
}

// Sampling inputs (pagedcore.sampling.row_sampling.RowSampling), all or none: temperature, top_k, top_p,
// min_p of num_rows entries and noise [noise_rows, noise_width]; the arrays stay referenced here.
struct SamplingArgs {
  Array<float> temperature, top_p, min_p, noise;
  Array<int64_t> top_k;
  kernels::SampleRowsParams params;
  bool given = false;

  SamplingArgs(const char* fn, const py::object& temperature_o, const py::object& top_k_o,
               const py::object& top_p_o, const py::object& min_p_o, const py::object& noise_o, int64_t num_rows,
               int64_t noise_rows, const char* noise_rows_name) {
    given = !temperature_o.is_none();
    if (given != !top_k_o.is_none() || given != !top_p_o.is_none() || given != !min_p_o.is_none() ||
        given != !noise_o.is_none())
      throw py::value_error(std::string(fn) + ": temperature, top_k, top_p, min_p and noise come together");
    if (!given) return;
    temperature = temperature_o.cast<Array<float>>();
    top_k = top_k_o.cast<Array<int64_t>>();
    top_p = top_p_o.cast<Array<float>>();
    min_p = min_p_o.cast<Array<float>>();
    noise = noise_o.cast<Array<float>>();
    expect_1d(temperature, "temperature", num_rows);
    expect_1d(top_k, "top_k", num_rows);
    expect_1d(top_p, "top_p", num_rows);
    expect_1d(min_p, "min_p", num_rows);
    if (noise.ndim() != 2 || noise.shape(0) != noise_rows)
      throw py::value_error(std::string(fn) + ": noise must be [" + noise_rows_name + ", noise_width]");
    params.temperature = temperature.data();
    params.top_k = top_k.data();
    params.top_p = top_p.data();
    params.min_p = min_p.data();
    params.noise = noise.data();
    params.noise_width = noise.shape(1);
  }
  const kernels::SampleRowsParams* get() const { return given ? &params : nullptr; }
};

}  // namespace

void bind_greedy_decode(py::module_& m) {
  py::class_<kernels::GreedyDecoder>(
      m, "GreedyDecoder",
      "Token table, rotary table, final norm and LM head of a model whose layers a DecoderStack runs "
      "(pagedcore.models.greedy_decode builds it).")
      .def(py::init([](uintptr_t table, int64_t table_rows, int64_t hidden_size, kernels::WeightFormat table_format,
                       int32_t dtype, uintptr_t cos_sin_cache, int64_t max_position, uintptr_t final_norm,
                       double final_norm_eps, const kernels::LinearLayer& head, int64_t head_max_rows) {
             kernels::GreedyDecoder g;
             g.embedding.table = ptr<const void>(table);
             g.embedding.num_rows = table_rows;
             g.embedding.K = hidden_size;
             g.embedding.format = table_format;
             g.embedding.out_dtype = to_dtype(dtype);
             g.cos_sin_cache = ptr<const void>(cos_sin_cache);
             g.max_position = max_position;
             g.final_norm = ptr<const void>(final_norm);
             g.final_norm_eps = static_cast<float>(final_norm_eps);
             g.head = head;
             g.head_max_rows = head_max_rows;
             return g;
           }),
           py::kw_only(), py::arg("table"), py::arg("table_rows"), py::arg("hidden_size"), py::arg("table_format"),
           py::arg("dtype"), py::arg("cos_sin_cache"), py::arg("max_position"), py::arg("final_norm"),
           py::arg("final_norm_eps"), py::arg("head"), py::arg("head_max_rows"))
      .def(
          "run",
          [](kernels::GreedyDecoder& g, kernels::DecoderStack& stack, const Array<int64_t>& input_ids,
             const Array<int64_t>& positions, uintptr_t kv_cache, int32_t cache_dtype, int64_t num_blocks,
             int64_t block_size, const Array<int64_t>& slot_mapping, const Array<int32_t>& block_tables,
             const Array<int32_t>& seq_lens, const Array<int32_t>& query_start_loc, int64_t max_query_len,
             int64_t max_seq_len, const Array<int64_t>& logits_indices, const py::object& temperature,
             const py::object& top_k, const py::object& top_p, const py::object& min_p, const py::object& noise,
             const py::object& edits, const py::object& raw_rows, const py::object& raw_out,
             uintptr_t lora_token_indices, uintptr_t lora_segment_slots, uintptr_t lora_segment_starts,
             int64_t lora_num_segments, const std::array<int64_t, 3>& kv_strides) {
            kernels::DecoderStackParams step =
                step_params(input_ids, positions, kv_cache, cache_dtype, num_blocks, block_size, slot_mapping,
                            block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, kv_strides);
            // The step's adapter rows (pagedcore.lora LoRABatch: int32, contiguous), as DecoderStack.run takes
            // them; the stack's LoRA launcher checks every index before layer 0 writes the cache.
            if (lora_num_segments < 0 ||
                (lora_num_segments > 0 && (!lora_token_indices || !lora_segment_slots || !lora_segment_starts)))
              throw py::value_error("GreedyDecoder.run: LoRA segments need their three arrays and a count >= 0");
            step.lora.token_indices = ptr<const int32_t>(lora_token_indices);
            step.lora.segment_slots = ptr<const int32_t>(lora_segment_slots);
            step.lora.segment_starts = ptr<const int32_t>(lora_segment_starts);
            step.lora.num_segments = lora_num_segments;
            expect_1d(logits_indices, "logits_indices", -1);
            const int64_t num_rows = logits_indices.shape(0);
            const SamplingArgs sampling("GreedyDecoder.run", temperature, top_k, top_p, min_p, noise, num_rows,
                                        num_rows, "len(logits_indices)");
            std::optional<LogitEditsArg> edits_arg;
            if (!edits.is_none()) edits_arg.emplace(edits, num_rows);
            // Raw logits rows (logprobs): the indices and a [len(raw_rows), vocab] float32 output, together.
            if (raw_rows.is_none() != raw_out.is_none())
              throw py::value_error("GreedyDecoder.run: raw_rows and raw_out come together");
            Array<int64_t> raw_rows_a;
            Array<float> raw_out_a;
            int64_t num_raw = 0;
            if (!raw_rows.is_none()) {
              raw_rows_a = raw_rows.cast<Array<int64_t>>();
              raw_out_a = raw_out.cast<Array<float>>();
              expect_1d(raw_rows_a, "raw_rows", -1);
              num_raw = raw_rows_a.shape(0);
              if (raw_out_a.ndim() != 2 || raw_out_a.shape(0) != num_raw || !raw_out_a.writeable())
                throw py::value_error(
                    "GreedyDecoder.run: raw_out must be a writable [len(raw_rows), vocab] float32 array");
              if (raw_out_a.shape(1) != g.head.params.N)
                throw py::value_error("GreedyDecoder.run: raw_out has " + std::to_string(raw_out_a.shape(1)) +
                                      " columns; the head's vocabulary is " + std::to_string(g.head.params.N));
            }
            py::array_t<int64_t> tokens(num_rows);  // [num_rows]
            kernels::Status status;
            {
              py::gil_scoped_release release;
              status = g.run(stack, step, input_ids.data(), positions.data(), logits_indices.data(), num_rows,
                             tokens.mutable_data(), sampling.get(),
                             edits_arg ? &edits_arg->params() : nullptr, num_raw ? raw_rows_a.data() : nullptr,
                             num_raw, num_raw ? raw_out_a.mutable_data() : nullptr);
            }
            raise_if_error(status);
            return tokens;
          },
          py::arg("stack"), py::arg("input_ids"), py::arg("positions"), py::arg("kv_cache"), py::arg("cache_dtype"),
          py::arg("num_blocks"), py::arg("block_size"), py::arg("slot_mapping"), py::arg("block_tables"),
          py::arg("seq_lens"), py::arg("query_start_loc"), py::arg("max_query_len"), py::arg("max_seq_len"),
          py::arg("logits_indices"), py::kw_only(), py::arg("temperature") = py::none(), py::arg("top_k") = py::none(),
          py::arg("top_p") = py::none(), py::arg("min_p") = py::none(), py::arg("noise") = py::none(),
          py::arg("edits") = py::none(), py::arg("raw_rows") = py::none(), py::arg("raw_out") = py::none(),
          py::arg("lora_token_indices") = 0, py::arg("lora_segment_slots") = 0, py::arg("lora_segment_starts") = 0,
          py::arg("lora_num_segments") = 0, py::arg("kv_strides") = std::array<int64_t, 3>{0, 0, 0},
          "One step: embedding, every layer, final norm, LM head and argmax -> int64 tokens [len(logits_indices)]; "
          "with temperature, top_k, top_p, min_p (1-D, a row each) and noise [rows, noise_width] (float32 / int64 "
          "numpy), sample_rows instead of the argmax; with edits (a pagedcore.sampling.logit_edits.LogitEdits), its "
          "logit edits before either; with raw_rows (int64) and raw_out ([len(raw_rows), vocab] float32), those rows' "
          "logits before any edit copied out (logprobs); with lora_* (pointers to a LoRABatch's int32 arrays and its "
          "segment count), the adapter rows' terms in every layer, as DecoderStack.run adds them. kv_cache is a raw "
          "pointer (the caller checks the cache tensor); every index and sampling value is checked before the cache "
          "is written.")
      .def(
          "run_steps",
          [](kernels::GreedyDecoder& g, kernels::DecoderStack& stack, const Array<int64_t>& input_ids,
             const Array<int64_t>& positions, uintptr_t kv_cache, int32_t cache_dtype, int64_t num_blocks,
             int64_t block_size, const Array<int64_t>& slot_mapping, const Array<int32_t>& block_tables,
             const Array<int32_t>& seq_lens, const Array<int32_t>& query_start_loc, int64_t max_seq_len,
             const py::object& temperature, const py::object& top_k, const py::object& top_p,
             const py::object& min_p, const py::object& noise, const py::object& edits,
             const py::object& ban_steps, const py::object& raw_seqs, const py::object& raw_out,
             const std::array<int64_t, 3>& kv_strides) {
            const kernels::DecoderStackParams step =
                step_params(input_ids, positions, kv_cache, cache_dtype, num_blocks, block_size, slot_mapping,
                            block_tables, seq_lens, query_start_loc, -1, max_seq_len, kv_strides);
            // A sequence's sampling values, a token's noise row (greedy_decode.h run_steps).
            const SamplingArgs sampling("GreedyDecoder.run_steps", temperature, top_k, top_p, min_p, noise,
                                        step.num_seqs, step.num_tokens, "num_tokens");
            // The first step's logit edits over the sequences (rows 0..num_seqs-1) and each one's ban steps.
            if (edits.is_none() != ban_steps.is_none())
              throw py::value_error("GreedyDecoder.run_steps: edits and ban_steps come together");
            std::optional<LogitEditsArg> edits_arg;
            Array<int32_t> ban_steps_a;
            if (!edits.is_none()) {
              edits_arg.emplace(edits, step.num_seqs);
              ban_steps_a = ban_steps.cast<Array<int32_t>>();
              expect_1d(ban_steps_a, "ban_steps", step.num_seqs);
            }
            // Raw logits of flagged sequences' tokens (logprobs): flags [num_seqs] and [their tokens, vocab].
            if (raw_seqs.is_none() != raw_out.is_none())
              throw py::value_error("GreedyDecoder.run_steps: raw_seqs and raw_out come together");
            Array<uint8_t> raw_seqs_a;
            Array<float> raw_out_a;
            const bool want_raw = !raw_seqs.is_none();
            if (want_raw) {
              raw_seqs_a = raw_seqs.cast<Array<uint8_t>>();
              raw_out_a = raw_out.cast<Array<float>>();
              expect_1d(raw_seqs_a, "raw_seqs", step.num_seqs);
              int64_t rows = 0;
              for (int64_t s = 0; s < step.num_seqs; ++s)
                if (raw_seqs_a.data()[s]) rows += step.query_start_loc[s + 1] - step.query_start_loc[s];
              if (raw_out_a.ndim() != 2 || raw_out_a.shape(0) != rows || raw_out_a.shape(1) != g.head.params.N ||
                  !raw_out_a.writeable())
                throw py::value_error("GreedyDecoder.run_steps: raw_out must be a writable float32 [" +
                                      std::to_string(rows) + ", " + std::to_string(g.head.params.N) +
                                      "] array (the flagged sequences' tokens x the vocabulary)");
            }
            py::array_t<int64_t> tokens(step.num_tokens);  // [num_tokens]
            kernels::Status status;
            {
              py::gil_scoped_release release;
              status = g.run_steps(stack, step, input_ids.data(), positions.data(), tokens.mutable_data(),
                                   sampling.get(), edits_arg ? &edits_arg->params() : nullptr,
                                   edits_arg ? ban_steps_a.data() : nullptr,
                                   want_raw ? raw_seqs_a.data() : nullptr,
                                   want_raw ? raw_out_a.mutable_data() : nullptr);
            }
            raise_if_error(status);
            return tokens;
          },
          py::arg("stack"), py::arg("input_ids"), py::arg("positions"), py::arg("kv_cache"), py::arg("cache_dtype"),
          py::arg("num_blocks"), py::arg("block_size"), py::arg("slot_mapping"), py::arg("block_tables"),
          py::arg("seq_lens"), py::arg("query_start_loc"), py::arg("max_seq_len"), py::kw_only(),
          py::arg("temperature") = py::none(), py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
          py::arg("min_p") = py::none(), py::arg("noise") = py::none(), py::arg("edits") = py::none(),
          py::arg("ban_steps") = py::none(), py::arg("raw_seqs") = py::none(), py::arg("raw_out") = py::none(),
          py::arg("kv_strides") = std::array<int64_t, 3>{0, 0, 0},
          "Several decode steps in one call (greedy_decode.h run_steps): each sequence's tokens after the "
          "first are placeholders; returns int64 [num_tokens], token query_start_loc[s] + i the token of "
          "sequence s's step i (the tokens single steps would give): its argmax, or with temperature, top_k, "
          "top_p, min_p (a sequence each) and noise [num_tokens, noise_width] (a token each), sample_rows'; "
          "with edits (a LogitEdits over the sequences, as the first step's) and ban_steps (int32, a sequence "
          "each: the steps its min_tokens bans last), each step's logit edits first; with raw_seqs (uint8, a "
          "sequence each) and raw_out (float32 [flagged sequences' tokens, vocab]), their logits before any "
          "edit copied out (logprobs).")
      .def_readwrite("timing", &kernels::GreedyDecoder::timing, "Add up seconds per part (see seconds()).")
      .def(
          "seconds",
          [](kernels::GreedyDecoder& g, bool reset) {
            const py::tuple out = py::make_tuple(g.layer_seconds, g.head_seconds);
            if (reset) g.layer_seconds = g.head_seconds = 0.0;
            return out;
          },
          py::arg("reset") = false,
          "(layers: lookup + rotary rows + stack, head: final norm + LM head + argmax) seconds while timing was on.");
}

}  // namespace bindings
}  // namespace pagedcore
