"""SGLang's BaseBackend.shutdown() on a RuntimeEndpoint (a script that ends with
`backend.shutdown()`, whichever backend it made): an AttributeError before; it releases
nothing, and the server keeps serving. The shared plain_server."""
from __future__ import annotations

import treadle as sgl


def test_runtime_endpoint_shutdown_leaves_the_server_running(plain_server):
    backend = sgl.RuntimeEndpoint(plain_server.url)
    assert backend.shutdown() is None
    assert sgl.RuntimeEndpoint(plain_server.url).get_server_info()["max_total_num_tokens"] > 0
