"""A small round-robin router in front of vLLM engines the panel did not start, standing for an llm-d gateway or a
production-stack router: real HTTP. Each request under /v1 goes to the next engine in turn, with that engine's own
key; /engines/<i>/metrics is engine i's /metrics; every request needs the router's own token. Streams are relayed
chunk by chunk as they arrive."""
import http.server
import itertools
import re
import threading

import httpx

RELAYED = ("content-type", "accept")


class RoundRobinProxy:
    def __init__(self, engines, *, token):
        """`engines`: [(the engine's OpenAI base URL, ending in /v1; its key)]."""
        self.engines = [(base_url.rstrip("/").removesuffix("/v1"), key) for base_url, key in engines]
        self.token, self.hits = token, [0] * len(engines)
        self.client = httpx.Client(timeout=httpx.Timeout(120, connect=5))
        turns, lock = itertools.cycle(range(len(engines))), threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.relay()

            def do_POST(self):
                self.relay()

            def relay(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Bearer {proxy.token}":
                    return self.answer(401, b'{"error": "the router wants its token"}')
                metrics = re.fullmatch(r"/engines/(\d+)/metrics", self.path)
                if metrics and int(metrics.group(1)) < len(proxy.engines):
                    index, path = int(metrics.group(1)), "/metrics"
                elif self.path.startswith("/v1/"):
                    with lock:
                        index = next(turns)
                        proxy.hits[index] += 1
                    path = self.path
                else:
                    return self.answer(404, b'{"error": "no such path"}')
                root, key = proxy.engines[index]
                headers = {name: value for name, value in self.headers.items() if name.lower() in RELAYED}
                headers["Authorization"] = f"Bearer {key}"
                with proxy.client.stream(self.command, root + path, headers=headers, content=body) as upstream:
                    self.send_response(upstream.status_code)
                    self.send_header("Content-Type", upstream.headers.get("content-type", "application/json"))
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in upstream.iter_bytes():
                        if chunk:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")

            def answer(self, status, data):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="pool-proxy", daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.client.close()
