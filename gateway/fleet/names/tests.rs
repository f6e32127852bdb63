use super::*;
use std::time::{Duration, UNIX_EPOCH};

fn key() -> NameKey {
    NameKey {
        pool: "p".into(),
        list: "workers",
        url: "http://engines.test:30000/".into(),
        name: "engines.test".into(),
        kind: Discover::Dns,
    }
}

fn at(ip: &str) -> Endpoint {
    Endpoint {
        addr: format!("{ip}:30000").parse().unwrap(),
        bootstrap_port: None,
    }
}

fn t(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s)
}

#[test]
fn a_good_answer_replaces_the_last_and_is_sorted() {
    let book = NameBook::default();
    book.record(&key(), Ok(vec![at("10.0.0.2"), at("10.0.0.1")]), t(1));
    assert_eq!(book.endpoints(&key()), vec![at("10.0.0.1"), at("10.0.0.2")]);
    book.record(&key(), Ok(vec![at("10.0.0.3")]), t(2));
    assert_eq!(book.endpoints(&key()), vec![at("10.0.0.3")]);
    let (_, state) = &book.of_pool("p")[0];
    assert_eq!(state.last_ok, Some(t(2)));
    assert!(!state.stale);
    assert_eq!(state.failures, 0);
}

#[test]
fn a_failure_or_an_empty_answer_keeps_the_last_answer_and_marks_it_stale() {
    let book = NameBook::default();
    book.record(&key(), Ok(vec![at("10.0.0.1")]), t(1));
    book.record(
        &key(),
        Err("engines.test: no such name (NXDOMAIN)".into()),
        t(2),
    );
    assert_eq!(book.endpoints(&key()), vec![at("10.0.0.1")]);
    let (_, state) = &book.of_pool("p")[0];
    assert!(state.stale);
    assert_eq!(state.last_ok, Some(t(1)));
    assert!(state.last_error.as_deref().unwrap().contains("NXDOMAIN"));
    book.record(&key(), Ok(vec![]), t(3));
    assert_eq!(book.endpoints(&key()), vec![at("10.0.0.1")]);
    let (_, state) = &book.of_pool("p")[0];
    assert!(state.stale);
    assert_eq!(state.failures, 2);
    book.record(&key(), Ok(vec![at("10.0.0.1")]), t(4));
    let (_, state) = &book.of_pool("p")[0];
    assert!(!state.stale, "a good answer clears stale");
    assert_eq!(state.last_error, None);
}

#[test]
fn a_name_that_never_answered_lists_nothing_and_is_not_stale() {
    let book = NameBook::default();
    book.record(&key(), Err("timeout".into()), t(1));
    assert!(book.endpoints(&key()).is_empty());
    let (_, state) = &book.of_pool("p")[0];
    assert!(!state.stale, "no older answer to be stale on");
    assert_eq!(state.failures, 1);
    book.record(&key(), Ok(vec![]), t(2));
    let (_, state) = &book.of_pool("p")[0];
    assert_eq!(state.failures, 1, "an empty name is not a failure");
    book.retain(&[]);
    assert!(book.of_pool("p").is_empty());
}
