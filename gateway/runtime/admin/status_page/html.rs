//! The status page's building blocks: HTML escaping, number and time formatting, the SVG
//! bar chart and the stylesheet.

use serde_json::Value;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A bar chart of `series` (one bar per bucket), scaled to its largest value.
pub(super) fn bars(series: &[u64], width: u32, height: u32, tone: &str) -> String {
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

/// A config error without the lines of the file it quotes (TOML parse errors show the
/// offending line, which may hold a secret such as a Redis password): this page needs no
/// token, `POST /reload` (which does) answers with the whole text.
pub(super) fn without_excerpts(error: &str) -> String {
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
pub(super) fn esc(s: &str) -> String {
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
pub(super) fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("—")
}

pub(super) fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

pub(super) fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{:.1} %", v * 100.0))
}

pub(super) fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `2026-05-01 12:34:56 UTC` (no time-zone crate: UTC is what logs use too).
pub(super) fn utc(t: SystemTime) -> String {
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

pub(super) fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=89 => format!("{s} s"),
        90..=5_399 => format!("{} min", (s + 30) / 60),
        _ => format!("{:.1} h", s as f64 / 3600.0),
    }
}

pub(super) const CSS: &str = "\
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
td.warn{color:var(--warn);font-weight:650}td.bad{color:var(--bad);font-weight:650}\
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
