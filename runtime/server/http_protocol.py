"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers.

uvicorn (0.55, h11) waits for a request's headers as long as the client likes: a connection
that sent nothing, or half a request line and then a byte now and then (slowloris), was held
open forever, each one a file descriptor and a protocol object, until the process ran out of
them. Here a connection has --request-body-timeout-s to send a whole set of headers, counted
from the connection or from its previous response; past it, the connection is closed (after
a 408 when some of a request had come). Once the headers are in, the body's own deadline is
the Gate's (http_server.body_deadline), and a response may take as long as it takes.

A chunked body of many small chunks, which costs the event loop more than it costs its
client to send (FREE_BODY_CHUNKS), is refused as a request h11 cannot parse is.

A request h11 cannot parse (headers past its buffer, a malformed request line or header) is
answered in the OpenAI error shape like every other refusal, a 431 for headers too large (the
status h11 gives, RFC 6585) and a 400 for the rest, not uvicorn's plain-text 400 "Invalid HTTP
request received." that JSON clients could not read.

It also bounds how long a response may wait for its client to read. uvicorn stops writing
when the socket's buffer is full (flow control) and waits for the client, forever: a client
that opened a stream and never read it held the connection, and every chunk the request went
on producing queued in memory, for as long as it kept the socket open. Here a connection
whose transport stays paused (its unsent output above the high-water mark) for
--stream-write-timeout-s is aborted; the handler then sees a disconnect, as for any client
gone, which aborts the request and frees its KV.

A client that sends a whole request and then half-closes its socket (shutdown(SHUT_WR): some
proxies and scripted clients do; RFC 9112 9.6 lets it) still gets its reply. uvicorn took the
end of its input for a hang-up and closed the connection, so the request was aborted and no
reply came. TCP does not tell such a client from one that closed its socket outright (each
sends a FIN), and a request of a client that is gone must still be aborted (its KV freed):
so the server probes. While the reply has not started it sends an interim `100 Continue`
(RFC 9110 15.2: a client must read any 1xx before the final response) every
HALF_CLOSE_PROBE_S (the first one that long after the half-close); a socket that is only half-closed takes it, one that is closed answers
with a reset, which the next look at the socket's error sees, and the request is aborted as
for any client gone. The connection closes once that reply (and those of the requests the
client pipelined before it half-closed) are sent. A Server-Sent Events stream whose reply has
started (it marks its scope, SSE_SCOPE_KEY) is probed with an SSE comment line instead (`:`,
which SSE readers skip): a stream falls silent while a tool call is held back to be parsed
whole, and a client that closed then went unnoticed until the next event, its request running
on to the end.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from treadle.runtime.server.protocol import error_body
from treadle.runtime.server.streaming import SSE_SCOPE_KEY

log = logging.getLogger("treadle.server")

# a chunked body's chunks: h11 makes an event of each (13 us of the event loop), so a body
# sent a byte a chunk (6 bytes on the wire) cost 2 us of the loop a byte sent: 6 MB of upload
# held it 13 s, every other client's /health taking up to 2 s meanwhile. This many chunks come
# free, then one more for each BODY_BYTES_PER_CHUNK of body; past that the request is a 400.
FREE_BODY_CHUNKS = 4096
BODY_BYTES_PER_CHUNK = 1024
HALF_CLOSE_PROBE_S = 0.5  # how often a half-closed client's connection is probed while its reply is due
LINGER_S = 2.0  # how long a connection refused mid-request reads on before it closes
SSE_PROBE = b":\n\n"  # an SSE comment line (and the blank line that ends a block): readers skip it


def header_deadline_protocol(timeout_s: float, write_timeout_s: float | None = None) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...), with a `timeout_s` header deadline
    and, unless None, a `write_timeout_s` bound on a paused (unread) response."""
    body = json.dumps(error_body(f"the request's headers did not arrive within {timeout_s:g} s "
                                 "(--request-body-timeout-s)", code="request_timeout")).encode()
    reply = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n" % len(body)) + body

    class HeaderDeadlineH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        _protocol_error: h11.RemoteProtocolError | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()
            parse = self.conn.next_event

            chunks = body_bytes = 0  # of the request being read

            def next_event() -> object:  # keeps h11's error for send_400_response (uvicorn drops it)
                nonlocal chunks, body_bytes
                try:
                    event = parse()
                    if type(event) is h11.Data:
                        body_bytes += len(event.data)
                        chunks += event.chunk_start
                        if chunks > FREE_BODY_CHUNKS + body_bytes // BODY_BYTES_PER_CHUNK:
                            raise h11.RemoteProtocolError(
                                f"the request body came in {chunks} chunks for {body_bytes} bytes; this server "
                                f"reads {FREE_BODY_CHUNKS} chunks, then one more for each "
                                f"{BODY_BYTES_PER_CHUNK} bytes: send larger chunks, or a Content-Length")
                    elif type(event) is h11.Request:
                        chunks = body_bytes = 0
                    return event
                except h11.RemoteProtocolError as e:
                    self._protocol_error = e
                    raise

            self.conn.next_event = next_event

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 could not parse, in JSON (see the module doc)."""
            e = self._protocol_error
            if e is not None and e.error_status_hint == 431:
                status, code, reason = 431, "request_header_fields_too_large", b"Request Header Fields Too Large"
                limit = getattr(self.conn, "_max_incomplete_event_size", 0)
                message = (f"the request's headers are too large: this server reads at most {limit // 1024} KiB of "
                           "request line and headers; send large values in the JSON body")
            else:
                status, code, reason = 400, "invalid_http_request", b"Bad Request"
                message = f"invalid HTTP/1.1 request: {e}" if e is not None else msg
            if self.cycle is not None and self.cycle.response_started:
                self.transport.close()  # a response was sent (a refusal before the body was read)
                return
            body = json.dumps(error_body(message, code=code)).encode()
            # written whole: h11's connection is in its error state and sends nothing more
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 b"content-length: %d\r\n\r\n" % (status, reason, len(body)) + body)
            self._close_lingering()

        _lingering = False

        def _close_lingering(self) -> None:
            """Close after a refusal sent while the client may still be sending (a body too
            chunked, headers too large): the reply and then a FIN go out, what the client still
            sends is read and dropped for up to LINGER_S, then the connection closes. Closed at
            once, the socket's unread input made the kernel send a reset, which threw away the
            reply before the client could read it."""
            self._lingering = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.transport.resume_reading()
            self.loop.call_later(LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if not self._lingering:
                super().data_received(data)

        _write_timer: asyncio.TimerHandle | None = None

        _probe_timer: asyncio.TimerHandle | None = None
        _eof = False  # the client half-closed: it sends nothing more

        def eof_received(self) -> bool | None:
            """The client sent all it will send. With a whole request in and its reply due, the
            connection stays open for that reply and those of the requests pipelined after it
            (then closes; on_response_complete) and is probed meanwhile (see the module doc);
            otherwise (idle, or a body cut short) it closes, as uvicorn's did."""
            cycle = self.cycle
            if self._lingering or cycle is None or cycle.response_complete or cycle.disconnected or cycle.more_body:
                return None  # the transport closes: a disconnect for a body still coming
            self._eof = True
            self._arm_probe()
            return True  # keep the transport open for writing

        def _arm_probe(self) -> None:
            # the first probe after a while: a reply that comes soon comes without a 100 before it
            if self._probe_timer is None:
                self._probe_timer = self.loop.call_later(HALF_CLOSE_PROBE_S, self._probe)

        def _probe(self) -> None:
            self._probe_timer = None
            cycle = self.cycle
            if self.transport.is_closing() or cycle is None or cycle.response_complete:
                return
            sock = self.transport.get_extra_info("socket")
            if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.transport.abort()  # reset by the client (it closed, not half-closed): a client gone
                return
            # (never to an HTTP/1.0 client, which RFC 9110 15.2 bids a server send no 1xx: its
            # request runs on until its reply is written, where a closed socket is seen)
            if (not cycle.response_started and self.conn.our_state is h11.SEND_RESPONSE
                    and cycle.scope.get("http_version") != "1.0"):
                probe = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
                self.transport.write(self.conn.send(probe))
            elif cycle.response_started and self.conn.our_state is h11.SEND_BODY and cycle.scope.get(SSE_SCOPE_KEY):
                # a stream's events are written whole, each in one write: this lands between two
                self.transport.write(self.conn.send(h11.Data(data=SSE_PROBE)))
            self._probe_timer = self.loop.call_later(HALF_CLOSE_PROBE_S, self._probe)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._probe_timer is not None:
                self._probe_timer.cancel()
                self._probe_timer = None
            if self._header_timer is not None:
                self._header_timer.cancel()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            super().pause_writing()
            if write_timeout_s is not None and self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout_s, self._write_stalled)

        def resume_writing(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            super().resume_writing()

        def _write_stalled(self) -> None:
            self._write_timer = None
            log.warning("closing a connection from %s: its client read none of its response for %g s "
                        "(--stream-write-timeout-s); its request is aborted",
                        "%s:%d" % tuple(self.client[:2]) if self.client else "?", write_timeout_s)
            self.transport.abort()  # close() would wait to flush what the client does not read

        def on_response_complete(self) -> None:
            self._arm()
            super().on_response_complete()  # a pipelined request may start here: it is under way, not late
            if self._eof and not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self.transport.close()  # the last request of a client that half-closed is answered
                else:
                    self._arm_probe()  # the next pipelined one is: probe on while it is due

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is under way: its headers came in time
            if self.conn.trailing_data[0]:  # part of a request came (h11 holds it until the headers end)
                self.transport.write(reply)
            self.transport.close()

    return HeaderDeadlineH11Protocol
