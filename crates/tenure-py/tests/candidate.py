"""A candidate process for the tests, on the blocking API: it campaigns,
says what happens as JSON lines on stdout, and obeys commands on stdin:

    check        -> {"event": "check", "leader": bool, "lost": kind or null}
    write KEY V  -> a FencedKey write of V with the term's token:
                    {"event": "write", "accepted": bool, "highest": int or null}
    resign       -> {"event": "resigned"}
    campaign     -> campaign again: {"event": "leading", ...}

Events it sends by itself: {"event": "campaigning"} before each campaign,
{"event": "leading", "token": N} when elected, {"event": "lost", "kind":
...} when the term ends (from a thread waiting on the term), and
{"event": "error", ...} if a call raised."""

import argparse
import json
import sys
import threading

import tenure


SAYING = threading.Lock()


def say(event: str, **fields: object) -> None:
    # One write per line, under a lock: the main thread and the thread
    # waiting on the term both speak.
    line = json.dumps({"event": event, **fields}) + "\n"
    with SAYING:
        sys.stdout.write(line)
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--fence-store")
    args = parser.parse_args()
    election = tenure.Election(args.name, store=args.store, ttl=args.ttl)
    fence_store = args.fence_store or args.store

    def campaign() -> tenure.BlockingTerm:
        say("campaigning", id=election.id)
        term = election.lead().__enter__()
        say("leading", token=term.token, id=term.id)

        def watch() -> None:
            reason = term.wait_lost()
            say("lost", kind=reason.kind if reason else None, message=str(reason))

        threading.Thread(target=watch, daemon=True).start()
        return term

    term = campaign()
    for line in sys.stdin:
        words = line.split()
        try:
            if words == ["check"]:
                reason = term.lost_reason()
                say("check", leader=term.is_leader(), lost=reason.kind if reason else None)
            elif words[:1] == ["write"]:
                written = tenure.FencedKey(words[1], store=fence_store).set_blocking(term.token, words[2])
                say("write", accepted=written.accepted, highest=written.highest)
            elif words == ["resign"]:
                term.resign()
                say("resigned")
            elif words == ["campaign"]:
                term = campaign()
        except tenure.TenureError as err:
            say("error", kind=type(err).__name__, message=str(err))


if __name__ == "__main__":
    main()
