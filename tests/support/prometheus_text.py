"""A small Prometheus-text server standing for the engines of a vLLM pool the panel did not start: real HTTP, one
/metrics body per path, a bearer token it checks when set, and vllm_metrics() to write vLLM's exposition."""
import http.server
import threading


def vllm_metrics(*, prompt, generation, queries=0, hits=0, waiting=0, running=0, kv=0.0, ttft=(0, 0, 0)):
    """/metrics as vLLM writes it (labels per model and engine). `ttft`: cumulative counts at le 0.1, 1.0, +Inf."""
    labels = 'engine="0",model_name="pool-chat"'
    lines = ["# TYPE vllm:prefix_cache_queries_total counter", f"vllm:prefix_cache_queries_total{{{labels}}} {queries}",
             "# TYPE vllm:prefix_cache_hits_total counter", f"vllm:prefix_cache_hits_total{{{labels}}} {hits}",
             "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
             "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{labels}}} {generation}",
             "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
             "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {running}",
             "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {waiting}",
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    for bound, count in zip(("0.1", "1.0", "+Inf"), ttft):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{bound}"}} {count}')
    lines += [f"vllm:time_to_first_token_seconds_count{{{labels}}} {ttft[-1]}",
              f"vllm:time_to_first_token_seconds_sum{{{labels}}} {0.05 * ttft[-1]}"]
    return "\n".join(lines) + "\n"


class PrometheusText:
    """Serves `bodies[path]` (404 for other paths; `statuses[path]` overrides 200). With `token` set, a request
    without "Authorization: Bearer <token>" gets 401. `seen` keeps each request's (path, Authorization)."""

    def __init__(self, token=""):
        self.bodies, self.statuses, self.token, self.seen = {}, {}, token, []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                fake.seen.append((self.path, self.headers.get("Authorization", "")))
                status = fake.statuses.get(self.path, 200)
                if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                    status = 401
                body = fake.bodies.get(self.path)
                if body is None:
                    status = 404
                data = (body or "not found").encode() if status == 200 else b"no"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path):
        return self.origin + path

    def close(self):
        self.server.shutdown()
        self.server.server_close()
