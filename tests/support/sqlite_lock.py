"""A long writer: another process holds a SQLite database's write lock until the test lets go or time is up."""
import contextlib
import subprocess
import sys

HOLD = """
import select, sqlite3, sys
database = sqlite3.connect(sys.argv[1], isolation_level=None)
database.execute("BEGIN IMMEDIATE")
print("held", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))  # until the test closes our stdin, or the time is up
"""


@contextlib.contextmanager
def write_lock_held(path, *, seconds=120):
    """Hold the write lock of the SQLite file at `path` from another process for at most `seconds`."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.stdin.close()
        process.wait(timeout=30)
