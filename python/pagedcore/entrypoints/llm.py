"""The offline API: `LLM(model).generate(prompts, SamplingParams(...))`, shaped like vLLM's."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from pagedcore.config import EngineConfig
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.outputs import BeamSearchOutput, BeamSearchSequence, RequestOutput
from pagedcore.sampling_params import BeamSearchParams, SamplingParams

PromptType = str | Sequence[int] | dict[str, Any]


def _make_engine(config: EngineConfig):
    """An LLMEngine, or with data_parallel_size > 1 the replicas behind the same calls (distributed/dp_offline.py)."""
    if config.data_parallel_size > 1:
        from pagedcore.distributed.dp_offline import DPLLMEngine

        return DPLLMEngine(config)
    return LLMEngine(config)


class LLM:
    """An engine for offline batched generation.

    model: an HF folder or a .gguf file; None loads the bundled SmolLM2-135M-Instruct.
    Every EngineConfig field is a keyword: dtype, max_num_seqs, max_num_batched_tokens,
    max_model_len, block_size, enable_prefix_caching, kv_cache_memory, preemption_mode, ...
    """

    def __init__(self, model: str | None = None, **engine_options):
        self.llm_engine = _make_engine(EngineConfig(model=model, **engine_options))
        self._request_ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.llm_engine = _make_engine(config)
        llm._request_ids = itertools.count()
        return llm

    def get_tokenizer(self):
        return self.llm_engine.view.tokenizer

    def shutdown(self) -> None:
        """Stops the worker ranks of a parallel model (tensor_parallel_size / pipeline_parallel_size > 1).
        They also stop when the LLM is garbage-collected or the interpreter exits. Idempotent."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(self, prompts: PromptType | Sequence[PromptType] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request=None) -> list[RequestOutput]:
        """Generates for every prompt, all batched together; outputs come back in prompt order.

        A prompt is a string, a list of token ids, or {"prompt": str} / {"prompt_token_ids": [...]}.
        sampling_params: one for all prompts, or one per prompt. lora_request (LLM(enable_lora=True)):
        a pagedcore.lora.LoRARequest for every prompt, or a list with one per prompt (None: base model).
        """
        items = self._normalise_prompts(prompts, prompt_token_ids)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(items)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(items):
                raise ValueError(f"got {len(params_list)} SamplingParams for {len(items)} prompts; "
                                 "give one, or one per prompt")
        if priority is not None and len(priority) != len(items):
            raise ValueError(f"got {len(priority)} priorities for {len(items)} prompts")
        lora_list = (list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * len(items))
        if len(lora_list) != len(items):
            raise ValueError(f"got {len(lora_list)} lora_requests for {len(items)} prompts; give one, or one per prompt")
        engine = self.llm_engine
        ids = []
        try:
            for i, ((text, token_ids), params) in enumerate(zip(items, params_list)):
                request_id = str(next(self._request_ids))
                engine.add_request(request_id, prompt=text, params=params, prompt_token_ids=token_ids,
                                   priority=0 if priority is None else priority[i], output_kind="final",
                                   lora_request=lora_list[i])
                ids.append(request_id)
        except Exception:
            for request_id in ids:  # a bad prompt in the batch leaves nothing half-queued
                engine.abort_request(request_id)
            raise
        return self._run(ids, use_tqdm)

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
                    lora_request=None, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """The params.beam_width best beams of every prompt, best first, as HF transformers'
        generate(num_beams=W, num_return_sequences=W, do_sample=False) returns them (docs/beam-search.md).
        concurrency_limit: prompts searched at once (None: all)."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        if lora_request is not None:
            raise ValueError("lora_request is not supported by beam_search; drop it")
        if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or
                                              not isinstance(concurrency_limit, int) or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be None or an integer >= 1, got {concurrency_limit!r}")
        items = self._normalise_prompts(prompts, None)
        chunk = concurrency_limit or max(len(items), 1)
        tokenizer = self.get_tokenizer()
        results = []
        for start in range(0, len(items), chunk):
            ids = []
            try:
                for text, token_ids in items[start:start + chunk]:
                    request_id = str(next(self._request_ids))
                    self.llm_engine.add_request(request_id, prompt=text, params=params, prompt_token_ids=token_ids,
                                                output_kind="final")
                    ids.append(request_id)
            except Exception:
                for request_id in ids:
                    self.llm_engine.abort_request(request_id)
                raise
            for out in self._run(ids, use_tqdm):
                results.append(BeamSearchOutput([BeamSearchSequence(
                    tokens=out.prompt_token_ids + c.token_ids,
                    logprobs=list(c.logprobs or []),
                    cum_logprob=c.cumulative_logprob,
                    text=None if tokenizer is None else tokenizer.decode(out.prompt_token_ids + c.token_ids,
                                                                         skip_special_tokens=True),
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason) for c in out.outputs]))
        return results

    def chat(self, messages: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """Generates replies to one conversation (a list of {"role", "content"}) or to several."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.apply_chat_template(c, chat_template, add_generation_prompt) for c in conversations]
        return self.generate([{"prompt_token_ids": p} for p in prompts], sampling_params, use_tqdm=use_tqdm)

    def apply_chat_template(self, conversation, chat_template: str | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        tokenizer = self.get_tokenizer()
        template = chat_template or self.llm_engine.view.chat_template or getattr(tokenizer, "chat_template", None)
        if template is None:
            raise ValueError("this model has no chat template; pass chat_template=... (a Jinja template)")
        text = tokenizer.apply_chat_template(list(conversation), chat_template=template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
        # The template writes the special tokens itself (BOS, role markers): do not add them twice.
        return tokenizer.encode(text, add_special_tokens=False)

    def _normalise_prompts(self, prompts, prompt_token_ids) -> list[tuple[str | None, list[int] | None]]:
        if prompt_token_ids is not None:
            if prompts is not None:
                raise ValueError("give prompts or prompt_token_ids, not both")
            return [(None, list(p)) for p in prompt_token_ids]
        if prompts is None:
            raise ValueError("give at least one prompt")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, Sequence) and prompts and
                                                isinstance(prompts[0], int)):
            prompts = [prompts]
        items = []
        for p in prompts:
            if isinstance(p, str):
                items.append((p, None))
            elif isinstance(p, dict):
                if "prompt_token_ids" in p:
                    items.append((p.get("prompt"), list(p["prompt_token_ids"])))
                elif "prompt" in p:
                    items.append((p["prompt"], None))
                else:
                    raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
            elif isinstance(p, Sequence):
                items.append((None, list(p)))
            else:
                raise ValueError(f"a prompt is a string, a list of token ids or a dict, got {type(p).__name__}")
        return items

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        pending = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        num_generated = 0
        try:
            while pending:
                for output in engine.step():
                    if output.finished and output.request_id in pending:
                        pending.discard(output.request_id)
                        finished[output.request_id] = output
                        num_generated += sum(len(o.token_ids) for o in output.outputs)
                        bar.update(1)
                        if use_tqdm:
                            bar.set_postfix_str(f"{num_generated / max(bar.format_dict['elapsed'], 1e-9):.1f} out tok/s")
        except BaseException:
            for request_id in pending:  # Ctrl-C or an error: free every block before leaving
                engine.abort_request(request_id)
            raise
        finally:
            bar.close()
        return [finished[r] for r in request_ids]
