"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers.

uvicorn (0.55, h11) waits for a request's headers as long as the client likes: a connection
that sent nothing, or half a request line and then a byte now and then (slowloris), was held
open forever, each one a file descriptor and a protocol object, until the process ran out of
them. Here a connection has --request-body-timeout-s to send a whole set of headers, counted
from the connection or from its previous response; past it, the connection is closed (after
a 408 when some of a request had come). Once the headers are in, the body's own deadline is
the Gate's (http_server.body_deadline), and a response may take as long as it takes.
"""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

from treadle.runtime.server.protocol import error_body


def header_deadline_protocol(timeout_s: float) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...), with a `timeout_s` header deadline."""
    body = json.dumps(error_body(f"the request's headers did not arrive within {timeout_s:g} s "
                                 "(--request-body-timeout-s)", code="request_timeout")).encode()
    reply = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n" % len(body)) + body

    class HeaderDeadlineH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            self._arm()
            super().on_response_complete()  # a pipelined request may start here: it is under way, not late

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
