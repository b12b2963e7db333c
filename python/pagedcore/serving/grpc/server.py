"""The gRPC server: fmaas.GenerationService (TGIS), grpc.health.v1 and server reflection on one port.

    server = await start_grpc_server(async_engine, port=8033, api_keys=["secret"])
    ...                                   # on SIGTERM:
    await server.begin_drain()            # health NOT_SERVING, new generation UNAVAILABLE
    await async_engine.shutdown(timeout)  # in-flight requests finish
    await server.stop(grace=5)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pagedcore.serving.async_engine import AsyncLLMEngine
from pagedcore.serving.grpc.auth import ApiKeyInterceptor
from pagedcore.serving.grpc.params import MAX_NEW_TOKENS_LIMIT
from pagedcore.serving.grpc.servicer import GenerationServicer
from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GenerationService"].full_name   # "fmaas.GenerationService"
DEFAULT_PORT = 8033   # TGIS's gRPC port


class GrpcServer:
    """A running server: `port` is the bound port (useful with port=0)."""

    def __init__(self, server: grpc.aio.Server, servicer: GenerationServicer,
                 health_servicer: health.aio.HealthServicer, address: str, port: int):
        self._server = server
        self.servicer = servicer
        self.health = health_servicer
        self.address = address
        self.port = port

    async def begin_drain(self) -> None:
        """Reports NOT_SERVING (so load balancers and probes route elsewhere) and refuses new
        generation with UNAVAILABLE; calls in flight carry on. Call it first on shutdown."""
        if self.servicer.draining:
            return
        self.servicer.draining = True
        await self.health.enter_graceful_shutdown()   # every service NOT_SERVING, for good
        logger.info("gRPC server on %s draining: health NOT_SERVING", self.address)

    async def stop(self, grace: float | None = 5.0) -> None:
        """Drains, then stops: calls still running after `grace` seconds are cancelled, which
        aborts their requests."""
        await self.begin_drain()
        await self._server.stop(grace)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def start_grpc_server(async_engine: AsyncLLMEngine, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                            api_keys: Sequence[str] | None = (), served_model_name: str | None = None,
                            max_model_len: int | None = None, max_new_tokens: int = MAX_NEW_TOKENS_LIMIT,
                            default_include_stop_sequence: bool = True,
                            tls: tuple[bytes, bytes, bytes | None] | None = None) -> GrpcServer:
    """Starts the gRPC front end on the running event loop and returns once it listens.

    max_model_len: what ModelInfo reports and prompts are checked against (default: the engine's).
    max_new_tokens: the largest stopping.max_new_tokens a request may ask for (TGIS's default 1024).
    default_include_stop_sequence: for requests that leave include_stop_sequence unset (TGIS: true).
    tls: (certificate chain, private key, client CA or None) as PEM bytes: TLS on the port, and with a
    client CA mutual TLS (a client without a certificate that CA signed fails the handshake). None: plaintext.
    """
    engine_max_len = async_engine.engine.view.config.max_model_len
    max_model_len = max_model_len or engine_max_len
    if max_model_len > engine_max_len:
        raise ValueError(f"max_model_len {max_model_len} is larger than the engine's ({engine_max_len}); "
                         f"pass max_model_len <= {engine_max_len}")
    servicer = GenerationServicer(async_engine, max_model_len=max_model_len, max_new_tokens_limit=max_new_tokens,
                                  default_include_stop_sequence=default_include_stop_sequence)
    api_keys = [key for key in (api_keys or ()) if key]
    interceptors = [ApiKeyInterceptor(api_keys)] if api_keys else []
    server = grpc.aio.server(interceptors=interceptors)
    pb_grpc.add_GenerationServiceServicer_to_server(servicer, server)

    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):   # "" is the whole server, as probes ask by default
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server)

    address = _address(host, port)
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            cert_chain, private_key, client_ca = tls
            credentials = grpc.ssl_server_credentials([(private_key, cert_chain)], root_certificates=client_ca,
                                                      require_client_auth=client_ca is not None)
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as error:
        raise OSError(f"could not listen for gRPC on {address} ({error}); is the port in use? "
                      "pick another with --grpc-port") from None
    if not bound:
        raise OSError(f"could not listen for gRPC on {address}; is the port in use? pick another with --grpc-port")
    await server.start()
    address = _address(host, bound)
    security = "plaintext" if tls is None else "TLS" if tls[2] is None else "mutual TLS"
    logger.info("gRPC (TGIS fmaas.GenerationService, health, reflection) on %s (%s) for model %s%s", address,
                security, served_model_name or "(unnamed)", ", API key required" if interceptors else "")
    return GrpcServer(server, servicer, health_servicer, address, bound)


__all__ = ["GrpcServer", "start_grpc_server", "SERVICE_NAME", "DEFAULT_PORT"]
