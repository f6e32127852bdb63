//! The status page's "Discovered names" section: the DNS names that list pools' workers
//! (`discover`), from the same `names_json` view as `GET /pools` — the engines each lists,
//! its last good answer and, when its latest resolution failed, that it is stale and why.

use serde_json::Value;
use std::fmt::Write;

use super::html::{esc, text};
use crate::fleet::Fleet;
use crate::runtime::admin::api::names_json;

/// Nothing when no pool discovers its workers by DNS.
pub(super) fn names_section(out: &mut String, fleet: &Fleet) {
    let rows: Vec<(String, Value)> = fleet
        .pools()
        .iter()
        .flat_map(|p| {
            let list = names_json(fleet, &p.name);
            let names = list.as_array().cloned().unwrap_or_default();
            names.into_iter().map(move |n| (p.name.to_string(), n))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"names\"><h2>Discovered names</h2><table><thead><tr><th>pool</th><th>list</th>\
         <th>name</th><th>state</th><th>engines</th><th class=\"num\">last answer</th><th>last error</th>\
         </tr></thead><tbody>",
    );
    for (pool, n) in rows {
        let stale = n["stale"].as_bool().unwrap_or(false);
        let engines: Vec<&str> = n["engines"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let (state, tone) = match (stale, engines.is_empty()) {
            (true, _) => ("stale", "warn"),
            (false, true) => ("no engines", "bad"),
            (false, false) => ("fresh", "good"),
        };
        let _ = write!(
            out,
            "<tr data-name=\"{name}\" data-pool=\"{pool}\"><td>{pool}</td><td>{}</td><td class=\"mono\">{name}</td>\
             <td data-field=\"state\" data-stale=\"{stale}\"><span class=\"badge {tone}\">{state}</span></td>\
             <td class=\"mono\" data-field=\"engines\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(text(&n["list"])),
            esc(&engines.join(" ")),
            n["last_ok_seconds_ago"]
                .as_f64()
                .map_or_else(|| "never".to_owned(), |s| format!("{s:.0} s ago")),
            esc(n["last_error"].as_str().unwrap_or("")),
            name = esc(text(&n["name"])),
            pool = esc(&pool),
        );
    }
    out.push_str("</tbody></table></section>");
}
