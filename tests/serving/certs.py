"""Throw-away certificates for the TLS tests, made in-process (no network): a CA, a server
certificate for 127.0.0.1 / localhost signed by it, a client certificate signed by it, and a rogue
client certificate signed by another CA. `cryptography` when installed, else the `openssl` CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass
class Certs:
    ca: str              # PEM paths
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_cert: str      # signed by a CA the server does not trust
    rogue_key: str

    def read(self, name: str) -> bytes:
        with open(getattr(self, name), "rb") as f:
            return f.read()


def make_certs(folder: str) -> Certs:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            raise RuntimeError("the TLS tests need the cryptography package or the openssl command") from None
        return _with_openssl(folder)
    return _with_cryptography(folder)


def _paths(folder: str) -> Certs:
    p = lambda name: os.path.join(folder, name)   # noqa: E731
    return Certs(p("ca.pem"), p("server.pem"), p("server.key"), p("client.pem"), p("client.key"), p("rogue.pem"),
                 p("rogue.key"))


def _with_openssl(folder: str) -> Certs:
    c = _paths(folder)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    def ca(name: str) -> None:
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def leaf(name: str, ca_name: str, extensions: str) -> None:
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        with open(os.path.join(folder, f"{name}.ext"), "w") as f:
            f.write(extensions)
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca_name}.pem", "-CAkey", f"{ca_name}.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")

    ca("ca")
    ca("rogueca")
    leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    leaf("client", "ca", "extendedKeyUsage=clientAuth\n")
    leaf("rogue", "rogueca", "extendedKeyUsage=clientAuth\n")
    return c


def _with_cryptography(folder: str) -> Certs:   # pragma: no cover - used where the package is installed
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    c = _paths(folder)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(path: str, cert, key=None, key_path: str | None = None) -> None:
        with open(path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            with open(key_path, "wb") as f:
                f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))

    def build(subject: str, issuer: str, issuer_key, key, ca: bool, extensions=()):
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        for ext in extensions:
            b = b.add_extension(ext, critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    write(c.ca, build("ca", "ca", ca_key, ca_key, True))
    server_key, client_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    write(c.server_cert, build("server", "ca", ca_key, server_key, False,
                               [san, x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])]),
          server_key, c.server_key)
    write(c.client_cert, build("client", "ca", ca_key, client_key, False,
                               [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])]), client_key, c.client_key)
    write(c.rogue_cert, build("rogue", "rogueca", rogue_ca_key, rogue_key, False,
                              [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])]), rogue_key, c.rogue_key)
    return c
