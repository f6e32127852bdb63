//! The status page's "Tenants, last hour" section: each configured tenant's requests,
//! errors and the tokens its engines reported over the last hour (`accounting`'s per-tenant
//! minutes). One row per tenant of the config, so the table is as bounded as the config.

use std::fmt::Write;
use std::time::Instant;

use super::html::esc;
use crate::accounting::{Book, HOUR_MINUTES};

/// The section; a note instead when no accounting is attached.
pub(super) fn tenants_section(out: &mut String, book: Option<&Book>, now: Instant) {
    out.push_str("<section id=\"tenants\"><h2>Tenants, last hour</h2>");
    let Some(book) = book else {
        out.push_str(
            "<p class=\"note\">Tenant accounting is not attached to this admin port.</p></section>",
        );
        return;
    };
    let _ = write!(
        out,
        "<p class=\"note\" id=\"tenants-window\" data-minutes=\"{HOUR_MINUTES}\">Requests and the tokens \
         the engines reported, per tenant, over the last {HOUR_MINUTES} minutes (the same numbers as \
         <code>kvgate_tenant_*</code> on /metrics and the audit lines). Errors are every outcome but ok.</p>\
         <table id=\"tenant-usage\"><thead><tr><th>tenant</th><th class=\"num\">requests</th>\
         <th class=\"num\">errors</th><th class=\"num\">prompt tokens</th>\
         <th class=\"num\">completion tokens</th><th class=\"num\">cached tokens</th></tr></thead><tbody>"
    );
    for hour in book.hours() {
        let c = hour.last_hour(now);
        let _ = write!(
            out,
            "<tr data-tenant=\"{tenant}\"><td>{tenant}</td>\
             <td class=\"num\" data-field=\"requests\">{}</td><td class=\"num\" data-field=\"errors\">{}</td>\
             <td class=\"num\" data-field=\"prompt\">{}</td><td class=\"num\" data-field=\"completion\">{}</td>\
             <td class=\"num\" data-field=\"cached\">{}</td></tr>",
            c.requests,
            c.errors,
            c.prompt,
            c.completion,
            c.cached,
            tenant = esc(hour.tenant()),
        );
    }
    out.push_str("</tbody></table></section>");
}
