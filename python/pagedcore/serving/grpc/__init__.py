"""The gRPC front end: the TGIS protocol (fmaas.GenerationService), health and reflection.

`start_grpc_server(async_engine, port=8033)` is the entry point; the messages are generated from
proto/generation.proto (see stubs.py). Lazy, so that a client importing only
`pagedcore.serving.grpc.stubs` does not load torch and the engine.
"""

__all__ = ["start_grpc_server", "GrpcServer", "SERVICE_NAME", "DEFAULT_PORT"]


def __getattr__(name):
    if name in __all__:
        from pagedcore.serving.grpc import server

        return getattr(server, name)
    raise AttributeError(f"module 'pagedcore.serving.grpc' has no attribute {name!r}")
