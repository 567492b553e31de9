"""What a gateway process spends with nothing to do, its caches warm (not a test; results in docs/benchmarks.md):

  .venv/bin/python bench/gateway_idle_bench.py [--seconds 15] [--rounds 2]

Starts the fake upstream, a Redis of the bench's own and the web server as `make run` starts it
(bench/gateway_client_bench.py's pieces), sends a few streams so that the key, the budgets, the route and the
channels' clean state are cached and their refreshers run, then, for --rounds rounds of --seconds each with no
request (a stream between rounds keeps the caches in use): the CPU of every process and thread of the server (utime +
stime from /proc), the event loops and the other threads apart, and the commands the server's Redis ran meanwhile
(INFO's total_commands_processed, less the bench's own INFO calls)."""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis
from gateway_bench import prepare_panel, stop
from gateway_client_bench import cpu_seconds, own_redis, thread_seconds, tree, web_server
from gateway_overhead import upstream

BODY = {"model": "chat", "stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def streams(url, key, count):
    with httpx.Client(timeout=30) as client:
        for _ in range(count):
            with client.stream("POST", f"{url}/chat/completions", json=BODY,
                               headers={"Authorization": f"Bearer {key}"}) as response:
                for _ in response.iter_bytes():
                    pass


def idle_round(processes, redis_client, seconds):
    commands_before = redis_client.info("stats")["total_commands_processed"]
    cpu_before, threads_before = cpu_seconds(processes), thread_seconds(processes)
    time.sleep(seconds)
    cpu_after, threads_after = cpu_seconds(processes), thread_seconds(processes)
    commands = redis_client.info("stats")["total_commands_processed"] - commands_before - 1
    parts = {"event_loops": 0.0, "other_threads": 0.0}
    for pid, now in threads_after.items():
        was = threads_before.get(pid, {"main": [0.0, 0.0], "others": [0.0, 0.0]})
        parts["event_loops"] += sum(now["main"]) - sum(was["main"])
        parts["other_threads"] += sum(now["others"]) - sum(was["others"])
    return {"cpu_ms_per_s": (cpu_after - cpu_before) * 1000 / seconds,
            **{f"{name}_ms_per_s": spent * 1000 / seconds for name, spent in parts.items()},
            "redis_commands_per_s": commands / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tokenwise-idle-bench-"))
    running = []
    try:
        fake, fake_url = upstream(200, 0.005)
        running.append(fake)
        redis_process, redis_url = own_redis(folder)
        running.append(redis_process)
        os.environ["REDIS_URL"] = redis_url
        env, key = prepare_panel(folder, fake_url)
        server, url = web_server(env, "make-run")
        running.append(server)
        streams(url, key, 20)
        time.sleep(1)
        processes = tree(server.pid)
        redis_client = redis.Redis.from_url(redis_url)
        rounds = []
        for _ in range(args.rounds):
            rounds.append(idle_round(processes, redis_client, args.seconds))
            print(json.dumps(rounds[-1]), flush=True)
            streams(url, key, 1)  # the caches stay in use
    finally:
        for process in reversed(running):
            stop(process)
    print(json.dumps({"settings": vars(args), "processes": len(processes), "rounds": rounds}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
