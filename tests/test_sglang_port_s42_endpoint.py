"""SGLang's BaseBackend.shutdown() on a RuntimeEndpoint (a script that ends with
`backend.shutdown()`, whichever backend it made): an AttributeError before; it releases
nothing, and the server keeps serving. The shared plain_server."""
from __future__ import annotations

import treadle as sgl


def test_runtime_endpoint_shutdown_leaves_the_server_running(plain_server):
    backend = sgl.RuntimeEndpoint(plain_server.url)
    assert backend.shutdown() is None
    assert sgl.RuntimeEndpoint(plain_server.url).get_server_info()["max_total_num_tokens"] > 0


def test_raw_get_server_info_has_sglangs_top_level_keys(plain_server):
    """A ported client reading requests.get(url + "/get_server_info").json()["max_total_num_tokens"]
    (or model_path, tp_size, version), as SGLang's server answers: treadle's had the arguments
    only under "engine_args", and no pool size (the DSL added them, an Engine's now has them)."""
    import requests

    info = requests.get(plain_server.url + "/get_server_info", timeout=30).json()
    assert info["max_total_num_tokens"] == info["total_slots"] == 4096
    assert 0 < info["max_req_input_len"] < 4096 and info["model_path"].endswith(".gguf")
    assert info["tp_size"] == 1 and isinstance(info["version"], str) and "api_key" not in info
    assert info["engine_args"]["max_total_tokens"] == 4096 and "num_in_flight" in info
