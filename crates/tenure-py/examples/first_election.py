import asyncio, os, sys, tenure

async def main(store: str) -> None:
    election = tenure.Election("first-election", store=store, ttl=5)
    async with election.campaign() as term:  # wait until this process leads
        print(f"{os.getpid()} leads with fencing token {term.token}", flush=True)
        await term.run(asyncio.to_thread(sys.stdin.readline))  # lead until Enter
    print(f"{os.getpid()} resigned", flush=True)  # the other process leads now

asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379"))
