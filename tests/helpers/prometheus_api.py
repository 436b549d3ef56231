"""A stand-in for Prometheus' instant-query API on 127.0.0.1: every query answers ``value`` for every fleet.

For what needs a real HTTP server but not real PromQL (how ``autoscaler.metrics.Prometheus`` reads under slow
or failing queries): put ``mmfleet_lab.cluster.prometheus_faults.PrometheusFaultProxy`` in front to delay or
break answers. The PromQL itself is tested against Debian's Prometheus (tests/integration).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler

from mmfleet.autoscaler.metrics import BACKEND_LABEL, Key
from mmfleet_lab.cluster.prometheus_faults import LocalHttpServer


class PrometheusApi(LocalHttpServer):
    """Answers ``/api/v1/query`` with one sample per fleet, labelled as the autoscaler's queries label them."""

    def __init__(self, fleets: Iterable[Key], value: float = 1.0, backend: str = "vllm") -> None:
        result = [
            {
                "metric": {"namespace": ns, "mmfleet_io_inference": name, BACKEND_LABEL: backend},
                "value": [0, str(value)],
            }
            for ns, name in fleets
        ]
        answer = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *_: object) -> None:
                pass

        self._serve(Handler)
