"""A daily cleanup at 03:00 Berlin time, once per day across all replicas.

`python daily_cleanup.py [STORE_URL] [--schedule CRON] [--seconds N]`
(the store defaults to $TENURE_STORE, else redis://127.0.0.1:6379;
`--schedule "* * * * * *"` runs it every second, to watch it work)."""

import argparse
import asyncio
import datetime as dt
import os
import signal

import tenure


async def delete_expired_batch(token: int) -> int:
    # DELETE FROM events WHERE expired_at < now() AND <fenced by token> LIMIT 1000;
    await asyncio.sleep(0.1)
    return 0  # rows deleted: none left, in this example


def cleanup(store: str):
    # The cleanup's own record, fenced: a write by a leader that lost its
    # term (paused past its ttl, say) carries a lower token and is refused.
    record = tenure.FencedKey("daily-cleanup:last", store=store) if store.startswith("redis") else None

    async def run(term: tenure.Term, slot: dt.datetime) -> None:
        print(f"[{os.getpid()}] cleanup for {slot.isoformat()} with token {term.token}", flush=True)
        while True:
            term.check()  # raises NotLeaderError once the term is over
            if await delete_expired_batch(term.token) == 0:
                break
        if record is not None and not await record.set(term.token, slot.isoformat()):
            print(f"[{os.getpid()}] a newer term recorded a cleanup: ours is stale", flush=True)

    return run


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", nargs="?", default=os.environ.get("TENURE_STORE", "redis://127.0.0.1:6379"))
    parser.add_argument("--schedule", default="0 3 * * *")
    parser.add_argument("--seconds", type=float, help="stop after this many seconds")
    args = parser.parse_args()

    stop = asyncio.Event()  # set by Ctrl-C, SIGTERM or --seconds
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.seconds is not None:
        loop.call_later(args.seconds, stop.set)

    # Each slot runs at most once, across failovers: the leader claims it in
    # the store first. A slot missed while nobody led runs late if a leader
    # is there within the starting deadline (an hour here). The slot is in
    # Berlin time, daylight saving time included, whatever the host's zone.
    schedule = tenure.Schedule(args.schedule, time_zone="Europe/Berlin", starting_deadline=3600)
    election = tenure.Election("daily-cleanup", store=args.store, ttl=30)
    await election.runner().cron(schedule, cleanup(args.store)).run(until=stop.wait())


if __name__ == "__main__":
    asyncio.run(main())
