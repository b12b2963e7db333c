"""Transport flags of `pagedcore serve`, under the names users copy from vLLM (HTTPS, CORS) and TGIS
(gRPC TLS / mTLS), checked once at start so a typo fails in a second, not at the first request.

HTTPS:     --ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs (0 none, 1 optional, 2 required)
gRPC TLS:  --tls-cert-path, --tls-key-path, --tls-client-ca-cert-path (mutual TLS: a client without a
           certificate signed by that CA is refused at the handshake)
CORS:      --allowed-origins, --allowed-methods, --allowed-headers (JSON lists, as vLLM takes them),
           --allow-credentials
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
from dataclasses import dataclass, field


@dataclass
class CorsConfig:
    """Starlette's CORSMiddleware settings; none configured means no CORS headers (same origin only)."""

    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def json_list(text: str) -> list[str]:
    """vLLM's syntax, a JSON list ('["https://a.example", "https://b.example"]'); a bare value or a
    comma-separated list ('*', 'https://a.example,https://b.example') is also taken."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list ({error.msg}); write it like "
                                             "'[\"https://app.example\"]'") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError(f"{text!r} must be a JSON list of strings")
        return value
    return [part.strip() for part in stripped.split(",") if part.strip()]


def add_transport_args(g) -> None:
    g.add_argument("--ssl-keyfile", default=None, metavar="FILE", help="HTTPS: the server's private key (PEM)")
    g.add_argument("--ssl-certfile", default=None, metavar="FILE",
                   help="HTTPS: the server's certificate chain (PEM); with --ssl-keyfile the HTTP API speaks TLS only")
    g.add_argument("--ssl-ca-certs", default=None, metavar="FILE",
                   help="HTTPS: CA certificates (PEM) that client certificates are checked against")
    g.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE), choices=[0, 1, 2],
                   help="HTTPS client certificates, as Python's ssl module numbers them: 0 not asked (default), "
                        "1 checked if sent, 2 required (mutual TLS; needs --ssl-ca-certs)")
    g.add_argument("--tls-cert-path", default=None, metavar="FILE",
                   help="gRPC TLS (TGIS's flag): the server's certificate chain (PEM); needs --tls-key-path")
    g.add_argument("--tls-key-path", default=None, metavar="FILE", help="gRPC TLS: the server's private key (PEM)")
    g.add_argument("--tls-client-ca-cert-path", default=None, metavar="FILE",
                   help="gRPC mutual TLS: clients must present a certificate signed by this CA (PEM); others are "
                        "refused at the handshake")
    g.add_argument("--allowed-origins", type=json_list, default=None, metavar="JSON_LIST",
                   help="CORS: origins whose browser pages may call the API, e.g. '[\"https://app.example\"]' or "
                        "'[\"*\"]' (default: none, so only pages served by this server; vLLM's default is [\"*\"])")
    g.add_argument("--allowed-methods", type=json_list, default=["*"], metavar="JSON_LIST",
                   help="CORS: methods allowed to those origins (default [\"*\"])")
    g.add_argument("--allowed-headers", type=json_list, default=["*"], metavar="JSON_LIST",
                   help="CORS: request headers allowed to those origins (default [\"*\"])")
    g.add_argument("--allow-credentials", action="store_true",
                   help="CORS: let those origins send cookies and Authorization (not with origin \"*\")")


def _readable(flag: str, path: str | None) -> None:
    if path is not None and not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r}: no such file; give the path of a PEM file")


def check_transport_args(args) -> CorsConfig | None:
    """Raises ValueError naming the flag to fix; returns the CORS settings (None: no CORS)."""
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "tls_cert_path", "tls_key_path",
                 "tls_client_ca_cert_path"):
        _readable("--" + flag.replace("_", "-"), getattr(args, flag))
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("HTTPS needs both --ssl-keyfile and --ssl-certfile")
    if args.ssl_ca_certs and not args.ssl_certfile:
        raise ValueError("--ssl-ca-certs checks client certificates of HTTPS; give --ssl-certfile and --ssl-keyfile")
    if args.ssl_cert_reqs != ssl.CERT_NONE and not args.ssl_ca_certs:
        raise ValueError(f"--ssl-cert-reqs {args.ssl_cert_reqs} checks client certificates: give --ssl-ca-certs "
                         "with the CA that signs them")
    if bool(args.tls_cert_path) != bool(args.tls_key_path):
        raise ValueError("gRPC TLS needs both --tls-cert-path and --tls-key-path")
    if args.tls_client_ca_cert_path and not args.tls_cert_path:
        raise ValueError("--tls-client-ca-cert-path (mutual TLS) needs --tls-cert-path and --tls-key-path")
    if args.ssl_certfile:
        try:   # load now: a key that does not match its certificate fails here, with the flag named
            uvicorn_ssl_context(args)
        except (ssl.SSLError, OSError) as error:
            raise ValueError(f"cannot use --ssl-certfile/--ssl-keyfile/--ssl-ca-certs: {error}") from None
    if args.allowed_origins is None:
        return None
    if args.allow_credentials and "*" in args.allowed_origins:
        raise ValueError("--allow-credentials cannot be combined with --allowed-origins '[\"*\"]' (browsers refuse "
                         "credentials to any origin); list the origins")
    return CorsConfig(args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials)


def uvicorn_ssl_context(args) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    context.verify_mode = ssl.VerifyMode(args.ssl_cert_reqs)
    if args.ssl_ca_certs:
        context.load_verify_locations(args.ssl_ca_certs)
    return context


def uvicorn_ssl_kwargs(args) -> dict:
    """uvicorn.Config's TLS arguments (empty: plain HTTP)."""
    if not getattr(args, "ssl_certfile", None):
        return {}
    return dict(ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs,
                ssl_cert_reqs=args.ssl_cert_reqs)


def grpc_tls_files(args) -> tuple[bytes, bytes, bytes | None] | None:
    """(certificate chain, private key, client CA or None) as PEM bytes; None: plaintext gRPC."""
    if not getattr(args, "tls_cert_path", None):
        return None

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    ca = args.tls_client_ca_cert_path
    return read(args.tls_cert_path), read(args.tls_key_path), read(ca) if ca else None
