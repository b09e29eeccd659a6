# Stand-in for "our" cold-start failover responder: 503 + Retry-After + a body saying the model is starting.
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = json.dumps({"error": {"type": "model_starting", "message": "model is starting (scaled to zero); retry",
                                     "model": self.headers.get("X-KEDA-HTTP-Cold-Start-Ref-Name")}}).encode()
        self.send_response(503); self.send_header("Retry-After", "10")
        self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("10.250.68.1", 19300), H).serve_forever()
