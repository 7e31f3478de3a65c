"""A stand-in aggregated API server for the harness tests (stdlib only).

Serves discovery for subresources.aggapi.io/v1alpha1 with aggapi's serving cert, requires
a client certificate from kube-apiserver's front-proxy CA with CN front-proxy-client (as
the aggregator presents), and echoes the X-Remote-* identity of every other request. It
proves the path kube-apiserver -> aggregator -> netns endpoint without aggapi's own code.

usage: python3 standin_server.py ADDRESS PORT CERT KEY FRONT_PROXY_CA
"""

from __future__ import annotations

import json
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DISCOVERY = {
    "kind": "APIResourceList", "apiVersion": "v1",
    "groupVersion": "subresources.aggapi.io/v1alpha1",
    "resources": [
        {"name": "pods/imagepullprogress", "singularName": "", "namespaced": True,
         "kind": "ImagePullProgress", "verbs": ["get"]},
        {"name": "pods/copy", "singularName": "", "namespaced": True, "kind": "ContainerCopy",
         "verbs": ["create", "get"]},
    ],
}


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        peer = self.connection.getpeercert() or {}
        cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), "")
        if cn != "front-proxy-client":
            self._send(401, {"kind": "Status", "code": 401, "message": f"peer {cn!r}"})
            return
        if self.path.split("?")[0] in ("/apis/subresources.aggapi.io/v1alpha1",
                                       "/apis/subresources.aggapi.io/v1alpha1/"):
            self._send(200, DISCOVERY)
            return
        self._send(200, {
            "path": self.path, "peer": cn,
            "user": self.headers.get("X-Remote-User"),
            "uid": self.headers.get("X-Remote-Uid"),
            "groups": self.headers.get_all("X-Remote-Group") or [],
            "authorization": self.headers.get("Authorization"),
        })

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("standin: " + (format % args) + "\n")


def main() -> None:
    addr, port, cert, key, ca = sys.argv[1:6]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL  # health probes come without a cert
    srv = ThreadingHTTPServer((addr, int(port)), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
