"""Two candidate processes on a real store: one leads with a token, resign
hands over at once, a killed leader is replaced after its lease, and a
stopped leader's term is over when it wakes.

Timing is checked only as ordering against the lease: a hand-over that
waited for the lease would come after it; a takeover before the old lease
could have expired would be two leaders. The bounds given to `expect` only
stop a stuck test."""

import signal
import time

import tenure


def leader_and_follower(candidates, store, name, ttl):
    a = candidates(store, name, ttl)
    a.expect("leading")
    b = candidates(store, name, ttl)
    b.expect("campaigning")
    return a, b


def test_one_of_two_processes_leads_with_a_token(candidates, store, name):
    a, b = leader_and_follower(candidates, store, name, ttl=5)
    leading = a.seen[-1]
    # The store agrees: the leader is a's id, with a's token.
    info = tenure.Election(name, store=store).leader_blocking()
    assert info is not None
    assert (info.id, info.token) == (leading["id"], leading["token"])
    # b is still campaigning: its campaign has not returned.
    assert [e["event"] for e in b.seen] == ["campaigning"]
    assert b.events.empty()


def test_resign_hands_over_without_waiting_for_the_lease(candidates, store, name):
    # A hand-over that waited for the lease would come at least
    # ttl - ttl/3 (10 s) after the resign: the test allows half of that.
    # (A store younger than the ttl grants its first lease only once it
    # is a ttl old, which `expect`'s bound allows for.)
    ttl = 15
    a, b = leader_and_follower(candidates, store, name, ttl)
    a_token = a.seen[-1]["token"]
    a.send("resign")
    resigned = a.expect("resigned")
    leading = b.expect("leading", timeout=ttl / 3)
    assert leading["token"] > a_token
    assert leading["at"] - resigned["at"] < ttl / 3
    lost = a.event("lost")
    assert lost["kind"] == "resigned"


def test_a_killed_leader_is_replaced_after_its_lease(candidates, store, name):
    ttl = 2.0
    a, b = leader_and_follower(candidates, store, name, ttl)
    a_token = a.seen[-1]["token"]
    killed = time.monotonic()
    a.signal(signal.SIGKILL)
    leading = b.expect("leading")
    assert leading["token"] > a_token
    # a's last renewal was sent at most one renew interval (ttl/3) before
    # the kill, so its lease lasted at least ttl - ttl/3 after it: b may not
    # lead before then.
    assert leading["at"] - killed >= ttl - ttl / 3


def test_a_stopped_leader_wakes_with_its_term_lost_and_its_writes_refused(
    candidates, store, redis_server, name
):
    ttl = 2.0
    key = f"{name}:fenced"
    a = candidates(store, name, ttl, fence_store=redis_server.url)
    a.expect("leading")
    a.send("write", key, "from-a")
    assert a.expect("write")["accepted"]
    b = candidates(store, name, ttl, fence_store=redis_server.url)
    b.expect("campaigning")
    # Stop the whole process, Python and the library's threads alike.
    a.signal(signal.SIGSTOP)
    leading = b.expect("leading")
    b.send("write", key, "from-b")
    assert b.expect("write")["accepted"]
    a.signal(signal.SIGCONT)
    # The first thing a does after waking: its term ended while it was
    # stopped (its local deadline passed), whatever it learns from the store.
    a.send("check")
    check = a.expect("check")
    assert check["leader"] is False
    lost = a.event("lost")
    assert lost["kind"] in ("deadline", "taken", "expired")
    # And its late write, with its old token, is refused.
    a.send("write", key, "late-from-a")
    write = a.expect("write")
    assert write == {**write, "accepted": False, "highest": leading["token"]}
    assert tenure.FencedKey(key, store=redis_server.url).get_blocking() == (leading["token"], b"from-b")
