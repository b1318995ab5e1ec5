#!/usr/bin/env python3
"""Alertmanager webhook receiver for testbed/tests/e2e_alerts.rs.

Usage: webhook.py PORT OUT_FILE. Listens on 127.0.0.1:PORT; each POST body (Alertmanager's
webhook JSON, version 4) is appended to OUT_FILE as one line, prefixed with the request
path and a tab; answers 200. Prints "listening" on stdout once bound.
"""
import http.server
import sys

port, out = int(sys.argv[1]), sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n).decode("utf-8", "replace").replace("\n", " ")
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"{self.path}\t{body}\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", port), Handler)
print("listening", flush=True)
server.serve_forever()
