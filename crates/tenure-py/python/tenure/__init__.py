"""Leader election for Python: one leader per named election, kept while it
is healthy, handed over in milliseconds when it steps down, and told the
moment it may no longer act.

    import asyncio, tenure

    async def main():
        election = tenure.Election("report-mailer", store="redis://127.0.0.1:6379")
        async with election.campaign() as term:       # wait until we lead
            print("leading with fencing token", term.token)
            await term.run(send_the_reports(term.token))  # cancelled if the term is lost
        # leaving the block resigns: a follower takes over in milliseconds

This package is the Rust library `tenure`, compiled in. Its keeper (the
task that renews the lease) runs on the library's own threads and never
waits for the GIL: a Python thread stuck in a long computation cannot delay
a renewal. What such a thread can do is *act late*: check `is_leader()`,
compute for longer than the ttl, then write. No lease can stop that; the
term's fencing token can (pass `term.token` with every write and let the
resource refuse older tokens: `FencedKey`, or the SQL pattern in the book).

Every call that talks to the store has an asyncio form (`await
election.leader()`) and a blocking twin (`election.leader_blocking()`);
the blocking twin of `campaign()` is `lead()`.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import threading
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    List,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

from . import _tenure
from ._tenure import (
    DEFAULT_PREFIX,
    DEFAULT_TTL,
    MAX_PERMITS,
    AuthError,
    ConfigError,
    ForeignDataError,
    InternalError,
    NoPermissionError,
    NotLeaderError,
    NotTheStoreError,
    StoreError,
    StoreTimeoutError,
    TenureError,
    TlsError,
    TransientError,
    UnreachableError,
    UnsafeStoreError,
    instance_id,
    redact_url,
    validate_name,
)

__version__: str = _tenure.__version__

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_TTL",
    "MAX_PERMITS",
    "AuthError",
    "BlockingTerm",
    "ConfigError",
    "Election",
    "FencedKey",
    "FencedWrite",
    "ForeignDataError",
    "InternalError",
    "LeaderInfo",
    "LostReason",
    "NoPermissionError",
    "NotLeaderError",
    "NotTheStoreError",
    "PartitionSet",
    "Runner",
    "Schedule",
    "Semaphore",
    "StoreError",
    "StoreTimeoutError",
    "TenureError",
    "Term",
    "TlsError",
    "TransientError",
    "UnreachableError",
    "UnsafeStoreError",
    "instance_id",
    "redact_url",
    "validate_name",
]

log = logging.getLogger("tenure")

T = TypeVar("T")


def _utc(seconds: Optional[float]) -> Optional[_dt.datetime]:
    if seconds is None:
        return None
    return _dt.datetime.fromtimestamp(seconds, tz=_dt.timezone.utc)


def _unix(when: _dt.datetime) -> float:
    if when.tzinfo is None:
        raise ConfigError(
            "invalid configuration: give an aware datetime (with tzinfo), not a naive one"
        )
    return when.timestamp()


@dataclass(frozen=True)
class LeaderInfo:
    """The leader of an election as the store reports it."""

    id: str
    """The leader's instance id."""
    token: int
    """Its term's fencing token."""
    ttl_left: float
    """Seconds until its lease expires, unless renewed."""
    held_since: Optional[_dt.datetime]
    """When its term began (UTC), if the store records it."""

    @classmethod
    def _from(cls, raw: Optional[Tuple[str, int, float, Optional[float]]]) -> Optional[LeaderInfo]:
        if raw is None:
            return None
        return cls(raw[0], raw[1], raw[2], _utc(raw[3]))


@dataclass(frozen=True)
class LostReason:
    """Why a term ended. `str(reason)` is the library's one-line message."""

    kind: str
    """One of "taken", "expired", "deadline", "resigned", "shutdown"."""
    message: str
    by: Optional[str] = None
    """For "taken": the instance that holds the lease now."""
    token: Optional[int] = None
    """For "taken": the token of its term."""

    def __str__(self) -> str:
        return self.message

    @classmethod
    def _from(cls, raw: Tuple[str, str, Optional[str], Optional[int]]) -> LostReason:
        return cls(*raw)


def _not_leader(reason: Optional[LostReason]) -> NotLeaderError:
    why = str(reason) if reason is not None else "local deadline passed without a successful renewal"
    return NotLeaderError(f"not leader any more: {why}")


class _TermBase:
    """What both kinds of term share: the facts and the clock checks."""

    __slots__ = ("_native",)

    def __init__(self, native: _tenure.Term) -> None:
        self._native = native

    @property
    def token(self) -> int:
        """The fencing token: larger than every earlier term's of this election."""
        return self._native.token

    @property
    def election(self) -> str:
        return self._native.election

    @property
    def id(self) -> str:
        """This instance's id."""
        return self._native.id

    def is_leader(self) -> bool:
        """A clock check, no store call: True until the local deadline, or
        until the term is lost, whichever comes first."""
        return self._native.is_leader()

    def remaining(self) -> float:
        """Seconds left until the local deadline (0 once past it)."""
        return self._native.remaining()

    def lost_reason(self) -> Optional[LostReason]:
        """Why the term ended, or None while it lasts."""
        raw = self._native.lost_reason()
        return None if raw is None else LostReason._from(raw)

    def check(self) -> None:
        """Raise `NotLeaderError` unless this instance still leads: call it
        before each step of work that must run on the leader alone."""
        if not self._native.is_leader():
            raise _not_leader(self.lost_reason())

    def __repr__(self) -> str:
        return repr(self._native)


class Term(_TermBase):
    """A term of leadership, for asyncio code. `campaign()` gives one."""

    __slots__ = ()

    async def lost(self) -> LostReason:
        """Wait until the term ends, at the latest at its local deadline, and
        say why. Nothing revives a term once lost."""
        return LostReason._from(await self._native.lost())

    async def confirm(self) -> float:
        """Renew now, and say how many seconds of leadership that bought.
        Raises `NotLeaderError` if the store no longer has our lease."""
        return await self._native.confirm()

    async def resign(self) -> None:
        """Release the lease now, so that a follower takes over at once."""
        await self._native.resign()

    async def run(self, work: Awaitable[T]) -> T:
        """Run `work` (a coroutine) while the term lasts: it is cancelled the
        moment the term is lost, and `NotLeaderError` raised. Otherwise its
        result is returned, or its exception raised."""
        task: asyncio.Future[T] = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self.lost())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            raise _not_leader(lost.result())
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()


class BlockingTerm(_TermBase):
    """A term of leadership, for threaded code. `lead()` gives one.

    A thread cannot be cancelled from outside: work in a thread checks
    `is_leader()` (or calls `check()`) before each step, and passes
    `token` with every write it must fence."""

    __slots__ = ()

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[LostReason]:
        """Block until the term ends and say why; None if `timeout`
        seconds passed first."""
        try:
            return LostReason._from(self._native.lost().wait(timeout))
        except TimeoutError:
            return None

    def confirm(self) -> float:
        """Renew now, and say how many seconds of leadership that bought."""
        return self._native.confirm().wait()

    def resign(self) -> None:
        """Release the lease now, so that a follower takes over at once."""
        self._native.resign().wait()


class _Campaign:
    """`election.campaign()`: an async context manager that leads for the
    block and resigns on leaving it, or an awaitable that gives the term."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self._start = start
        self._term: Optional[Term] = None

    def __await__(self) -> Generator[Any, None, Term]:
        native = yield from self._start().__await__()
        return Term(native)

    async def __aenter__(self) -> Term:
        self._term = await self
        return self._term

    async def __aexit__(self, kind: object, *exc: object) -> None:
        term, self._term = self._term, None
        if term is None or term.lost_reason() is not None:
            return
        try:
            await term.resign()
        except NotLeaderError:
            pass  # over already: nothing of ours to release
        except TenureError:
            if kind is None:
                raise
            # The block's own exception matters more; the lease lapses.
            log.warning("tenure: could not resign %s on leaving the block", term.election, exc_info=True)


class _Lead:
    """`election.lead()`: the blocking twin of `_Campaign`."""

    def __init__(self, start: Callable[[], BlockingTerm]) -> None:
        self._start = start
        self._term: Optional[BlockingTerm] = None

    def __enter__(self) -> BlockingTerm:
        self._term = self._start()
        return self._term

    def __exit__(self, kind: object, *exc: object) -> None:
        term, self._term = self._term, None
        if term is None or term.lost_reason() is not None:
            return
        try:
            term.resign()
        except NotLeaderError:
            pass
        except TenureError:
            if kind is None:
                raise
            log.warning("tenure: could not resign %s on leaving the block", term.election, exc_info=True)


def _timed_out(what: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"{what} within {timeout}s")


class Election:
    """One election, seen from this instance.

    Made without a store call: the first call connects and checks the
    store, and raises its error if the store is unreachable or unsafe;
    `connect()` does so up front.

    Args:
        name: the election's name, e.g. "nightly-cleanup".
        store: the store's URL: redis://, rediss://, redis+sentinel://,
            redis+cluster://, etcd://, zk://, postgres://, sqlite://.
        ttl: the lease's time to live, in seconds (default 10).
        renew_every: seconds between renewals (default ttl/3).
        margin: seconds taken off the local deadline (default: the
            library's, a share of the ttl).
        call_timeout: seconds a store call may take.
        id: this instance's id (default: host name and 128 random bits).
        prefix: the key prefix (default "tenure").
        max_ttl: the largest ttl any instance of the store uses, for the
            hold-off after a store lost its leases.
        allow_eviction: accept a Redis that may evict keys.
        tls_ca_file: a CA bundle for rediss:// and TLS stores.
    """

    def __init__(
        self,
        name: str,
        *,
        store: str,
        ttl: Optional[float] = None,
        renew_every: Optional[float] = None,
        margin: Optional[float] = None,
        call_timeout: Optional[float] = None,
        id: Optional[str] = None,
        prefix: Optional[str] = None,
        max_ttl: Optional[float] = None,
        allow_eviction: bool = False,
        tls_ca_file: Optional[str] = None,
    ) -> None:
        self._native = _tenure.Election(
            name,
            store,
            id=id,
            ttl=ttl,
            renew_every=renew_every,
            margin=margin,
            call_timeout=call_timeout,
            prefix=prefix,
            max_ttl=max_ttl,
            allow_eviction=allow_eviction,
            tls_ca_file=tls_ca_file,
        )

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def id(self) -> str:
        """This instance's id."""
        return self._native.id

    def __repr__(self) -> str:
        return f"Election(name={self.name!r}, id={self.id!r})"

    async def connect(self) -> None:
        """Connect and check the store now."""
        await self._native.connect()

    def connect_blocking(self) -> None:
        self._native.connect().wait()

    def campaign(self) -> _Campaign:
        """Wait until this instance leads. `async with election.campaign() as
        term:` leads for the block and resigns on leaving it; `term = await
        election.campaign()` leaves resigning to you."""
        return _Campaign(self._native.campaign)

    def lead(self, timeout: Optional[float] = None) -> _Lead:
        """The blocking twin of `campaign()`: `with election.lead() as term:`.
        With `timeout`, raises `TimeoutError` if not elected within it."""

        def start() -> BlockingTerm:
            if timeout is None:
                return BlockingTerm(self._native.campaign().wait())
            native = self._native.campaign_timeout(timeout).wait()
            if native is None:
                raise _timed_out("not elected", timeout)
            return BlockingTerm(native)

        return _Lead(start)

    async def try_campaign(self) -> Optional[Term]:
        """Lead if nobody does, without waiting: the term, or None."""
        native = await self._native.try_campaign()
        return None if native is None else Term(native)

    def try_lead(self) -> Optional[BlockingTerm]:
        native = self._native.try_campaign().wait()
        return None if native is None else BlockingTerm(native)

    async def leader(self) -> Optional[LeaderInfo]:
        """The current leader, or None."""
        return LeaderInfo._from(await self._native.leader())

    def leader_blocking(self) -> Optional[LeaderInfo]:
        return LeaderInfo._from(self._native.leader().wait())

    async def watch(self) -> AsyncIterator[Optional[LeaderInfo]]:
        """The leader now, then each time it changes (None: nobody leads)."""
        watch = self._native.watch()
        while True:
            try:
                raw = await watch.next()
            except StopAsyncIteration:
                return
            yield LeaderInfo._from(raw)

    def watch_blocking(self) -> Iterator[Optional[LeaderInfo]]:
        watch = self._native.watch()
        while True:
            try:
                raw = watch.next().wait()
            except StopAsyncIteration:
                return
            yield LeaderInfo._from(raw)

    async def release_if_held(self) -> bool:
        """Release a lease this instance's id holds (after a crash and
        restart with the same id); True if there was one."""
        return await self._native.release_if_held()

    def release_if_held_blocking(self) -> bool:
        return self._native.release_if_held().wait()

    def runner(self, *, shutdown_grace: Optional[float] = None) -> Runner:
        """Work for the leader: `every`, `cron` or `lead`, then `run`."""
        return Runner(self, shutdown_grace=shutdown_grace)


class Semaphore:
    """At most `permits` holders at once: the elections `NAME/permit-0` to
    `NAME/permit-{permits-1}`. A permit is a term like a leader's: token,
    deadline, `lost()`, `resign()`. Takes `Election`'s keyword arguments."""

    def __init__(self, name: str, permits: int, *, store: str, **options: Any) -> None:
        self._native = _tenure.Semaphore(name, permits, store, **options)

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def permits(self) -> int:
        return self._native.permits

    @property
    def id(self) -> str:
        return self._native.id

    def acquire(self) -> _Campaign:
        """Wait for a permit: `async with semaphore.acquire() as permit:`."""
        return _Campaign(self._native.acquire)

    def acquire_blocking(self) -> _Lead:
        """The blocking twin: `with semaphore.acquire_blocking() as permit:`."""
        return _Lead(lambda: BlockingTerm(self._native.acquire().wait()))

    async def try_acquire(self) -> Optional[Term]:
        native = await self._native.try_acquire()
        return None if native is None else Term(native)

    def try_acquire_blocking(self) -> Optional[BlockingTerm]:
        native = self._native.try_acquire().wait()
        return None if native is None else BlockingTerm(native)

    async def holders(self) -> List[Optional[LeaderInfo]]:
        """Each permit's holder, in order (None: free)."""
        return [LeaderInfo._from(h) for h in await self._native.holders()]

    def holders_blocking(self) -> List[Optional[LeaderInfo]]:
        return [LeaderInfo._from(h) for h in self._native.holders().wait()]


@dataclass(frozen=True)
class FencedWrite:
    """What a fenced write did."""

    accepted: bool
    highest: Optional[int] = None
    """When refused: the highest token the key has seen."""

    def __bool__(self) -> bool:
        return self.accepted


class FencedKey:
    """A Redis key written only with a token at least as large as every
    token it has seen: a stale leader's late write is refused."""

    def __init__(
        self,
        key: str,
        *,
        store: str,
        call_timeout: float = 2.0,
        tls_ca_file: Optional[str] = None,
    ) -> None:
        self._native = _tenure.FencedKey(key, store, call_timeout=call_timeout, tls_ca_file=tls_ca_file)

    @property
    def key(self) -> str:
        return self._native.key

    async def set(self, token: int, value: Union[bytes, str]) -> FencedWrite:
        """Write `value` with `token`; refused if a larger token wrote."""
        return FencedWrite(*await self._native.set(token, _bytes(value)))

    def set_blocking(self, token: int, value: Union[bytes, str]) -> FencedWrite:
        return FencedWrite(*self._native.set(token, _bytes(value)).wait())

    async def get(self) -> Optional[Tuple[int, bytes]]:
        """The last accepted write: (token, value), or None."""
        return await self._native.get()

    def get_blocking(self) -> Optional[Tuple[int, bytes]]:
        return self._native.get().wait()


def _bytes(value: Union[bytes, str]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class Schedule:
    """A cron expression (five fields, or six with seconds) in a time zone
    (default UTC). A slot missed while nobody led still runs if a leader is
    there within `starting_deadline` seconds of it."""

    def __init__(
        self,
        expression: str,
        *,
        time_zone: Optional[str] = None,
        starting_deadline: Optional[float] = None,
    ) -> None:
        self._native = _tenure.Schedule(expression, time_zone=time_zone, starting_deadline=starting_deadline)

    @property
    def expression(self) -> str:
        return self._native.expression

    @property
    def time_zone(self) -> str:
        return self._native.time_zone

    @property
    def starting_deadline(self) -> float:
        return self._native.starting_deadline

    def next_after(self, when: _dt.datetime) -> Optional[_dt.datetime]:
        """The first slot after `when` (an aware datetime), in UTC."""
        return _utc(self._native.next_after(_unix(when)))

    def __repr__(self) -> str:
        return f"Schedule({self.expression!r}, time_zone={self.time_zone!r})"


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


async def _drive(
    running: _tenure.Running,
    call: Callable[[_tenure.Job, Term], Awaitable[Any]],
    until: Optional[Awaitable[Any]],
) -> None:
    """Run each job of `running` as an asyncio task, cancelled when its
    term is lost, until `until` completes or the run ends by itself."""
    tasks: set = set()

    async def one(job: _tenure.Job) -> None:
        term = Term(job.term())
        try:
            await term.run(call(job, term))
        except NotLeaderError as err:
            job.done(str(err))
        except asyncio.CancelledError:
            job.done("cancelled")
            raise
        except Exception as err:  # the work's own failure: logged, reported
            log.exception("tenure: work for %s failed", term.election)
            job.done(_one_line(err))
        else:
            job.done()

    async def feed() -> None:
        while True:
            job = await running.next_job()
            if job is None:
                return
            task = asyncio.ensure_future(one(job))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def finished() -> None:
        await running.finished()

    feeder = asyncio.ensure_future(feed())
    ended = asyncio.ensure_future(finished())
    stopper = asyncio.ensure_future(until) if until is not None else None
    try:
        waits = {ended} if stopper is None else {ended, stopper}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Stopping (also when this task is cancelled: Ctrl-C, SIGTERM):
        # the running work ends with its terms, and the run releases every
        # lease before it ends, so that a follower takes over at once
        # rather than after a ttl.
        running.stop()
        if stopper is not None and not stopper.done():
            stopper.cancel()
        try:
            await asyncio.wait({ended})
        finally:
            for pending in (feeder, *tasks):
                if not pending.done():
                    pending.cancel()
            await asyncio.gather(feeder, *tasks, return_exceptions=True)
    ended.result()


def _drive_blocking(
    running: _tenure.Running,
    call: Callable[[_tenure.Job, BlockingTerm], Any],
    until: Optional[threading.Event],
) -> None:
    """`_drive` for threads: each job in a thread of its own."""

    def one(job: _tenure.Job) -> None:
        term = BlockingTerm(job.term())
        try:
            call(job, term)
        except NotLeaderError as err:
            job.done(str(err))
        except Exception as err:
            log.exception("tenure: work for %s failed", term.election)
            job.done(_one_line(err))
        else:
            job.done()

    if until is not None:
        stop_when = until

        def watch_stop() -> None:
            stop_when.wait()
            running.stop()

        threading.Thread(target=watch_stop, name="tenure-stop", daemon=True).start()
    ended = running.finished()
    try:
        while True:
            job = running.next_job().wait()
            if job is None:
                break
            threading.Thread(target=one, args=(job,), name=f"tenure-{job.term().election}", daemon=True).start()
    finally:
        running.stop()
        ended.wait()


class Runner:
    """Work for the leader of one election, started and stopped with its
    terms. Choose one kind of work, then `run()` (or `run_blocking()`):

    - `every(period, tick)`: `tick(term)` at most once per `period` seconds
      across failovers (the last run is recorded in the store);
    - `cron(schedule, tick)`: `tick(term, slot)` once per calendar slot,
      across failovers;
    - `lead(work)`: `work(term)` once per term.

    Work is cancelled the moment the term is lost (asyncio); in threads it
    should check `term.is_leader()` before each step."""

    def __init__(self, election: Election, *, shutdown_grace: Optional[float] = None) -> None:
        self._election = election
        self._grace = shutdown_grace
        self._start: Optional[Callable[[], _tenure.Running]] = None
        self._call: Optional[Callable[[_tenure.Job, Any], Any]] = None

    def every(self, period: float, tick: Callable[[Any], Any]) -> Runner:
        native = self._election._native
        self._start = lambda: _tenure.run_every(native, period, self._grace)
        self._call = lambda job, term: tick(term)
        return self

    def cron(self, schedule: Schedule, tick: Callable[[Any, _dt.datetime], Any]) -> Runner:
        native = self._election._native

        def call(job: _tenure.Job, term: Any) -> Any:
            slot = _utc(job.slot)
            assert slot is not None  # a cron job always has its slot
            return tick(term, slot)

        self._start = lambda: _tenure.run_cron(native, schedule._native, self._grace)
        self._call = call
        return self

    def lead(self, work: Callable[[Any], Any]) -> Runner:
        native = self._election._native
        self._start = lambda: _tenure.run_lead(native, self._grace)
        self._call = lambda job, term: work(term)
        return self

    def _started(self) -> Tuple[_tenure.Running, Callable[[_tenure.Job, Any], Any]]:
        if self._start is None or self._call is None:
            raise ConfigError("invalid configuration: give the runner its work first (every, cron or lead)")
        return self._start(), self._call

    async def run(self, until: Optional[Awaitable[Any]] = None) -> None:
        """Campaign, run the work on each term, and follow between terms,
        until `until` completes (then the running work gets the shutdown
        grace and the lease is released). Work given to `lead` that returns
        ends the run."""
        running, call = self._started()
        await _drive(running, call, until)

    def run_blocking(self, until: Optional[threading.Event] = None) -> None:
        """`run` for threaded code: work runs in threads, and the run ends
        when `until` is set (or on Ctrl-C, releasing the lease)."""
        running, call = self._started()
        _drive_blocking(running, call, until)


class PartitionSet:
    """A fair share of `partitions` for each member of `group`: one term per
    partition held, one consumer per partition in the whole group. Takes
    `Election`'s keyword arguments (but `allow_eviction`)."""

    def __init__(self, group: str, partitions: Iterable[str], *, store: str, **options: Any) -> None:
        self._native = _tenure.PartitionSet(group, list(partitions), store, **options)

    @property
    def group(self) -> str:
        return self._native.group

    @property
    def id(self) -> str:
        return self._native.id

    @property
    def partitions(self) -> List[str]:
        return self._native.partitions

    async def run(
        self,
        work: Callable[[str, Term], Awaitable[Any]],
        until: Optional[Awaitable[Any]] = None,
    ) -> None:
        """Run `work(partition, term)` for each partition held, as a task
        cancelled when that partition's term is lost, until `until`
        completes; then stop the work, release every lease, leave."""

        def call(job: _tenure.Job, term: Term) -> Awaitable[Any]:
            partition = job.partition
            assert partition is not None  # a partition set's job has one
            return work(partition, term)

        await _drive(self._native.run(), call, until)

    def run_blocking(
        self,
        work: Callable[[str, BlockingTerm], Any],
        until: Optional[threading.Event] = None,
    ) -> None:
        """`run` for threaded code: each partition's work in a thread."""

        def call(job: _tenure.Job, term: BlockingTerm) -> Any:
            partition = job.partition
            assert partition is not None
            return work(partition, term)

        _drive_blocking(self._native.run(), call, until)
