"""--api-key: a bearer token on every inference route (/v1/*, /tokenize, /detokenize); /health,
/metrics and /version stay open for probes and scrapers."""

from __future__ import annotations

import hmac
import os

from fastapi import Request

from pagedcore.serving.openai.errors import APIError

ENV_VAR = "PAGEDCORE_API_KEY"


def parse_api_keys(values: list[str] | None, environ=os.environ) -> list[str]:
    """--api-key may repeat or hold commas; PAGEDCORE_API_KEY adds more the same way."""
    raw = list(values or [])
    if environ.get(ENV_VAR):
        raw.append(environ[ENV_VAR])
    return [k.strip() for v in raw for k in v.split(",") if k.strip()]


class APIKeyCheck:
    """A FastAPI dependency; with no keys configured every request passes."""

    def __init__(self, keys: list[str]):
        self.keys = [k.encode() for k in keys]

    async def __call__(self, request: Request) -> None:
        if not self.keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # compare_digest on every key: the time taken says nothing about how close a guess was
        if scheme.lower() == "bearer" and any([hmac.compare_digest(token.strip().encode(), k) for k in self.keys]):
            return
        raise APIError(401, "missing or wrong API key; send the header 'Authorization: Bearer <key>' with a key "
                            "given to the server by --api-key or PAGEDCORE_API_KEY", code="invalid_api_key")
