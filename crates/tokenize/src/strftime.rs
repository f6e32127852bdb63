//! `strftime` for chat templates: HF's `strftime_now` global, and the dates llama.cpp
//! puts in its template variables. UTC: the gateway has no time zone database.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// `strftime_now(format)`: the current time (UTC; the sim has no time zone database).
pub(crate) fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(strftime_utc(&format, secs))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A small `strftime` over UTC: the directives chat templates use (dates in prompts).
pub(crate) fn strftime_utc(format: &str, unix_secs: u64) -> String {
    let days = i64::try_from(unix_secs / 86_400).unwrap_or(0);
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = usize::try_from((days + 3).rem_euclid(7)).unwrap_or(0);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let month_name = MONTHS
        .get(month.saturating_sub(1) as usize)
        .copied()
        .unwrap_or("");
    let weekday_name = WEEKDAYS.get(weekday).copied().unwrap_or("");
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('-') => match chars.next() {
                Some('d') => write!(out, "{day}"),
                Some('m') => write!(out, "{month}"),
                Some(other) => write!(out, "%-{other}"),
                None => write!(out, "%-"),
            },
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", month_name.get(..3).unwrap_or("")),
            Some('A') => write!(out, "{weekday_name}"),
            Some('a') => write!(out, "{}", weekday_name.get(..3).unwrap_or("")),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}
