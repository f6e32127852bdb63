#!/usr/bin/env python3
"""Paced streams through each target: when content reaches the client, and how evenly.

Called by benches/load.sh (its paced section) with one paced mock engine and the targets in
front of it; usable alone:

    python3 benches/paced_streams.py --pace 20 --first-token 40 --samples 12 \
        direct=http://127.0.0.1:30000 kvgate_block=http://127.0.0.1:8080

The first target is the baseline (straight to the paced mock: what the engine sends).
For every answer kind (the mock's `[answer:KIND]` marker: prose, code, digits, cjk) and
sample, one streamed chat goes to every target, the targets side by side (at most
--parallel at once; 1: one stream at a time), each target one stream at a time, in a
shuffled order. Every SSE event gets the client's arrival time (time.perf_counter at the
recv that completed it). Per stream: time to the first event with non-empty
`delta.content`, time to the last event, the largest gap between two consecutive events
from that first content event on (the wait before it is already the first column; with it,
every row's largest gap would be the engine's time to first token).
The table shows, per target and kind, what a target adds to the baseline's time to first
content (its p50 minus the baseline's p50, p99 minus p99) and to the last event (p50), the largest gap (p50 over streams) beside
the baseline's, and errors (not 200, an error event, no content or no [DONE]).

Standard library only. A bench, not a test: nothing here asserts a time.
"""
import argparse
import bisect
import concurrent.futures
import json
import random
import socket
import statistics
import sys
import time
import urllib.parse

KINDS = ("prose", "code", "digits", "cjk")
QUESTIONS = {
    "prose": "How are KV pages admitted?",
    "code": "Show the admission function.",
    "digits": "List the last order.",
    "cjk": "请用中文和日语回答。",
}


def body(kind, max_tokens):
    user = f"[answer:{kind}] {QUESTIONS[kind]}"
    return json.dumps({"model": "qwen3", "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": user}]}).encode()


def fetch(url, payload, key, timeout):
    """One streamed POST; returns (status, raw bytes, recv end offsets, recv times, t0)."""
    u = urllib.parse.urlsplit(url)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ends, times, parts, size = [], [], [], 0
    try:
        t0 = time.perf_counter()
        sock.sendall(head + payload)
        while True:
            data = sock.recv(65536)
            t = time.perf_counter()
            if not data:
                break
            size += len(data)
            parts.append(data)
            ends.append(size)
            times.append(t)
    finally:
        sock.close()
    return b"".join(parts), ends, times, t0


def dechunk(raw, start):
    """The chunked body from `start`: (body, [(body offset, raw offset)] of each piece)."""
    out, pieces, pos = bytearray(), [], start
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            break
        size = int(raw[pos:eol].split(b";")[0], 16)
        if size == 0:
            break
        pieces.append((len(out), eol + 2))
        out += raw[eol + 2:eol + 2 + size]
        pos = eol + 2 + size + 2
    return bytes(out), pieces


def measure(url, payload, key, timeout):
    """One stream's numbers (ms): first content, last event, largest gap; or an error."""
    try:
        raw, ends, times, t0 = fetch(url, payload, key, timeout)
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        return {"error": "no response head"}
    head = raw[:head_end].decode("latin-1").lower()
    status = int(head.split()[1])
    if status != 200:
        return {"error": f"status {status}"}
    start = head_end + 4
    if "transfer-encoding: chunked" in head:
        data, pieces = dechunk(raw, start)
    else:
        data, pieces = raw[start:], [(0, start)]
    starts = [p[0] for p in pieces]

    def arrival(offset):  # the client's time for the body byte at `offset`
        body_at, raw_at = pieces[bisect.bisect_right(starts, offset) - 1]
        return times[bisect.bisect_right(ends, raw_at + offset - body_at)] - t0

    events, pos = [], 0
    while True:
        end = data.find(b"\n\n", pos)
        if end < 0:
            break
        events.append((arrival(end + 1), data[pos:end]))
        pos = end + 2
    first, first_index, done, failed = None, 0, False, None
    for index, (at, event) in enumerate(events):
        payload_line = event.decode("utf-8", "replace").removeprefix("data: ")
        if payload_line == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(payload_line)
        except ValueError:
            failed = "an event is not JSON"
            continue
        if "error" in chunk:
            failed = "error event"
        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
        if first is None and delta.get("content"):
            first, first_index = at, index
    if failed or first is None or not done:
        return {"error": failed or ("no content" if first is None else "no [DONE]")}
    arrivals = [at for at, _ in events]
    content = arrivals[first_index:]  # the wait before it is the first-content column's
    gap = max((b - a for a, b in zip(content, content[1:])), default=0.0)
    return {"first": first * 1e3, "last": arrivals[-1] * 1e3, "gap": gap * 1e3,
            "events": len(events)}


def pct(values, p):
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", help="NAME=URL; the first is the baseline (direct)")
    ap.add_argument("--pace", type=float, required=True, help="the mock's ms per token (label)")
    ap.add_argument("--first-token", type=float, default=0, help="the mock's ms to first token (label)")
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--parallel", type=int, default=0, help="streams at once (0: every target)")
    ap.add_argument("--key", default="kvgate-demo-key")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--json", help="also write every stream's numbers here")
    args = ap.parse_args()
    targets = [t.split("=", 1) for t in args.targets]
    kinds = [k for k in args.kinds.split(",") if k]
    parallel = args.parallel or len(targets)
    results = {(name, kind): [] for name, _ in targets for kind in kinds}
    rng = random.Random(7)
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        for kind in kinds:
            payload = body(kind, args.max_tokens)
            for sample in range(args.samples + 1):  # the first round warms every cache
                order = list(targets)
                rng.shuffle(order)
                jobs = [(name, pool.submit(measure, url, payload, args.key, args.timeout))
                        for name, url in order]
                for name, job in jobs:
                    if sample > 0:
                        results[(name, kind)].append(job.result())
                    else:
                        job.result()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{n} {k}": v for (n, k), v in results.items()}, f)
    base_name = targets[0][0]
    print(f"\npaced streams: {args.pace:g} ms/token, first token {args.first_token:g} ms, "
          f"max_tokens {args.max_tokens}, {args.samples} streams per row, "
          f"{parallel} at once; ms; {base_name} absolute, the others added to it; gap: the "
          f"largest between events from the first content on, p50 over streams")
    print(f"{'target':<18}{'kind':<8}{'+1st p50':>10}{'+1st p99':>10}{'+last p50':>11}"
          f"{'gap p50':>9}{'(' + base_name + ')':>10}{'events':>8}{'errors':>8}")
    for name, _ in targets:
        for kind in kinds:
            rows = results[(name, kind)]
            ok = [r for r in rows if "error" not in r]
            base = [r for r in results[(base_name, kind)] if "error" not in r]
            errors = len(rows) - len(ok)
            if not ok or not base:
                why = next((r["error"] for r in rows if "error" in r), "no samples")
                print(f"{name:<18}{kind:<8}{'-':>10}{'-':>10}{'-':>11}{'-':>9}{'-':>10}{'-':>8}"
                      f"{errors:>8}  ({why})")
                continue
            med = statistics.median
            first, last = [r["first"] for r in ok], [r["last"] for r in ok]
            b_first, b_last = med([r["first"] for r in base]), med([r["last"] for r in base])
            b_first99 = pct([r["first"] for r in base], 99)
            b_gap = med([r["gap"] for r in base])
            sign = "" if name == base_name else "+"
            shift = (lambda v, b: v) if name == base_name else (lambda v, b: v - b)
            print(f"{name:<18}{kind:<8}{shift(med(first), b_first):>{sign}10.1f}"
                  f"{shift(pct(first, 99), b_first99):>{sign}10.1f}{shift(med(last), b_last):>{sign}11.1f}"
                  f"{med([r['gap'] for r in ok]):>9.1f}{b_gap:>10.1f}"
                  f"{med([r['events'] for r in ok]):>8.0f}{errors:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
