//! The status page (`GET /status` on the admin port): one self-contained HTML page — inline
//! CSS and SVG, no script, no external resource — that a person reads instead of the logs.
//! It reloads itself every [`REFRESH_SECONDS`].
//!
//! Sections: recent activity (admits, refusals and errors by code, guard trips by reason,
//! leak suspicions; charts of the last ten minutes from [`Activity`]), models with the
//! enforced prompt limit per pool ([`PoolBudget`], what admission enforces), pools and
//! workers (the admin API's own `pool_json` / `worker_json` views, so the page and
//! `GET /pools` never disagree) and the last config reload.
//!
//! Every value that comes from the config or from engines is HTML-escaped. Rows and values
//! carry `data-*` attributes and ids, so tests (and scrapers) read them without parsing
//! the layout.

use serde_json::Value;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::activity::{Activity, Counts, Recent, BUCKET, CODES, TRIP_REASONS};
use crate::rollout::{Phase, Rollouts};
use crate::runtime::admin_api::pool_json;
use crate::runtime::reload::LastReload;
use crate::stack::admission::{AdmissionState, PoolBudget};
use crate::stack::routing::Router;

/// Seconds between the page's own reloads.
pub const REFRESH_SECONDS: u32 = 5;

/// What the page is drawn from.
#[derive(Debug)]
pub struct StatusSources<'a> {
    pub router: &'a Router,
    pub rollouts: &'a Rollouts,
    /// The models' context windows (None: limits are not shown).
    pub admission: Option<&'a AdmissionState>,
    pub activity: &'a Activity,
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
    models_section(&mut out, s);
    pools_section(&mut out, s, now);
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
    let cards: [(&str, &str, u64, u64, Vec<u64>, &str); 4] = [
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
    let _ = write!(
        out,
        "</div><p class=\"note\">Counts over the last {} in {}-second buckets (rightmost: the open one). \
         A request counts once, by its outcome; a guard trip also counts as its error code.</p>",
        human(covers),
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

/// A bar chart of `series` (one bar per bucket), scaled to its largest value.
fn bars(series: &[u64], width: u32, height: u32, tone: &str) -> String {
    let max = series.iter().copied().max().unwrap_or(0).max(1);
    let slots = series.len().max(crate::activity::BUCKETS + 1) as f64;
    let step = f64::from(width) / slots;
    // Right-aligned: a young history fills from the "now" end, as time does.
    let offset = f64::from(width) - step * series.len() as f64;
    let mut svg = format!(
        "<svg class=\"chart {tone}\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" preserveAspectRatio=\"none\" \
         role=\"img\" aria-label=\"peak {max} per bucket\"><line x1=\"0\" y1=\"{y}\" x2=\"{width}\" y2=\"{y}\" class=\"axis\"/>",
        y = height - 1
    );
    for (i, v) in series.iter().enumerate().filter(|(_, v)| **v > 0) {
        let h = (*v as f64 / max as f64 * f64::from(height - 2)).max(2.0);
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\"><title>{v}</title></rect>",
            offset + step * i as f64,
            f64::from(height - 1) - h,
            (step - 0.4).max(0.8),
        );
    }
    svg.push_str("</svg>");
    svg
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
        for pool in s.router.pools_of(model) {
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
    let views: Vec<Value> = s.router.pools().iter().map(|p| pool_json(p, now)).collect();
    for (pool, view) in s.router.pools().iter().zip(&views) {
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

    out.push_str(
        "<section id=\"workers\"><h2>Workers</h2><table><thead><tr><th>pool</th><th>role</th>\
         <th>worker</th><th>version</th><th class=\"num\">KV capacity</th><th>health</th>\
         <th class=\"num\">in flight</th><th>eligible</th></tr></thead><tbody>",
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
        let _ = write!(
            out,
            "<tr data-worker=\"{addr}\" data-pool=\"{}\" data-role=\"{}\"><td>{}</td><td>{}</td><td class=\"mono\">{addr}</td>\
             <td data-field=\"version\">{}</td><td class=\"num\" data-field=\"kv_tokens\">{}</td>\
             <td data-field=\"health\" data-state=\"{state}\"><span class=\"badge {tone}\">{state}</span> <span class=\"dim\">{detail}</span></td>\
             <td class=\"num\" data-field=\"outstanding\">{outstanding}</td><td>{}</td></tr>",
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

// === formatting ===

/// A config error without the lines of the file it quotes (TOML parse errors show the
/// offending line, which may hold a secret such as a Redis password): this page needs no
/// token, `POST /reload` (which does) answers with the whole text.
fn without_excerpts(error: &str) -> String {
    error
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            let l = l
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start();
            !l.starts_with('|')
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// HTML-escape text for element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A JSON view's string, `—` for null or missing.
fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("—")
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{:.1} %", v * 100.0))
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `2026-05-01 12:34:56 UTC` (no time-zone crate: UTC is what logs use too).
pub fn utc(t: SystemTime) -> String {
    let secs = unix(t);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=89 => format!("{s} s"),
        90..=5_399 => format!("{} min", (s + 30) / 60),
        _ => format!("{:.1} h", s as f64 / 3600.0),
    }
}

const CSS: &str = "\
:root{--bg:#f6f7f9;--fg:#1d2330;--dim:#6b7280;--line:#e3e6eb;--good:#1f9d55;--warn:#d98e04;--bad:#d64545;--card:#fff}\
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif}\
header{background:#1d2330;color:#fff;padding:14px 28px}header h1{margin:0;font-size:20px;font-weight:650}header h1 span{font-weight:400;opacity:.7}\
.meta{margin:4px 0 0;color:#c7ccd6;font-size:13px}main{padding:8px 28px 28px;max-width:1400px}\
h2{font-size:15px;text-transform:uppercase;letter-spacing:.06em;color:var(--dim);margin:26px 0 10px}\
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:14px}\
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px;border-top:4px solid var(--dim)}\
.card.good{border-top-color:var(--good)}.card.warn{border-top-color:var(--warn)}.card.bad{border-top-color:var(--bad)}\
.label{color:var(--dim);font-size:13px}.big{font-size:30px;font-weight:650;font-variant-numeric:tabular-nums}.sub{color:var(--dim);font-size:12px;margin-bottom:6px}\
table{width:100%;border-collapse:collapse;background:var(--card);border:1px solid var(--line);border-radius:8px;overflow:hidden}\
th,td{padding:7px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:middle}\
th{background:#eef0f4;font-weight:600;font-size:12px;color:#4b5563}tr:last-child td{border-bottom:0}\
.num{text-align:right;font-variant-numeric:tabular-nums}.strong{font-weight:650}.dim{color:var(--dim);font-size:12px}\
.mono,code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}\
pre{white-space:pre-wrap;background:#fff4f4;border:1px solid #f3c6c6;border-radius:6px;padding:8px 10px;margin:8px 0 0}\
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;background:#e5e7eb;color:#374151}\
.badge.good{background:#dcf5e6;color:#136c3a}.badge.warn{background:#fdf0d2;color:#8a5a00}.badge.bad{background:#fbe0e0;color:#a12c2c}\
.note{color:var(--dim);font-size:12.5px;margin:6px 0 10px}\
svg.chart{display:block}svg .axis{stroke:var(--line)}svg.good rect{fill:var(--good)}svg.warn rect{fill:var(--warn)}svg.bad rect{fill:var(--bad)}\
#breakdown{margin-top:12px}.card svg.chart{width:100%}.ticks{display:flex;justify-content:space-between;color:var(--dim);font-size:10.5px;margin-top:2px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert(\"x\")</script>&'"),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
    }

    #[test]
    fn reload_errors_lose_the_file_lines_they_quote() {
        let e = "x.toml: key `limits`: TOML parse error at line 3, column 9\n  |\n3 | redis_url = \"redis://:secret@h\" x\n  |         ^\nexpected newline";
        let shown = without_excerpts(e);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("line 3, column 9") && shown.contains("expected newline"));
    }

    #[test]
    fn formats_utc_dates() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // leap day 2024
        assert_eq!(utc(t), "2024-02-29 12:34:56 UTC");
    }

    #[test]
    fn bars_scale_to_the_peak_and_skip_empty_buckets() {
        let svg = bars(&[0, 2, 4], 242, 20, "good");
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("<title>4</title>"));
        assert!(
            svg.contains("height=\"18.0\""),
            "the peak fills the chart: {svg}"
        );
    }
}
