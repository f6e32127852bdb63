"""The benches' streamed-request client (standard library only): one POST over a raw
connection (Connection: close), its response head, and an incremental parser that
de-chunks an HTTP/1.1 body and splits it into server-sent events. Raw sockets rather than
a client library so each event's arrival time is the moment its bytes were read.

Used by benches/noisy_neighbour.py and benches/prefix_routing.py.
"""

import asyncio


class Sse:
    """De-chunks an HTTP/1.1 body (when chunked) and splits it into SSE events."""

    def __init__(self, chunked):
        self.chunked = chunked
        self.raw = b""
        self.body = b""
        self.ended = False  # the zero-size chunk was seen

    def feed(self, data):
        """Add bytes read; returns the `data:` payloads of the events now complete."""
        if not self.chunked:
            self.body += data
        else:
            self.raw += data
            while not self.ended:
                eol = self.raw.find(b"\r\n")
                if eol < 0:
                    break
                size = int(self.raw[:eol].split(b";")[0], 16)
                if size == 0:
                    self.ended = True
                    break
                if len(self.raw) < eol + 2 + size + 2:
                    break
                self.body += self.raw[eol + 2:eol + 2 + size]
                self.raw = self.raw[eol + 2 + size + 2:]
        out = []
        while True:
            end = self.body.find(b"\n\n")
            if end < 0:
                break
            event, self.body = self.body[:end], self.body[end + 2:]
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    out.append(line[5:].strip())
        return out


class ClosedEarly(Exception):
    """The connection closed before a response head."""


async def post(host, port, path, headers, payload):
    """POST `payload` to `path` with `headers` (a dict); returns (reader, writer, status,
    response headers lower-cased, the body bytes already read). The caller closes `writer`
    (also when this raises: it is returned through ClosedEarly.args[0] when opened)."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "Connection: close\r\n\r\n").encode()
    writer.write(head + payload)
    await writer.drain()
    raw = b""
    while b"\r\n\r\n" not in raw:
        data = await reader.read(65536)
        if not data:
            raise ClosedEarly(writer)
        raw += data
    end = raw.index(b"\r\n\r\n")
    lines = raw[:end].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return reader, writer, status, hdrs, raw[end + 4:]


async def read_to_end(reader, body):
    """The rest of a body that ends with the connection (Connection: close)."""
    while True:
        data = await reader.read(65536)
        if not data:
            return body
        body += data
