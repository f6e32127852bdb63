//! The status page (`GET /status` on the admin port): one self-contained HTML page — inline
//! CSS and SVG, no script, no external resource — that a person reads instead of the logs.
//! It reloads itself every [`REFRESH_SECONDS`].
//!
//! Sections: recent activity (admits, refusals and errors by code, guard trips by reason,
//! leak suspicions; charts of the last ten minutes from [`Activity`]), each tenant's last
//! hour (requests, errors, reported tokens; `tenants.rs`), models with the
//! enforced prompt limit per pool ([`PoolBudget`], what admission enforces), pools and
//! workers (the admin API's own `pool_json` / `worker_json` views, so the page and
//! `GET /pools` never disagree), each pool's gateway queue (length against its bound, by
//! class and tenant, oldest wait, drain rate) and the last config reload.
//!
//! Every value that comes from the config or from engines is HTML-escaped. Rows and values
//! carry `data-*` attributes and ids, so tests (and scrapers) read them without parsing
//! the layout.

mod html;
mod names;
mod tenants;

use serde_json::Value;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use crate::accounting::Book;
use crate::activity::{Activity, Counts, Recent, BUCKET, CODES, TRIP_REASONS};
use crate::fleet::Fleet;
use crate::rollout::{Phase, Rollouts};
use crate::runtime::admin::api::pool_json;
use crate::runtime::process::reload::LastReload;
use crate::stack::admission::{AdmissionState, PoolBudget};
use html::{bars, esc, human, opt, percent, text, unix, utc, without_excerpts, CSS};

/// Seconds between the page's own reloads.
pub const REFRESH_SECONDS: u32 = 5;

/// What the page is drawn from.
#[derive(Debug)]
pub struct StatusSources<'a> {
    pub fleet: &'a Fleet,
    pub rollouts: &'a Rollouts,
    /// The models' context windows (None: limits are not shown).
    pub admission: Option<&'a AdmissionState>,
    pub activity: &'a Activity,
    /// Per-tenant accounting (None: the tenants table says it is not attached).
    pub accounting: Option<&'a Book>,
    pub last_reload: Option<LastReload>,
    /// The data port is draining (shutdown began).
    pub draining: bool,
}

/// The whole page at `now` (`wall`: the same moment on the wall clock).
pub fn render(s: &StatusSources<'_>, now: Instant, wall: SystemTime) -> String {
    let recent = s.activity.recent(now);
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>kvgate status</title><style>{CSS}</style></head><body>\
         <header><h1>kvgate <span>status</span></h1><p class=\"meta\">\
         <span id=\"generated-at\" data-unix=\"{}\">{}</span> · refreshes every {REFRESH_SECONDS} s · \
         <span id=\"serving\" data-draining=\"{}\" class=\"badge {}\">{}</span></p></header><main>",
        unix(wall),
        utc(wall),
        s.draining,
        if s.draining { "bad" } else { "good" },
        if s.draining { "draining" } else { "serving" },
    );
    activity_section(&mut out, &recent);
    tenants::tenants_section(&mut out, s.accounting, now);
    models_section(&mut out, s);
    pools_section(&mut out, s, now);
    names::names_section(&mut out, s.fleet);
    reload_section(&mut out, s.last_reload.as_ref(), wall);
    out.push_str("</main></body></html>\n");
    out
}

// === activity ===

/// Buckets in the last minute (the open one included).
const MINUTE_BUCKETS: usize = (60 / BUCKET.as_secs()) as usize;

fn activity_section(out: &mut String, recent: &Recent) {
    let all = recent.sum();
    let minute = recent.sum_last(MINUTE_BUCKETS);
    let covers = recent.covers.max(Duration::from_secs(1));
    out.push_str("<section id=\"activity\"><h2>Recent activity</h2><div class=\"cards\">");
    // (id, label, last 10 min, last minute, chart, tone)
    let cards = [
        (
            "admits",
            "Admitted (success)",
            all.admits,
            minute.admits,
            recent.series(|c| c.admits),
            "good",
        ),
        (
            "refusals",
            "Refused or failed",
            all.refusal_total(),
            minute.refusal_total(),
            recent.series(Counts::refusal_total),
            "warn",
        ),
        (
            "trips",
            "Guard trips",
            all.trip_total(),
            minute.trip_total(),
            recent.series(Counts::trip_total),
            "bad",
        ),
        (
            "leaks",
            "Leak suspicions",
            all.leaks,
            minute.leaks,
            recent.series(|c| c.leaks),
            "bad",
        ),
    ];
    for (id, label, total, last_minute, series, tone) in cards {
        let _ = write!(
            out,
            "<div class=\"card {tone}\" id=\"card-{id}\"><div class=\"label\">{label}</div>\
             <div class=\"big\" id=\"{id}-total\" data-count=\"{total}\">{total}</div>\
             <div class=\"sub\"><span id=\"{id}-minute\" data-count=\"{last_minute}\">{last_minute}</span> in the last minute</div>{}\
             <div class=\"ticks\"><span>−10 min</span><span>−5 min</span><span>now</span></div></div>",
            bars(&series, 260, 44, tone),
        );
    }
    // The charts always span the whole window (their ticks say −10 min); right after a
    // start only part of it holds counts, which the caption says instead of naming the
    // shorter span as if it were the charts' (issue 40).
    let window = BUCKET * crate::activity::BUCKETS as u32;
    let counted = if recent.covers + BUCKET < window {
        format!(
            " (counted since the gateway started, {} ago)",
            human(covers)
        )
    } else {
        String::new()
    };
    let _ = write!(
        out,
        "</div><p class=\"note\" id=\"activity-window\" data-seconds=\"{}\">Charts and counts over the last {}{counted}, \
         in {}-second buckets (rightmost: the open one). \
         A request counts once, by its outcome; a guard trip also counts as its error code.</p>",
        window.as_secs(),
        human(window),
        BUCKET.as_secs()
    );
    out.push_str(
        "<table id=\"breakdown\"><thead><tr><th>kind</th><th>reason / code</th>\
                  <th class=\"num\">last minute</th><th class=\"num\">last 10 min</th>\
                  <th class=\"num\">per minute</th><th>last 10 min</th></tr></thead><tbody>",
    );
    // Averaged over at least a minute: three requests in the first second after a start
    // are not 180 a minute.
    let per_minute = |n: u64| n as f64 * 60.0 / covers.as_secs_f64().max(60.0);
    let mut row = |kind: &str, key: &str, pick: &dyn Fn(&Counts) -> u64, tone: &str| {
        let (ten, one) = (pick(&all), pick(&minute));
        if ten == 0 && kind != "admit" {
            return;
        }
        let _ = write!(
            out,
            "<tr data-kind=\"{kind}\" data-key=\"{key}\"><td>{kind}</td><td><code>{key}</code></td>\
             <td class=\"num\" data-field=\"minute\">{one}</td><td class=\"num\" data-field=\"count\">{ten}</td>\
             <td class=\"num\">{:.1}</td><td>{}</td></tr>",
            per_minute(ten),
            bars(&recent.series(pick), 240, 20, tone),
        );
    };
    row("admit", "success", &|c| c.admits, "good");
    for (i, code) in CODES.iter().enumerate() {
        row("refusal", code, &|c| c.refusals[i], "warn");
    }
    for (i, reason) in TRIP_REASONS.iter().enumerate() {
        row("guard_trip", reason, &|c| c.trips[i], "bad");
    }
    row("leak", "leak_suspected", &|c| c.leaks, "bad");
    out.push_str("</tbody></table></section>");
}

// === models, pools, workers ===

fn models_section(out: &mut String, s: &StatusSources<'_>) {
    out.push_str("<section id=\"models\"><h2>Models and admission limits</h2>");
    let Some(admission) = s.admission else {
        out.push_str(
            "<p class=\"note\">Admission state is not attached to this admin port.</p></section>",
        );
        return;
    };
    out.push_str(
        "<p class=\"note\">The largest prompt each pool admits: the smallest of the context window, \
         the prefill workers' input limit and the decode workers' KV pool (eligible workers only). \
         Longer prompts get 400 <code>context_length_exceeded</code> before any byte is sent.</p>\
         <table><thead><tr><th>model</th><th class=\"num\">context window</th><th>pool</th>\
         <th class=\"num\">smallest prefill KV</th><th class=\"num\">smallest decode KV</th>\
         <th class=\"num\">enforced prompt limit</th><th></th></tr></thead><tbody>",
    );
    let mut models: Vec<(&String, u64)> = admission
        .models
        .iter()
        .map(|(name, m)| (name, m.context_window))
        .collect();
    models.sort_unstable();
    for (model, window) in models {
        for pool in s.fleet.pools_of(model) {
            let budget = PoolBudget::of(pool, window);
            let tokens =
                |b: &Option<crate::stack::admission::WorkerBound>| b.as_ref().map(|b| b.tokens);
            let prefill = tokens(&budget.prefill_pool);
            let limit = budget.max_prompt_tokens();
            // The incident's configuration: a window the KV pool cannot hold.
            let mismatch = prefill.is_some_and(|p| window > p);
            let _ = write!(
                out,
                "<tr data-model=\"{m}\" data-pool=\"{p}\"><td>{m}</td><td class=\"num\" data-field=\"context_window\">{window}</td>\
                 <td>{p}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num strong\" data-field=\"limit\" data-tokens=\"{}\">{}</td><td>{}</td></tr>",
                opt(prefill),
                opt(tokens(&budget.decode_pool)),
                limit.map_or_else(String::new, |l| l.to_string()),
                limit.map_or_else(|| "serves nothing".to_owned(), |l| l.to_string()),
                if mismatch {
                    "<span class=\"badge warn\" title=\"context window larger than the smallest prefill KV pool\">window &gt; KV pool</span>"
                } else {
                    ""
                },
                m = esc(model),
                p = esc(&pool.name),
            );
        }
    }
    out.push_str("</tbody></table></section>");
}

fn pools_section(out: &mut String, s: &StatusSources<'_>, now: Instant) {
    out.push_str(
        "<section id=\"pools\"><h2>Pools</h2><table><thead><tr><th>pool</th><th>model</th>\
         <th>version</th><th class=\"num\">weight</th><th>rollout</th><th>eligible</th>\
         <th class=\"num\">requests in window</th><th class=\"num\">guard-trip rate</th></tr></thead><tbody>",
    );
    let views: Vec<Value> = s
        .fleet
        .pools()
        .iter()
        .map(|p| pool_json(p, now, s.fleet.kv_overcommit()))
        .collect();
    for (pool, view) in s.fleet.pools().iter().zip(&views) {
        let rollout = rollout_state(s.rollouts, &pool.name);
        let weight = view["weight"].as_u64().unwrap_or(0);
        let configured = view["configured_weight"].as_u64().unwrap_or(0);
        let _ = write!(
            out,
            "<tr data-pool=\"{p}\"><td class=\"strong\">{p}</td><td>{}</td><td data-field=\"version\">{}</td>\
             <td class=\"num\" data-field=\"weight\">{weight}{}</td><td data-field=\"rollout\">{rollout}</td><td>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(text(&view["model"])),
            esc(text(&view["version"])),
            if weight == configured {
                String::new()
            } else {
                format!(" <span class=\"dim\">(configured {configured})</span>")
            },
            eligibility(view),
            view["rates"]["requests"].as_u64().unwrap_or(0),
            percent(view["rates"]["guard_trip_rate"].as_f64()),
            p = esc(&pool.name),
        );
    }
    out.push_str("</tbody></table></section>");
    queues_section(out, s, &views);

    out.push_str(
        "<section id=\"workers\"><h2>Workers</h2><table><thead><tr><th>pool</th><th>role</th>\
         <th>worker</th><th>version</th><th class=\"num\">KV capacity</th><th>health</th>\
         <th class=\"num\">in flight</th><th class=\"num\">KV room</th><th>eligible</th></tr></thead><tbody>",
    );
    let workers = views
        .iter()
        .flat_map(|v| v["workers"].as_array().into_iter().flatten());
    for w in workers {
        let health = &w["health"];
        let state = text(&health["state"]);
        let tone = match state {
            "serving" => "good",
            "trial" => "warn",
            _ => "bad",
        };
        let detail = [
            health["cause"].as_str().map(esc),
            health["ejected_for_seconds"]
                .as_f64()
                .map(|s| format!("back in {s:.0} s")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" · ");
        let outstanding = w["outstanding"].as_u64().unwrap_or(0);
        // Tokens free after kvgate's own KV and the engine's report (the larger of the two).
        let room = w["room"]
            .as_u64()
            .map_or_else(|| "unknown".to_owned(), |r| r.to_string());
        let _ = write!(
            out,
            "<tr data-worker=\"{addr}\" data-pool=\"{}\" data-role=\"{}\"><td>{}</td><td>{}</td><td class=\"mono\">{addr}</td>\
             <td data-field=\"version\">{}</td><td class=\"num\" data-field=\"kv_tokens\">{}</td>\
             <td data-field=\"health\" data-state=\"{state}\"><span class=\"badge {tone}\">{state}</span> <span class=\"dim\">{detail}</span></td>\
             <td class=\"num\" data-field=\"outstanding\">{outstanding}</td>\
             <td class=\"num\" data-field=\"room\">{room}</td><td>{}</td></tr>",
            esc(text(&w["pool"])),
            esc(text(&w["role"])),
            esc(text(&w["pool"])),
            esc(text(&w["role"])),
            esc(text(&w["version"])),
            w["kv_tokens"].as_u64().map_or_else(|| "unknown".to_owned(), |k| k.to_string()),
            eligibility(w),
            addr = esc(text(&w["worker"])),
            state = esc(state),
        );
    }
    out.push_str("</tbody></table></section>");
}

/// Each pool's gateway queue, from the same `pool_json` view as `GET /pools`.
fn queues_section(out: &mut String, s: &StatusSources<'_>, views: &[Value]) {
    out.push_str(
        "<section id=\"queues\"><h2>Gateway queues</h2><p class=\"note\">Requests wait in their pool's \
         queue while no worker has KV room for them (<code>[scheduling]</code>): a higher class first, \
         tenants by weight inside a class. Drain: releases per second over the last 10 s.</p>\
         <table><thead><tr><th>pool</th><th class=\"num\">queued / max</th><th class=\"num\">critical</th>\
         <th class=\"num\">standard</th><th class=\"num\">sheddable</th><th>by tenant</th>\
         <th class=\"num\">oldest wait</th><th class=\"num\">drain</th><th class=\"num\">Retry-After</th></tr></thead><tbody>",
    );
    for (pool, view) in s.fleet.pools().iter().zip(views) {
        let q = &view["queue"];
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        let (length, max) = (n(&q["length"]), n(&q["max_queued"]));
        let tone = match length {
            0 => "",
            l if l >= max => " bad",
            _ => " warn",
        };
        let tenants = q["by_tenant"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(t, c)| format!("<span data-tenant=\"{t}\">{t}: {}</span>", n(c), t = esc(t)))
            .collect::<Vec<_>>()
            .join(" · ");
        let tenants = if tenants.is_empty() {
            "—".to_owned()
        } else {
            tenants
        };
        let class = |c: &str| n(&q["by_class"][c]);
        let _ = write!(
            out,
            "<tr data-queue=\"{p}\"><td class=\"strong\">{p}</td>\
             <td class=\"num{tone}\"><span data-field=\"queue_length\">{length}</span> / <span data-field=\"max_queued\">{max}</span></td>\
             <td class=\"num\" data-field=\"critical\">{}</td><td class=\"num\" data-field=\"standard\">{}</td>\
             <td class=\"num\" data-field=\"sheddable\">{}</td><td class=\"dim\" data-field=\"by_tenant\">{tenants}</td>\
             <td class=\"num\" data-field=\"oldest_wait\" data-seconds=\"{wait:.3}\">{wait:.1} s</td>\
             <td class=\"num\" data-field=\"drain\" data-per-second=\"{drain:.3}\">{drain:.2}/s</td>\
             <td class=\"num\" data-field=\"retry_after\">{} s</td></tr>",
            class("critical"),
            class("standard"),
            class("sheddable"),
            n(&q["retry_after_seconds"]),
            wait = q["oldest_wait_seconds"].as_f64().unwrap_or(0.0),
            drain = q["drain_per_second"].as_f64().unwrap_or(0.0),
            p = esc(&pool.name),
        );
    }
    out.push_str("</tbody></table></section>");
}

/// `stable`, `canary · rolled back (signal)`, or empty for a pool without a rollout.
fn rollout_state(rollouts: &Rollouts, pool: &str) -> String {
    if let Some(r) = rollouts.of_canary(pool) {
        let phase = match r.decision().phase {
            Phase::Canary => "<span class=\"badge warn\">canary</span>".to_owned(),
            Phase::Promoted => "<span class=\"badge good\">canary · promoted</span>".to_owned(),
            Phase::RolledBack { breach, origin } => format!(
                "<span class=\"badge bad\">canary · rolled back</span> <span class=\"dim\">{} ({})</span>",
                esc(&breach.signal),
                esc(&origin)
            ),
        };
        return phase;
    }
    if rollouts.all().iter().any(|r| &*r.stable.name == pool) {
        return "<span class=\"badge\">stable</span>".to_owned();
    }
    String::new()
}

/// A view's `eligible` and `reason`, with `draining` when set.
fn eligibility(view: &Value) -> String {
    let drain = if view["draining"].as_bool() == Some(true) {
        " <span class=\"badge warn\">draining</span>"
    } else {
        ""
    };
    match view["eligible"].as_bool() {
        Some(true) => format!("<span class=\"badge good\" data-eligible=\"true\">yes</span>{drain}"),
        _ => format!(
            "<span class=\"badge bad\" data-eligible=\"false\">no</span> <span class=\"dim\">{}</span>{drain}",
            esc(text(&view["reason"]))
        ),
    }
}

// === reload ===

fn reload_section(out: &mut String, last: Option<&LastReload>, wall: SystemTime) {
    out.push_str("<section id=\"reload\"><h2>Last config reload</h2>");
    match last {
        None => out.push_str(
            "<p id=\"reload-state\" data-state=\"none\">No reload since start \
             (<code>POST /reload</code> or SIGHUP re-reads tenants and keys).</p>",
        ),
        Some(r) => {
            let ago = wall.duration_since(r.at).unwrap_or_default();
            let (state, badge) = match &r.result {
                Ok(()) => ("ok", "<span class=\"badge good\">ok</span>".to_owned()),
                Err(e) => (
                    "error",
                    format!(
                        "<span class=\"badge bad\">refused, running config kept</span> \
                         <pre id=\"reload-error\">{}</pre>",
                        esc(&without_excerpts(e))
                    ),
                ),
            };
            let _ = write!(
                out,
                "<p id=\"reload-state\" data-state=\"{state}\">{badge} at \
                 <span id=\"reload-at\" data-unix=\"{}\">{}</span> <span class=\"dim\">({} ago)</span></p>",
                unix(r.at),
                utc(r.at),
                human(ago),
            );
        }
    }
    out.push_str("</section>");
}
