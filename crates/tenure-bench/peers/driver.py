"""One candidate of a Python peer library, driven by tenure-bench's peers section.

Each peer is used the way its own documentation shows for a singleton job:

- `redis-py`: redis-py's `Lock` (`SET NX PX`; a blocked `acquire()` polls
  every 0.1 s). It has no auto-renewal, so a thread renews it by hand with
  `reacquire()` every ttl/3, the renewal loop its docs leave to the user; a
  renewal that fails ends the job.
- `python-redis-lock`: `redis_lock.Lock(..., auto_renewal=True)`: its own
  renewal thread (every 2/3 of the expiry), and `BLPOP` on a signal list
  that `release()` pushes to: a real hand-over notification.
- `pottery`: pottery's `Redlock` on one master, renewed by hand with
  `extend()` every ttl/3; the job checks `locked()` (a store read) before
  each step, as its docs show. A Redlock may be extended 3 times by default
  (`num_extensions`), then `extend()` raises and the lock lapses under a
  holder still at work: the driver lifts that limit, as a long-running
  leader must.
- `kazoo`: kazoo's `Election` recipe on ZooKeeper (`election.run(job)`: an
  ephemeral sequential znode, each contender watching the one before it),
  on a session whose timeout is the ttl. The job acts while kazoo's
  connection state is `CONNECTED` and its session was never `LOST`, as
  kazoo's docs on connection states tell a leader to check.

The protocol, one line each way (stdout is flushed at every line):

    key KEY           the Redis key that holds the lock (for its PTTL), or
                      the znode under which kazoo's contenders are
    ready             connected; about to block in acquire()
    held NS           holds the lock; NS is CLOCK_MONOTONIC in ns, the clock
                      every process of the host shares
    releasing NS      the `release` line arrived; the release call starts
    released          released; the process exits 0

stdin: `release` releases and exits; end of input does the same.

With `--scale N` the process holds N locks at once (NAME-0 and on), each
the way the peer's docs show for one, and says `holding K` every second
until it says `held NS` once all are; it says `ready` first and no `key`.

With `--act-ms N` the job acts every N ms while it believes it holds the
lock: one `RPUSH ACT_LOG ID` on a connection of its own (on the
redis-server of `--redis`, whatever the lock's store). The bench reads that
list (the store's own order) to count acts made while another held.
"""

import argparse
import sys
import threading
import time

import redis


def say(*words: object) -> None:
    print(*words, flush=True)


class RedisPy:
    """redis-py's Lock with a renewal loop by hand."""

    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        self.lock = client.lock(name, timeout=ttl, sleep=0.1, blocking=True, thread_local=False)
        self.ttl = ttl
        self.key = name
        self.held = False
        self.stop = threading.Event()

    def acquire(self) -> None:
        self.lock.acquire()
        self.held = True
        threading.Thread(target=self.renew, daemon=True).start()

    def renew(self) -> None:
        while not self.stop.wait(self.ttl / 3):
            try:
                self.lock.reacquire()
            except Exception:  # LockNotOwnedError, or the store unreachable
                self.held = False
                return

    def may_act(self) -> bool:
        return self.held

    def release(self) -> None:
        self.stop.set()
        self.lock.release()


class PythonRedisLock:
    """python-redis-lock with its own auto-renewal."""

    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        import redis_lock

        # Its expiry is whole seconds.
        self.lock = redis_lock.Lock(client, name, expire=max(1, round(ttl)), auto_renewal=True)
        self.key = "lock:" + name

    def acquire(self) -> None:
        self.lock.acquire(blocking=True)

    def may_act(self) -> bool:
        # Its docs run the job inside `with lock:`: nothing to check.
        return True

    def release(self) -> None:
        self.lock.release()


class Pottery:
    """pottery's Redlock on one master, extended by hand."""

    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        from pottery import Redlock

        self.lock = Redlock(
            key=name, masters={client}, auto_release_time=ttl, num_extensions=sys.maxsize
        )
        self.key = "redlock:" + name
        self.ttl = ttl
        self.stop = threading.Event()

    def acquire(self) -> None:
        self.lock.acquire(blocking=True)
        threading.Thread(target=self.renew, daemon=True).start()

    def renew(self) -> None:
        while not self.stop.wait(self.ttl / 3):
            try:
                self.lock.extend()
            except Exception:  # ExtendUnlockedLock, TooManyExtensions, ...
                return

    def may_act(self) -> bool:
        return self.lock.locked() > 0

    def release(self) -> None:
        self.stop.set()
        self.lock.release()


class Kazoo:
    """kazoo's Election recipe on ZooKeeper, the job run inside `run()`."""

    def __init__(self, hosts: str, name: str, ttl: float, me: str, client=None) -> None:
        from kazoo.protocol.states import KazooState

        self.connected = KazooState.CONNECTED
        self.client = client or kazoo_client(hosts, ttl)
        self.lost = False
        self.client.add_listener(self.listen)
        self.key = "/" + name
        self.election = self.client.Election(self.key, me)
        self.leading = threading.Event()
        self.stop = threading.Event()
        self.runner = threading.Thread(target=self.election.run, args=(self.lead,), daemon=True)

    def listen(self, state) -> None:
        from kazoo.protocol.states import KazooState

        if state == KazooState.LOST:
            self.lost = True

    def lead(self) -> None:
        self.leading.set()
        self.stop.wait()

    def acquire(self) -> None:
        self.runner.start()
        self.leading.wait()

    def may_act(self) -> bool:
        return not self.lost and self.client.state == self.connected

    def release(self) -> None:
        # The job returns; run() leaves its `with lock:`, which deletes the
        # contender's znode.
        self.stop.set()
        self.runner.join()
        self.client.stop()


def kazoo_client(hosts: str, ttl: float):
    """A started kazoo client whose session timeout is the ttl."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=ttl)
    client.start(timeout=10)
    return client


PEERS = {
    "redis-py": RedisPy,
    "python-redis-lock": PythonRedisLock,
    "pottery": Pottery,
    "kazoo": Kazoo,
}


def zk_hosts(url: str) -> str:
    """The `HOST:PORT,...` of a `zk://` URL."""
    rest = url.removeprefix("zk://")
    return rest.rsplit("@", 1)[-1].split("/", 1)[0]


def act(peer, client: redis.Redis, log: str, me: str, every: float, done: threading.Event) -> None:
    while not done.wait(every):
        if peer.may_act():
            client.rpush(log, me)


def hold_many(args, client: redis.Redis, n: int) -> list:
    """`--scale N`: hold N locks at once, named NAME-0 and on, each the way
    the peer's docs show for one (its own renewal thread each); say
    `holding K` every second and `held NS` once all are held."""
    ttl = args.ttl_ms / 1000
    names = [f"{args.name}-{i}" for i in range(n)]
    held = [0]
    count = threading.Lock()

    def one_more() -> None:
        with count:
            held[0] += 1

    def report() -> None:
        said = time.monotonic()
        while True:
            time.sleep(0.1)
            if held[0] >= n:
                say("held", time.monotonic_ns())
                return
            if time.monotonic() - said >= 1:
                say("holding", held[0])
                said = time.monotonic()

    threading.Thread(target=report, daemon=True).start()
    peers = []
    if args.peer == "kazoo":
        shared = kazoo_client(zk_hosts(args.store), ttl)
        stop = threading.Event()

        def lead() -> None:
            one_more()
            stop.wait()

        for name in names:
            peer = Kazoo("", name, ttl, args.id, client=shared)
            peer.runner = threading.Thread(target=peer.election.run, args=(lead,), daemon=True)
            peer.runner.start()
            peers.append(peer)
    else:
        for name in names:
            peer = PEERS[args.peer](client, name, ttl)
            peer.acquire()
            peers.append(peer)
            one_more()
    # Kept by the caller: python-redis-lock's renewal thread holds its lock
    # by a weak reference, and stops once the lock is gone.
    return peers


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--store", help="the lock's store when it is not --redis: zk://HOSTS")
    parser.add_argument("--name", required=True)
    parser.add_argument("--ttl-ms", type=int, required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--act-ms", type=int)
    parser.add_argument("--act-log", default="bench:acts")
    parser.add_argument("--scale", type=int, help="hold this many locks at once")
    args = parser.parse_args()

    client = redis.Redis.from_url(args.redis)
    client.ping()
    if args.peer == "kazoo" and not (args.store or "").startswith("zk://"):
        parser.error("kazoo needs --store zk://HOSTS")
    if args.scale:
        # redis-py's default pool opens at most 100 connections and raises
        # MaxConnectionsError past them, which thousands of renewal threads
        # reach; its documented fix is a blocking pool, whose threads wait
        # for a free connection.
        pool = redis.BlockingConnectionPool.from_url(args.redis, max_connections=100, timeout=None)
        client = redis.Redis(connection_pool=pool)
        say("ready")
        peers = hold_many(args, client, args.scale)
        for line in sys.stdin:
            if line.strip() == "release":
                break
        # Ended by the harness: the locks lapse with the process.
        say("releasing", time.monotonic_ns())
        say("released")
        return 0
    if args.peer == "kazoo":
        peer = Kazoo(zk_hosts(args.store), args.name, args.ttl_ms / 1000, args.id)
    else:
        peer = PEERS[args.peer](client, args.name, args.ttl_ms / 1000)
    say("key", peer.key)
    say("ready")
    peer.acquire()
    say("held", time.monotonic_ns())
    done = threading.Event()
    if args.act_ms:
        actor = redis.Redis.from_url(args.redis)
        threading.Thread(
            target=act,
            args=(peer, actor, args.act_log, args.id, args.act_ms / 1000, done),
            daemon=True,
        ).start()
    for line in sys.stdin:
        if line.strip() == "release":
            break
    say("releasing", time.monotonic_ns())
    done.set()
    try:
        peer.release()
    except Exception as err:  # the lock was lost meanwhile (expired, taken)
        say("release-failed", type(err).__name__)
        return 1
    say("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
