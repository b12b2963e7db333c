// The one pybind11 file: exposes the C++ core as pagedcore._core.
// Arrays leave as numpy views on C++-owned buffers (no copies); C++ exceptions become Python
// exceptions (std::invalid_argument -> ValueError, std::out_of_range -> IndexError,
// std::logic_error -> RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "core/block_pool.h"
#include "core/scheduler.h"
#ifdef PAGEDCORE_HAS_CUDA
#include "device_info.h"
#endif

#include "kernels/cache_kernels.h"
#include "kernels/cpu_isa.h"
#include "kernels/huge_pages.h"
#include "kernels/paged_attention.h"
#include "kernels/parallel.h"
namespace py = pybind11;
using namespace pagedcore;

namespace {

void bind_block_pool(py::module_& m) {
  py::class_<BlockPool>(m, "BlockPool")
      .def(py::init<int, int, bool>(), py::arg("num_blocks"), py::arg("block_size") = 16,
           py::arg("enable_prefix_caching") = false)
      .def_property_readonly("num_blocks", &BlockPool::num_blocks)
      .def_property_readonly("block_size", &BlockPool::block_size)
      .def_property_readonly("num_free_blocks", &BlockPool::num_free_blocks)
      .def_property_readonly("num_used_blocks", &BlockPool::num_used_blocks)
      .def_property_readonly("num_cached_blocks", &BlockPool::num_cached_blocks)
      .def_property_readonly("num_cached_free_blocks", &BlockPool::num_cached_free_blocks)
      .def_property_readonly("num_evictions", &BlockPool::num_evictions)
      .def("allocate", &BlockPool::allocate, py::arg("owner") = -1)
      .def("retain", &BlockPool::retain, py::arg("block_id"))
      .def("release", &BlockPool::release, py::arg("block_id"), py::arg("owner") = -1)
      .def("ref_count", &BlockPool::ref_count, py::arg("block_id"))
      .def("is_free", &BlockPool::is_free, py::arg("block_id"))
      .def("free_block_ids", &BlockPool::free_block_ids);
}

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
                       PreemptionMode preemption_mode, SchedulingPolicy policy, bool enable_trace) {
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
             c.validate();
             return c;
           }),
           py::kw_only(), py::arg("num_gpu_blocks"), py::arg("num_cpu_blocks") = 0, py::arg("block_size") = 16,
           py::arg("max_num_batched_tokens") = 2048, py::arg("max_num_seqs") = 256, py::arg("max_model_len") = 2048,
           py::arg("enable_prefix_caching") = true, py::arg("enable_chunked_prefill") = true,
           py::arg("preemption_mode") = PreemptionMode::kRecompute, py::arg("policy") = SchedulingPolicy::kFcfs,
           py::arg("enable_trace") = false)
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
      .def_readonly("enable_trace", &SchedulerConfig::enable_trace);

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
  def_view(out, "input_ids", &SchedulerOutput::input_ids, "int64 [num_tokens]");
  def_view(out, "positions", &SchedulerOutput::positions, "int64 [num_tokens]");
  def_view(out, "slot_mapping", &SchedulerOutput::slot_mapping, "int64 [num_tokens], -1 = padding");
  def_view(out, "logits_indices", &SchedulerOutput::logits_indices, "int64 [num_samples] rows to sample");
  def_view(out, "sample_seq_ids", &SchedulerOutput::sample_seq_ids, "int64 [num_samples]");
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
      .def_readonly("num_preemptions", &Sequence::num_preemptions)
      .def_readonly("block_table", &Sequence::block_table)
      .def_property_readonly("num_tokens", &Sequence::num_tokens)
      .def_property_readonly("num_output_tokens", &Sequence::num_output_tokens);

  py::class_<Scheduler>(m, "Scheduler")
      .def(py::init<const SchedulerConfig&>(), py::arg("config"))
      .def_property_readonly("config", &Scheduler::config)
      .def("add_sequence",
           [](Scheduler& s, SeqId seq_id, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& prompt,
              int max_tokens, int min_tokens, bool ignore_eos, std::vector<TokenId> eos_token_ids,
              std::vector<TokenId> stop_token_ids, int priority, uint64_t extra_key) {
             StoppingParams p;
             p.max_tokens = max_tokens;
             p.min_tokens = min_tokens;
             p.ignore_eos = ignore_eos;
             p.eos_token_ids = std::move(eos_token_ids);
             p.stop_token_ids = std::move(stop_token_ids);
             p.priority = priority;
             p.extra_key = extra_key;
             s.add_sequence(seq_id, to_tokens(prompt, "prompt_token_ids"), p);
           },
           py::arg("seq_id"), py::arg("prompt_token_ids"), py::kw_only(), py::arg("max_tokens") = 16,
           py::arg("min_tokens") = 0, py::arg("ignore_eos") = false, py::arg("eos_token_ids") = std::vector<TokenId>{},
           py::arg("stop_token_ids") = std::vector<TokenId>{}, py::arg("priority") = 0, py::arg("extra_key") = 0)
      .def("fork_sequence", &Scheduler::fork_sequence, py::arg("parent_id"), py::arg("child_id"),
           py::arg("last_token_id") = -1)
      .def("append_tokens",
           [](Scheduler& s, SeqId seq_id, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& t) {
             s.append_tokens(seq_id, to_tokens(t, "token_ids"));
           },
           py::arg("seq_id"), py::arg("token_ids"))
      .def("abort_sequence", &Scheduler::abort_sequence, py::arg("seq_id"))
      .def("schedule", &Scheduler::schedule)
      .def("update",
           [](Scheduler& s, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& sampled,
              const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& forks) {
             std::vector<SampleFork> fork_list;
             if (forks && forks->size() > 0) {
               if (forks->ndim() != 2 || forks->shape(1) != 3) {
                 throw std::invalid_argument("forks must be an int array [n, 3] of (parent_id, child_id, token_id)");
               }
               auto f = forks->unchecked<2>();
               for (py::ssize_t i = 0; i < f.shape(0); ++i) {
                 fork_list.push_back(SampleFork{f(i, 0), f(i, 1), static_cast<TokenId>(f(i, 2))});
               }
             }
             return s.update(to_tokens(sampled, "sampled_token_ids"), fork_list);
           },
           py::arg("sampled_token_ids"), py::arg("forks") = py::none())
      .def("cancel_step", &Scheduler::cancel_step)
      .def_property_readonly("step_in_flight", &Scheduler::step_in_flight)
      .def("has_unfinished", &Scheduler::has_unfinished)
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

// ---- kernels: begin (CPU attention / cache kernels; see cpp/kernels/) ----
// Only forwards: python/pagedcore/kernels.py checks the tensors and passes data_ptr() ints, sizes
// and strides; the launchers check indices and return a Status, raised here. The GIL is released
// while a kernel runs.
void raise_if_error(const kernels::Status& status) {
  if (status.code == kernels::Status::kOutOfRange) throw py::index_error(status.message);
  if (status.code != kernels::Status::kOk) throw py::value_error(status.message);
}

kernels::DType to_dtype(int32_t code) {
  if (!kernels::valid_dtype(code)) throw py::value_error("unknown dtype code " + std::to_string(code));
  return static_cast<kernels::DType>(code);
}

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void bind_kernels(py::module_& m) {
  m.def(
      "reshape_and_cache_cpu",
      [](uintptr_t key, uintptr_t value, uintptr_t key_cache, uintptr_t value_cache, uintptr_t slot_mapping,
         int64_t num_tokens, int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t key_stride_token, int64_t key_stride_head, int64_t value_stride_token,
         int64_t value_stride_head, int32_t src_dtype, int32_t cache_dtype) {
        kernels::ReshapeAndCacheParams p;
        p.key = ptr<const void>(key);
        p.value = ptr<const void>(value);
        p.key_cache = ptr<void>(key_cache);
        p.value_cache = ptr<void>(value_cache);
        p.slot_mapping = ptr<const int64_t>(slot_mapping);
        p.num_tokens = num_tokens;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.key_stride_token = key_stride_token;
        p.key_stride_head = key_stride_head;
        p.value_stride_token = value_stride_token;
        p.value_stride_head = value_stride_head;
        p.src_dtype = to_dtype(src_dtype);
        p.cache_dtype = to_dtype(cache_dtype);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::reshape_and_cache(p);
        }
        raise_if_error(status);
      },
      "Raw-pointer entry of pagedcore.kernels.reshape_and_cache (call that instead).");
  m.def(
      "paged_attention_cpu",
      [](uintptr_t out, uintptr_t query, uintptr_t key_cache, uintptr_t value_cache, uintptr_t block_tables,
         uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs, int64_t num_tokens,
         int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t max_blocks_per_seq, int64_t q_stride_token, int64_t q_stride_head,
         int64_t out_stride_token, int64_t out_stride_head, int32_t q_dtype, int32_t cache_dtype,
         double scale, int64_t max_query_len, int64_t max_seq_len) {
        kernels::PagedAttentionParams p;
        p.out = ptr<void>(out);
        p.query = ptr<const void>(query);
        p.key_cache = ptr<const void>(key_cache);
        p.value_cache = ptr<const void>(value_cache);
        p.block_tables = ptr<const int32_t>(block_tables);
        p.seq_lens = ptr<const int32_t>(seq_lens);
        p.query_start_loc = ptr<const int32_t>(query_start_loc);
        p.num_seqs = num_seqs;
        p.num_tokens = num_tokens;
        p.num_heads = num_heads;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.max_blocks_per_seq = max_blocks_per_seq;
        p.q_stride_token = q_stride_token;
        p.q_stride_head = q_stride_head;
        p.out_stride_token = out_stride_token;
        p.out_stride_head = out_stride_head;
        p.q_dtype = to_dtype(q_dtype);
        p.cache_dtype = to_dtype(cache_dtype);
        p.scale = static_cast<float>(scale);
        p.max_query_len = max_query_len;
        p.max_seq_len = max_seq_len;
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::paged_attention(p);
        }
        raise_if_error(status);
      },
      "Raw-pointer entry of pagedcore.kernels.paged_attention (call that instead).");
  m.def(
      "copy_blocks_cpu",
      [](uintptr_t src, uintptr_t dst, uintptr_t block_mapping, int64_t num_pairs, int64_t num_planes,
         int64_t src_num_blocks, int64_t dst_num_blocks, int64_t block_bytes) {
        kernels::CopyBlocksParams p;
        p.src = ptr<const void>(src);
        p.dst = ptr<void>(dst);
        p.block_mapping = ptr<const int32_t>(block_mapping);
        p.num_pairs = num_pairs;
        p.num_planes = num_planes;
        p.src_num_blocks = src_num_blocks;
        p.dst_num_blocks = dst_num_blocks;
        p.block_bytes = block_bytes;
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::copy_blocks(p);
        }
        raise_if_error(status);
      },
      "Raw-pointer entry of pagedcore.kernels.copy_blocks / swap_blocks (call those instead).");
  m.def("kernel_isa", []() { return std::string(kernels::isa_name(kernels::active_isa())); },
        "Instruction set the CPU kernels use: generic, generic16, avx2 or avx512.");
  m.def(
      "set_kernel_isa",
      [](const std::string& name) {
        for (kernels::Isa isa : {kernels::Isa::kGeneric, kernels::Isa::kGeneric16, kernels::Isa::kAvx2,
                                 kernels::Isa::kAvx512}) {
          if (name == kernels::isa_name(isa)) return kernels::set_active_isa(isa);
        }
        throw py::value_error("unknown ISA '" + name + "'; use generic, generic16, avx2 or avx512");
      },
      py::arg("name"), "Selects the kernels' ISA (tests, benchmarks); False if this CPU lacks it.");
  m.def("kernel_threading",
        []() { return std::string(kernels::active_threading() == kernels::Threading::kOpenMP ? "openmp" : "pool"); },
        "How the CPU kernels use threads: openmp (shares torch's runtime) or pool.");
  m.def(
      "set_kernel_threading",
      [](const std::string& name) {
        if (name != "openmp" && name != "pool") throw py::value_error("use 'openmp' or 'pool'");
        kernels::set_active_threading(name == "openmp" ? kernels::Threading::kOpenMP : kernels::Threading::kPool);
      },
      py::arg("name"));
  m.def("kernel_max_threads", &kernels::max_threads, "Threads a CPU kernel call may use.");
  m.def(
      "set_attention_tuning",
      [](int64_t max_tile_rows, int64_t min_partition_keys, int64_t items_per_thread) {
        kernels::set_attention_tuning({max_tile_rows, min_partition_keys, items_per_thread});
      },
      py::arg("max_tile_rows") = 0, py::arg("min_partition_keys") = 0, py::arg("items_per_thread") = 0,
      "Work-planning knobs of paged_attention (tests, benchmarks); 0 restores a default.");
  m.def("advise_huge_pages", &kernels::advise_huge_pages, py::arg("ptr"), py::arg("num_bytes"),
        "madvise(MADV_HUGEPAGE) over the whole 2 MB pages of [ptr, ptr + num_bytes); returns the bytes "
        "advised (0 where not possible). Call before the pages are first touched.");
}
// ---- kernels: end ----

}  // namespace

// ---- linear: begin (linear layers, fused norm / rotary ops; see cpp/kernels/linear.h) ----
#include "kernels/decoder_stack.h"
#include "kernels/linear.h"
#include "kernels/norm.h"

namespace {
// Only forwards, like the kernels region: python/pagedcore/kernels_linear.py checks the tensors.
// LinearHandle keeps a layer's weight-side arguments (built once at load), so a decode call passes
// five integers.
struct LinearHandle {
  kernels::LinearParams params;
  kernels::LinearIsa isa = kernels::LinearIsa::kAuto;

  void run(uintptr_t out, uintptr_t x, int64_t M, int64_t x_stride, int64_t out_stride) const {
    kernels::LinearParams p = params;
    p.out = ptr<void>(out);
    p.x = ptr<const void>(x);
    p.M = M;
    p.x_stride = x_stride;
    p.out_stride = out_stride;
    kernels::Status status;
    {
      py::gil_scoped_release release;
      status = kernels::linear(p, isa);
    }
    raise_if_error(status);
  }
};

kernels::LinearIsa to_linear_isa(int32_t code) {
  if (code < -1 || code > 5) throw py::value_error("unknown linear ISA code " + std::to_string(code));
  return static_cast<kernels::LinearIsa>(code);
}

// Every decoder layer's weight pointers and the model's sizes (pagedcore.layers.decoder_stack
// builds it once at load); run() takes one step's buffers and metadata.
struct DecoderStack {
  std::vector<kernels::DecoderLayerWeights> layers;
  kernels::DecoderStackParams sizes;
  kernels::LinearIsa isa = kernels::LinearIsa::kAuto;
  bool profiling = false;
  std::vector<double> op_seconds = std::vector<double>(kernels::kNumStackOps, 0.0);

  void run(uintptr_t hidden, uintptr_t residual, int64_t num_tokens, uintptr_t cos_sin, uintptr_t kv_cache,
           int32_t cache_dtype, int64_t num_blocks, int64_t block_size, uintptr_t slot_mapping,
           uintptr_t block_tables, uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs,
           int64_t max_blocks_per_seq, int64_t max_query_len, int64_t max_seq_len, int64_t num_actual_tokens) {
    kernels::DecoderStackParams p = sizes;
    p.layers = layers.data();
    p.num_layers = static_cast<int64_t>(layers.size());
    p.hidden = ptr<void>(hidden);
    p.residual = ptr<void>(residual);
    p.num_tokens = num_tokens;
    p.cos_sin = ptr<const void>(cos_sin);
    p.kv_cache = ptr<void>(kv_cache);
    p.cache_dtype = to_dtype(cache_dtype);
    p.num_blocks = num_blocks;
    p.block_size = block_size;
    p.slot_mapping = ptr<const int64_t>(slot_mapping);
    p.block_tables = ptr<const int32_t>(block_tables);
    p.seq_lens = ptr<const int32_t>(seq_lens);
    p.query_start_loc = ptr<const int32_t>(query_start_loc);
    p.num_seqs = num_seqs;
    p.max_blocks_per_seq = max_blocks_per_seq;
    p.max_query_len = max_query_len;
    p.max_seq_len = max_seq_len;
    p.num_actual_tokens = num_actual_tokens;
    p.op_seconds = profiling ? op_seconds.data() : nullptr;
    kernels::Status status;
    {
      py::gil_scoped_release release;
      status = kernels::decoder_stack(p, isa);
    }
    raise_if_error(status);
  }
};

void bind_linear(py::module_& m) {
  py::class_<LinearHandle>(m, "LinearHandle",
                           "Weight-side arguments of one linear layer (pagedcore.kernels_linear builds it).")
      .def(py::init([](uintptr_t weight, uintptr_t bias, int64_t N, int64_t K, int32_t x_dtype, int32_t w_dtype,
                       int32_t bias_dtype, int32_t out_dtype, int32_t epilogue, int32_t isa) {
             if (epilogue != 0 && epilogue != 1) throw py::value_error("unknown epilogue code");
             LinearHandle h;
             h.params.weight = ptr<const void>(weight);
             h.params.bias = ptr<const void>(bias);
             h.params.N = N;
             h.params.K = K;
             h.params.x_dtype = to_dtype(x_dtype);
             h.params.w_dtype = to_dtype(w_dtype);
             h.params.bias_dtype = to_dtype(bias_dtype);
             h.params.out_dtype = to_dtype(out_dtype);
             h.params.epilogue = static_cast<kernels::LinearEpilogue>(epilogue);
             h.isa = to_linear_isa(isa);
             return h;
           }),
           py::arg("weight"), py::arg("bias"), py::arg("N"), py::arg("K"), py::arg("x_dtype"), py::arg("w_dtype"),
           py::arg("bias_dtype"), py::arg("out_dtype"), py::arg("epilogue"), py::arg("isa"))
      .def("__call__", &LinearHandle::run, py::arg("out"), py::arg("x"), py::arg("M"), py::arg("x_stride"),
           py::arg("out_stride"), "out[M, :] = epilogue(x[M, K] . W^T + bias) (raw pointers; checked by the caller).");
  py::class_<DecoderStack>(m, "DecoderStack",
                           "Weight pointers of every decoder layer (pagedcore.layers.decoder_stack builds it).")
      .def(py::init([](const std::vector<std::vector<uintptr_t>>& layer_ptrs, int64_t hidden_size, int64_t num_heads,
                       int64_t num_kv_heads, int64_t head_dim, int64_t intermediate_size, double rms_norm_eps,
                       double attn_scale, int32_t dtype, int32_t isa) {
             DecoderStack s;
             for (const auto& v : layer_ptrs) {
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
             s.isa = to_linear_isa(isa);
             return s;
           }),
           py::arg("layer_ptrs"), py::arg("hidden_size"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("intermediate_size"), py::arg("rms_norm_eps"), py::arg("attn_scale"),
           py::arg("dtype"), py::arg("isa"))
      .def("run", &DecoderStack::run, "One step through every layer (raw pointers; checked by the caller).")
      .def_readwrite("profiling", &DecoderStack::profiling, "Accumulate seconds per op (see profile()).")
      .def(
          "profile",
          [](DecoderStack& s, bool reset) {
            py::dict d;
            for (int op = 0; op < kernels::kNumStackOps; ++op) {
              d[kernels::stack_op_name(op)] = s.op_seconds[op];
              if (reset) s.op_seconds[op] = 0.0;
            }
            return d;
          },
          py::arg("reset") = false, "Seconds per op accumulated while profiling was on.");
  m.def("linear_isa_name", [](int32_t code) { return std::string(kernels::linear_isa_name(to_linear_isa(code))); });
  m.def("linear_isa_supported", [](int32_t code) { return kernels::linear_isa_supported(to_linear_isa(code)); });
  m.def("linear_auto_isa", []() { return static_cast<int32_t>(kernels::linear_auto_isa()); },
        "Code of the linear kernel variant the CPU runs by default.");
  m.def(
      "set_linear_tuning",
      [](int64_t n_chunk, int64_t m_chunk) { kernels::set_linear_tuning({n_chunk, m_chunk}); },
      py::arg("n_chunk") = 0, py::arg("m_chunk") = 0,
      "Task sizes of the linear kernel (tests, benchmarks); 0 restores a default.");
  m.def(
      "rms_norm_cpu",
      [](uintptr_t out, uintptr_t residual, uintptr_t x, uintptr_t weight, int64_t rows, int64_t n,
         int64_t x_stride, int64_t out_stride, int64_t residual_stride, double eps, int32_t dtype, int32_t isa) {
        kernels::RmsNormParams p;
        p.out = ptr<void>(out);
        p.residual = ptr<void>(residual);
        p.x = ptr<const void>(x);
        p.weight = ptr<const void>(weight);
        p.rows = rows;
        p.n = n;
        p.x_stride = x_stride;
        p.out_stride = out_stride;
        p.residual_stride = residual_stride;
        p.eps = static_cast<float>(eps);
        p.dtype = to_dtype(dtype);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::rms_norm(p, to_linear_isa(isa));
        }
        raise_if_error(status);
      },
      "Raw-pointer entry of pagedcore.kernels_linear.rms_norm (call that instead).");
  m.def(
      "rotary_embedding_cpu",
      [](uintptr_t x, uintptr_t cos_sin, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
         int64_t x_stride_token, int64_t x_stride_head, int64_t cos_sin_stride, int32_t dtype, int32_t isa) {
        kernels::RotaryParams p;
        p.x = ptr<void>(x);
        p.cos_sin = ptr<const void>(cos_sin);
        p.num_tokens = num_tokens;
        p.num_heads = num_heads;
        p.head_dim = head_dim;
        p.x_stride_token = x_stride_token;
        p.x_stride_head = x_stride_head;
        p.cos_sin_stride = cos_sin_stride;
        p.dtype = to_dtype(dtype);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::rotary_embedding(p, to_linear_isa(isa));
        }
        raise_if_error(status);
      },
      "Raw-pointer entry of pagedcore.kernels_linear.rotary_embedding (call that instead).");
  m.def(
      "linear_read_probe",
      [](uintptr_t data, int64_t bytes, int threads, int32_t isa) {
        py::gil_scoped_release release;
        return kernels::read_probe(ptr<const void>(data), bytes, threads, to_linear_isa(isa));
      },
      py::arg("data"), py::arg("bytes"), py::arg("threads"), py::arg("isa") = -1,
      "Streams bytes from data on threads threads (the bandwidth probe of bench/bench_decode.py).");
}

}  // namespace
// ---- linear: end ----

// ---- cuda: begin (CUDA kernels and the NCCL communicator; see cuda/) ----
// Only forwards: python/pagedcore/kernels_cuda.py checks the tensors and passes data_ptr() ints,
// sizes, strides and the CUDA stream; the launchers check sizes and return a cudaError_t. Invalid
// arguments raise ValueError (out-of-range block ids IndexError), CUDA errors RuntimeError.
#ifdef PAGEDCORE_HAS_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "cache_kernels_cuda.h"
#include "nccl_communicator.h"
#include "paged_attention_cuda.h"

namespace {

cuda::DType to_cuda_dtype(int32_t code) {
  if (!cuda::valid_dtype(code)) throw py::value_error("unknown CUDA dtype code " + std::to_string(code));
  return static_cast<cuda::DType>(code);
}

template <typename T>
T* device_ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t to_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

void raise_if_cuda_error(cudaError_t status, const char* op) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(op) + " failed: " + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ")");
}

void raise_if_invalid(const std::string& problem, const char* op) {
  if (!problem.empty()) throw py::value_error(std::string(op) + ": " + problem);
}

void bind_cuda(py::module_& m) {
  m.def(
      "reshape_and_cache_cuda",
      [](uintptr_t key, uintptr_t value, uintptr_t key_cache, uintptr_t value_cache, uintptr_t slot_mapping,
         int64_t num_tokens, int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t key_stride_token, int64_t key_stride_head, int64_t value_stride_token, int64_t value_stride_head,
         int32_t src_dtype, int32_t cache_dtype, uintptr_t stream) {
        cuda::ReshapeAndCacheParams p;
        p.key = device_ptr<const void>(key);
        p.value = device_ptr<const void>(value);
        p.key_cache = device_ptr<void>(key_cache);
        p.value_cache = device_ptr<void>(value_cache);
        p.slot_mapping = device_ptr<const int64_t>(slot_mapping);
        p.num_tokens = num_tokens;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.key_stride_token = key_stride_token;
        p.key_stride_head = key_stride_head;
        p.value_stride_token = value_stride_token;
        p.value_stride_head = value_stride_head;
        p.src_dtype = to_cuda_dtype(src_dtype);
        p.cache_dtype = to_cuda_dtype(cache_dtype);
        p.stream = to_stream(stream);
        raise_if_invalid(cuda::check_reshape_and_cache(p), "reshape_and_cache");
        raise_if_cuda_error(cuda::reshape_and_cache(p), "reshape_and_cache");
      },
      "Raw-pointer entry of pagedcore.kernels_cuda.reshape_and_cache (call that instead).");
  m.def(
      "paged_attention_cuda",
      [](uintptr_t out, uintptr_t query, uintptr_t key_cache, uintptr_t value_cache, uintptr_t block_tables,
         uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs, int64_t num_tokens, int64_t num_heads,
         int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t max_blocks_per_seq, int64_t q_stride_token, int64_t q_stride_head, int64_t out_stride_token,
         int64_t out_stride_head, int32_t q_dtype, int32_t cache_dtype, double scale, int64_t max_query_len,
         int64_t max_seq_len, uintptr_t workspace, int64_t workspace_bytes, uintptr_t stream,
         int64_t partition_size, int32_t prefill_impl, int32_t decode_impl) -> int64_t {
        cuda::PagedAttentionParams p;
        p.out = device_ptr<void>(out);
        p.query = device_ptr<const void>(query);
        p.key_cache = device_ptr<const void>(key_cache);
        p.value_cache = device_ptr<const void>(value_cache);
        p.block_tables = device_ptr<const int32_t>(block_tables);
        p.seq_lens = device_ptr<const int32_t>(seq_lens);
        p.query_start_loc = device_ptr<const int32_t>(query_start_loc);
        p.num_seqs = num_seqs;
        p.num_tokens = num_tokens;
        p.num_heads = num_heads;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.max_blocks_per_seq = max_blocks_per_seq;
        p.q_stride_token = q_stride_token;
        p.q_stride_head = q_stride_head;
        p.out_stride_token = out_stride_token;
        p.out_stride_head = out_stride_head;
        p.q_dtype = to_cuda_dtype(q_dtype);
        p.cache_dtype = to_cuda_dtype(cache_dtype);
        p.scale = static_cast<float>(scale);
        p.max_query_len = max_query_len;
        p.max_seq_len = max_seq_len;
        p.workspace = device_ptr<void>(workspace);
        p.workspace_bytes = workspace_bytes;
        p.stream = to_stream(stream);
        p.tuning.partition_size = partition_size;
        p.tuning.prefill = prefill_impl;
        p.tuning.decode = decode_impl;
        raise_if_invalid(cuda::check_paged_attention(p), "paged_attention");
        const int64_t needed = cuda::paged_attention_workspace_bytes(p);
        if (needed > workspace_bytes || (needed > 0 && workspace == 0)) return needed;  // nothing launched
        raise_if_cuda_error(cuda::paged_attention(p), "paged_attention");
        return 0;
      },
      "Raw-pointer entry of pagedcore.kernels_cuda.paged_attention (call that instead). Returns 0 once "
      "launched, or the workspace bytes the call needs (nothing launched) when the given one is smaller.");
  m.def(
      "copy_blocks_cuda",
      [](uintptr_t kv_cache, uintptr_t block_mapping, uintptr_t block_mapping_host, int64_t num_pairs,
         int64_t num_planes, int64_t num_blocks, int64_t block_bytes, uintptr_t stream) {
        const int32_t* host_rows = device_ptr<const int32_t>(block_mapping_host);
        if (host_rows != nullptr) {
          const std::string problem = cuda::check_block_mapping(host_rows, num_pairs, num_blocks, num_blocks);
          if (!problem.empty()) throw py::index_error("copy_blocks: " + problem);
        }
        cuda::CopyBlocksParams p;
        p.src = device_ptr<const void>(kv_cache);
        p.dst = device_ptr<void>(kv_cache);
        p.block_mapping = device_ptr<const int32_t>(block_mapping);
        p.block_mapping_host = host_rows;
        p.num_pairs = num_pairs;
        p.num_planes = num_planes;
        p.src_num_blocks = num_blocks;
        p.dst_num_blocks = num_blocks;
        p.block_bytes = block_bytes;
        p.stream = to_stream(stream);
        raise_if_cuda_error(cuda::copy_blocks(p), "copy_blocks");
      },
      "Raw-pointer entry of pagedcore.kernels_cuda.copy_blocks (call that instead).");
  m.def(
      "swap_blocks_cuda",
      [](uintptr_t src, uintptr_t dst, uintptr_t block_mapping_host, int64_t num_pairs, int64_t num_planes,
         int64_t src_num_blocks, int64_t dst_num_blocks, int64_t block_bytes, uintptr_t stream) {
        const int32_t* host_rows = device_ptr<const int32_t>(block_mapping_host);
        const std::string problem = cuda::check_block_mapping(host_rows, num_pairs, src_num_blocks, dst_num_blocks);
        if (!problem.empty()) throw py::index_error("swap_blocks: " + problem);
        cuda::CopyBlocksParams p;
        p.src = device_ptr<const void>(src);
        p.dst = device_ptr<void>(dst);
        p.block_mapping = host_rows;
        p.num_pairs = num_pairs;
        p.num_planes = num_planes;
        p.src_num_blocks = src_num_blocks;
        p.dst_num_blocks = dst_num_blocks;
        p.block_bytes = block_bytes;
        p.stream = to_stream(stream);
        cudaError_t status;
        {
          py::gil_scoped_release release;  // a copy from pageable host memory returns only once staged
          status = cuda::swap_blocks(p);
        }
        raise_if_cuda_error(status, "swap_blocks");
      },
      "Raw-pointer entry of pagedcore.kernels_cuda.swap_blocks (call that instead).");

  py::class_<cuda::NcclCommunicator>(m, "NcclCommunicator",
                                     "One rank of an NCCL group (libnccl.so.2 loaded at run time). "
                                     "pagedcore.kernels_cuda.NcclCommunicator wraps it for tensors.")
      .def(py::init([](int world_size, int rank, const py::bytes& unique_id, int device, const std::string& library) {
             const std::string id = unique_id;
             if (id.size() != cuda::kNcclUniqueIdBytes) {
               throw py::value_error("unique_id must be the " + std::to_string(cuda::kNcclUniqueIdBytes) +
                                     " bytes of NcclCommunicator.get_unique_id(), got " + std::to_string(id.size()));
             }
             cuda::NcclUniqueId raw;
             std::copy(id.begin(), id.end(), raw.begin());
             py::gil_scoped_release release;  // blocks until every rank has joined
             return std::make_unique<cuda::NcclCommunicator>(world_size, rank, raw, device, library);
           }),
           py::arg("world_size"), py::arg("rank"), py::arg("unique_id"), py::arg("device"),
           py::arg("library_path") = "")
      .def_static(
          "get_unique_id",
          [](const std::string& library) {
            const cuda::NcclUniqueId id = cuda::NcclCommunicator::unique_id(library);
            return py::bytes(id.data(), id.size());
          },
          py::arg("library_path") = "", "A new group id (rank 0 makes it and sends it to the others).")
      .def_static("nccl_version", &cuda::NcclCommunicator::version, py::arg("library_path") = "")
      .def(
          "all_reduce",
          [](cuda::NcclCommunicator& c, uintptr_t send, uintptr_t recv, size_t count, int32_t dtype,
             uintptr_t stream) {
            const cuda::DType t = to_cuda_dtype(dtype);
            py::gil_scoped_release release;
            c.all_reduce(device_ptr<const void>(send), device_ptr<void>(recv), count, t, to_stream(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("stream"),
          "Sum over ranks on `stream` (pointers as ints; recv may equal send).")
      .def("destroy", &cuda::NcclCommunicator::destroy)
      .def_property_readonly("world_size", &cuda::NcclCommunicator::world_size)
      .def_property_readonly("rank", &cuda::NcclCommunicator::rank)
      .def_property_readonly("device", &cuda::NcclCommunicator::device)
      .def_property_readonly("destroyed", &cuda::NcclCommunicator::destroyed);
}

}  // namespace
#endif  // PAGEDCORE_HAS_CUDA
// ---- cuda: end ----

PYBIND11_MODULE(_core, m) {
  m.doc() = "pagedcore C++ core: block pool, scheduler and CPU kernels";
#ifdef PAGEDCORE_HAS_CUDA
  m.attr("has_cuda") = true;
  m.def("cuda_device_count", &cuda::device_count, "Visible CUDA devices (0 without a driver or GPU).");
  bind_cuda(m);
#else
  m.def("cuda_device_count", []() { return 0; }, "Visible CUDA devices (0: built without CUDA).");
  m.attr("has_cuda") = false;
#endif
  m.attr("NULL_BLOCK") = kNullBlock;
  m.attr("PAD_SLOT") = kPadSlot;
  bind_block_pool(m);
  bind_scheduler(m);
  bind_kernels(m);
  bind_linear(m);
}
