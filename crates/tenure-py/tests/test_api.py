"""The Python API in one process, on real stores: terms, cancellation at
loss, fencing, watches, semaphores, runners, partition sets, and errors
with the library's one-line messages."""

import asyncio
import datetime as dt
import sys
import threading
import time

import pytest

import tenure


async def test_leaving_the_block_resigns_and_the_next_campaign_leads(store, name):
    a = tenure.Election(name, store=store, ttl=5)
    b = tenure.Election(name, store=store, ttl=5)
    async with a.campaign() as term:
        assert term.is_leader()
        assert term.election == name and term.id == a.id
        info = await b.leader()
        assert info is not None and (info.id, info.token) == (a.id, term.token)
        assert await b.try_campaign() is None
        waiting = asyncio.ensure_future(b.campaign())
        await asyncio.sleep(0)
        assert not waiting.done()
    assert term.lost_reason() == tenure.LostReason("resigned", "resigned")
    assert not term.is_leader()
    nxt = await waiting
    assert nxt.token > term.token
    await nxt.resign()


async def test_lost_fires_and_run_cancels_the_work_when_the_lease_vanishes(redis_server, name):
    election = tenure.Election(name, store=redis_server.url, ttl=1)
    term = await election.campaign()
    cancelled = asyncio.Event()

    async def work():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = asyncio.ensure_future(term.run(work()))
    await asyncio.sleep(0)
    # An operator deletes the lease: a crash as far as tenure is concerned.
    redis_server.command("DEL", f"tenure:{{{name}}}:lease")
    with pytest.raises(tenure.NotLeaderError, match="^not leader any more: "):
        await running
    assert cancelled.is_set()
    reason = await term.lost()
    assert reason.kind in ("expired", "deadline", "taken")
    assert not term.is_leader()
    with pytest.raises(tenure.NotLeaderError):
        term.check()


async def test_run_returns_the_works_result_while_the_term_lasts(store, name):
    async with tenure.Election(name, store=store, ttl=5).campaign() as term:
        assert await term.run(asyncio.sleep(0, result=42)) == 42
        with pytest.raises(ZeroDivisionError):
            await term.run(_divide())
        assert await term.confirm() > 0


async def _divide():
    return 1 / 0


async def test_renewals_do_not_wait_for_the_gil(redis_server, name):
    ttl = 1.0
    election = tenure.Election(name, store=redis_server.url, ttl=ttl)
    term = await election.campaign()
    # Hold the GIL for three ttls: no other thread gets it for 30 s, so a
    # keeper that needed it could not renew, and the term would lapse.
    # A Python thread that counts while it has the GIL shows that nobody
    # else had it.
    counted = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    before = sys.getswitchinterval()
    sys.setswitchinterval(30)
    counter = threading.Thread(target=count)
    try:
        counter.start()
        start = counted[0]
        end = time.monotonic() + 3 * ttl
        while time.monotonic() < end:
            pass
        held_throughout = counted[0] == start
    finally:
        stop.set()
        sys.setswitchinterval(before)
        counter.join()
    assert held_throughout
    assert term.is_leader(), term.lost_reason()
    info = await election.leader()
    assert info is not None and info.token == term.token
    await term.resign()


async def test_a_stale_token_is_refused_by_a_fenced_key(redis_server, store, name):
    key = tenure.FencedKey(f"{name}:report", store=redis_server.url)
    old = await tenure.Election(name, store=store, ttl=5).campaign()
    assert (await key.set(old.token, "first")).accepted
    await old.resign()
    new = await tenure.Election(name, store=store, ttl=5).campaign()
    assert await key.set(new.token, b"second")
    late = await key.set(old.token, "late")
    assert late == tenure.FencedWrite(False, new.token)
    assert not late
    assert await key.get() == (new.token, b"second")
    assert key.get_blocking() == (new.token, b"second")
    await new.resign()


async def test_watch_reports_each_leader(store, name):
    a = tenure.Election(name, store=store, ttl=5)
    seen = []
    watch = a.watch()
    assert await watch.__anext__() is None
    term = await a.campaign()
    info = await watch.__anext__()
    assert info is not None and info.token == term.token and info.id == a.id
    assert info.held_since is not None and info.held_since.tzinfo is not None
    seen.append(info)
    await term.resign()
    assert await watch.__anext__() is None
    await watch.aclose()


def test_the_blocking_twins(store, name):
    a = tenure.Election(name, store=store, ttl=5)
    b = tenure.Election(name, store=store, ttl=5)
    with a.lead() as term:
        assert isinstance(term, tenure.BlockingTerm)
        assert b.try_lead() is None
        assert b.leader_blocking().token == term.token
        with pytest.raises(TimeoutError, match="not elected within 0.2s"):
            with b.lead(timeout=0.2):
                pass
        assert term.wait_lost(timeout=0.05) is None
        assert term.confirm() > 0
    assert term.wait_lost().kind == "resigned"
    watch = b.watch_blocking()
    assert next(watch) is None
    assert a.release_if_held_blocking() is False


async def test_a_semaphore_admits_its_permits_and_no_more(store, name):
    holders = [tenure.Semaphore(name, 2, store=store, ttl=5) for _ in range(3)]
    first = await holders[0].acquire()
    second = await holders[1].acquire()
    assert await holders[2].try_acquire() is None
    waiting = asyncio.ensure_future(holders[2].acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    ids = {h.id for h in await holders[2].holders() if h is not None}
    assert ids == {holders[0].id, holders[1].id}
    await first.resign()
    third = await waiting
    assert third.is_leader() and second.is_leader()
    for permit in (second, third):
        await permit.resign()


async def test_every_runs_once_per_period_across_instances(store, name):
    ran = []
    done = asyncio.Event()

    async def tick(term):
        ran.append(term.token)
        done.set()

    first = tenure.Election(name, store=store, ttl=2).runner().every(3600, tick)
    await first.run(until=done.wait())
    assert len(ran) == 1
    # A second instance, within the period: the run is recorded, no tick.
    stop = asyncio.Event()
    second = tenure.Election(name, store=store, ttl=2)
    task = asyncio.ensure_future(second.runner().every(3600, tick).run(until=stop.wait()))
    while getattr(await second.leader(), "id", None) != second.id:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    stop.set()
    await task
    assert len(ran) == 1


async def test_cron_runs_each_slot_once_with_its_instant(redis_server, name):
    slots = []
    three = asyncio.Event()

    async def tick(term, slot):
        assert term.is_leader()
        slots.append(slot)
        if len(slots) == 3:
            three.set()

    schedule = tenure.Schedule("* * * * * *")  # every second
    runner = tenure.Election(name, store=redis_server.url, ttl=2).runner().cron(schedule, tick)
    await runner.run(until=three.wait())
    assert all(s.tzinfo is not None and s.microsecond == 0 for s in slots)
    assert [b - a for a, b in zip(slots, slots[1:])] == [dt.timedelta(seconds=1)] * 2


async def test_lead_work_that_returns_ends_the_run(store, name):
    tokens = []

    async def work(term):
        tokens.append(term.token)

    await tenure.Election(name, store=store, ttl=2).runner().lead(work).run()
    assert len(tokens) == 1


async def test_two_members_share_the_partitions(store, name):
    partitions = [f"{name}-{i}" for i in range(4)]
    owners = {}
    both_hold = asyncio.Event()
    clash = []

    def member():
        async def consume(partition, term):
            if partition in owners and owners[partition] != term.id:
                clash.append(partition)
            owners[partition] = term.id
            if len(owners) == 4 and len(set(owners.values())) == 2:
                both_hold.set()
            try:
                await term.lost()
            finally:
                if owners.get(partition) == term.id:
                    del owners[partition]

        return consume

    sets = [tenure.PartitionSet(name, partitions, store=store, ttl=2) for _ in range(2)]
    await asyncio.gather(*(s.run(member(), until=both_hold.wait()) for s in sets))
    assert clash == []


def test_runner_blocking_runs_ticks_in_threads(redis_server, name):
    stop = threading.Event()
    seen = []

    def tick(term):
        assert isinstance(term, tenure.BlockingTerm)
        seen.append(threading.current_thread().name)
        stop.set()

    tenure.Election(name, store=redis_server.url, ttl=2).runner().every(3600, tick).run_blocking(until=stop)
    assert len(seen) == 1


# Bad input: the right exception class, the library's one-line message,
# and never a secret.


def test_bad_settings_raise_config_errors():
    with pytest.raises(tenure.ConfigError, match=r"election name \"two words\" contains ' '"):
        tenure.Election("two words", store="redis://127.0.0.1:1")
    with pytest.raises(tenure.ConfigError, match="ttl must be a finite, non-negative number"):
        tenure.Election("x", store="redis://127.0.0.1:1", ttl=-1)
    with pytest.raises(tenure.ConfigError, match="election name is 100000 bytes long; at most 200 are allowed"):
        tenure.Election("x" * 100_000, store="redis://127.0.0.1:1")
    with pytest.raises(tenure.ConfigError, match="1 to"):
        tenure.Semaphore("x", 0, store="redis://127.0.0.1:1")
    with pytest.raises(tenure.ConfigError):
        tenure.Schedule("61 * * * *")
    with pytest.raises(tenure.ConfigError):
        tenure.Schedule("0 2 * * *", time_zone="Mars/Olympus")
    with pytest.raises(tenure.ConfigError, match="runner its work"):
        tenure.Election("x", store="redis://127.0.0.1:1").runner().run_blocking()


async def test_a_bad_url_and_a_dead_port_raise_clear_errors():
    with pytest.raises(tenure.ConfigError):
        await tenure.Election("x", store="nosuchstore://host").connect()
    dead = tenure.Election("x", store="redis://:hunter2@127.0.0.1:1", call_timeout=1)
    with pytest.raises(tenure.UnreachableError) as caught:
        await dead.leader()
    assert isinstance(caught.value, tenure.TransientError)
    message = str(caught.value)
    assert "\n" not in message and "hunter2" not in message and "***" in message
    assert "hunter2" not in repr(dead)


def test_wrong_credentials_raise_auth_error_without_the_password(name):
    from conftest import RedisServer

    server = RedisServer(password="right-password")
    try:
        url = f"redis://:wrong-password@127.0.0.1:{server.port}"
        with pytest.raises(tenure.AuthError) as caught:
            tenure.Election(name, store=url).connect_blocking()
        assert "wrong-password" not in str(caught.value)
        assert "\n" not in str(caught.value)
        with tenure.Election(name, store=server.url).lead() as term:
            assert term.is_leader()
    finally:
        server.stop()


def test_foreign_data_in_our_key_is_refused_and_left_alone(redis_server, name):
    key = f"tenure:{{{name}}}:lease"
    redis_server.command("SET", key, "somebody else's")
    with pytest.raises(tenure.ForeignDataError, match="tenure will not touch it"):
        tenure.Election(name, store=redis_server.url).try_lead()
    assert redis_server.command("GET", key) == b"$15\r\nsomebody else's\r\n"


def test_a_server_that_is_not_the_store(etcd_server, name):
    # etcd's port, given as a Redis URL.
    url = f"redis://127.0.0.1:{etcd_server.port}"
    with pytest.raises((tenure.NotTheStoreError, tenure.UnreachableError, tenure.StoreError)) as caught:
        tenure.Election(name, store=url, call_timeout=2).connect_blocking()
    assert "\n" not in str(caught.value)


def test_an_op_runs_once():
    op = tenure.Election("x", store="redis://127.0.0.1:1", call_timeout=0.5).leader_blocking
    with pytest.raises(tenure.UnreachableError):
        op()
    native = tenure.Election("x", store="redis://127.0.0.1:1")._native.leader()
    with pytest.raises(TimeoutError):
        native.wait(timeout=0)
    with pytest.raises(RuntimeError, match="already"):
        native.wait()


async def test_a_cancelled_run_releases_its_lease_for_a_follower(redis_server, name):
    # ttl 30: a follower that got in only once the lease expired would
    # find it still held when it looks.
    leading = asyncio.Event()

    async def work(term):
        leading.set()
        await asyncio.sleep(3600)

    election = tenure.Election(name, store=redis_server.url, ttl=30)
    run = asyncio.ensure_future(election.runner().lead(work).run())
    await leading.wait()
    run.cancel()  # what asyncio.run does on Ctrl-C
    with pytest.raises(asyncio.CancelledError):
        await run
    follower = await tenure.Election(name, store=redis_server.url, ttl=30).try_campaign()
    assert follower is not None
    await follower.resign()


def test_a_forked_child_gets_a_clear_error_not_a_hang(redis_server, name):
    import subprocess

    script = f"""
import os, sys, tenure
election = tenure.Election({name!r}, store={redis_server.url!r})
assert election.leader_blocking() is None
pid = os.fork()
if pid == 0:
    try:
        tenure.Election({name!r}, store={redis_server.url!r}).leader_blocking()
        os._exit(3)
    except tenure.TenureError as err:
        print(err, flush=True)
        os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "this process is a fork of it" in done.stdout


async def test_the_blocks_own_exception_is_kept_when_resigning_fails(name):
    from conftest import RedisServer

    server = RedisServer()
    election = tenure.Election(name, store=server.url, ttl=5, call_timeout=0.5)
    with pytest.raises(ValueError, match="the block's own"):
        async with election.campaign():
            server.stop()  # the store is gone: resigning on the way out fails
            raise ValueError("the block's own")


def test_the_interpreter_exits_cleanly_with_awaits_still_pending(redis_server, name):
    # A run that ends leaves awaits to cancel (its next job, its end), and
    # the interpreter exits while the library's threads hand those back: no
    # runtime thread may take the GIL then (CPython ends such a thread with
    # pthread_exit, and the process crashed: 4 times in 6 runs before).
    import subprocess

    script = f"""
import asyncio, tenure
async def main():
    election = tenure.Election({name!r}, store={redis_server.url!r}, ttl=15)
    await election.runner().every(5, lambda term: asyncio.sleep(0)).run(until=asyncio.sleep(0.3))
asyncio.run(main())
"""
    for _ in range(6):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
