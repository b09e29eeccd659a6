# stand-in for the engine's /metrics: a settable gauge vllm:num_requests_waiting (value read from /tmp/keda-spike/waiting)
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try: v = open('/tmp/keda-spike/waiting').read().strip() or '0'
        except OSError: v = '0'
        b = f'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name="fm"}} {v}\n'.encode()
        self.send_response(200); self.send_header('Content-Type','text/plain; version=0.0.4'); self.send_header('Content-Length',str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self,*a): pass
http.server.ThreadingHTTPServer(('127.0.0.1',19301),H).serve_forever()
