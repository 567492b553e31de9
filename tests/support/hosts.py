"""Hosts on this machine for a test: each a network namespace with its own address on a bridge, where a GPU worker
runs with its engines, as on a GPU host of its own. The test process, its gateway and the database stay in this
machine's own namespace, the "main host"; a worker in a namespace reaches the test's Redis at the bridge's address
(a relay there forwards to the Redis on 127.0.0.1), and the gateway and the scraper reach its engines at the
namespace's address, as they would reach another host's. The database is the suite's SQLite file, which every
namespace sees on the shared disk (PostgreSQL across hosts is tests/system/test_postgres.py's).

`cut(name)` is a host lost at once: its link goes down first (nothing more reaches it, and what it had open gets no
answer), then every process in it is SIGKILLed, so its heartbeats stop.

Creating namespaces needs root (CAP_NET_ADMIN), which the machines this suite runs on give."""
import asyncio
import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@dataclass
class Host:
    name: str  # TOKENWISE_HOST_NAME of its worker
    netns: str
    address: str
    link: str  # its end of the cable, on the bridge

    @property
    def argv_prefix(self):
        """What runs a command inside this host (`ip netns exec` executes it in place: the pid stays the same)."""
        return ["ip", "netns", "exec", self.netns]


class Relay:
    """TCP from `listen` (host, port) to `target` (host, port), on a thread of its own: the cable between the hosts
    and the services that listen only on 127.0.0.1 here."""

    def __init__(self, listen, target):
        self.target = target
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(listen, ready), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise AssertionError(f"the relay on {listen} did not start")

    def _run(self, listen, ready):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._pipe, *listen))
        ready.set()
        self.loop.run_forever()
        pending = asyncio.all_tasks(self.loop)  # the connections still open: closed with the loop
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _pipe(self, client_reader, client_writer):
        try:
            reader, writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return

        async def copy(source, sink):
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                sink.close()

        try:
            await asyncio.gather(copy(client_reader, writer), copy(reader, client_writer))
        except asyncio.CancelledError:
            pass  # the relay closes

    def close(self):
        def stop():
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self.thread.join(timeout=10)


class SimulatedHosts:
    """`with SimulatedHosts(["host-a", "host-b"], redis_port=...) as hosts:` hosts["host-a"].address, ...
    Names and addresses are this process's own (two test workers each have theirs); everything is removed on exit,
    the processes left in a namespace included."""

    def __init__(self, names, *, redis_port):
        tag = os.getpid() % 100000
        subnet = f"10.{200 + tag % 50}.{tag % 250}"
        self.bridge, self.gateway_address, self.redis_port = f"twbr{tag}", f"{subnet}.1", redis_port
        self.hosts = {name: Host(name, f"tw{tag}-{index}", f"{subnet}.{index + 2}", f"tw{tag}h{index}")
                      for index, name in enumerate(names)}
        self.subnet = f"{subnet}.0/24"
        self.relay = None

    def __enter__(self):
        try:
            self._create()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc):
        self._remove()

    def __getitem__(self, name):
        return self.hosts[name]

    def _create(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts.values():
            inside = f"{host.link}n"
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", host.netns)
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip("-n", host.netns, "link", "set", inside, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        self.relay = Relay((self.gateway_address, self.redis_port), ("127.0.0.1", self.redis_port))

    def worker_env(self, name):
        """The environment of the GPU worker of host `name`: its name, the main host's Redis across the bridge, its
        engines listening on its own address (where the gateway reaches them)."""
        host = self.hosts[name]
        return {"TOKENWISE_HOST_NAME": host.name, "REDIS_URL": f"redis://{self.gateway_address}:{self.redis_port}/0",
                "TOKENWISE_ENGINE_BIND": host.address, "TOKENWISE_ENGINE_ADVERTISE_HOST": host.address}

    def pids(self, name):
        listed = _ip("netns", "pids", self.hosts[name].netns, check=False).stdout.split()
        return [int(pid) for pid in listed if pid.isdigit()]

    def cut(self, name):
        """Host `name` is lost: its link down, then every process in it killed."""
        _ip("link", "set", self.hosts[name].link, "down")
        self._kill(name)

    def _kill(self, name):
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reachable(self, name, port, timeout=1.0):
        """Whether something in host `name` accepts a connection on `port` from the main host."""
        try:
            with socket.create_connection((self.hosts[name].address, port), timeout=timeout):
                return True
        except OSError:
            return False

    def _remove(self):
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        for host in self.hosts.values():
            self._kill(host.name)
            _ip("netns", "del", host.netns, check=False)  # its end of the cable goes with it
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)
