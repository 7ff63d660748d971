"""A scheduler that triggers due jobs every 5 seconds, on one replica only.

Run it on every replica: `python scheduler.py [STORE_URL] [--seconds N]`
(the store defaults to $TENURE_STORE, else redis://127.0.0.1:6379). One
process leads; the others wait, and one takes over in milliseconds when
the leader stops (after the lease's ttl when it crashes)."""

import argparse
import asyncio
import os
import signal

import tenure


async def run_due_jobs(term: tenure.Term) -> None:
    # Each job is claimed with the term's fencing token before it runs
    # (e.g. UPDATE jobs SET claimed_by_token = $token WHERE id = $id AND
    # claimed_by_token < $token): a stale leader's late claim is refused.
    print(f"[{os.getpid()}] running due jobs with token {term.token}", flush=True)
    await asyncio.sleep(0.1)  # the jobs themselves


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", nargs="?", default=os.environ.get("TENURE_STORE", "redis://127.0.0.1:6379"))
    parser.add_argument("--seconds", type=float, help="stop after this many seconds")
    args = parser.parse_args()

    stop = asyncio.Event()  # set by Ctrl-C, SIGTERM or --seconds
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.seconds is not None:
        loop.call_later(args.seconds, stop.set)

    election = tenure.Election("scheduler", store=args.store, ttl=15)
    # At most once per 5 s across failovers: the last run is recorded in
    # the store, so a new leader does not run again at once.
    await election.runner().every(5, run_due_jobs).run(until=stop.wait())
    print(f"[{os.getpid()}] stopped; the lease is released", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
