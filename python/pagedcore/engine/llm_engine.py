"""LLMEngine: add / step / abort around the C++ scheduler, a worker and the sampler.

One step:  scheduler.schedule() -> worker.execute_step() -> sampler -> scheduler.update() -> outputs.
Request state lives in a RequestRegistry; readers (servers, benchmarks, the trace recorder) use
`engine.view`. Not thread-safe: one thread drives it (the async engine serialises adds and aborts
onto that thread).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence

import numpy as np
import torch

from pagedcore import _core
from pagedcore.config import EngineConfig
from pagedcore.distributed.parallel_config import executor_backend, machine_kv_cache_spec, parallel_layout
from pagedcore.engine import host_memory
from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.fused_step import fused_step
from pagedcore.engine.beam_search import BeamSearch
from pagedcore.engine.fault_injection import FaultInjector
from pagedcore.engine.multi_step import MultiStep
from pagedcore.engine.output_processor import OutputProcessor
from pagedcore.engine.request_registry import RequestRegistry
from pagedcore.engine.request_state import OUTPUT_KINDS
from pagedcore.engine.step_input import StepInput
from pagedcore.engine.thread_team import make_thread_team
from pagedcore.engine.view import EngineView
from pagedcore.engine.worker import InProcessWorker
from pagedcore.layers.linear_quant import BLOCK_METHODS, QUANT_LINEAR_METHODS
from pagedcore.outputs import RequestMetrics, RequestOutput
from pagedcore.sampling.sampler import Sampler
from pagedcore.sampling_params import BeamSearchParams, SamplingParams
from pagedcore.spec_decode import draft_setup
from pagedcore.spec_decode.speculator import Speculator
from pagedcore.spec_decode.stats import step_record as spec_step_record
from pagedcore.structured_output.compiler import GrammarCache

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, loaded=None):
        self.config = config = config or EngineConfig()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)  # the generator of every unseeded sampling row
        t0 = time.perf_counter()
        executor = None   # tp * pp > 1 (or an explicit backend): the model runs in worker ranks (distributed/)
        if executor_backend(config) is not None:
            if loaded is not None:
                raise ValueError("a model loaded in this process runs here: pass loaded=None (the ranks load "
                                 "their shards) or use tensor_parallel_size = pipeline_parallel_size = 1")
            loaded, executor = _start_executor(config)
        elif loaded is None:
            from pagedcore.loader import load_model

            loaded = load_model(config.model, dtype=config.dtype, quantization=config.quantization)
        try:
            self._init(config, loaded, executor, t0)
        except BaseException:
            if executor is not None:
                executor.shutdown()
            raise

    def _init(self, config: EngineConfig, loaded, executor, t0: float) -> None:
        if config.device != "cpu" and loaded.weight_format in QUANT_LINEAR_METHODS:
            raise ValueError(f"the model's linear layers are kept quantized ({loaded.weight_format}), and those "
                             f"kernels run on the CPU only; use --device cpu (a GGUF can be dequantised for the "
                             f"GPU with --dtype float32; GPTQ / AWQ / compressed-tensors checkpoints run on the CPU)")
        self.loaded = loaded
        self.model_config = mc = loaded.config
        # "auto" -> the model's activation dtype; the KV cache's too, but for blocks as stored in this process
        # (a GGUF, or a GPTQ / AWQ checkpoint in Q4 blocks).
        as_stored = loaded.weight_format in BLOCK_METHODS and executor is None and config.device == "cpu"
        config.resolve_dtype(mc.dtype, "bfloat16" if as_stored else None)
        self.tokenizer = loaded.tokenizer
        config.resolve_lengths(mc.max_position_embeddings)
        self.eos_token_ids = list(mc.eos_token_ids)

        spec = kvc.KVCacheSpec.of(mc, config.block_size, config.kv_cache_dtype)
        on_gpu = torch.device(config.device).type == "cuda"
        if executor is not None:
            # One block id costs every rank its shard of the block: size the pool by the machine's bytes.
            spec = machine_kv_cache_spec(mc, parallel_layout(config), config.block_size, config.dtype)
            t_weights = time.perf_counter()
            executor.load_model()
            loaded.load_seconds["weights"] = time.perf_counter() - t_weights
        self.worker = worker = executor or InProcessWorker(loaded.model, config.device)
        if executor is None:
            worker.load_model()
        # Speculation's draft_model / layer_skip draft (None otherwise): its KV shares the block ids.
        self.draft = draft_setup.build_draft(config, loaded, spec, in_process=executor is None)
        budget = None
        if config.num_gpu_blocks_override:
            num_blocks = config.num_gpu_blocks_override
        elif on_gpu and executor is not None:   # CUDA ranks: each profiles its own GPU, the fewest blocks win
            num_blocks = executor.profile_num_blocks(kvc.ProfileShape.largest_step(config))
            budget = num_blocks * spec.bytes_per_block
        elif on_gpu:
            shape = kvc.ProfileShape.largest_step(config)
            profile = worker.profile_memory(spec, shape)
            budget = kvc.gpu_kv_cache_budget(config, profile.total_bytes, profile.peak_bytes, shape)
        else:
            budget = (kvc.cpu_kv_cache_budget(config, spec) if self.draft is None
                      else draft_setup.cpu_kv_cache_budget(config, self.draft, spec))
        if budget is not None:
            num_blocks = (kvc.num_blocks_for(spec, budget) if self.draft is None
                          else draft_setup.num_blocks_for(self.draft, spec, budget))
            if num_blocks * config.block_size < config.max_model_len:
                raise ValueError(
                    f"the KV cache holds {num_blocks * config.block_size} tokens, fewer than max_model_len "
                    f"({config.max_model_len}); give it more memory (--kv-cache-memory) or lower --max-model-len")
        num_cpu_blocks = 0
        if config.preemption_mode == "swap":
            swap = kvc.parse_memory_size(config.swap_space)
            swap_bytes = int(swap * kvc.available_memory_bytes()) if isinstance(swap, float) else swap
            num_cpu_blocks = (kvc.num_blocks_for(spec, swap_bytes) if self.draft is None
                              else draft_setup.num_cpu_blocks_for(self.draft, spec, swap_bytes))
        self.kv_cache_spec = spec
        self.kv_cache_description = kvc.describe(spec, num_blocks, budget)
        if self.draft is not None:
            self.kv_cache_description += "; " + self.draft.describe(num_blocks)
        logger.info(self.kv_cache_description)
        worker.init_kv_cache(spec, num_blocks + (self.draft.extra_target_blocks if self.draft else 0), num_cpu_blocks,
                             background_commit=config.kv_cache_commit == "background")
        if executor is not None:
            loaded.weight_bytes = {loaded.weight_format: executor.memory_report().weight_bytes}

        self.scheduler = _core.Scheduler(_core.SchedulerConfig(
            num_gpu_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks, block_size=config.block_size,
            max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len, enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill,
            preemption_mode=(_core.PreemptionMode.SWAP if config.preemption_mode == "swap"
                             else _core.PreemptionMode.RECOMPUTE),
            policy=(_core.SchedulingPolicy.PRIORITY if config.scheduling_policy == "priority"
                    else _core.SchedulingPolicy.FCFS),
            enable_trace=config.enable_trace, max_loras=config.max_loras if config.enable_lora else 0))
        self.sampler = Sampler()
        # Structured output: constraints compile here (front ends first, to refuse bad ones with a 400).
        self.grammars = GrammarCache(self.tokenizer, mc.vocab_size, self.eos_token_ids)
        self.registry = RequestRegistry(self.tokenizer, config.device)
        self.lora_manager = None  # multi-LoRA (pagedcore.lora): adapters, their slots, each step's adapter rows
        if config.enable_lora:
            from pagedcore.lora import LoRAManager

            self.lora_manager = LoRAManager(
                loaded.model, max_loras=config.max_loras, max_lora_rank=config.max_lora_rank,
                max_cpu_loras=config.max_cpu_loras, is_request_live=lambda request_id: request_id in self.registry)
            worker.runner.lora_manager = self.lora_manager
        self.output_processor = OutputProcessor(self.registry, self.scheduler, self.sampler, self.tokenizer,
                                                mc.vocab_size, self.eos_token_ids)
        self._prompt_logprob_salts = itertools.count(1)
        self.step_listeners = []      # callables(out, result, timing) after each step (tracer, probes)
        self.last_step_timing: dict | None = None
        self.fault_injector = FaultInjector.from_env()   # a test hook; None unless PAGEDCORE_FAULT_INJECTION
        # Threads sized to the cores other processes leave free (engine/thread_team.py); None: off.
        self.thread_team = make_thread_team(config.device, config.num_threads) if executor is None else None
        self.speculator = None   # speculative decoding (spec_decode/): drafts proposed after each step
        if config.speculative_config is not None:
            if self.draft is not None:
                self.draft.bind(worker.runner.kv_cache, num_blocks, num_cpu_blocks, self.scheduler)
            self.speculator = Speculator(config.speculative_config, self.scheduler, self.output_processor,
                                         config.max_model_len, config.max_num_batched_tokens, draft=self.draft)
        # vLLM's num_scheduler_steps: plain decodes run up to N tokens a step in one call (engine/multi_step.py).
        self.multi_step = None
        if config.num_scheduler_steps > 1:
            self.multi_step = MultiStep(config.num_scheduler_steps, self.scheduler, worker, config.block_size,
                                        config.max_model_len, config.max_num_batched_tokens, mc.vocab_size,
                                        self.eos_token_ids)
            if not worker.can_multi_step():
                logger.warning("num_scheduler_steps=%d: this model and worker have no one-call decode path "
                               "(a GPU, LoRA, a parallel model or a layer the C++ stack does not run); every "
                               "step runs one token", config.num_scheduler_steps)
        # Beam-search requests (BeamSearchParams): decided per step over their beams' logits rows.
        self.beam_search = BeamSearch(self.registry, self.scheduler, self.tokenizer, self.eos_token_ids,
                                      mc.vocab_size, config.max_num_seqs, config.max_model_len,
                                      speculative=self.speculator is not None)
        self.view = EngineView(self)
        self.startup_seconds = time.perf_counter() - t0

    def shutdown(self) -> None:
        """Stops the worker ranks of a parallel model (nothing to do in one process). Idempotent."""
        shutdown = getattr(self.worker, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def wait_for_kv_commit(self, timeout: float | None = None) -> bool:
        """Waits until this process's KV cache memory is resident (kv_cache_commit="background" commits it on
        a thread: engine/host_memory.py). True when no commit is left running."""
        return host_memory.wait_for_background_commits(timeout)

    def memory_report(self):
        """The worker's MemoryReport, with a draft model's weights and KV (speculative decoding) filled in."""
        report = self.worker.memory_report()
        return report if self.draft is None else self.draft.add_to(report)

    def check_health(self) -> None:
        """Raises (WorkerDiedError) if a worker rank of a parallel model is gone; cheap (no step runs)."""
        check = getattr(self.worker, "check_health", None)
        if check is not None:
            check()

    # -- requests ----------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None, params: SamplingParams | None = None,
                    prompt_token_ids: Sequence[int] | None = None, arrival_time: float | None = None,
                    priority: int = 0, output_kind: str = "cumulative", lora_request=None) -> None:
        """Queues one request. Raises ValueError, naming the fix, for anything that could never run.
        lora_request: a pagedcore.lora.LoRARequest to run the request under that adapter."""
        params = params or SamplingParams()
        if request_id in self.registry:
            raise ValueError(f"request id {request_id!r} is already in use")
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("give a prompt or prompt_token_ids")
            prompt_token_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        prompt_token_ids = [int(t) for t in prompt_token_ids]
        beam_params = None   # beam search: its sequences run as greedy ones, the beam stage decides
        if isinstance(params, BeamSearchParams):
            beam_params, params = params, self.beam_search.sampling_params(params, len(prompt_token_ids),
                                                                           lora_request)
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        if params.prompt_logprobs == -1:   # vLLM's "the whole vocabulary"; a copy: params may be shared
            params = dataclasses.replace(params, prompt_logprobs=vocab)
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(params, name)
            if n is not None and n > self.config.max_logprobs:
                raise ValueError(f"{name}={n} exceeds the server's max_logprobs ({self.config.max_logprobs})")
        max_model_len = self.config.max_model_len
        if len(prompt_token_ids) >= max_model_len:
            raise ValueError(f"prompt has {len(prompt_token_ids)} tokens but max_model_len is {max_model_len}, "
                             f"which leaves no room to generate; shorten the prompt or raise --max-model-len")
        max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - len(prompt_token_ids)
        # Compiled before anything is queued (a bad constraint raises ValueError); cached by constraint.
        grammar = self.grammars.compile(params.structured_outputs) if params.structured_outputs else None
        now = time.time()
        metrics = RequestMetrics(arrival_time=arrival_time if arrival_time is not None else now, num_samples=params.n)
        adapter_id = 0
        if lora_request is not None:  # loads (or finds) the adapter and pins it; raises before anything is queued
            if self.lora_manager is None:
                raise ValueError(f"request {request_id!r} names LoRA adapter {lora_request.lora_name!r} but LoRA is "
                                 "off; start the engine with enable_lora=True (--enable-lora)")
            adapter_id = self.lora_manager.acquire(lora_request, request_id)
        req = self.registry.new_request(request_id, prompt, prompt_token_ids, params, metrics, output_kind,
                                        grammar=grammar)
        seq = req.seqs[0]
        # A request that wants prompt logprobs must compute every prompt row: a salt keeps it off the cache.
        cache_salt = next(self._prompt_logprob_salts) if params.prompt_logprobs is not None else 0
        eos = [] if params.ignore_eos else self.eos_token_ids
        self.scheduler.add_sequence(
            seq.seq_id, np.asarray(prompt_token_ids, dtype=np.int64), max_tokens=max_tokens,
            min_tokens=params.min_tokens, ignore_eos=params.ignore_eos, eos_token_ids=eos,
            stop_token_ids=params.stop_token_ids or [], priority=priority, cache_salt=cache_salt,
            adapter_id=adapter_id)
        self.registry.add(req)
        if beam_params is not None:
            self.beam_search.track(req, beam_params, priority)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Ends a request at once and frees its blocks; returns its final output (None if unknown)."""
        req = self.registry.abort(request_id)
        if req is None:
            return None
        self.beam_search.forget(request_id)
        for seq in req.seqs:
            self.scheduler.abort_sequence(seq.seq_id)
        req.metrics.on_finished(time.time())
        return req.make_output()

    def has_unfinished_requests(self) -> bool:
        return len(self.registry) > 0

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.registry)

    # -- the step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Runs one scheduler step and returns outputs of requests that changed (finished ones for
        output_kind 'final')."""
        try:
            with torch.inference_mode():
                return self._step()
        except BaseException:
            self.scheduler.cancel_step()   # nothing advanced; the caller decides what to fail
            raise

    def _step(self) -> list[RequestOutput]:
        if self.thread_team is not None:
            self.thread_team.on_step()
        t_start = time.perf_counter()
        if self.multi_step is not None:
            self.multi_step.before_schedule()   # placeholders only where the step can run in one call
        out = self.scheduler.schedule()
        self.output_processor.mark_scheduled(out, time.time())
        t_scheduled = time.perf_counter()
        extra_rows = self.output_processor.prompt_logprob_rows(out)
        step_input = StepInput.from_scheduler_output(out, extra_rows)
        self.output_processor.start_grammar_masks(out)   # structured output: masks fill during the forward
        rows = self.registry.seqs_of(out.sample_seq_ids.tolist())
        # Each sampled row's own distribution (or argmax) alone decides: the worker may run the step and
        # the sampling in one C++ call (models/greedy_decode.py); None when it does not, having run nothing.
        multi = None   # a multi-step's (result, process_rows, tokens): several decode steps in one call
        if self.multi_step is not None and out.num_draft_tokens and extra_rows is None:
            multi = self.multi_step.run(out, step_input, rows)
        fused_tokens = (fused_step(self, step_input, rows) if extra_rows is None and not out.num_draft_tokens
                        else None)
        logits = self.worker.execute_step(step_input) if fused_tokens is None and multi is None else None
        if self.speculator is not None:
            self.speculator.observe_step(step_input, out)   # a draft model runs the same rows (no logits)
        if self.fault_injector is not None:
            self.fault_injector.on_step()
        t_forward = time.perf_counter()
        num_samples = len(out.sample_seq_ids)
        beam_step = None
        if multi is not None:
            result, process_rows, sampled, sampler_output = multi
            t_sampled = time.perf_counter()
        elif fused_tokens is not None:
            (sampled, sampler_output), process_rows = fused_tokens, rows
            t_sampled = time.perf_counter()
            result = self.scheduler.update(sampled, None)
        elif out.num_draft_tokens and self.multi_step is not None:  # placeholders the one call did not take
            num_samples = len(out.logits_indices)
            result, process_rows, sampled, sampler_output = self.multi_step.verify(out, logits[:num_samples], rows)
            t_sampled = time.perf_counter()
        elif out.num_draft_tokens:  # speculative decoding: K + 1 rows per drafting sequence (spec_decode/)
            num_samples = len(out.logits_indices)   # prompt-logprob rows follow every sample's rows
            result, process_rows, sampled, sampler_output = self.speculator.verify_step(
                out, logits[:num_samples], rows)
            t_sampled = time.perf_counter()
        else:
            sample_logits = logits[:num_samples]
            # Beam-search rows: the beam stage picks their tokens and forks (engine/beam_search.py).
            beam_step = self.beam_search.begin_step(rows, sample_logits)
            if beam_step is not None:
                rows, sample_logits = beam_step.other_rows, beam_step.other_logits
            # n > 1: the first sample of such a request draws its row n times, once per child.
            fork_rows, forks = self.output_processor.expand_forks(rows)
            sampled, sampler_output, _ = self.output_processor.sample(sample_logits, rows, fork_rows)
            t_sampled = time.perf_counter()
            fork_array = None
            if forks:
                fork_array = np.array([(p, c.seq_id, int(sampled[len(rows) + i]))
                                       for i, (p, c) in enumerate(forks)], dtype=np.int64)
            update_tokens = sampled[:len(rows)]
            if beam_step is not None:
                update_tokens, fork_array = beam_step.merge(update_tokens, fork_array)
            result = self.scheduler.update(update_tokens, fork_array)
            process_rows = rows + fork_rows
        if extra_rows is not None:
            self.output_processor.record_prompt_logprobs(out, logits[num_samples:])
        outputs = self.output_processor.process(out, process_rows, sampled, sampler_output, result)
        if beam_step is not None:
            outputs += beam_step.finish()
        if self.speculator is not None:  # drafts for the next step
            self.speculator.propose(process_rows, len(self.registry))
        if self.multi_step is not None:  # placeholders for the next step's slots
            self.multi_step.append_placeholders(process_rows, allowed=len(self.beam_search) == 0)
        t_end = time.perf_counter()
        self.last_step_timing = {
            "schedule": t_scheduled - t_start, "forward": t_forward - t_scheduled,
            "sample": t_sampled - t_forward, "update_and_outputs": t_end - t_sampled,
            "total": t_end - t_start, "num_tokens": out.num_tokens, "num_seqs": out.num_seqs,
            "num_prefill_tokens": out.num_prefill_tokens, "num_decode_tokens": out.num_decode_tokens,
            **spec_step_record(self.speculator and self.speculator.stats, out),
        }
        for listener in self.step_listeners:
            listener(out, result, self.last_step_timing)
        return outputs


def _start_executor(config: EngineConfig):
    """The driver of a parallel model: config and tokenizer only (no weights), every start-up check
    that can fail before a weight loads, then the ranks. Returns (LoadedModel without a model, executor)."""
    from pagedcore.distributed.executor import make_executor
    from pagedcore.distributed.model_metadata import load_model_metadata
    from pagedcore.distributed.parallel_config import check_parallel_config

    loaded, _ = load_model_metadata(config.model, dtype=config.dtype, quantization=config.quantization)
    check_parallel_config(config, loaded.config)
    # Spawned before config.dtype resolves: the ranks' loaders read --dtype as given ("auto" keeps GGUF blocks).
    return loaded, make_executor(config, loaded.config)
