"""An OTLP/HTTP traces endpoint that accepts every export and keeps nothing but counts: what
``overhead.py --tracing`` points the proxy's exporter at, so tracing's cost is measured with
its export really happening (on loopback, no collector to install)."""

from __future__ import annotations

import argparse
import http.server


class Sink(http.server.BaseHTTPRequestHandler):
    exports = 0
    received_bytes = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        Sink.exports += 1
        Sink.received_bytes += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        text = f'{{"exports": {Sink.exports}, "bytes": {Sink.received_bytes}}}'.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *_: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


if __name__ == "__main__":
    main()
