#!/usr/bin/env python3
"""Prefix-routing clients and report (driven by benches/prefix_routing.sh; see its header).

Three subcommands:

    prefix_routing.py describe [workload flags]
    prefix_routing.py row --name "kvgate cache-aware" --urls http://127.0.0.1:8080[,...] \
        --engines http://127.0.0.1:30001,... --pids 1234[,...] --auth tenant --out row.json \
        [--salt-in-body] [workload flags]
    prefix_routing.py report row1.json row2.json ... [--skipped "row: reason"]

The workload is a function of the seed and the sizes only, so every row sends the same
token content: TENANTS tenants, each with a long system prompt (SYSTEM_WORDS words; the
first ORG_TENANTS tenants' prompts open with one org-wide preamble of ORG_WORDS words, the
rest of theirs their own), CONVERSATIONS multi-turn conversations per tenant of TURNS_MIN..
TURNS_MAX turns (each turn sends the system prompt, the whole history — the engine's real
answers — and a new user message of about USER_WORDS words), and one-shot requests (the
system prompt and one question) making ONESHOT_SHARE of the requests. Each tenant runs
CONCURRENCY sessions at once (a session: one conversation or one one-shot), THINK_MS between
turns; the tenants' first sessions start spread over RAMP_S seconds.

Every request is a streamed chat (`stream_options.include_usage`) over raw HTTP/1.1 with
Connection: close; TTFT is the time to the first event with non-empty content. Requests go
round-robin over --urls (one counter for all tenants: the ×4 replicas row). With --auth
tenant each carries its tenant's API key; with --salt-in-body each carries
`"cache_salt": "salt-<tenant>"` in the body (kvgate strips a client's salt and sends its
own; SMG forwards it).

Measured per row: each engine's `/metrics` counters `sglang:prompt_tokens_total` and
`sglang:cached_tokens_total` before and after (the hit rate, and prompt tokens per engine for
the load spread); where an engine has no such counters, the answers' usage
(`prompt_tokens_details.cached_tokens`) for the hit rate and the time-integrated in-flight
requests (running + waiting, `/v1/loads` polled) for the spread; the gateway processes' CPU
(utime + stime of /proc/PID/stat, summed) before and after.

Standard library only. A bench, not a test: nothing here fails on a missed target.
"""
import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
import urllib.parse
import urllib.request

from stream_client import ClosedEarly, Sse, post, read_to_end

# Plain words (mostly one token each with their leading space): random runs of them make
# text that no two tenants share by chance.
VOCAB = """
account action address advice agent answer area audit balance bank batch border branch
budget buffer build cache call capacity card case change channel charge check claim client
cluster code column common config contract copy cost count credit current customer cycle
data date deal debit delay delivery demand deploy detail device digest disk domain draft
driver engine entry error event export factor fault feature field figure file filter flag
flow focus format frame fund gate graph group guard handle header health history host
import incident index input insight invoice issue item job journal key label layer ledger
level limit line link list load lock log loop margin market matrix measure memory merge
message method metric model module monitor name network node note notice number object
offer office order origin output owner packet page panel parcel partner patch path payment
period permit phase place plan policy pool port post power price print process product
profile program project proof query queue quota range rate reader record region release
report request reserve resource result review risk role route rule sample scale schedule
scope score screen search section sector segment select sender series server service
session setting share shift signal size slot source space split stage state status step
stock storage store stream subject summary supply support switch symbol system table target
task team term test thread ticket time token topic total trace track trade transfer trend
trial type unit update usage user value vendor version view volume warning window worker
""".split()


def words(rng, n):
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def tenant_key(tenant):
    return f"pr-{tenant}-key"


def tenant_names(n):
    return [f"t{i:02d}" for i in range(n)]


def build_workload(a):
    """{tenant: {"system": str, "sessions": [[user message, ...], ...]}}, from the seed."""
    org = "Organisation policy. " + words(random.Random(f"{a.seed}/org"), a.org_words)
    out = {}
    conv_turns = 0
    for i, t in enumerate(tenant_names(a.tenants)):
        rng = random.Random(f"{a.seed}/{t}")
        if i < a.org_tenants:
            own = max(a.system_words - a.org_words, 16)
            system = f"{org}\n\nTenant {t} instructions. {words(rng, own)}"
        else:
            system = f"Tenant {t} instructions. {words(rng, a.system_words)}"
        sessions = []
        for c in range(a.conversations):
            turns = rng.randint(a.turns_min, a.turns_max)
            conv_turns += turns
            sessions.append([f"[{t} c{c} u{k}] " + words(rng, max(4, int(rng.gauss(a.user_words, a.user_words / 4))))
                             for k in range(turns)])
        out[t] = {"system": system, "sessions": sessions}
    # One-shots: ONESHOT_SHARE of all requests, dealt to the tenants in turn.
    share = min(max(a.oneshot_share, 0.0), 0.9)
    oneshots = round(share * conv_turns / (1 - share))
    names = list(out)
    for k in range(oneshots):
        t = names[k % len(names)]
        rng = random.Random(f"{a.seed}/{t}/oneshot{k}")
        out[t]["sessions"].append([f"[{t} o{k}] " + words(rng, max(4, int(rng.gauss(a.user_words, a.user_words / 4))))])
    for t in names:
        random.Random(f"{a.seed}/{t}/order").shuffle(out[t]["sessions"])
    return out


def workload_counts(w):
    sessions = sum(len(v["sessions"]) for v in w.values())
    requests = sum(len(s) for v in w.values() for s in v["sessions"])
    oneshots = sum(1 for v in w.values() for s in v["sessions"] if len(s) == 1 and " o" in s[0][:12])
    return sessions, requests, oneshots


# ---------------------------------------------------------------------------------------
# One streamed request.

async def stream_chat(url, headers, payload, t0):
    """POST one streamed chat; returns a record (times in seconds from t0)."""
    u = urllib.parse.urlsplit(url)
    rec = {"sent": time.monotonic() - t0, "status": None, "ok": False}
    writer = None
    try:
        try:
            reader, writer, rec["status"], hdrs, rest = await post(
                u.hostname, u.port, "/v1/chat/completions", headers, payload)
        except ClosedEarly as e:
            writer = e.args[0]
            rec["why"] = "closed before a response head"
            return rec
        if rec["status"] != 200:
            body = await read_to_end(reader, rest)
            rec["why"] = f"status {rec['status']}: {body[:160].decode('utf-8', 'replace')}"
            return rec
        sse = Sse("chunked" in hdrs.get("transfer-encoding", ""))
        text, usage, done, error = [], None, False, None
        data = rest
        while True:
            now = time.monotonic() - t0
            for ev in sse.feed(data):
                if ev == b"[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(ev)
                except ValueError:
                    error = "a malformed event"
                    continue
                if "error" in chunk:
                    error = f"error event: {json.dumps(chunk['error'])[:120]}"
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if "first" not in rec:
                            rec["first"] = now
                        text.append(content)
            if sse.ended or done:
                break
            data = await reader.read(65536)
            if not data:
                break
        rec["end"] = time.monotonic() - t0
        rec["answer"] = "".join(text)
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                rec["cached_tokens"] = details["cached_tokens"]
        if error or "first" not in rec or not done:
            rec["why"] = error or ("no content" if "first" not in rec else "no [DONE]")
        else:
            rec["ok"] = True
        return rec
    except OSError as e:
        rec["why"] = f"{type(e).__name__}: {e}"
        return rec
    finally:
        if writer is not None:
            writer.close()


# ---------------------------------------------------------------------------------------
# Engines and gateway processes.

def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


COUNTERS = ("sglang:prompt_tokens_total", "sglang:cached_tokens_total")


def scrape(url):
    """{counter: value summed over its label sets} for COUNTERS; a counter not served is absent."""
    out = {}
    try:
        text = http_get(url + "/metrics", 5).decode("utf-8", "replace")
    except Exception as e:  # an engine that cannot be read has no counters
        return {"error": str(e)}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


async def poll_loads(engines, stop, acc, interval=0.2):
    """Per engine: samples, running + waiting integrated over time (request-seconds), peaks."""
    loop = asyncio.get_running_loop()
    last = {}
    while not stop.is_set():
        for url in engines:
            try:
                load = json.loads(await loop.run_in_executor(None, http_get, url + "/v1/loads"))
            except Exception:  # a missed poll is only a missed sample
                continue
            a = acc.setdefault(url, {"samples": 0, "inflight_s": 0.0, "peak_running": 0,
                                     "peak_waiting": 0})
            running, waiting = load.get("num_running_reqs", 0), load.get("num_waiting_reqs", 0)
            now = time.monotonic()
            a["samples"] += 1
            a["inflight_s"] += (running + waiting) * (now - last.get(url, now))
            last[url] = now
            a["peak_running"] = max(a["peak_running"], running)
            a["peak_waiting"] = max(a["peak_waiting"], waiting)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


# ---------------------------------------------------------------------------------------
# One row.

async def run_row(a):
    w = build_workload(a)
    urls = [u for u in a.urls.split(",") if u]
    engines = [e for e in a.engines.split(",") if e]
    pids = [int(p) for p in a.pids.split(",") if p]
    rr = [0]
    records = []
    t0 = time.monotonic()

    async def session_loop(tenant, queue, start_at):
        await asyncio.sleep(max(0.0, start_at - (time.monotonic() - t0)))
        system = w[tenant]["system"]
        while queue:
            turns = queue.pop(0)
            history = []
            for k, user in enumerate(turns):
                messages = [{"role": "system", "content": system}] + history + [{"role": "user", "content": user}]
                body = {"model": a.model, "max_tokens": a.max_tokens, "stream": True,
                        "stream_options": {"include_usage": True}, "messages": messages}
                if a.salt_in_body:
                    body["cache_salt"] = f"salt-{tenant}"
                headers = {"Authorization": f"Bearer {tenant_key(tenant)}"} if a.auth == "tenant" else {}
                url = urls[rr[0] % len(urls)]
                rr[0] += 1
                try:
                    rec = await asyncio.wait_for(
                        stream_chat(url, headers, json.dumps(body).encode(), t0), a.client_timeout)
                except asyncio.TimeoutError:
                    rec = {"sent": None, "status": None, "ok": False, "why": "hung"}
                rec.update(tenant=tenant, turn=k, turns=len(turns), url=url)
                answer = rec.pop("answer", None)
                records.append(rec)
                # The next turn carries the engine's real answer (the same in every row: the
                # simulated engine's answer is a function of the prompt), or a stand-in.
                history += [{"role": "user", "content": user},
                            {"role": "assistant", "content": answer if rec["ok"] and answer else "(no answer)"}]
                if k + 1 < len(turns) and a.think_ms > 0:
                    await asyncio.sleep(a.think_ms / 1000)

    stop = asyncio.Event()
    loads = {}
    poller = asyncio.ensure_future(poll_loads(engines, stop, loads))
    before = {e: scrape(e) for e in engines}
    cpu0 = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    loops = []
    rng = random.Random(f"{a.seed}/ramp")
    for tenant in w:
        queue = list(w[tenant]["sessions"])
        for _ in range(a.concurrency):
            loops.append(session_loop(tenant, queue, rng.uniform(0, a.ramp_s)))
    await asyncio.gather(*loops)
    wall = time.monotonic() - t0
    cpu1 = [cpu_seconds(p) for p in pids]
    stop.set()
    await poller
    after = {e: scrape(e) for e in engines}
    cpu = None
    if pids and all(x is not None for x in cpu0 + cpu1):
        cpu = sum(c1 - c0 for c0, c1 in zip(cpu0, cpu1))
    sessions, requests, oneshots = workload_counts(w)
    out = {"name": a.name, "note": a.note, "wall": wall, "urls": urls, "engines": engines,
           "replicas": len(urls), "salt": a.salt, "cpu_s": cpu, "pids": pids,
           "metrics_before": before, "metrics_after": after, "loads": loads,
           "workload": {"tenants": a.tenants, "sessions": sessions, "requests": requests,
                        "oneshots": oneshots, "seed": a.seed},
           "records": records}
    with open(a.out, "w") as f:
        json.dump(out, f)
    ok = sum(1 for r in records if r["ok"])
    print(f"  {a.name}: {ok}/{len(records)} answered in {wall:.1f} s", flush=True)
    whys = {}
    for r in records:
        if not r["ok"]:
            whys[r.get("why", "?")[:120]] = whys.get(r.get("why", "?")[:120], 0) + 1
    for why, n in sorted(whys.items(), key=lambda x: -x[1])[:3]:
        print(f"    failed {n}×: {why}", flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# Report.

def pct(values, p):
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(math.ceil(p / 100 * len(s))) - 1))]


def summarise(v):
    recs = v["records"]
    ok = [r for r in recs if r["ok"]]
    s = {"name": v["name"], "note": v.get("note") or "", "sent": len(recs), "ok": len(ok),
         "salt": v.get("salt", "")}
    ttft = [(r["first"] - r["sent"]) * 1e3 for r in ok]
    s["ttft50"] = statistics.median(ttft) if ttft else None
    s["ttft99"] = pct(ttft, 99) if ttft else None
    later = [(r["first"] - r["sent"]) * 1e3 for r in ok if r["turn"] > 0]
    s["ttft50_later"] = statistics.median(later) if later else None
    # Hit rate: the engines' counters, else the answers' usage.
    engines = v["engines"]
    deltas = {}
    for e in engines:
        b, a = v["metrics_before"].get(e, {}), v["metrics_after"].get(e, {})
        if all(c in a for c in COUNTERS):
            deltas[e] = {c: a[c] - b.get(c, 0.0) for c in COUNTERS}
    prompt_sum = sum(r.get("prompt_tokens") or 0 for r in ok)
    s["prompt_per_req"] = prompt_sum / len(ok) if ok else None
    if len(deltas) == len(engines) and engines:
        p = sum(d[COUNTERS[0]] for d in deltas.values())
        c = sum(d[COUNTERS[1]] for d in deltas.values())
        s["hit"], s["hit_src"] = (c / p if p else None), "engines"
    elif ok and all(r.get("cached_tokens") is not None for r in ok):
        c = sum(r["cached_tokens"] for r in ok)
        s["hit"], s["hit_src"] = (c / prompt_sum if prompt_sum else None), "usage"
    else:
        s["hit"], s["hit_src"] = None, "n/a"
    # Spread of load over the workers: prompt tokens each engine counted, else the
    # time-integrated in-flight requests from /v1/loads.
    if len(deltas) == len(engines) and engines:
        per = [deltas[e][COUNTERS[0]] for e in engines]
        s["spread_src"] = "prompt tokens"
    else:
        per = [v["loads"].get(e, {}).get("inflight_s", 0) for e in engines]
        s["spread_src"] = "in-flight·s"
    mean = sum(per) / len(per) if per else 0
    s["spread"] = max(per) / mean if mean else None
    s["per_worker"] = per
    s["cpu_us"] = v["cpu_s"] / s["ok"] * 1e6 if v.get("cpu_s") is not None and s["ok"] else None
    s["replicas"] = v.get("replicas", 1)
    s["wall"] = v["wall"]
    s["peak_waiting"] = max((x.get("peak_waiting", 0) for x in v["loads"].values()), default=0)
    return s


def fmt(x, spec, none="n/a"):
    return none if x is None else format(x, spec)


def report(a):
    loaded = [json.load(open(p)) for p in a.rows if os.path.exists(p)]
    rows = [summarise(v) for v in loaded if "skipped" not in v]
    ran = [v for v in loaded if "skipped" not in v]
    if ran:
        wl = ran[0]["workload"]
        print(f"\nworkload: {wl['tenants']} tenants, {wl['sessions']} sessions, {wl['requests']} requests "
              f"({wl['oneshots']} one-shot), seed {wl['seed']}, ≈ {fmt(rows[0]['prompt_per_req'], '.0f')} "
              "prompt tokens per request\n")
    print("| row | salt | answered | hit rate | TTFT p50 ms | TTFT p99 ms | TTFT p50 later turns | "
          "load max/mean | gateway CPU µs/req | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    it = iter(rows)
    for v in loaded:
        if "skipped" in v:
            print(f"| {v['name']} | | skipped: {v['skipped']} | | | | | | | |")
            continue
        s = next(it)
        hit = f"{s['hit']:.1%} ({s['hit_src']})" if s["hit"] is not None else "n/a (no cached-token counts)"
        spread = f"{s['spread']:.2f} ({s['spread_src']})" if s["spread"] is not None else "n/a"
        print(f"| {s['name']} | {s['salt']} | {s['ok']}/{s['sent']} | {hit} | {fmt(s['ttft50'], '.0f')} | "
              f"{fmt(s['ttft99'], '.0f')} | {fmt(s['ttft50_later'], '.0f')} | {spread} | "
              f"{fmt(s['cpu_us'], '.0f')} | {s['wall']:.0f} |")
    print()
    for s in rows:
        if s["note"]:
            print(f"- {s['name']}: {s['note']}")
        unit = "s" if s["spread_src"] == "in-flight·s" else ""
        print(f"- {s['name']}: per worker {', '.join(f'{x:.1f}{unit}' if unit else f'{x:.0f}' for x in s['per_worker'])} "
              f"({s['spread_src']}); peak waiting in an engine {s['peak_waiting']}; "
              f"{fmt(s['prompt_per_req'], '.0f')} prompt tokens per answered request")
    by = {s["name"]: s for s in rows}
    smg, smg_salt = by.get("smg cache_aware"), by.get("smg cache_aware + body cache_salt")
    if smg and smg_salt:
        print(f"- salts under SMG (per-tenant cache_salt in the body, forwarded; its tree ignores it): "
              f"hit rate {fmt(smg['hit'], '.1%')} → {fmt(smg_salt['hit'], '.1%')}, load max/mean "
              f"{fmt(smg['spread'], '.2f')} → {fmt(smg_salt['spread'], '.2f')}, TTFT p50 "
              f"{fmt(smg['ttft50'], '.0f')} → {fmt(smg_salt['ttft50'], '.0f')} ms")
    # Targets.
    ca = by.get("kvgate cache-aware")
    replicated = [s for s in rows if s["name"].startswith("kvgate cache-aware ×")]
    checks = []

    def check(what, ok, value):
        word = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        checks.append(f"- {word}: {what} ({value})")

    for ref in (smg, smg_salt):
        if ca and ref:
            both = ca["hit"] is not None and ref["hit"] is not None
            check(f"kvgate cache-aware hit rate ≥ {ref['name']}", (ca["hit"] >= ref["hit"]) if both else None,
                  f"{fmt(ca['hit'], '.1%')} vs {fmt(ref['hit'], '.1%')}")
            both = ca["ttft50"] is not None and ref["ttft50"] is not None
            check(f"kvgate cache-aware TTFT p50 and p99 ≤ {ref['name']}",
                  (ca["ttft50"] <= ref["ttft50"] and ca["ttft99"] <= ref["ttft99"]) if both else None,
                  f"{fmt(ca['ttft50'], '.0f')}/{fmt(ca['ttft99'], '.0f')} ms vs "
                  f"{fmt(ref['ttft50'], '.0f')}/{fmt(ref['ttft99'], '.0f')} ms")
    for s in [ca] + replicated:
        if s:
            check(f"{s['name']} load max/mean ≤ 1.3", (s["spread"] <= 1.3) if s["spread"] is not None else None,
                  f"{fmt(s['spread'], '.2f')}, {s['spread_src']}")
    for ca4 in replicated if ca else []:
        both = ca["hit"] is not None and ca4["hit"] is not None
        check(f"{ca4['name']}: hit rate within 5 points of ×1",
              (abs(ca["hit"] - ca4["hit"]) <= 0.05) if both else None,
              f"{fmt(ca4['hit'], '.1%')} vs {fmt(ca['hit'], '.1%')}")
    if checks:
        print("\ntargets:")
        print("\n".join(checks))
    return 0


def workload_args(p):
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--org-tenants", type=int, default=8, help="tenants whose prompt opens with the org preamble")
    p.add_argument("--system-words", type=int, default=1400)
    p.add_argument("--org-words", type=int, default=700)
    p.add_argument("--conversations", type=int, default=6, help="per tenant")
    p.add_argument("--turns-min", type=int, default=4)
    p.add_argument("--turns-max", type=int, default=6)
    p.add_argument("--user-words", type=int, default=60)
    p.add_argument("--oneshot-share", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=3, help="sessions in flight per tenant")
    p.add_argument("--think-ms", type=float, default=300)
    p.add_argument("--ramp-s", type=float, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--model", default="qwen3")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("describe")
    workload_args(d)
    r = sub.add_parser("row")
    workload_args(r)
    r.add_argument("--name", required=True)
    r.add_argument("--note", default="")
    r.add_argument("--salt", default="", help="label: which salt the engines see")
    r.add_argument("--urls", required=True, help="comma-separated gateway base URLs, used round-robin")
    r.add_argument("--engines", required=True)
    r.add_argument("--pids", default="", help="gateway process ids (CPU time)")
    r.add_argument("--auth", choices=("tenant", "none"), default="tenant")
    r.add_argument("--salt-in-body", action="store_true")
    r.add_argument("--client-timeout", type=float, default=120)
    r.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("rows", nargs="*", help="row files, in order ({name, skipped} for a row that did not run)")
    a = ap.parse_args()
    if a.cmd == "describe":
        sessions, requests, oneshots = workload_counts(build_workload(a))
        print(f"{a.tenants} tenants, {sessions} sessions, {requests} requests ({oneshots} one-shot)")
        return 0
    if a.cmd == "row":
        return asyncio.run(run_row(a))
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
