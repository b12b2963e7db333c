"""The HTTP connection protocol: uvicorn's h11 protocol plus bounds on each request's head.

uvicorn closes idle keep-alive connections, but neither the time a client takes to send its request
line and headers (a slowloris client dripping a header every few seconds holds a connection, and its
buffer, forever) nor, reliably, their size (h11's limit applies only while the head is incomplete:
64 KiB of headers arriving in one read pass). Here, per request:
  - the head must arrive within HEADER_TIMEOUT_S of its first byte (or of the connection opening),
    else the connection is closed;
  - the head may hold at most MAX_HEADER_BYTES (so also a bounded number of headers), else 431 and close.
The body has its own deadline and size limit (openai/body.py).
"""

from __future__ import annotations

import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pagedcore.serving.openai.errors import error_body

logger = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 15.0
MAX_HEADER_BYTES = 32 * 1024   # the whole request line + headers; 431 past it
_END_OF_HEAD = b"\r\n\r\n"


class HeaderDeadlineH11Protocol(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer = None
        self._head_bytes = 0      # bytes of the current request's head seen so far
        self._tail = b""          # the last bytes of the previous read: the blank line may straddle reads
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state == h11.IDLE:
            self._arm()   # the next request on a kept-alive connection starts its own deadline
            window = self._tail + data
            end = window.find(_END_OF_HEAD)
            self._head_bytes += len(data) if end < 0 else max(0, end + len(_END_OF_HEAD) - len(self._tail))
            self._tail = window[-(len(_END_OF_HEAD) - 1):]
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse_head()
                return
        super().data_received(data)
        if self.conn.their_state != h11.IDLE:
            self._disarm()  # the request line and every header are in
            self._head_bytes, self._tail = 0, b""

    def _refuse_head(self) -> None:
        self._disarm()
        body = json.dumps(error_body(431, f"the request line and headers are larger than this server's limit of "
                                          f"{MAX_HEADER_BYTES} bytes; send fewer or smaller headers")).encode()
        if not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state == h11.IDLE and not self.transport.is_closing():
            logger.info("closing a connection from %s: its request headers took more than %.0f s",
                        self.client, self.header_timeout_s)
            self.transport.close()
