"""Exceptions -> gRPC status codes, in one place, for every GenerationService method.

INVALID_ARGUMENT  a parameter or prompt the server refuses (the message names the field)
RESOURCE_EXHAUSTED  the waiting queue is full (--max-queued-requests): retry later
UNAVAILABLE  the server is draining or its engine stopped: go to another replica
INTERNAL  anything else (logged with its traceback here)
A cancelled call or a passed deadline never reaches this: asyncio cancels the handler, and closing
the engine's stream aborts the request and frees its blocks.
"""

from __future__ import annotations

import functools
import inspect
import logging
from contextlib import aclosing

import grpc

from pagedcore.serving.async_engine import EngineDeadError, EngineDrainingError, QueueFullError

logger = logging.getLogger(__name__)


class ServerDrainingError(RuntimeError):
    """The gRPC server began draining (health NOT_SERVING): it takes no new generation."""


def status_of(error: Exception) -> tuple[grpc.StatusCode, str]:
    from pagedcore.lora.errors import LoRANotFoundError

    if isinstance(error, LoRANotFoundError):   # adapter_id names no loaded adapter (the message lists them)
        return grpc.StatusCode.NOT_FOUND, str(error)
    if isinstance(error, ValueError):   # ParamError, and the engine's own refusals (add_request)
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, QueueFullError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, (EngineDrainingError, ServerDrainingError, EngineDeadError)):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}): {error}"


async def _abort(context, method_name: str, error: Exception):
    code, message = status_of(error)
    if code == grpc.StatusCode.INTERNAL:
        logger.error("%s failed", method_name, exc_info=error)
    else:
        logger.info("%s refused: %s %s", method_name, code.name, message)
    # RESOURCE_EXHAUSTED: the message says "retry after N s"; the same N rides in trailing metadata
    # ("retry-after", as HTTP's header) for clients that read it programmatically.
    trailing = (("retry-after", str(error.retry_after_s)),) if isinstance(error, QueueFullError) else ()
    await context.abort(code, message, trailing_metadata=trailing)


def rpc_errors(method):
    """Decorates a servicer method (coroutine or async generator) so that an exception becomes the
    call's status instead of grpc's generic UNKNOWN."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream_wrapper(self, request, context):
            try:
                # aclosing: if grpc drops this generator (client gone while a message was being
                # written), the handler's own generator is closed now, not whenever GC gets to it.
                async with aclosing(method(self, request, context)) as messages:
                    async for message in messages:
                        yield message
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                await _abort(context, method.__name__, error)

        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _abort(context, method.__name__, error)

    return unary_wrapper


__all__ = ["ServerDrainingError", "status_of", "rpc_errors"]
