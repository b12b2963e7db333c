"""The gRPC front end: the TGIS protocol (fmaas.GenerationService), health and reflection.

`start_grpc_server(async_engine, port=8033)` is the entry point; the messages are generated from
proto/generation.proto (see stubs.py).
"""

from pagedcore.serving.grpc.server import DEFAULT_PORT, SERVICE_NAME, GrpcServer, start_grpc_server

__all__ = ["start_grpc_server", "GrpcServer", "SERVICE_NAME", "DEFAULT_PORT"]
