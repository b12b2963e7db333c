"""Transport security with the flags users copy: HTTPS (vLLM's --ssl-*) and gRPC TLS / mutual TLS
(TGIS's --tls-*), one server for both, with throw-away certificates made in-process. Under mutual
TLS a client without a certificate from the trusted CA is refused at the handshake, before any
request is read."""

from __future__ import annotations

import argparse
import ssl

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc
from pagedcore.serving.transport_args import add_transport_args, check_transport_args
from tests.serving.certs import Certs, make_certs
from tests.serving.http_helpers import ServerProcess, free_port


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


def client_context(certs: Certs, with_cert: str | None = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certs.ca)
    if with_cert is not None:
        context.load_cert_chain(getattr(certs, f"{with_cert}_cert"), getattr(certs, f"{with_cert}_key"))
    return context


@pytest.fixture(scope="module")
def server(certs):
    grpc_port = free_port()
    s = ServerProcess("--ssl-keyfile", certs.server_key, "--ssl-certfile", certs.server_cert,
                      "--ssl-ca-certs", certs.ca, "--ssl-cert-reqs", "2",
                      "--grpc-port", str(grpc_port), "--tls-cert-path", certs.server_cert,
                      "--tls-key-path", certs.server_key, "--tls-client-ca-cert-path", certs.ca,
                      https={"verify": client_context(certs)})
    s.grpc_port = grpc_port
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def test_https_with_a_client_certificate_serves(server, certs):
    with httpx.Client(verify=client_context(certs), timeout=300) as client:
        assert client.get(server.url + "/health").status_code == 200
        r = client.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("who", [None, "rogue"])
def test_https_refuses_a_client_without_a_trusted_certificate(server, certs, who):
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        # TLS 1.3 reports a refused client certificate on the first read, hence the read errors too.
        httpx.get(server.url + "/health", verify=client_context(certs, who), timeout=30)


def test_plain_http_gets_no_answer_on_the_https_port(server):
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url.replace("https://", "http://") + "/health", timeout=30)


def _secure_channel(certs: Certs, port: int, who: str | None) -> grpc.Channel:
    key = certs.read(f"{who}_key") if who else None
    chain = certs.read(f"{who}_cert") if who else None
    credentials = grpc.ssl_channel_credentials(root_certificates=certs.read("ca"), private_key=key,
                                               certificate_chain=chain)
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials,
                               options=[("grpc.ssl_target_name_override", "localhost")])


def test_grpc_mutual_tls_serves_a_trusted_client(server, certs):
    with _secure_channel(certs, server.grpc_port, "client") as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        info = pb_grpc.GenerationServiceStub(channel).ModelInfo(pb.ModelInfoRequest(), timeout=30)
        assert info.max_sequence_length > 0
        reply = pb_grpc.GenerationServiceStub(channel).Generate(pb.BatchedGenerationRequest(
            requests=[pb.GenerationRequest(text="Hello")],
            params=pb.Parameters(stopping=pb.StoppingCriteria(max_new_tokens=1))), timeout=300)
        assert reply.responses[0].generated_token_count == 1


@pytest.mark.parametrize("who", [None, "rogue"])
def test_grpc_mutual_tls_refuses_other_clients_at_the_handshake(server, certs, who):
    with _secure_channel(certs, server.grpc_port, who) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GenerationServiceStub(channel).ModelInfo(pb.ModelInfoRequest(), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE   # the connection never came up


def test_grpc_plaintext_client_is_refused(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GenerationServiceStub(channel).ModelInfo(pb.ModelInfoRequest(), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


# -- the flags' checks, without a server ----------------------------------------------------------

def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_transport_args(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv,message", [
    (["--ssl-certfile", "{server_cert}"], "both --ssl-keyfile and --ssl-certfile"),
    (["--ssl-keyfile", "{server_key}", "--ssl-certfile", "{server_cert}", "--ssl-cert-reqs", "2"],
     "give --ssl-ca-certs"),
    (["--ssl-keyfile", "{client_key}", "--ssl-certfile", "{server_cert}"], "cannot use --ssl-certfile"),
    (["--ssl-keyfile", "/nonexistent.key", "--ssl-certfile", "{server_cert}"], "--ssl-keyfile '/nonexistent.key'"),
    (["--tls-cert-path", "{server_cert}"], "both --tls-cert-path and --tls-key-path"),
    (["--tls-client-ca-cert-path", "{ca}"], "needs --tls-cert-path"),
])
def test_bad_tls_flags_are_refused_naming_the_flag(certs, argv, message):
    args = _args(*(a.format(**vars(certs)) for a in argv))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("'", "'")):
        check_transport_args(args)


def test_good_tls_flags_pass(certs):
    args = _args("--ssl-keyfile", certs.server_key, "--ssl-certfile", certs.server_cert, "--ssl-ca-certs", certs.ca,
                 "--ssl-cert-reqs", "2", "--tls-cert-path", certs.server_cert, "--tls-key-path", certs.server_key)
    assert check_transport_args(args) is None    # no CORS asked for
