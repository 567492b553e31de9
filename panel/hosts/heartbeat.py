"""Each worker process announces its host (CPU, memory, GPUs, queues) every few seconds from a thread."""
import logging
import os
import threading

import psutil
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

log = logging.getLogger(__name__)

_stop = threading.Event()
_thread = None

# A Celery worker forks its pool's processes from the process this thread beats in (a fresh one every
# CELERY_WORKER_MAX_TASKS_PER_CHILD tasks). A fork during a beat's database write copies SQLite's process-wide locks
# as held by a thread the child does not have, and the child's first query waits on them without end, past its soft
# time limit (issue 29: a roll-up killed at its hard limit). So a fork waits for the beat in flight, up to this long.
FORK_WAITS_FOR_BEAT_SECONDS = 60
beating = threading.Lock()  # held while a beat runs
_held_for_fork = False


def _before_fork():
    global _held_for_fork
    _held_for_fork = beating.acquire(timeout=FORK_WAITS_FOR_BEAT_SECONDS)
    if not _held_for_fork:
        log.warning("forking while a worker heartbeat is still running after %s s", FORK_WAITS_FOR_BEAT_SECONDS)


def _after_fork():
    if _held_for_fork:
        beating.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def gpu_facts():
    """GPUs through NVML when the driver is there; an empty list on a CPU host."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_bytes": int(memory.total),
                "memory_free_bytes": int(memory.free),
            })
        return gpus
    finally:
        pynvml.nvmlShutdown()


def facts(consumer_queues, node_name, started_at, slots=None):
    memory = psutil.virtual_memory()
    queues = sorted(consumer_queues)
    return {
        "name": node_name,
        "host": settings.HOST_NAME,
        "kind": "gpu" if "gpu" in queues else "default",
        "queues": queues,
        "cpu_count": os.cpu_count() or 0,
        "memory_bytes": memory.total,
        "memory_available_bytes": memory.available,
        "gpus": gpu_facts(),
        "pid": os.getpid(),
        "started_at": started_at,
        "slots": slots,
    }


def beat_once(consumer_queues, node_name, started_at, slots=None):
    from panel.hosts.services import host_heartbeat

    with beating:
        close_old_connections()
        try:
            host_heartbeat(**facts(consumer_queues, node_name, started_at, slots))
        finally:
            close_old_connections()


def start(consumer):
    global _thread
    queues = [queue.name for queue in consumer.task_consumer.queues] if consumer.task_consumer else []
    node_name = consumer.hostname
    started_at = timezone.now()
    slots = getattr(getattr(consumer, "controller", None), "concurrency", None)  # the worker's -c

    def loop():
        while not _stop.is_set():
            try:
                beat_once(queues, node_name, started_at, slots)
            except Exception:
                log.exception("worker heartbeat failed")
            _stop.wait(settings.HOST_HEARTBEAT_SECONDS)

    _stop.clear()
    _thread = threading.Thread(target=loop, name="tokenwise-heartbeat", daemon=True)
    _thread.start()


def stop(worker):
    from panel.hosts.services import host_offline

    _stop.set()
    if _thread is not None:
        # A beat in flight would write last_seen again after the farewell below and leave the host online.
        _thread.join(timeout=settings.HOST_HEARTBEAT_SECONDS + 10)
    try:
        close_old_connections()
        host_offline(name=worker.hostname)
    except Exception:
        log.exception("could not mark the worker offline")
