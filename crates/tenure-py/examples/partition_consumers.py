"""One consumer per partition of a queue, spread over the replicas.

`python partition_consumers.py [STORE_URL] [--seconds N]` on each replica
(the store defaults to $TENURE_STORE, else redis://127.0.0.1:6379). The
replicas share the four partitions fairly; when one stops, the others take
its partitions over at their next cycle, within a renew interval (ttl/3,
5 s here; after the ttl when it crashes)."""

import argparse
import asyncio
import os
import signal

import tenure

PARTITIONS = [f"orders-{i}" for i in range(4)]


async def consume(partition: str, term: tenure.Term) -> None:
    # Runs while this replica holds the partition: the task is cancelled
    # the moment the partition's term is lost, so two consumers never
    # process one partition. Acks carry term.token, for a broker (or a
    # table) that refuses an older consumer's late ack.
    print(f"[{os.getpid()}] consuming {partition} with token {term.token}", flush=True)
    try:
        while True:
            await asyncio.sleep(0.5)  # fetch a batch, process, ack
    finally:
        print(f"[{os.getpid()}] stopped consuming {partition}", flush=True)


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

    # Each member holds at most its fair share, ceil(4 / members); each
    # partition held is a term of its own, with its own fencing token.
    consumers = tenure.PartitionSet("orders", PARTITIONS, store=args.store, ttl=15)
    await consumers.run(consume, until=stop.wait())


if __name__ == "__main__":
    asyncio.run(main())
