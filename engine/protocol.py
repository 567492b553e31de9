"""The protocol every engine runner speaks to the panel (panel/jobs/runner.py reads it): one JSON object a line on
stdout, flushed at once, and an exit status.

    {"phase": "loading model", "progress": 5}        what it does now, 0-100 (a phase may end in " · about 31 s
                                                     left": the panel drops that estimate when the job ends)
    {"log": "calibration: 128 samples"}              a line for the job's log
    {"result": {...}}                                the last line of a success: exit 0
    {"error": {"kind": KIND, "reason": "..."}}       the last line of a failure: exit 1

Library chatter goes to stderr (the panel keeps its tail for the log). Standard library only: every runner imports
this, and nothing here may need the engine's packages."""
import argparse
import json
import signal
import sys

REASON_LIMIT = 1500


def say(**message):
    print(json.dumps(message), flush=True)


def progress(phase, percent):
    say(phase=phase, progress=percent)


class RunnerError(Exception):
    """A failure the runner classified itself: `kind` names it for the panel, `reason` is for a user."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Stopped(SystemExit):
    """Raised by the SIGTERM/SIGINT handler, so that every finally-block (a partial folder's removal) runs."""

    def __init__(self, signum):
        super().__init__(1)
        self.signal_name = signal.Signals(signum).name


def on_signal(signum, frame):
    # Once is enough: a second signal while the first unwinds must not interrupt the cleanup.
    ignore_signals()
    raise Stopped(signum)


def stop_on_signals():
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def ignore_signals():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class JsonArgumentParser(argparse.ArgumentParser):
    """Bad arguments are a RunnerError (one error line), not argparse's usage text and exit status 2."""

    def error(self, message):
        raise RunnerError("failed", f"bad arguments: {message}")


def run(body, *, parse_args, classify, argv=None):
    """A runner's main(): parse the arguments, run `body(args)`, and end with exactly one result or error line.
    `classify(error, args)` names a failure: (kind, reason). `--help` prints the usage and exits 0 with no error
    line. Returns the exit status."""
    stop_on_signals()
    args = None
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        result = body(args)
    except SystemExit as error:
        if not isinstance(error, Stopped) and error.code in (0, None):
            return 0  # --help
        return fail(error, args, classify)
    except BaseException as error:  # every failure reaches the panel as one JSON line
        return fail(error, args, classify)
    say(result=result)
    return 0


def describe(error, args=None):
    """(kind, reason) for what every runner can name: its own RunnerError, a signal, an interrupt; anything else is
    "failed" with the exception's words."""
    if isinstance(error, RunnerError):
        return error.kind, error.reason
    if isinstance(error, Stopped):
        return "failed", f"stopped by {error.signal_name} before it finished; nothing was written"
    if isinstance(error, KeyboardInterrupt):
        return "failed", "interrupted before it finished; nothing was written"
    return "failed", f"{type(error).__name__}: {error}"


def fail(error, args, classify):
    kind, reason = classify(error, args)
    say(error={"kind": kind, "reason": reason[:REASON_LIMIT]})
    if not isinstance(error, (RunnerError, Stopped, KeyboardInterrupt)):
        import traceback

        traceback.print_exc(file=sys.stderr)  # for the log, after the line the panel reads
    return 1
