"""Raw HTTP over a socket, for what no HTTP client sends: a request that stalls in its headers or
its body. Shared by the proxy tests (tests/test_serve.py) and the in-process uvicorn tests
(tests/test_header_timeout.py)."""

from __future__ import annotations

import socket
import time

# a request cut off inside its headers
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl"


def raw_request(host: str, port: int, head: bytes, timeout: float) -> socket.socket:
    """A connection that has sent `head` (maybe nothing) and then nothing more."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(head)
    return s


def read_until_closed(s: socket.socket, deadline: float) -> bytes:
    """What the server sends until it closes the connection (then `<closed>` is appended) or
    time.monotonic() passes `deadline`."""
    data = b""
    while time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            return data + b"<closed>"
        data += chunk
    return data


def silent(s: socket.socket) -> bool:
    """Whether the server has sent nothing on `s` and kept it open, as of now (nothing is read)."""
    timeout = s.gettimeout()
    s.settimeout(0.0)  # (with a timeout, recv would wait for data first)
    try:
        s.recv(1, socket.MSG_PEEK)  # a byte, or b"" once closed
    except BlockingIOError:
        return True
    finally:
        s.settimeout(timeout)
    return False
