"""ShmChannel: a Channel (one writer, n readers, FIFO of Python values) over a shared-memory ring
(cpp/distributed/shm_ring.h). Values are pickled with protocol 5: the pickle stream and the
out-of-band buffers (numpy arrays' raw bytes) are copied straight into the ring, and a reader gets
them back as views of one bytearray (no per-element Python objects, one copy each way).

A frame in the ring:  [u64 pickle_bytes][u32 num_buffers][u32 0][u64 buffer_bytes x n] [pickle]
                      then each buffer, starting at a 64-byte offset of the frame (aligned arrays)."""

from __future__ import annotations

import pickle
import struct

from pagedcore import _core
from pagedcore.distributed.communicator import Channel, IsAlive

__all__ = ["ShmChannel", "encode_frame", "decode_frame"]

_ALIGN = 64
_ZEROS = bytes(_ALIGN)


def encode_frame(value: object) -> list:
    """The parts of one frame for `value` (their concatenation is the frame)."""
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(buf.raw())  # 1-D bytes view; fails for non-contiguous data
        except BufferError:
            return True                 # serialise that one in band instead
        return False

    payload = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    header = struct.pack(f"<QII{len(buffers)}Q", len(payload), len(buffers), 0, *(b.nbytes for b in buffers))
    parts: list = [header, payload]
    offset = len(header) + len(payload)
    for buf in buffers:
        pad = -offset % _ALIGN
        if pad:
            parts.append(_ZEROS[:pad])
        parts.append(buf)
        offset += pad + buf.nbytes
    return parts


def decode_frame(frame: bytearray) -> object:
    view = memoryview(frame)
    payload_bytes, num_buffers, _ = struct.unpack_from("<QII", view, 0)
    sizes = struct.unpack_from(f"<{num_buffers}Q", view, 16)
    at = 16 + 8 * num_buffers
    payload = view[at:at + payload_bytes]
    at += payload_bytes
    buffers = []
    for size in sizes:
        at += -at % _ALIGN
        buffers.append(view[at:at + size])
        at += size
    return pickle.loads(payload, buffers=buffers)


class ShmChannel(Channel):
    """One end of a shared-memory channel: the writer (reader_index None) or reader `reader_index`.
    Open it with comm_spec.open_channel_writer / open_channel_reader."""

    def __init__(self, name: str, reader_index: int | None):
        self._ring = _core.ShmRing(name, -1 if reader_index is None else reader_index)
        self.reader_index = reader_index
        self.num_readers = self._ring.num_readers
        self.capacity_bytes = self._ring.capacity
        self._closed = False

    def put(self, value: object, timeout: float | None = None, is_alive: IsAlive | None = None) -> None:
        if self.reader_index is not None:
            raise RuntimeError("put on a channel's reader end (open it with open_channel_writer)")
        self._check_open()
        self._ring.write(encode_frame(value), -1.0 if timeout is None else float(timeout), is_alive)

    def get(self, timeout: float | None = None, is_alive: IsAlive | None = None) -> object:
        if self.reader_index is None:
            raise RuntimeError("get on a channel's writer end (open it with open_channel_reader)")
        self._check_open()
        return decode_frame(self._ring.read(-1.0 if timeout is None else float(timeout), is_alive))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the channel is closed")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._ring.close()

    def __repr__(self) -> str:
        end = "writer" if self.reader_index is None else f"reader {self.reader_index}"
        return f"ShmChannel({end} of {self.num_readers}, capacity_bytes={self.capacity_bytes})"
