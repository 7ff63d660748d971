#!/usr/bin/env python3
"""What one acquisition costs redis-server, step by step.

Starts a private redis-server on a free loopback port, loads the acquire
scripts as tenure does (the prelude, acquire_one.lua, then acquire.lua or
acquire_many.lua), and runs four kinds of call, a few thousand each,
reading Redis's own INFO commandstats after each: the process epoch alone
(two INFO calls and their matching), a winning acquisition, a follower's
look at a held lease, and acquire_many.lua's hundred elections a call. For
each it prints the microseconds the server spent per election in the
script, split into the commands the script called (counted by Redis) and
the rest (Lua itself, the arguments and the reply).

    target/peers/bin/python scripts/acquire-cost.py [CALLS] [SCRIPTS_DIR]

(target/peers is the virtualenv scripts/install-deps.sh makes for the
bench's Python peers; it has redis-py.)
"""
import socket
import subprocess
import sys
import time

import redis

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
SCRIPTS = sys.argv[2] if len(sys.argv) > 2 else "crates/tenure/src/backend/redis/scripts/"
# The lease ttl and hold-off: long enough that no lease expires during a run.
TTL_MS = 20000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def script(*files):
    return "\n".join(open(SCRIPTS + f).read() for f in files)


def keys(name):
    base = f"bench:{{{name}}}"
    return [base + ":lease", base + ":token", base + ":epoch", "bench:epoch", base + ":witness"]


def args(instance):
    return [instance, TTL_MS, "bench:events", "attempt-" + instance, TTL_MS, 86400000]


def commandstats(port):
    raw = subprocess.run(
        ["redis-cli", "-p", str(port), "INFO", "commandstats"], capture_output=True, text=True
    ).stdout
    stats = {}
    for line in raw.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            fields = dict(kv.split("=") for kv in rest.split(","))
            stats[name] = (int(fields["calls"]), int(fields["usec"]))
    return stats


def main():
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        one = r.script_load(script("prelude.lua", "acquire_one.lua", "acquire.lua"))
        many = r.script_load(script("prelude.lua", "acquire_one.lua", "acquire_many.lua"))
        epoch = r.script_load(script("prelude.lua") + "\nreturn process_epoch()")
        # The prefix's first election starts its hold-off; wait it out.
        r.evalsha(one, 5, *keys("warm-up"), *args("a"))
        time.sleep(TTL_MS / 1000 + 0.5)

        def acquire_many(i):
            ks, av = [], []
            for j in range(100):
                ks += keys(f"many-{i}-{j}")
                av += args("a")
            r.evalsha(many, len(ks), *ks, *av)

        kinds = [
            ("process epoch alone (two INFO calls and their matching)",
             lambda i: r.evalsha(epoch, 0), 1),
            ("a winning acquisition (acquire.lua)",
             lambda i: r.evalsha(one, 5, *keys(f"e{i}"), *args("a")), 1),
            ("a follower's look at a held lease (acquire.lua)",
             lambda i: r.evalsha(one, 5, *keys(f"e{i}"), *args("b")), 1),
            ("acquire_many.lua, 100 winning elections a call", acquire_many, 100),
        ]
        for label, run, per_call in kinds:
            r.config_resetstat()
            calls = CALLS // per_call
            for i in range(calls):
                run(i)
            elections = calls * per_call
            stats = commandstats(port)
            _, total = stats.pop("evalsha", (0, 0))
            stats.pop("config|resetstat", None)
            print(f"\n{label}: {total / elections:.1f} us an election")
            inside = 0.0
            for name, (n, usec) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
                inside += usec / elections
                print(f"  {name:8} {n / elections:5.2f} calls {usec / elections:6.2f} us")
            print(f"  commands {inside:.1f} us; Lua, arguments and reply {total / elections - inside:.1f} us")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
