#!/usr/bin/env python3
"""A singleton worker in plain Python, beside a `tenure serve` sidecar.

`tenure serve` campaigns for the election; this worker follows its event
stream, GET /v1/elections/NAME/events, whose every event is the election's
state: {"election", "is_leader", "token", "leader", "deadline_ms"}. The rule:

1. At each event, the local deadline becomes time.monotonic() at its arrival
   plus deadline_ms; an event without is_leader true and deadline_ms > 0 ends
   it at once.
2. Act only while time.monotonic() < deadline. Nothing else extends it: when
   the stream goes silent or breaks (the sidecar hangs or restarts, or closes
   the stream after a term ends), the worker stops at the last deadline it
   computed, and reconnects.
3. Pass the token with every write, to a resource that refuses a token lower
   than the highest it has accepted (a fenced write). A worker paused between
   its check and its write can still write late; only the fence makes that
   write harmless.

The resource here is a ledger file standing in for a database: under an
exclusive flock, a write whose token is at least the highest accepted one is
appended as ACCEPT, an older one as REJECT.

    tenure serve --election demo &
    python3 worker.py --election demo --ledger /tmp/ledger

Standard library only (Python 3.8+, Linux or macOS). SIGTERM or SIGINT: exit 0.
"""

import argparse
import fcntl
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# The sidecar sends a keep-alive comment every 15 s; a stream silent for this
# long is dead, and the worker reconnects (its deadline ran out long before).
READ_TIMEOUT = 45


def log(message):
    print(f"worker: {message}", file=sys.stderr, flush=True)


class Lease:
    """The last term heard of: its token and its local monotonic deadline."""

    def __init__(self):
        self.lock = threading.Lock()
        self.token = None
        self.deadline = 0.0
        self.fatal = None  # set when retrying cannot help

    def update(self, state, received):
        leading = state.get("is_leader") and (state.get("deadline_ms") or 0) > 0
        with self.lock:
            if leading:
                self.token = state["token"]
                self.deadline = received + state["deadline_ms"] / 1000
            else:
                self.token, self.deadline = None, 0.0

    def token_if_leading(self):
        """The token while this replica may act, else None."""
        with self.lock:
            return self.token if time.monotonic() < self.deadline else None


def read_events(response, lease):
    """Apply each event of an open stream to `lease` until the stream ends."""
    data, received = [], None
    while True:
        line = response.readline()
        if not line:
            return  # the sidecar closed the stream
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            # Taken when the event's first line arrives: the earliest moment
            # the worker knows of, so the deadline is never later than due.
            received = received or time.monotonic()
            data.append(line[6:] if line.startswith("data: ") else line[5:])
        elif line == "" and data:
            state = json.loads("\n".join(data))
            lease.update(state, received)
            if state.get("is_leader"):
                log(f"leading: token={state['token']} deadline_ms={state['deadline_ms']}")
            else:
                log(f"not leading; leader={state.get('leader')}")
            data, received = [], None
        # Anything else is a comment (": keep-alive") or a field not used here.


def follow(url, lease, stop):
    """Follow the event stream for ever, reconnecting after every end."""
    backoff = 0.1
    while not stop.is_set():
        request = urllib.request.Request(url, headers={"Accept": "text/event-stream"})
        try:
            with urllib.request.urlopen(request, timeout=READ_TIMEOUT) as response:
                backoff = 0.1
                read_events(response, lease)
            log("stream closed; reconnecting")
        except urllib.error.HTTPError as err:
            body = err.read().decode("utf-8", "replace").strip()
            if err.code == 404:  # a misconfiguration: retrying will not help
                lease.fatal = f"{url}: {body}"
                stop.set()
                return
            log(f"{url}: HTTP {err.code} {body}; retrying")
        except (OSError, ValueError, http.client.HTTPException) as err:
            # Refused (the sidecar is not up yet), reset, timed out, or cut
            # mid-event. The deadline stays as it was: never extended.
            log(f"stream broken ({err!r}); retrying in {backoff:.1f}s")
        stop.wait(backoff)
        backoff = min(backoff * 2, 2.0)


def fenced_write(path, name, token):
    """Append to the ledger unless a higher token was accepted: (ok, highest)."""
    with open(path, "a+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)  # released when the file closes
        ledger.seek(0)
        accepted = [int(line.split()[2]) for line in ledger if line.startswith("ACCEPT ")]
        highest = max(accepted, default=0)
        ok = token >= highest
        verdict = "ACCEPT" if ok else "REJECT"
        ledger.write(f"{verdict} {name} {token} {time.time():.6f}\n")
    return ok, highest


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env = os.environ.get
    parser.add_argument("--url", default=env("TENURE_SERVE_URL", "http://127.0.0.1:7878"),
                        help="where tenure serve listens (env TENURE_SERVE_URL)")
    parser.add_argument("--election", default=env("TENURE_ELECTION"), help="(env TENURE_ELECTION)")
    parser.add_argument("--ledger", default="ledger.txt", help="the shared ledger file")
    parser.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between writes")
    args = parser.parse_args()
    if not args.election:
        parser.error("give --election or TENURE_ELECTION")
    parsed = urllib.parse.urlsplit(args.url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        print(f"worker.py: --url {args.url!r} is not an http:// URL, e.g. http://127.0.0.1:7878",
              file=sys.stderr)
        return 2

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    lease = Lease()
    name = urllib.parse.quote(args.election, safe="")
    url = f"{args.url.rstrip('/')}/v1/elections/{name}/events"
    threading.Thread(target=follow, args=(url, lease, stop), daemon=True).start()

    while not stop.is_set():
        token = lease.token_if_leading()
        if token is not None:
            # Between this check and the write the worker may be paused past
            # its deadline; the fence, not the check, refuses that write.
            ok, highest = fenced_write(args.ledger, args.name, token)
            if ok:
                print(f"acting token={token}", flush=True)
            else:
                print(f"fenced write rejected token={token} highest={highest}", flush=True)
        stop.wait(args.every)
    if lease.fatal:
        log(lease.fatal)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
