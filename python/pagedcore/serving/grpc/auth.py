"""API keys for the gRPC front end: `authorization: Bearer <key>` metadata, as the HTTP API takes it.

Only fmaas.GenerationService is guarded. Health checks stay open (Kubernetes probes carry no key),
and so does reflection, which describes the protocol and returns no data.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import grpc

GUARDED_PREFIX = "/fmaas.GenerationService/"


def bearer_key(metadata) -> str | None:
    """The key of an `authorization: Bearer <key>` entry (grpc lowercases metadata keys)."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, api_keys: Iterable[str]):
        self._keys = [k.encode() for k in api_keys if k]
        if not self._keys:
            raise ValueError("ApiKeyInterceptor needs at least one non-empty key")

    def allows(self, metadata) -> bool:
        key = bearer_key(metadata)
        # compare_digest against every key: the time taken says nothing about which key came close.
        return key is not None and any([hmac.compare_digest(key.encode(), k) for k in self._keys])

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(GUARDED_PREFIX):
            return handler
        if self.allows(handler_call_details.invocation_metadata):
            return handler
        return _refusal(handler)


async def _refuse(request, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                        "missing or wrong API key: send the metadata `authorization: Bearer <key>` with a key "
                        "the server was started with (--api-key)")


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED."""
    codec = dict(request_deserializer=handler.request_deserializer,
                 response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(_refuse, **codec)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_refuse, **codec)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(_refuse, **codec)
    return grpc.stream_stream_rpc_method_handler(_refuse, **codec)


__all__ = ["ApiKeyInterceptor", "bearer_key", "GUARDED_PREFIX"]
