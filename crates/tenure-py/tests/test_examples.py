"""The examples run as documented, against a private redis-server."""

import re
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "src" / "python.md"
README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_first_election_is_the_docs_script_verbatim():
    script = (EXAMPLES / "first_election.py").read_text()
    assert len(script.strip().splitlines()) <= 10
    for page in (DOCS, README):
        assert script.strip() in page.read_text(), f"{page} does not show examples/first_election.py"


def read_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """One line of the process's output (the bound only stops a stuck test)."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    if not selector.select(timeout):
        raise AssertionError(f"no output within {timeout}s")
    return proc.stdout.readline().strip()


def test_two_first_elections_hand_over_on_resign(redis_server):
    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLES / "first_election.py"), redis_server.url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )

    redis_server.command("DEL", "tenure:{first-election}:lease", "tenure:{first-election}:witness")
    first, second = start(), start()
    try:
        line = read_line(first) if _leads_first(first, second) else read_line(second)
        leader, follower = (first, second) if line.startswith(str(first.pid)) else (second, first)
        token = int(re.fullmatch(r"\d+ leads with fencing token (\d+)", line).group(1))
        leader.stdin.write("\n")
        leader.stdin.flush()
        assert read_line(leader) == f"{leader.pid} resigned"
        taken = read_line(follower)
        match = re.fullmatch(rf"{follower.pid} leads with fencing token (\d+)", taken)
        assert match and int(match.group(1)) > token
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


def _leads_first(first: subprocess.Popen, second: subprocess.Popen, timeout: float = 30.0) -> bool:
    """Whether `first` speaks first (the leader is the one that speaks)."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(first.stdout, selectors.EVENT_READ, True)
    selector.register(second.stdout, selectors.EVENT_READ, False)
    ready = selector.select(timeout)
    if not ready:
        raise AssertionError(f"neither process led within {timeout}s")
    return ready[0][0].data


def run_until_it_says(redis_server, example, expected, *args):
    """Start an example, wait for a line matching `expected`, stop it with
    SIGTERM as a service manager would, and check it exits cleanly."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / example), redis_server.url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
    )
    try:
        # A store younger than the example's ttl grants its first lease only
        # once it is a ttl old: the bound allows for that.
        line = read_line(proc, timeout=60)
        assert re.fullmatch(expected, line), line
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
    finally:
        proc.kill()
        proc.wait()


def test_the_scheduler_example(redis_server):
    run_until_it_says(redis_server, "scheduler.py", r"\[\d+\] running due jobs with token \d+")


def test_the_daily_cleanup_example(redis_server):
    run_until_it_says(
        redis_server, "daily_cleanup.py", r"\[\d+\] cleanup for \S+ with token \d+", "--schedule", "* * * * * *"
    )


def test_the_partition_consumers_example(redis_server):
    run_until_it_says(redis_server, "partition_consumers.py", r"\[\d+\] consuming orders-\d with token \d+")
