"""A local webhook receiver for the notification tests: it records every POST (headers and body) and misbehaves
on demand (answers 500, or waits before answering) a given number of times. It binds 127.0.0.1 only."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, port=0):
        self.received = []
        self.plan = []  # one entry per coming request: ("status", 500) or ("sleep", seconds); then 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    step = receiver.plan.pop(0) if receiver.plan else ("status", 200)
                    receiver.received.append({"headers": dict(self.headers), "body": body, "answered": step})
                if step[0] == "sleep":
                    time.sleep(step[1])
                    step = ("status", 200)
                try:
                    self.send_response(step[1])
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up meanwhile

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def bodies(self):
        return [json.loads(item["body"]) for item in self.received]
