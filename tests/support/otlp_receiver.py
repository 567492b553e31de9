"""An OTLP/HTTP receiver for the telemetry tests: it answers POST /v1/traces and /v1/metrics as a collector does and
keeps what it decoded (opentelemetry-proto's ExportTraceServiceRequest / ExportMetricsServiceRequest), so a test
reads the spans and metrics a gateway process really sent. It binds 127.0.0.1 only."""
import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.waiting import wait_until

SIGNALS = {"/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
           "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse)}


def attribute_value(any_value):
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def attributes_of(proto_attributes):
    return {item.key: attribute_value(item.value) for item in proto_attributes}


class OtlpReceiver:
    """`spans()`: every span received, as dicts (name, kind, ids, times, attributes, status, resource);
    `metrics()`: every metric data point received, as dicts (name, kind, attributes, value or count/sum/buckets)."""

    def __init__(self):
        self.requests = []  # (path, headers, decoded request)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                kinds = SIGNALS.get(self.path)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if kinds is None or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver.lock:
                    receiver.requests.append((self.path, dict(self.headers), kinds[0].FromString(body)))
                answer = kinds[1]().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp receiver", daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def clear(self):
        with self.lock:
            self.requests.clear()

    def _received(self, path):
        with self.lock:
            return [(headers, request) for sent_to, headers, request in self.requests if sent_to == path]

    def headers(self, path="/v1/traces"):
        return [headers for headers, _ in self._received(path)]

    def spans(self):
        found = []
        for _, request in self._received("/v1/traces"):
            for resource_spans in request.resource_spans:
                resource = attributes_of(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append({
                            "name": span.name, "kind": span.kind, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(), "parent_span_id": span.parent_span_id.hex(),
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                            "attributes": attributes_of(span.attributes), "status": span.status.code,
                            "status_message": span.status.message, "resource": resource,
                            "scope": scope_spans.scope.name})
        return found

    def metrics(self):
        found = []
        for _, request in self._received("/v1/metrics"):
            for resource_metrics in request.resource_metrics:
                resource = attributes_of(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            entry = {"name": metric.name, "kind": kind, "resource": resource,
                                     "attributes": attributes_of(point.attributes)}
                            if kind == "histogram":
                                entry.update(count=point.count, sum=point.sum, buckets=list(point.bucket_counts),
                                             bounds=list(point.explicit_bounds))
                            else:
                                entry["value"] = point.as_double if point.HasField("as_double") else point.as_int
                            found.append(entry)
        return found

    def wait_for_spans(self, predicate, seconds=15, message="spans"):
        """The spans received, once `predicate(spans)` holds."""
        wait_until(lambda: predicate(self.spans()), seconds=seconds, message=message)
        return self.spans()
