#!/usr/bin/env python3
"""Noisy-neighbour clients and report (driven by benches/noisy_neighbour.sh; see its header).

Two subcommands:

    noisy_neighbour.py phase --name today --url http://127.0.0.1:8080 \
        --engines http://127.0.0.1:30001,http://127.0.0.1:30002 --gateway-pid 1234 \
        --tenants flood,light,eq1,eq2,eq3,w2,w1 --out today.json [sizes...]
    noisy_neighbour.py report --baseline baseline.json today.json scheduling.json

`phase` runs one variant for --duration seconds: open loops (flood, light: evenly spaced
arrivals at a fixed rate, whatever the answers) and closed loops (eq1..eq3, w2, w1: each
keeps --closed-k streams in flight, a new one as soon as one ends; after a 429/503 it waits
the Retry-After, at most 1 s, or 100 ms without one). Every request is a streamed chat
(`"stream": true`, `stream_options.include_usage`) of a distinct prompt of a few hundred
tokens and --max-tokens new tokens, its API key naming the tenant, over raw HTTP/1.1
(Connection: close). At --duration no new request starts; the ones in flight get until
their own client timeout (--client-timeout: the gateway's queue timeout + a margin) to
finish. Meanwhile every engine's `GET /v1/loads` is polled (peak KV in use, peak waiting)
and the gateway's CPU time (utime + stime of /proc/PID/stat) is read before and after.

`report` prints one table per variant; `baseline` is the light tenant alone.

Standard library only. A bench, not a test: nothing here fails on a missed target.
"""
import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
import urllib.parse

from stream_client import ClosedEarly, Sse, post, read_to_end

FILLER = ("Paged KV caches hold every running request's keys and values; admission decides "
          "which request may take pages now, and a fair gateway shares them by weight. ")
OPEN = ("flood", "light")


def tenant_key(tenant):
    return f"nn-{tenant}-key"


def prompt(tenant, n, words):
    text = (FILLER * (words // len(FILLER.split()) + 1)).split()[:words]
    return f"[{tenant} {n} {time.time_ns()}] " + " ".join(text)


def chat_body(tenant, n, words, max_tokens):
    return json.dumps({"model": "qwen3", "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": prompt(tenant, n, words)}]}).encode()


class Stream:
    """A streamed chat's events as they arrive (de-chunked and split by [`Sse`]): records
    when token events arrive."""

    def __init__(self, chunked):
        self.sse = Sse(chunked)
        self.first = None    # arrival of the first event with non-empty content (TTFT)
        self.content = []    # arrival times of token events (one token each)
        self.done = False
        self.error = None
        self.usage = None

    @property
    def ended(self):
        return self.sse.ended

    def feed(self, data, now):
        for data in self.sse.feed(data):
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                self.error = "an event is not JSON"
                continue
            if "error" in chunk:
                self.error = "error event"
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            # One event per token; the opening role event is not one; a special token
            # arrives as an empty content.
            if "content" in delta and "role" not in delta:
                self.content.append(now)
            if delta.get("content") and self.first is None:
                self.first = now


async def one_request(host, port, tenant, payload, t0):
    """One streamed chat; returns a record (times in seconds from the phase start t0)."""
    rec = {"tenant": tenant, "sent": time.monotonic() - t0, "status": None, "kind": None}
    writer = None
    try:
        auth = {"Authorization": f"Bearer {tenant_key(tenant)}"}
        try:
            reader, writer, rec["status"], headers, rest = await post(
                host, port, "/v1/chat/completions", auth, payload)
        except ClosedEarly as e:
            writer = e.args[0]
            rec["kind"] = "other"
            rec["why"] = "closed before a response head"
            return rec
        rec["retry_after"] = headers.get("retry-after")
        if "x-kvgate-queued-ms" in headers:
            rec["queued_ms"] = headers["x-kvgate-queued-ms"]
        if rec["status"] != 200:
            body = await read_to_end(reader, rest)
            rec["kind"] = {429: "429", 503: "503_ra" if rec["retry_after"] else "503"}.get(
                rec["status"], "other")
            rec["why"] = f"status {rec['status']}: {body[:160].decode('utf-8', 'replace')}"
            return rec
        s = Stream("chunked" in headers.get("transfer-encoding", ""))
        data = rest
        while True:
            s.feed(data, time.monotonic() - t0)
            if s.ended:
                break
            data = await reader.read(65536)
            if not data:
                break
        rec["first"] = s.first
        rec["content"] = s.content
        rec["usage_tokens"] = (s.usage or {}).get("completion_tokens")
        if s.error or s.first is None or not s.done:
            rec["kind"] = "other"
            rec["why"] = s.error or ("no content" if s.first is None else "no [DONE]")
        else:
            rec["kind"] = "served"
        return rec
    except OSError as e:
        rec["kind"] = "other"
        rec["why"] = f"{type(e).__name__}: {e}"
        return rec
    finally:
        if writer is not None:
            writer.close()


async def timed(host, port, tenant, n, args, t0, records):
    payload = chat_body(tenant, n, args.prompt_words, args.max_tokens)
    sent = time.monotonic() - t0
    try:
        rec = await asyncio.wait_for(one_request(host, port, tenant, payload, t0), args.client_timeout)
    except asyncio.TimeoutError:
        rec = {"tenant": tenant, "sent": sent, "status": None, "kind": "hung"}
    rec["ended"] = time.monotonic() - t0
    records.append(rec)
    return rec


async def open_loop(host, port, tenant, rate, args, t0, records, tasks, lead=0.0):
    """Arrivals from `lead` seconds before t0 (sent times negative) until the window ends."""
    if rate <= 0:
        return
    n = 0
    while True:
        at = n / rate - lead
        if at >= args.duration:
            return
        delay = at - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(timed(host, port, tenant, n, args, t0, records)))
        n += 1


async def closed_loop(host, port, tenant, slot, args, t0, records):
    n = 0
    while time.monotonic() - t0 < args.duration:
        rec = await timed(host, port, tenant, slot * 1_000_000 + n, args, t0, records)
        n += 1
        if rec["kind"] in ("429", "503_ra", "503"):
            ra = rec.get("retry_after")
            try:
                wait = min(1.0, float(ra)) if ra else 0.1
            except ValueError:
                wait = 0.1
            await asyncio.sleep(wait)
        elif rec["kind"] in ("other", "hung"):
            await asyncio.sleep(0.1)


def http_get_json(url, timeout=2.0):
    import urllib.request
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


async def poll_loads(engines, stop, peaks):
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        for url in engines:
            try:
                load = await loop.run_in_executor(None, http_get_json, url + "/v1/loads")
            except Exception:  # a missed poll is only a missed sample
                continue
            p = peaks.setdefault(url, {"used": 0, "pool": load.get("max_total_num_tokens"),
                                       "waiting": 0, "running": 0, "samples": 0})
            p["used"] = max(p["used"], load.get("num_used_tokens", 0))
            p["waiting"] = max(p["waiting"], load.get("num_waiting_reqs", 0))
            p["running"] = max(p["running"], load.get("num_running_reqs", 0))
            p["samples"] += 1
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except asyncio.TimeoutError:
            pass


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


async def phase(args):
    u = urllib.parse.urlsplit(args.url)
    host, port = u.hostname, u.port
    tenants = [t for t in args.tenants.split(",") if t]
    engines = [e for e in args.engines.split(",") if e]
    records, tasks, peaks = [], [], {}
    stop = asyncio.Event()
    poller = asyncio.ensure_future(poll_loads(engines, stop, peaks))
    cpu0 = cpu_seconds(args.gateway_pid)
    # The light tenant is already a steady user when the others arrive: it runs alone for
    # --light-lead seconds before t0 (those requests are not counted). A negative lead: it
    # arrives that many seconds after the others started (a cold newcomer into the flood).
    lead = args.light_lead if "light" in tenants and len(tenants) > 1 else 0.0
    t0 = time.monotonic() + max(lead, 0.0)

    async def at_t0(loop):
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        await loop

    loops = []
    for tenant in tenants:
        if tenant == "flood":
            loops.append(at_t0(open_loop(host, port, tenant, args.flood_rate, args, t0, records, tasks)))
        elif tenant == "light":
            loops.append(open_loop(host, port, tenant, args.light_rate, args, t0, records, tasks, lead))
        else:
            loops += [at_t0(closed_loop(host, port, tenant, k, args, t0, records))
                      for k in range(args.closed_k)]
    await asyncio.gather(*loops)
    if tasks:
        await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    cpu1 = cpu_seconds(args.gateway_pid)
    stop.set()
    await poller
    out = {"name": args.name, "duration": args.duration, "wall": wall, "tenants": tenants,
           "weights": dict(w.split("=") for w in args.weights.split(",") if w),
           "flood_rate": args.flood_rate, "light_rate": args.light_rate,
           "capacity_rps": args.capacity_rps, "client_timeout": args.client_timeout,
           "closed_k": args.closed_k, "max_tokens": args.max_tokens, "light_lead": lead,
           "cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
           "loads": peaks, "records": records}
    with open(args.out, "w") as f:
        json.dump(out, f)
    kinds = {}
    for r in records:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"  {args.name}: {len(records)} requests in {wall:.0f} s: "
          + " ".join(f"{k}={v}" for k, v in sorted(kinds.items())), flush=True)


def pct(values, p):
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(math.ceil(p / 100 * len(s))) - 1))]


def fair_shares(tenants, weights, demand):
    """Max-min weighted fair shares (water filling) of 1.0; demand: share a tenant can use."""
    share, active, left = {t: 0.0 for t in tenants}, set(tenants), 1.0
    while active and left > 1e-9:
        total = sum(weights[t] for t in active)
        capped = [t for t in active if share[t] + left * weights[t] / total >= demand.get(t, 9e9)]
        if not capped:
            for t in active:
                share[t] += left * weights[t] / total
            break
        for t in capped:
            left -= demand[t] - share[t]
            share[t] = demand[t]
            active.discard(t)
    return share


def report(args):
    base = json.load(open(args.baseline))
    b_ttft = [r["first"] * 1e3 - r["sent"] * 1e3 for r in base["records"] if r["kind"] == "served"]
    b50, b99 = (statistics.median(b_ttft), pct(b_ttft, 99)) if b_ttft else (None, None)
    b_bad = sum(1 for r in base["records"] if r["kind"] != "served")
    print(f"\nbaseline: light alone, {base['light_rate']:.2f} req/s for {base['duration']:.0f} s: "
          f"{len(b_ttft)} streams, TTFT p50 {b50 or 0:.0f} ms, p99 {b99 or 0:.0f} ms"
          f"{f', {b_bad} not served' if b_bad else ''}")
    status = 0
    for path in args.variants:
        if not os.path.exists(path):
            continue
        v = json.load(open(path))
        status |= variant_table(v, b50, b99)
    for line in args.skipped or []:
        print(f"\n{line}")
    return 0


def variant_table(v, b50, b99):
    dur, tenants = v["duration"], v["tenants"]
    # The light tenant's lead (sent before t0, alone) is not part of the window.
    lead_recs = [r for r in v["records"] if r["sent"] < 0]
    recs = [r for r in v["records"] if r["sent"] >= 0]
    weights = {t: float(v["weights"].get(t, 1)) for t in tenants}
    print(f"\n== {v['name']} == {dur:.0f} s (+ {v['wall'] - dur:.0f} s for the last answers), "
          f"flood {v['flood_rate']:.1f} req/s, light {v['light_rate']:.2f} req/s (fleet ≈ "
          f"{v['capacity_rps']:.1f} req/s by its sizes), closed loops {v['closed_k']} in flight each, "
          f"client timeout {v['client_timeout']:.0f} s"
          + (f"; light ran alone {v['light_lead']:.0f} s before the others ({len(lead_recs)} requests, not counted)"
             if (v.get("light_lead") or 0) > 0 else "")
          + (f"; light arrived {-v['light_lead']:.0f} s after the others started (a cold newcomer)"
             if (v.get("light_lead") or 0) < 0 else ""))
    # Tokens: token events (a delta with `content`, the opening role event aside) that reached
    # the client inside the window; usage.completion_tokens is checked against the count.
    tokens = {t: 0 for t in tenants}
    mismatch = 0
    for r in recs:
        tokens[r["tenant"]] += sum(1 for at in r.get("content", []) if 0 <= at <= dur)
        if r["kind"] == "served" and r.get("usage_tokens") is not None and r["usage_tokens"] != len(r["content"]):
            mismatch += 1
    total = sum(tokens.values()) or 1
    offered_light = v["light_rate"] * dur * v["max_tokens"]
    demand = {"light": offered_light / total}
    fair = fair_shares(tenants, weights, demand)
    print(f"{'tenant':<7}{'weight':>7}{'tok/s':>8}{'share':>7}{'fair':>7}{'sent':>6}{'served':>7}"
          f"{'queued':>7}{'429':>5}{'503+RA':>7}{'503':>5}{'other':>6}{'hung':>5}"
          f"{'TTFT p50':>9}{'p99 ms':>8}")
    by = {t: [r for r in recs if r["tenant"] == t] for t in tenants}
    whys = {}
    for t in tenants:
        rs = by[t]
        served = [r for r in rs if r["kind"] == "served"]
        ttft = [(r["first"] - r["sent"]) * 1e3 for r in served]
        count = lambda k: sum(1 for r in rs if r["kind"] == k)
        queued = sum(1 for r in served if "queued_ms" in r)
        for r in rs:
            if r["kind"] not in ("served", "hung"):
                why = r.get("why", "?")[:100]
                whys[why] = whys.get(why, 0) + 1
        p50 = f"{statistics.median(ttft):.0f}" if ttft else "-"
        p99 = f"{pct(ttft, 99):.0f}" if ttft else "-"
        print(f"{t:<7}{weights[t]:>7g}{tokens[t] / dur:>8.0f}{tokens[t] / total:>7.1%}{fair[t]:>7.1%}"
              f"{len(rs):>6}{len(served):>7}{queued:>7}{count('429'):>5}{count('503_ra'):>7}"
              f"{count('503'):>5}{count('other'):>6}{count('hung'):>5}{p50:>9}{p99:>8}")
    answered = sum(1 for r in recs if r["status"] is not None)
    hung = sum(1 for r in recs if r["kind"] == "hung")
    served_all = sum(1 for r in recs if r["kind"] == "served")
    print(f"tokens = token events (one per token) received within the {dur:.0f} s window; "
          f"usage.completion_tokens ≠ the count in {mismatch} served streams; fair = max-min "
          f"weighted share (light capped at what it offers); served {served_all / dur:.1f} req/s")
    for why, n in sorted(whys.items(), key=lambda x: -x[1])[:3]:
        print(f"  refused or failed, {n}×: {why}")
    # Targets.
    light = [(r["first"] - r["sent"]) * 1e3 for r in by.get("light", []) if r["kind"] == "served"]
    rows = []
    if light and b99:
        l50, l99 = statistics.median(light), pct(light, 99)
        rows.append(("light TTFT p50 / alone", f"{l50:.0f} / {b50:.0f} ms = {l50 / b50:.2f}×", "-", None))
        rows.append(("light TTFT p99 / alone", f"{l99:.0f} / {b99:.0f} ms = {l99 / b99:.2f}×", "≤ 1.5×",
                     l99 / b99 <= 1.5))
        # Of that, the time the gateway's queue held it (x-kvgate-queued-ms), when it did.
        waits = [float(r["queued_ms"]) for r in by.get("light", [])
                 if r["kind"] == "served" and "queued_ms" in r]
        if waits:
            rows.append(("light waited in the gateway queue p50 / p99",
                         f"{statistics.median(waits):.0f} / {pct(waits, 99):.0f} ms ({len(waits)} queued)",
                         "-", None))
        # The moment the others arrive: how long until the light tenant is protected.
        first = [(r["first"] - r["sent"]) * 1e3 for r in by.get("light", [])
                 if r["kind"] == "served" and r["sent"] < 10]
        if first:
            rows.append(("light TTFT max in the others' first 10 s",
                         f"{max(first):.0f} ms ({len(first)} streams)", "-", None))
    elif "light" in tenants:
        rows.append(("light TTFT p99 / alone", "no light stream served", "≤ 1.5×", False))
    eq = [tokens[t] for t in ("eq1", "eq2", "eq3") if t in tokens]
    if eq:
        jain = (sum(eq) ** 2) / (len(eq) * sum(x * x for x in eq)) if any(eq) else 0.0
        rows.append(("Jain's index eq1..eq3 (tokens)", f"{jain:.3f}", "≥ 0.95", jain >= 0.95))
    if "w2" in tokens and "w1" in tokens:
        ratio = tokens["w2"] / tokens["w1"] if tokens["w1"] else float("inf")
        rows.append(("w2 : w1 tokens", f"{ratio:.2f}", "2 ± 10%", 1.8 <= ratio <= 2.2))
    rows.append(("hung (no answer in client timeout)", f"{hung}", "0", hung == 0))
    cpu = v.get("cpu_s")
    rows.append(("gateway CPU per answered request",
                 f"{cpu / answered * 1e6:.0f} µs ({answered} answered)" if cpu is not None and answered else "-",
                 "-", None))
    for url, p in sorted(v["loads"].items()):
        pool = p.get("pool") or 0
        rows.append((f"engine {url.rsplit(':', 1)[-1]} peak KV in use",
                     f"{p['used']} / {pool} ({p['used'] / pool:.0%}), peak running {p['running']}, "
                     f"waiting {p['waiting']}, {p['samples']} polls" if pool else "no /v1/loads answer",
                     "≤ pool", p["used"] <= pool if pool else None))
    for name, value, target, ok in rows:
        word = "" if ok is None else ("PASS" if ok else "FAIL")
        print(f"  {name:<36}{value:<58}{target:>9}  {word}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("phase")
    p.add_argument("--name", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--engines", required=True, help="comma-separated engine base URLs (/v1/loads)")
    p.add_argument("--gateway-pid", type=int, required=True)
    p.add_argument("--tenants", required=True)
    p.add_argument("--weights", default="", help="tenant=weight,... (the report's fair shares)")
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--flood-rate", type=float, default=0)
    p.add_argument("--light-rate", type=float, default=0)
    p.add_argument("--capacity-rps", type=float, default=0, help="label: the fleet's estimated req/s")
    p.add_argument("--closed-k", type=int, default=16)
    p.add_argument("--light-lead", type=float, default=0.0,
                   help="seconds the light tenant runs alone before the others start (not counted); "
                        "negative: it arrives that long after them (a cold newcomer)")
    p.add_argument("--prompt-words", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--client-timeout", type=float, default=40)
    p.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--baseline", required=True)
    r.add_argument("--skipped", action="append", help="a line printed for a skipped variant")
    r.add_argument("variants", nargs="*")
    args = ap.parse_args()
    if args.cmd == "phase":
        asyncio.run(phase(args))
        return 0
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
