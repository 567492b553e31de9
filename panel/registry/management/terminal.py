"""Running a job in the terminal, as a command does: the job's task body in a thread here (claiming the job as any
worker would), with a progress bar; Ctrl-C cancels it."""
import sys
import threading

from django.core.management.base import CommandError

from panel.jobs.services import job_cancel

BAR_WIDTH = 40


def follow(job, execute):
    """Run `execute(job_id=..., worker="terminal")` for `job` and draw its progress until it ends. Returns the job
    as it ended; CommandError unless it succeeded."""
    worker = threading.Thread(target=execute, kwargs={"job_id": job.pk, "worker": "terminal"})
    worker.start()
    try:
        while worker.is_alive():
            draw(type(job).objects.get(pk=job.pk))
            worker.join(timeout=0.5)
    except KeyboardInterrupt:
        sys.stdout.write("\ncancelling...\n")
        job_cancel(job)
        worker.join()
    job.refresh_from_db()
    draw(job)
    sys.stdout.write("\n")
    if job.state != "succeeded":
        raise CommandError(f"job #{job.pk} {job.state}: {job.failure_kind} {job.failure_reason}".strip())
    return job


def draw(job):
    filled = int(BAR_WIDTH * job.progress / 100)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    sys.stdout.write(f"\r[{bar}] {job.progress:3d}% {job.phase[:70]:<70}")
    sys.stdout.flush()
