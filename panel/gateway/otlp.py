"""This process's OTLP exporters, started at the first gateway request that ends while TOKENWISE_OTEL_ENDPOINT is
set (never without it): the SDK's tracer with its BatchSpanProcessor, which exports on its own thread, and one
thread that sends the panel's metrics every TOKENWISE_OTEL_EXPORT_INTERVAL_MS. Each web process (panel/web.py) has
its own, named by service.instance.id; a process forked after the start builds its own again."""
import atexit
import logging
import os
import socket
import threading
import time

from django.conf import settings
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from panel.gateway import otlp_metrics

log = logging.getLogger(__name__)

EXPORT_TIMEOUT_SECONDS = 10  # one OTLP request; a collector that does not answer costs a batch, never a request
SCOPE = "tokenwise.gateway"


class Exporters:
    """The tracer, the span processor and the metrics thread of one process."""

    def __init__(self):
        self.pid = os.getpid()
        self.started_ns = time.time_ns()
        endpoint, headers = settings.OTEL_ENDPOINT, settings.OTEL_HEADERS
        interval = settings.OTEL_EXPORT_INTERVAL_SECONDS
        self.resource = Resource.create({"service.name": settings.OTEL_SERVICE_NAME,
                                         "service.instance.id": f"{socket.gethostname()}-{self.pid}"})
        self.ids = PresetIds()
        self.provider = TracerProvider(resource=self.resource, shutdown_on_exit=False, id_generator=self.ids)
        self.processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", headers=headers, timeout=EXPORT_TIMEOUT_SECONDS),
            schedule_delay_millis=interval * 1000)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer(SCOPE)
        self.metric_exporter = OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics", headers=headers,
                                                  timeout=EXPORT_TIMEOUT_SECONDS)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._send_metrics, args=(interval,), name="otlp metrics", daemon=True)
        self.thread.start()
        atexit.register(self.stop)  # the spans still queued and the last figures go out as the process ends

    def emit(self, request, attempts, ids=None):
        """Make the request's span (a server span) and its attempts' (client spans, its children) from their
        tracing.Span, ended at their own times: the batch processor queues them for its thread. `ids`
        (tracing.TraceIds): the request span's own ids, under the client's span when it named one."""
        outer = None
        if ids is not None:
            self.ids.preset(ids.trace_id, ids.span_id)
            if ids.parent_span_id is not None:
                outer = trace.set_span_in_context(NonRecordingSpan(SpanContext(
                    ids.trace_id, ids.parent_span_id, is_remote=True, trace_flags=TraceFlags(ids.flags),
                    trace_state=TraceState.from_header([ids.tracestate]) if ids.tracestate else None)))
        try:
            parent = self._start(request, SpanKind.SERVER, outer)
        finally:
            self.ids.preset(None, None)
        context = trace.set_span_in_context(parent)
        for attempt in attempts:
            self._start(attempt, SpanKind.CLIENT, context).end(end_time=attempt.end_ns)
        parent.end(end_time=request.end_ns)

    def _start(self, span, kind, context):
        started = self.tracer.start_span(span.name, context=context, kind=kind, start_time=span.start_ns,
                                         attributes=span.attributes)
        if span.error:
            started.set_status(Status(StatusCode.ERROR, span.error))
        return started

    def _send_metrics(self, interval):
        while not self.stopped.wait(interval):
            self.send_metrics()

    def send_metrics(self):
        try:
            self.metric_exporter.export(otlp_metrics.metrics_data(self.resource, self.started_ns))
        except Exception:  # the exporter logs its own failures; anything else must not end the thread
            log.exception("the panel's metrics were not sent over OTLP")

    def stop(self):
        """Send what is queued and stop: at the process's exit, once."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.thread.join(timeout=EXPORT_TIMEOUT_SECONDS)
        self.send_metrics()
        self.provider.shutdown()
        self.metric_exporter.shutdown()


class PresetIds(RandomIdGenerator):
    """Random ids, except those chosen for the next span this thread makes: a request's span gets the ids its
    upstream calls already carried in their traceparent (gateway/tracing.py)."""

    def __init__(self):
        self._next = threading.local()

    def preset(self, trace_id, span_id):
        self._next.trace_id, self._next.span_id = trace_id, span_id

    def generate_trace_id(self):
        return getattr(self._next, "trace_id", None) or super().generate_trace_id()

    def generate_span_id(self):
        chosen = getattr(self._next, "span_id", None)
        self._next.span_id = None  # one span only: its children get ids of their own
        return chosen or super().generate_span_id()


_exporters = None
_lock = threading.Lock()


def exporters():
    """This process's exporters, started on first use (or again in a forked child)."""
    global _exporters
    current = _exporters
    if current is not None and current.pid == os.getpid():
        return current
    with _lock:
        if _exporters is None or _exporters.pid != os.getpid():
            _exporters = Exporters()
        return _exporters


def running():
    """The exporters of this process, or None when none were started."""
    return _exporters if _exporters is not None and _exporters.pid == os.getpid() else None


def stop():
    global _exporters
    with _lock:
        if running() is not None:
            _exporters.stop()
        _exporters = None
