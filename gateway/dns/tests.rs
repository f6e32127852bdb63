use super::*;
use crate::fleet::{Endpoint, NameBook};
use std::path::Path;
use std::time::UNIX_EPOCH;

fn config(pools: &str) -> Config {
    let text = format!(
        r#"
[server]
allow_anonymous = true

[[models]]
name = "m"
tokenizer = "tokenizers/qwen3/tokenizer.json"
context_window = 4096

{pools}"#
    );
    let anchor = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/test.toml");
    Config::from_toml(&text, &anchor).unwrap_or_else(|e| panic!("{e}"))
}

fn at(addr: &str, bootstrap: Option<u16>) -> Endpoint {
    Endpoint {
        addr: addr.parse().unwrap(),
        bootstrap_port: bootstrap,
    }
}

#[test]
fn a_dns_entry_becomes_one_worker_per_address_with_its_settings() {
    let written = config(
        r#"[[pools]]
name = "p"
model = "m"
engine = "sglang"
mode = "unified"
workers = [
  { url = "http://10.0.0.9:30000" },
  { url = "https://engines.ns.svc:30000", discover = "dns", kv_tokens = 1000, max_running = 8 },
]"#,
    );
    let queries = queries(&written);
    assert_eq!(queries.len(), 1);
    assert_eq!(queries[0].port, 30000);
    assert_eq!(queries[0].key.name, "engines.ns.svc");
    let book = NameBook::default();
    let unresolved = resolved(&written, &book);
    assert_eq!(
        unresolved.pools[0].workers.len(),
        1,
        "no answer yet: no worker"
    );
    book.record(
        &queries[0].key,
        Ok(vec![at("10.0.0.2:30000", None), at("10.0.0.9:30000", None)]),
        UNIX_EPOCH,
    );
    let workers = resolved(&written, &book).pools.remove(0).workers;
    let urls: Vec<String> = workers.iter().map(|w| w.url.to_string()).collect();
    assert_eq!(
        urls,
        ["http://10.0.0.9:30000/", "https://10.0.0.2:30000/"],
        "the address already listed is one worker"
    );
    let found = &workers[1];
    assert_eq!(found.kv_tokens, Some(1000));
    assert_eq!(found.max_running, Some(8));
    assert_eq!(found.discover, None);
    assert_eq!(found.tls_server_name.as_deref(), Some("engines.ns.svc"));
}

#[test]
fn an_srv_prefill_entry_takes_each_engines_bootstrap_port() {
    let written = config(
        r#"[[pools]]
name = "pd"
model = "m"
engine = "sglang"
mode = "disaggregated"
prefill = [{ url = "http://_http._tcp.prefill.ns.svc", discover = "srv", bootstrap_srv = "_bootstrap._tcp.prefill.ns.svc" }]
decode = [{ url = "http://_http._tcp.decode.ns.svc", discover = "srv" }]"#,
    );
    let queries = queries(&written);
    assert_eq!(queries.len(), 2);
    assert_eq!(
        queries[0].bootstrap_srv.as_deref(),
        Some("_bootstrap._tcp.prefill.ns.svc")
    );
    let book = NameBook::default();
    book.record(
        &queries[0].key,
        Ok(vec![at("10.1.0.1:30000", Some(8998))]),
        UNIX_EPOCH,
    );
    book.record(
        &queries[1].key,
        Ok(vec![at("10.2.0.1:30001", None)]),
        UNIX_EPOCH,
    );
    let pool = resolved(&written, &book).pools.remove(0);
    assert_eq!(pool.prefill[0].url.to_string(), "http://10.1.0.1:30000/");
    assert_eq!(pool.prefill[0].bootstrap_port, Some(8998));
    assert_eq!(pool.decode[0].url.to_string(), "http://10.2.0.1:30001/");
}

#[test]
fn a_config_without_discover_entries_resolves_to_itself() {
    let written = config(
        r#"[[pools]]
name = "p"
model = "m"
engine = "sglang"
mode = "unified"
workers = [{ url = "http://10.0.0.1:30000" }]"#,
    );
    assert!(queries(&written).is_empty());
    let book = NameBook::default();
    assert_eq!(resolved(&written, &book).pools, written.pools);
}
