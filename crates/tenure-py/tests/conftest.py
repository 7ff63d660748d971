"""Test support: private redis-server and etcd processes on free loopback
ports, stopped by PID (never the shared default ports, never pkill), and
candidate processes driven over stdin/stdout.

A free port is found by binding port 0 and letting go; another process can
take it before our server binds it. So a server counts as started only when
it answers as *our* child: redis's `INFO server` names its `process_id`,
and etcd must still be running when its port answers."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
CHILD = HERE / "candidate.py"
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(port: int, *args: str, password: Optional[str] = None) -> bytes:
    """One command over a fresh connection, raw RESP: the reply's bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        def send(*parts: str) -> bytes:
            wire = f"*{len(parts)}\r\n".encode()
            for part in parts:
                data = part.encode()
                wire += b"$%d\r\n%s\r\n" % (len(data), data)
            s.sendall(wire)
            return read_reply(s)

        if password is not None:
            send("AUTH", password)
        return send(*args)


def read_reply(s: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
        if data.startswith(b"$"):
            header, _, rest = data.partition(b"\r\n")
            length = int(header[1:])
            if length < 0 or len(rest) >= length + 2:
                return data
        elif data.endswith(b"\r\n"):
            return data


class RedisServer:
    def __init__(self, password: Optional[str] = None) -> None:
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="tenure-py-redis-")
        for _ in range(10):
            self.port = free_port()
            args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", self.dir]
            if password is not None:
                # Through stdin, not argv: a password never shows in `ps`.
                args = ["redis-server", "-"]
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if password is not None:
                config = (
                    f"port {self.port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\n"
                    f"dir {self.dir}\nrequirepass {password}\n"
                )
                assert self.proc.stdin is not None
                self.proc.stdin.write(config.encode())
                self.proc.stdin.close()
            if self._ours():
                return
            self.stop()
        raise RuntimeError("could not start redis-server on a free port")

    def _ours(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                info = redis_command(self.port, "INFO", "server", password=self.password)
            except OSError:
                time.sleep(0.02)
                continue
            return f"process_id:{self.proc.pid}\r\n".encode() in info
        return False

    @property
    def url(self) -> str:
        if self.password is not None:
            return f"redis://:{self.password}@127.0.0.1:{self.port}"
        return f"redis://127.0.0.1:{self.port}"

    def command(self, *args: str) -> bytes:
        return redis_command(self.port, *args, password=self.password)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class EtcdServer:
    def __init__(self) -> None:
        if shutil.which("etcd") is None:
            pytest.skip("etcd is not installed (scripts/install-deps.sh installs it)")
        self.dir = tempfile.mkdtemp(prefix="tenure-py-etcd-")
        for _ in range(10):
            self.port, peer = free_port(), free_port()
            client, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
            self.proc = subprocess.Popen(
                ["etcd", "--name", "t", "--data-dir", os.path.join(self.dir, str(peer)),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"t={peer_url}", "--log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._ready():
                return
            self.stop()
        raise RuntimeError("could not start etcd on free ports")

    def _ready(self) -> bool:
        import urllib.request

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    body = json.loads(r.read())
                # Still running after it answered: the answer was our child's.
                if body.get("health") == "true" and self.proc.poll() is None:
                    return True
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        return False

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    server = EtcdServer()
    yield server
    server.stop()


@pytest.fixture(params=["redis", "etcd"])
def store(request: pytest.FixtureRequest) -> str:
    """The URL of each real store the package is tested on."""
    server = request.getfixturevalue(f"{request.param}_server")
    return server.url


@pytest.fixture
def name() -> str:
    """An election name of this test's own."""
    return f"py-{uuid.uuid4().hex[:12]}"


class Candidate:
    """A process that campaigns (tests/candidate.py), driven over stdin;
    its events, one JSON object per line, are read by a thread."""

    def __init__(self, store: str, name: str, ttl: float, **extra: Any) -> None:
        args = [sys.executable, str(CHILD), "--store", store, "--name", name, "--ttl", str(ttl)]
        for key, value in extra.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self.events: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.seen: List[Dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            event["at"] = time.monotonic()
            self.events.put(event)
        self.events.put({"event": "exited", "at": time.monotonic()})

    def expect(self, kind: str, timeout: float = 30.0) -> Dict[str, Any]:
        """The next event of `kind`; fails on an error event, on exit, or
        after `timeout` seconds (a bound for a stuck test, not a speed)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind!r} event within {timeout}s; saw {self.seen}; stderr: {self.stderr()}")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(event)
            if event["event"] == kind:
                return event
            if event["event"] in ("error", "exited"):
                raise AssertionError(f"wanted {kind!r}, got {event}; stderr: {self.stderr()}")

    def event(self, kind: str, timeout: float = 30.0) -> Dict[str, Any]:
        """An event of `kind` already seen (events from the candidate's
        threads may come in any order), else the next one."""
        for event in self.seen:
            if event["event"] == kind:
                return event
        return self.expect(kind, timeout)

    def send(self, *words: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(words) + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(still running)"
        return self.proc.stderr.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def candidates() -> Iterator[Any]:
    """Start candidates with `candidates(store, name, ttl)`; all are killed
    at the end of the test."""
    started: List[Candidate] = []

    def start(store: str, name: str, ttl: float, **extra: Any) -> Candidate:
        candidate = Candidate(store, name, ttl, **extra)
        started.append(candidate)
        return candidate

    yield start
    for candidate in started:
        candidate.stop()
