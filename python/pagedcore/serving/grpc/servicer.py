"""fmaas.GenerationService over the async engine: Generate, GenerateStream, Tokenize, ModelInfo.

    request ─▶ check + plan (params.py) ─▶ tokenize, truncate, fit max_model_len
            ─▶ AsyncLLMEngine.generate (one stream per prompt, all in the same continuous batch)
            ─▶ Progress ─▶ GenerationResponse (responses.py)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing

from pagedcore.serving.async_engine import AsyncLLMEngine
from pagedcore.serving.grpc import responses
from pagedcore.serving.grpc.errors import ServerDrainingError, rpc_errors
from pagedcore.serving.grpc.params import (MAX_NEW_TOKENS_LIMIT, FittedPrompt, GenerationPlan, ParamError,
                                           check_request, constraint_field, plan_generation)
from pagedcore.serving.grpc.streams import TIME_LIMIT, run_all, until_deadline
from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, async_engine: AsyncLLMEngine, *, max_model_len: int,
                 max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT, default_include_stop_sequence: bool = True):
        self.engine = async_engine
        self.tokenizer = async_engine.engine.view.tokenizer
        self.max_model_len = max_model_len
        # A request may never ask for more than fits after a one-token prompt.
        self.max_new_tokens_limit = min(max_new_tokens_limit, max_model_len - 1)
        self.default_include_stop_sequence = default_include_stop_sequence
        self.max_logprobs = async_engine.engine.view.config.max_logprobs
        self.lora_manager = async_engine.engine.lora_manager  # None without --enable-lora
        self.draining = False

    # -- Generate ------------------------------------------------------------------------------------
    @rpc_errors
    async def Generate(self, request, context):
        start = time.monotonic()
        plan, lora_request = await self._plan(request)
        texts = [r.text for r in request.requests]
        prompts = [self._fit(text, plan, f"requests[{i}].text") for i, text in enumerate(texts)]
        request_id = uuid.uuid4().hex
        return pb.BatchedGenerationResponse(responses=await run_all([
            self._generate_one(prompt, text, plan, f"{request_id}-{i}", start, lora_request)
            for i, (prompt, text) in enumerate(zip(prompts, texts))]))

    async def _generate_one(self, prompt: FittedPrompt, text: str, plan: GenerationPlan, request_id: str,
                            start: float, lora_request=None):
        progress, time_limited = responses.Progress(), False
        # Without a time limit one final output is enough; with one, deltas keep what was generated in time.
        outputs = self.engine.generate(None, prompt.sampling_params, request_id, prompt_token_ids=prompt.token_ids,
                                       stream=plan.time_limit_s is not None, lora_request=lora_request)
        async with aclosing(until_deadline(outputs, self._deadline(plan, start))) as timed_outputs:
            async for output in timed_outputs:
                if output is TIME_LIMIT:
                    time_limited = True
                    break
                progress.add(output)
        return responses.generation_response(self.tokenizer, prompt, text, plan, progress, time_limited=time_limited)

    # -- GenerateStream ------------------------------------------------------------------------------
    @rpc_errors
    async def GenerateStream(self, request, context):
        start = time.monotonic()
        plan, lora_request = await self._plan(request)
        text = request.request.text
        prompt = self._fit(text, plan, "request.text")
        outputs = self.engine.generate(None, prompt.sampling_params, uuid.uuid4().hex,
                                       prompt_token_ids=prompt.token_ids, stream=True, lora_request=lora_request)
        progress, sent_input = responses.Progress(), False
        async with aclosing(until_deadline(outputs, self._deadline(plan, start))) as timed_outputs:
            async for output in timed_outputs:
                if not sent_input:
                    # TGIS streams the input side first; prompt logprobs are complete with the first token.
                    prompt_logprobs = None if output is TIME_LIMIT else output.prompt_logprobs
                    yield responses.stream_input_message(self.tokenizer, prompt, text, plan, prompt_logprobs)
                    sent_input = True
                if output is TIME_LIMIT:
                    yield responses.time_limit_message(progress)
                    return
                delta = progress.add(output)
                yield responses.stream_delta_message(self.tokenizer, prompt, plan, delta, progress)

    # -- Tokenize / ModelInfo ------------------------------------------------------------------------
    @rpc_errors
    async def Tokenize(self, request, context):
        check_request(request, lora_enabled=self.lora_manager is not None)  # same tokenizer for every adapter
        keep = request.truncate_input_tokens
        out = []
        for r in request.requests:
            encoding = self.tokenizer(r.text, add_special_tokens=True, return_offsets_mapping=request.return_offsets)
            ids = list(encoding["input_ids"])
            offsets = list(encoding["offset_mapping"]) if request.return_offsets else []
            if keep and len(ids) > keep:   # the same truncation Generate applies
                ids, offsets = ids[-keep:], offsets[-keep:]
            response = pb.TokenizeResponse(token_count=len(ids))
            if request.return_tokens:
                response.tokens.extend(self.tokenizer.convert_ids_to_tokens(ids))
            response.offsets.extend(pb.TokenizeResponse.Offset(start=s, end=e) for s, e in offsets)
            out.append(response)
        return pb.BatchedTokenizeResponse(responses=out)

    @rpc_errors
    async def ModelInfo(self, request, context):
        return pb.ModelInfoResponse(model_kind=pb.ModelInfoResponse.DECODER_ONLY,
                                    max_sequence_length=self.max_model_len,
                                    max_new_tokens=self.max_new_tokens_limit)

    # -- helpers -------------------------------------------------------------------------------------
    async def _plan(self, request):
        """(GenerationPlan, the LoRARequest adapter_id names or None); an unknown adapter is NOT_FOUND."""
        if self.draining:
            raise ServerDrainingError("the server is shutting down and accepts no new requests; retry on another "
                                      "replica")
        adapter_name = check_request(request, lora_enabled=self.lora_manager is not None)
        lora_request = None if adapter_name is None else self.lora_manager.get(adapter_name)
        plan = plan_generation(request.params, max_new_tokens_limit=self.max_new_tokens_limit,
                               default_include_stop_sequence=self.default_include_stop_sequence,
                               max_logprobs=self.max_logprobs)
        constraint = plan.sampling_params.structured_outputs
        if constraint is not None:
            # Compiled now (and cached for the engine), so a bad one is INVALID_ARGUMENT naming its field.
            try:
                await asyncio.to_thread(self.engine.engine.grammars.compile, constraint)
            except ValueError as error:
                reason = getattr(error, "reason", str(error))
                raise ParamError(constraint_field(constraint), f"could not be compiled: {reason}") from None
        return plan, lora_request

    def _fit(self, text: str, plan: GenerationPlan, field: str) -> FittedPrompt:
        try:
            # The engine's own tokenization (LLMEngine.add_request), so text in == text offline.
            ids = self.tokenizer.encode(text, add_special_tokens=True)
        except Exception as error:
            raise ParamError(field, f"could not be tokenized: {error}") from None
        return plan.fit(ids, self.max_model_len, field)

    @staticmethod
    def _deadline(plan: GenerationPlan, start: float) -> float | None:
        return None if plan.time_limit_s is None else start + plan.time_limit_s


__all__ = ["GenerationServicer"]
