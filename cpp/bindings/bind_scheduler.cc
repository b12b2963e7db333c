// pagedcore._core's scheduler: its config, enums, per-step output (arrays leave as zero-copy numpy
// views on C++-owned buffers) and the Scheduler itself (cpp/core/scheduler.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings/bind_common.h"
#include "core/scheduler.h"

namespace pagedcore {
namespace bindings {
namespace {

// A numpy view of a vector owned by `owner` (a Python object wrapping the C++ struct): the array
// keeps the owner alive, so no copy is made and no view can dangle.
template <typename T>
py::array_t<T> view_1d(const std::vector<T>& v, py::handle owner) {
  return py::array_t<T>({static_cast<py::ssize_t>(v.size())}, {static_cast<py::ssize_t>(sizeof(T))}, v.data(), owner);
}
template <typename T>
py::array_t<T> view_2d(const std::vector<T>& v, py::ssize_t cols, py::handle owner) {
  const py::ssize_t rows = cols == 0 ? 0 : static_cast<py::ssize_t>(v.size()) / cols;
  return py::array_t<T>({rows, cols}, {static_cast<py::ssize_t>(cols * sizeof(T)), static_cast<py::ssize_t>(sizeof(T))},
                        v.data(), owner);
}
py::array_t<int64_t> events_view(const std::vector<TraceEvent>& events, py::handle owner) {
  // [num_events, 4] int64: (type, seq_id, a, b)
  return py::array_t<int64_t>({static_cast<py::ssize_t>(events.size()), static_cast<py::ssize_t>(4)},
                              {static_cast<py::ssize_t>(sizeof(TraceEvent)), static_cast<py::ssize_t>(sizeof(int64_t))},
                              reinterpret_cast<const int64_t*>(events.data()), owner);
}

template <typename T, typename Field>
void def_view(py::class_<T>& cls, const char* name, Field field, const char* doc) {
  cls.def_property_readonly(
      name, [field](py::object self) { return view_1d(self.cast<const T&>().*field, self); }, doc);
}

std::vector<TokenId> to_tokens(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a,
                               const char* what) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(what) + " must be 1-D");
  std::vector<TokenId> out(static_cast<size_t>(a.size()));
  const int64_t* p = a.data();
  for (size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || p[i] > INT32_MAX) {
      throw std::invalid_argument(std::string(what) + " holds " + std::to_string(p[i]) + ", not a token id");
    }
    out[i] = static_cast<TokenId>(p[i]);
  }
  return out;
}

std::vector<int32_t> to_counts(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a,
                               const char* what) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(what) + " must be 1-D, one count per sample row");
  std::vector<int32_t> out(static_cast<size_t>(a.size()));
  const int64_t* p = a.data();
  for (size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || p[i] > INT32_MAX) {
      throw std::invalid_argument(std::string(what) + " holds " + std::to_string(p[i]) + ", not a count");
    }
    out[i] = static_cast<int32_t>(p[i]);
  }
  return out;
}

}  // namespace

void bind_scheduler(py::module_& m) {
  py::enum_<PreemptionMode>(m, "PreemptionMode")
      .value("RECOMPUTE", PreemptionMode::kRecompute)
      .value("SWAP", PreemptionMode::kSwap);
  py::enum_<SchedulingPolicy>(m, "SchedulingPolicy")
      .value("FCFS", SchedulingPolicy::kFcfs)
      .value("PRIORITY", SchedulingPolicy::kPriority);
  py::enum_<SeqStatus>(m, "SeqStatus")
      .value("WAITING", SeqStatus::kWaiting)
      .value("RUNNING", SeqStatus::kRunning)
      .value("SWAPPED", SeqStatus::kSwapped)
      .value("FINISHED", SeqStatus::kFinished);
  py::enum_<FinishReason>(m, "FinishReason")
      .value("NONE", FinishReason::kNone)
      .value("STOP", FinishReason::kStop)
      .value("LENGTH", FinishReason::kLength)
      .value("ABORT", FinishReason::kAbort);
  py::enum_<TraceEventType>(m, "TraceEventType")
      .value("ALLOCATE", TraceEventType::kAllocate)
      .value("FREE", TraceEventType::kFree)
      .value("PREFIX_HIT", TraceEventType::kPrefixHit)
      .value("COPY_ON_WRITE", TraceEventType::kCopyOnWrite)
      .value("SWAP_OUT", TraceEventType::kSwapOut)
      .value("SWAP_IN", TraceEventType::kSwapIn)
      .value("EVICT", TraceEventType::kEvict)
      .value("PREEMPT", TraceEventType::kPreempt)
      .value("QUEUE_MOVE", TraceEventType::kQueueMove)
      .value("FINISH", TraceEventType::kFinish)
      .value("REJECT", TraceEventType::kReject)
      .value("SCHEDULE", TraceEventType::kSchedule)
      .value("FORK", TraceEventType::kFork)
      .value("CACHE_REGISTER", TraceEventType::kCacheRegister);

  py::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(py::init([](int num_gpu_blocks, int num_cpu_blocks, int block_size, int max_num_batched_tokens,
                       int max_num_seqs, int max_model_len, bool enable_prefix_caching, bool enable_chunked_prefill,
                       PreemptionMode preemption_mode, SchedulingPolicy policy, bool enable_trace,
                       int max_loras) {
             SchedulerConfig c;
             c.num_gpu_blocks = num_gpu_blocks;
             c.num_cpu_blocks = num_cpu_blocks;
             c.block_size = block_size;
             c.max_num_batched_tokens = max_num_batched_tokens;
             c.max_num_seqs = max_num_seqs;
             c.max_model_len = max_model_len;
             c.enable_prefix_caching = enable_prefix_caching;
             c.enable_chunked_prefill = enable_chunked_prefill;
             c.preemption_mode = preemption_mode;
             c.policy = policy;
             c.enable_trace = enable_trace;
             c.max_loras = max_loras;
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("num_gpu_blocks"), py::arg("num_cpu_blocks") = 0, py::arg("block_size") = 16,
           py::arg("max_num_batched_tokens") = 2048, py::arg("max_num_seqs") = 256, py::arg("max_model_len") = 2048,
           py::arg("enable_prefix_caching") = true, py::arg("enable_chunked_prefill") = true,
           py::arg("preemption_mode") = PreemptionMode::kRecompute, py::arg("policy") = SchedulingPolicy::kFcfs,
           py::arg("enable_trace") = false, py::arg("max_loras") = 0)
      .def_readonly("num_gpu_blocks", &SchedulerConfig::num_gpu_blocks)
      .def_readonly("num_cpu_blocks", &SchedulerConfig::num_cpu_blocks)
      .def_readonly("block_size", &SchedulerConfig::block_size)
      .def_readonly("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens)
      .def_readonly("max_num_seqs", &SchedulerConfig::max_num_seqs)
      .def_readonly("max_model_len", &SchedulerConfig::max_model_len)
      .def_readonly("enable_prefix_caching", &SchedulerConfig::enable_prefix_caching)
      .def_readonly("enable_chunked_prefill", &SchedulerConfig::enable_chunked_prefill)
      .def_readonly("preemption_mode", &SchedulerConfig::preemption_mode)
      .def_readonly("policy", &SchedulerConfig::policy)
      .def_readonly("enable_trace", &SchedulerConfig::enable_trace)
      .def_readonly("max_loras", &SchedulerConfig::max_loras);

  py::class_<SchedulerOutput> out(m, "SchedulerOutput", "One step's schedule; arrays are zero-copy numpy views.");
  out.def_readonly("step_id", &SchedulerOutput::step_id)
      .def_property_readonly("num_seqs", &SchedulerOutput::num_seqs)
      .def_property_readonly("num_tokens", &SchedulerOutput::num_tokens)
      .def_readonly("max_num_blocks_per_seq", &SchedulerOutput::max_num_blocks_per_seq)
      .def_readonly("max_query_len", &SchedulerOutput::max_query_len)
      .def_readonly("max_seq_len", &SchedulerOutput::max_seq_len)
      .def_readonly("num_prefill_tokens", &SchedulerOutput::num_prefill_tokens)
      .def_readonly("num_decode_tokens", &SchedulerOutput::num_decode_tokens)
      .def_property_readonly("block_tables", [](py::object self) {
        const auto& o = self.cast<const SchedulerOutput&>();
        return view_2d(o.block_tables, o.max_num_blocks_per_seq, self);
      }, "int32 [num_seqs, max_num_blocks_per_seq], padded with -1")
      .def_property_readonly("blocks_to_copy", [](py::object self) {
        return view_2d(self.cast<const SchedulerOutput&>().blocks_to_copy, 2, self);
      }, "int32 [n, 2] (src, dst) copy-on-write")
      .def_property_readonly("blocks_to_swap_out", [](py::object self) {
        return view_2d(self.cast<const SchedulerOutput&>().blocks_to_swap_out, 2, self);
      }, "int32 [n, 2] (device block, cpu block)")
      .def_property_readonly("blocks_to_swap_in", [](py::object self) {
        return view_2d(self.cast<const SchedulerOutput&>().blocks_to_swap_in, 2, self);
      }, "int32 [n, 2] (cpu block, device block)")
      .def_property_readonly("events", [](py::object self) {
        return events_view(self.cast<const SchedulerOutput&>().events, self);
      }, "int64 [num_events, 4] (type, seq_id, a, b) when tracing");
  def_view(out, "seq_ids", &SchedulerOutput::seq_ids, "int64 [num_seqs] batch order");
  def_view(out, "num_scheduled_tokens", &SchedulerOutput::num_scheduled_tokens, "int32 [num_seqs]");
  def_view(out, "num_computed_tokens", &SchedulerOutput::num_computed_tokens, "int32 [num_seqs] before this step");
  def_view(out, "query_start_loc", &SchedulerOutput::query_start_loc, "int32 [num_seqs + 1]");
  def_view(out, "seq_lens", &SchedulerOutput::seq_lens, "int32 [num_seqs] cache length after this step");
  def_view(out, "adapter_ids", &SchedulerOutput::adapter_ids, "uint64 [num_seqs] LoRA adapter per sequence (0: base)");
  def_view(out, "input_ids", &SchedulerOutput::input_ids, "int64 [num_tokens]");
  def_view(out, "positions", &SchedulerOutput::positions, "int64 [num_tokens]");
  def_view(out, "slot_mapping", &SchedulerOutput::slot_mapping, "int64 [num_tokens], -1 = padding");
  out.def_property_readonly("num_samples", &SchedulerOutput::num_samples)
      .def_property_readonly("num_logits", &SchedulerOutput::num_logits)
      .def_readonly("num_draft_tokens", &SchedulerOutput::num_draft_tokens);
  def_view(out, "num_logits_rows", &SchedulerOutput::num_logits_rows,
           "int32 [num_seqs] logits rows per scheduled sequence: num_draft_tokens + 1 when sampled, else 0");
  def_view(out, "sample_seq_ids", &SchedulerOutput::sample_seq_ids, "int64 [num_samples] sequences with logits rows");
  def_view(out, "logits_start_loc", &SchedulerOutput::logits_start_loc,
           "int32 [num_samples + 1] rows of sample i: logits_indices[logits_start_loc[i]:logits_start_loc[i + 1]]");
  def_view(out, "logits_indices", &SchedulerOutput::logits_indices,
           "int64 [num_logits] token rows whose logits are sampled, in sample order");
  def_view(out, "preempted_seq_ids", &SchedulerOutput::preempted_seq_ids, "int64 [num_preempted]");

  py::class_<UpdateResult> upd(m, "UpdateResult");
  def_view(upd, "finished_seq_ids", &UpdateResult::finished_seq_ids, "int64 [num_finished]");
  def_view(upd, "finish_reasons", &UpdateResult::finish_reasons, "int32 [num_finished] FinishReason values");
  def_view(upd, "stop_token_ids", &UpdateResult::stop_token_ids, "int32 [num_finished], -1 unless stopped by a token");
  upd.def_property_readonly("events", [](py::object self) {
    return events_view(self.cast<const UpdateResult&>().events, self);
  });

  py::class_<SchedulerStats>(m, "SchedulerStats")
      .def_readonly("num_waiting", &SchedulerStats::num_waiting)
      .def_readonly("num_running", &SchedulerStats::num_running)
      .def_readonly("num_swapped", &SchedulerStats::num_swapped)
      .def_readonly("num_free_blocks", &SchedulerStats::num_free_blocks)
      .def_readonly("num_cached_free_blocks", &SchedulerStats::num_cached_free_blocks)
      .def_readonly("num_free_cpu_blocks", &SchedulerStats::num_free_cpu_blocks)
      .def_readonly("kv_cache_usage", &SchedulerStats::kv_cache_usage)
      .def_readonly("prefix_query_tokens", &SchedulerStats::prefix_query_tokens)
      .def_readonly("prefix_hit_tokens", &SchedulerStats::prefix_hit_tokens)
      .def_readonly("num_preemptions", &SchedulerStats::num_preemptions)
      .def_readonly("num_evictions", &SchedulerStats::num_evictions)
      .def_readonly("num_steps", &SchedulerStats::num_steps);

  py::class_<Sequence>(m, "SequenceInfo", "A snapshot of one sequence's state.")
      .def_readonly("seq_id", &Sequence::seq_id)
      .def_readonly("status", &Sequence::status)
      .def_readonly("finish_reason", &Sequence::finish_reason)
      .def_readonly("token_ids", &Sequence::token_ids)
      .def_readonly("num_prompt_tokens", &Sequence::num_prompt_tokens)
      .def_readonly("num_computed_tokens", &Sequence::num_computed_tokens)
      .def_readonly("num_cached_tokens", &Sequence::num_cached_tokens)
      .def_readonly("num_draft_tokens", &Sequence::num_draft_tokens)
      .def_readonly("num_preemptions", &Sequence::num_preemptions)
      .def_property_readonly("adapter_id", [](const Sequence& s) { return s.params.cache_key.adapter_id; })
      .def_readonly("block_table", &Sequence::block_table)
      .def_property_readonly("num_tokens", &Sequence::num_tokens)
      .def_property_readonly("num_output_tokens", &Sequence::num_output_tokens);

  py::class_<Scheduler>(m, "Scheduler")
      .def(py::init<const SchedulerConfig&>(), py::arg("config"))
      .def_property_readonly("config", &Scheduler::config)
      .def("add_sequence",
           [](Scheduler& s, SeqId seq_id, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& prompt,
              int max_tokens, int min_tokens, bool ignore_eos, std::vector<TokenId> eos_token_ids,
              std::vector<TokenId> stop_token_ids, int priority, uint64_t adapter_id, uint64_t cache_salt) {
             StoppingParams p;
             p.max_tokens = max_tokens;
             p.min_tokens = min_tokens;
             p.ignore_eos = ignore_eos;
             p.eos_token_ids = std::move(eos_token_ids);
             p.stop_token_ids = std::move(stop_token_ids);
             p.priority = priority;
             p.cache_key.adapter_id = adapter_id;
             p.cache_key.cache_salt = cache_salt;
             s.add_sequence(seq_id, to_tokens(prompt, "prompt_token_ids"), p);
           },
           py::arg("seq_id"), py::arg("prompt_token_ids"), py::kw_only(), py::arg("max_tokens") = 16,
           py::arg("min_tokens") = 0, py::arg("ignore_eos") = false, py::arg("eos_token_ids") = std::vector<TokenId>{},
           py::arg("stop_token_ids") = std::vector<TokenId>{}, py::arg("priority") = 0, py::arg("adapter_id") = 0,
           py::arg("cache_salt") = 0)
      .def("fork_sequence", &Scheduler::fork_sequence, py::arg("parent_id"), py::arg("child_id"),
           py::arg("last_token_id") = -1)
      .def("append_tokens",
           [](Scheduler& s, SeqId seq_id, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& t,
              bool draft) { s.append_tokens(seq_id, to_tokens(t, "token_ids"), draft); },
           py::arg("seq_id"), py::arg("token_ids"), py::kw_only(), py::arg("draft") = false)
      .def("remove_tail_tokens", &Scheduler::remove_tail_tokens, py::arg("seq_id"), py::arg("num_tokens"))
      .def("set_draft_tokens",
           [](Scheduler& s, SeqId seq_id, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& t) {
             s.set_draft_tokens(seq_id, to_tokens(t, "token_ids"));
           },
           py::arg("seq_id"), py::arg("token_ids"))
      .def("abort_sequence", &Scheduler::abort_sequence, py::arg("seq_id"))
      .def("schedule", &Scheduler::schedule)
      .def("update",
           [](Scheduler& s, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& sampled,
              const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& forks,
              const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& num_accepted) {
             std::vector<SampleFork> fork_list;
             if (forks && forks->size() > 0) {
               if (forks->ndim() != 2 || forks->shape(1) != 3) {
                 throw std::invalid_argument("forks must be an int array [n, 3] of (parent_id, child_id, token_id)");
               }
               auto f = forks->unchecked<2>();
               for (py::ssize_t i = 0; i < f.shape(0); ++i) {
                 if (f(i, 2) < 0 || f(i, 2) > INT32_MAX) {
                   throw std::invalid_argument("forks[" + std::to_string(i) + ", 2] holds " + std::to_string(f(i, 2)) +
                                               ", not a token id");
                 }
                 fork_list.push_back(SampleFork{f(i, 0), f(i, 1), static_cast<TokenId>(f(i, 2))});
               }
             }
             if (!num_accepted) return s.update(to_tokens(sampled, "sampled_token_ids"), fork_list);
             return s.update_accepted(to_tokens(sampled, "sampled_token_ids"),
                                      to_counts(*num_accepted, "num_accepted_tokens"), fork_list);
           },
           py::arg("sampled_token_ids"), py::arg("forks") = py::none(), py::kw_only(),
           py::arg("num_accepted_tokens") = py::none(),
           "One token per sample row; with num_accepted_tokens ([num_samples], each 0..num_logits_rows), "
           "sampled_token_ids holds the accepted tokens of every sample row, concatenated in sample order.")
      .def("cancel_step", &Scheduler::cancel_step)
      .def_property_readonly("step_in_flight", &Scheduler::step_in_flight)
      .def("has_unfinished", &Scheduler::has_unfinished)
      // Called by the data-parallel router from the server's event loop while the replica's engine
      // thread drives this scheduler: safe because no method of this class releases the GIL, so the
      // probe never runs inside a schedule() or update(). Keep it that way (or add a lock to both).
      .def("num_cached_prefix_tokens",
           [](const Scheduler& s, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& prompt,
              uint64_t adapter_id, uint64_t cache_salt) {
             return s.num_cached_prefix_tokens(to_tokens(prompt, "prompt_token_ids"), CacheKey{adapter_id, cache_salt});
           },
           py::arg("prompt_token_ids"), py::kw_only(), py::arg("adapter_id") = 0, py::arg("cache_salt") = 0,
           "Prompt tokens (whole blocks, never the last token) this scheduler's prefix cache holds under "
           "(adapter_id, cache_salt). Read-only: changes no block, queue or counter.")
      .def("get_sequence",
           [](const Scheduler& s, SeqId seq_id) -> py::object {
             const Sequence* seq = s.find(seq_id);
             if (!seq) return py::none();
             return py::cast(*seq);  // a copy: a snapshot that outlives the sequence
           },
           py::arg("seq_id"))
      .def("stats", &Scheduler::stats)
      .def("waiting_ids", &Scheduler::waiting_ids)
      .def("running_ids", &Scheduler::running_ids)
      .def("swapped_ids", &Scheduler::swapped_ids)
      .def_property_readonly("gpu_pool", [](Scheduler& s) -> BlockPool& { return s.kv_cache().gpu_pool(); },
                             py::return_value_policy::reference_internal)
      .def_property_readonly("cpu_pool", [](Scheduler& s) -> BlockPool& { return s.kv_cache().cpu_pool(); },
                             py::return_value_policy::reference_internal);
}
}  // namespace bindings
}  // namespace pagedcore
