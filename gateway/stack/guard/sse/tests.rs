//! Unit, property and fuzz-style tests of the SSE re-framer.

use super::*;
use proptest::prelude::*;

/// Feed `chunks` in order, then finish; every event in order.
fn feed<'a>(r: &mut SseReframer, chunks: impl IntoIterator<Item = &'a [u8]>) -> Vec<SseEvent> {
    let mut out = Vec::new();
    for chunk in chunks {
        r.push(chunk, &mut out).unwrap();
    }
    out.extend(r.finish());
    out
}

fn whole(input: &[u8]) -> Vec<SseEvent> {
    feed(&mut SseReframer::new(), [input])
}

fn bytewise(input: &[u8]) -> Vec<SseEvent> {
    feed(&mut SseReframer::new(), input.chunks(1))
}

fn ev(raw: &'static [u8], data: Option<&str>) -> SseEvent {
    SseEvent {
        raw: Bytes::from_static(raw),
        data: data.map(str::to_owned),
        event: None,
        id: None,
        comment_only: false,
        complete: true,
    }
}

fn concat(events: &[SseEvent]) -> Vec<u8> {
    events.iter().flat_map(|e| e.raw.iter().copied()).collect()
}

// === line terminators ===

#[test]
fn lf_crlf_and_lone_cr_terminate_lines() {
    for input in [
        &b"data: a\ndata: b\n\n"[..],
        b"data: a\r\ndata: b\r\n\r\n",
        b"data: a\rdata: b\r\r",
        b"data: a\r\ndata: b\rdata: c\n\r\n",
    ] {
        let events = whole(input);
        assert_eq!(events.len(), 1, "{input:?}");
        let data = events[0].data.as_deref().unwrap();
        assert!(data.starts_with("a\nb"), "{input:?}: {data:?}");
        assert_eq!(events[0].raw, input);
        assert_eq!(bytewise(input), events);
    }
}

#[test]
fn cr_then_lf_in_the_next_chunk_is_one_terminator() {
    let mut r = SseReframer::new();
    let mut out = Vec::new();
    r.push(b"data: a\r", &mut out).unwrap();
    r.push(b"\n\r", &mut out).unwrap();
    assert!(out.is_empty(), "held until we know whether an LF follows");
    r.push(b"\ndata: b\n\n", &mut out).unwrap();
    assert_eq!(
        out,
        [
            ev(b"data: a\r\n\r\n", Some("a")),
            ev(b"data: b\n\n", Some("b"))
        ]
    );
    assert_eq!(r.finish(), None);
}

#[test]
fn event_ending_in_cr_waits_for_the_next_byte_or_finish() {
    let mut r = SseReframer::new();
    let mut out = Vec::new();
    r.push(b"data: a\r\r", &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(r.buffered(), 9);
    r.push(b"data: b\r\r", &mut out).unwrap();
    assert_eq!(out, [ev(b"data: a\r\r", Some("a"))]);
    let last = r.finish().unwrap();
    assert_eq!(last, ev(b"data: b\r\r", Some("b")), "complete, only held");
}

// === fields ===

#[test]
fn data_lines_join_and_strip_exactly_one_space() {
    let e = &whole(b"data:x\ndata: y\ndata:  z\ndata\ndata:\n\n")[0];
    assert_eq!(e.data.as_deref(), Some("x\ny\n z\n\n"));
    assert_eq!(whole(b"data\n\n")[0].data.as_deref(), Some(""));
    assert_eq!(whole(b"data:\n\n")[0].data.as_deref(), Some(""));
    assert_eq!(whole(b"event: e\n\n")[0].data, None);
}

#[test]
fn event_and_id_keep_the_last_value() {
    let e = &whole(b"event: a\nid: 1\nevent:b\nid: 2\nid: x\0y\ndata: d\n\n")[0];
    assert_eq!(e.event.as_deref(), Some("b"));
    assert_eq!(e.id.as_deref(), Some("2"), "an id with NUL is ignored");
    let e = &whole(b"event\nid\n\n")[0];
    assert_eq!(e.event.as_deref(), Some(""), "no colon: empty value");
    assert_eq!(e.id.as_deref(), Some(""));
}

#[test]
fn unknown_fields_are_ignored_but_kept_in_raw() {
    let input = b"retry: 100\nfoo: bar\ndat: x\nDATA: y\ndata: z\n\n";
    let e = &whole(input)[0];
    assert_eq!(e.data.as_deref(), Some("z"));
    assert_eq!((e.event.as_deref(), e.id.as_deref()), (None, None));
    assert_eq!(e.raw, &input[..]);
    assert!(whole(b"retry: 5\n\n")[0].is_empty());
}

#[test]
fn comments_are_ignored_for_data_and_kept_in_raw() {
    let events = whole(b": keep-alive\n\n: a\n:b\ndata: x\n: c\n\n");
    assert!(events[0].comment_only);
    assert_eq!(events[0].data, None);
    assert!(!events[0].is_empty());
    assert!(!events[1].comment_only);
    assert_eq!(events[1].data.as_deref(), Some("x"));
    assert_eq!(events[1].raw, &b": a\n:b\ndata: x\n: c\n\n"[..]);
}

#[test]
fn extra_blank_lines_are_empty_events_and_nothing_is_dropped() {
    let input = b"\ndata: a\n\n\r\n\r";
    let events = whole(input);
    assert_eq!(events.len(), 4);
    assert!(events[0].is_empty() && !events[0].comment_only);
    assert_eq!(events[1].data.as_deref(), Some("a"));
    assert!(events[2].is_empty() && events[3].is_empty());
    assert_eq!(concat(&events), input);
}

#[test]
fn bom_is_skipped_only_at_the_start_and_kept_in_raw() {
    let input = b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n";
    for events in [whole(input), bytewise(input)] {
        assert_eq!(events[0].data.as_deref(), Some("a"));
        assert_eq!(events[0].raw, &b"\xEF\xBB\xBFdata: a\n\n"[..]);
        assert_eq!(
            events[1].data, None,
            "a later BOM is part of the field name"
        );
        assert_eq!(concat(&events), input);
    }
    // A BOM prefix that is not a BOM is parsed as bytes.
    assert_eq!(bytewise(b"\xEFdata: a\n\n")[0].data, None);
    assert_eq!(bytewise(b"\xEF\xBB\n\n")[0].raw, &b"\xEF\xBB\n\n"[..]);
}

#[test]
fn invalid_utf8_is_lossy_in_fields_and_exact_in_raw() {
    let input = b"event: \xFF\ndata: a\xC3\ndata: \xE2\x82\xAC\xE2\x82\n\n";
    for events in [whole(input), bytewise(input)] {
        assert_eq!(
            events[0].data.as_deref(),
            Some("a\u{FFFD}\n\u{20AC}\u{FFFD}")
        );
        assert_eq!(events[0].event.as_deref(), Some("\u{FFFD}"));
        assert_eq!(events[0].raw, &input[..]);
    }
}

// === finish, buffered, limit ===

#[test]
fn finish_returns_the_unterminated_tail_and_resets() {
    let mut r = SseReframer::new();
    let mut out = Vec::new();
    r.push(b"data: a\n\nevent: e\ndata: {\"x\"", &mut out)
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(r.buffered(), b"event: e\ndata: {\"x\"".len());
    let tail = r.finish().unwrap();
    assert!(!tail.complete);
    assert_eq!(tail.event.as_deref(), Some("e"));
    assert_eq!(tail.data.as_deref(), Some("{\"x\""));
    assert_eq!(tail.raw, &b"event: e\ndata: {\"x\""[..]);
    assert_eq!((r.buffered(), r.finish()), (0, None));
    // Reset: a BOM is skipped again, as at the start of a new stream.
    r.push(b"\xEF\xBB\xBFdata: b\n\n", &mut out).unwrap();
    assert_eq!(out[1].data.as_deref(), Some("b"));
    assert_eq!(SseReframer::default().finish(), None);
}

#[test]
fn event_past_the_limit_is_an_error_and_sticks() {
    let mut r = SseReframer::with_limit(16);
    let mut out = Vec::new();
    r.push(b"data: 0123456\n\ndata: 0123456789", &mut out)
        .unwrap();
    assert_eq!(out.len(), 1);
    let err = r.push(b"a", &mut out).unwrap_err();
    assert_eq!(err, SseError::EventTooLarge { limit: 16 });
    assert_eq!(r.push(b"\n\n", &mut out), Err(err));
    assert_eq!((r.buffered(), r.finish(), out.len()), (0, None, 1));

    // A complete event over the limit fails too, however it was chunked.
    let input = b"data: ok\n\ndata: 0123456789\n\n";
    for chunks in [vec![&input[..]], input.chunks(1).collect()] {
        let mut r = SseReframer::with_limit(16);
        let mut out = Vec::new();
        let result: Result<(), _> = chunks.iter().try_for_each(|c| r.push(c, &mut out));
        assert_eq!(result, Err(SseError::EventTooLarge { limit: 16 }));
        assert_eq!(out, [ev(b"data: ok\n\n", Some("ok"))]);
    }
    let mut r = SseReframer::with_limit(10);
    assert_eq!(
        r.push(b"data: ok\n\n", &mut out),
        Ok(()),
        "exactly at the limit"
    );
}

#[test]
fn long_line_in_tiny_chunks_is_not_rescanned() {
    // 256 KiB in 1-byte pushes: quadratic re-scanning would take minutes.
    let mut input = b"data: ".to_vec();
    input.resize(256 * 1024, b'x');
    input.extend_from_slice(b"\n\n");
    let events = bytewise(&input);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].raw.len(), input.len());
}

// === SseEvent helpers ===

#[test]
fn done_and_json() {
    let events = whole(
        b"data: {\"text\":\"hi\"}\n\ndata: {\"error\":{\"message\":\"m\"}}\n\n\
          data: nope\n\n: c\n\ndata:  [DONE] \n\n",
    );
    assert_eq!(events[0].json().unwrap()["text"], "hi");
    assert_eq!(events[1].json().unwrap()["error"]["message"], "m");
    assert_eq!(events[2].json(), None);
    assert_eq!(events[3].json(), None);
    assert!(events[4].is_done() && events[4].json().is_none());
    assert!(!events[0].is_done() && !events[3].is_done());
}

#[test]
fn data_event_round_trips() {
    assert_eq!(SseEvent::data_event("x"), &b"data: x\n\n"[..]);
    assert_eq!(SseEvent::data_event(""), &b"data: \n\n"[..]);
    assert_eq!(
        SseEvent::data_event("a\nb\r\nc\r d"),
        &b"data: a\ndata: b\ndata: c\ndata:  d\n\n"[..]
    );
    for payload in ["", " x", "a\n\nb", "{\"a\":1}", "[DONE]", "\n"] {
        let events = whole(&SseEvent::data_event(payload));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.as_deref(), Some(payload));
    }
}

// === property tests ===

#[derive(Clone, Debug)]
enum Line {
    Data { space: bool, value: String },
    Comment(String),
    Event(String),
    Id(String),
    Unknown(String, String),
    NoColon(&'static str),
}

#[derive(Clone, Copy, Debug)]
enum Term {
    Lf,
    CrLf,
    Cr,
}

fn line() -> impl Strategy<Value = Line> {
    let text = "[^\r\n]{0,24}";
    let json = (any::<u32>(), "[^\r\n]{0,16}", any::<bool>()).prop_map(|(n, s, b)| {
        serde_json::json!({"text": s, "meta_info": {"n": n, "finish": b}}).to_string()
    });
    let value =
        prop_oneof![4 => text.prop_map(String::from), 2 => json, 1 => Just("[DONE]".into())];
    prop_oneof![
        6 => (any::<bool>(), value).prop_map(|(space, value)| Line::Data { space, value }),
        2 => text.prop_map(Line::Comment),
        1 => "[a-z ]{0,8}".prop_map(Line::Event),
        1 => "[^\r\n\0]{0,8}".prop_map(Line::Id),
        1 => ("(retry|[a-z]{1,6})", text)
            .prop_filter("a known field", |(n, _)| !matches!(&n[..], "data" | "event" | "id"))
            .prop_map(|(n, v)| Line::Unknown(n, v)),
        1 => prop::sample::select(&["data", "event", "id", "retry", "x"][..]).prop_map(Line::NoColon),
    ]
}

fn term() -> impl Strategy<Value = Term> {
    prop_oneof![3 => Just(Term::Lf), 2 => Just(Term::CrLf), 1 => Just(Term::Cr)]
}

type Model = Vec<(Vec<(Line, Term)>, Term)>;

fn events() -> impl Strategy<Value = Model> {
    let event = (prop::collection::vec((line(), term()), 0..5), term());
    prop::collection::vec(event, 0..12)
}

/// Append one line and its terminator.
fn put(bytes: &mut Vec<u8>, line: &[u8], t: Term, prev_cr: &mut bool) {
    // A lone CR followed by a blank LF line would read as one CRLF.
    let t = match (t, *prev_cr && line.is_empty()) {
        (Term::Lf, true) => Term::CrLf,
        (t, _) => t,
    };
    bytes.extend_from_slice(line);
    bytes.extend_from_slice(match t {
        Term::Lf => b"\n",
        Term::CrLf => b"\r\n",
        Term::Cr => b"\r",
    });
    *prev_cr = matches!(t, Term::Cr);
}

/// Serialize the model and the events the spec says it holds.
fn serialize(model: &Model) -> (Vec<u8>, Vec<SseEvent>) {
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    let mut prev_cr = false;
    for (lines, blank) in model {
        let start = bytes.len();
        let mut data: Option<String> = None;
        let (mut event, mut id, mut comments) = (None, None, 0);
        for (line, t) in lines {
            let text = match line {
                Line::Data { space, value } => {
                    let v = if *space {
                        value.as_str()
                    } else {
                        value.strip_prefix(' ').unwrap_or(value)
                    };
                    data = Some(match data.take() {
                        Some(d) => format!("{d}\n{v}"),
                        None => v.to_owned(),
                    });
                    format!("data:{}{value}", if *space { " " } else { "" })
                }
                Line::Comment(c) => {
                    comments += 1;
                    format!(":{c}")
                }
                Line::Event(e) => {
                    event = Some(e.clone());
                    format!("event: {e}")
                }
                Line::Id(i) => {
                    id = Some(i.clone());
                    format!("id: {i}")
                }
                Line::Unknown(n, v) => format!("{n}: {v}"),
                Line::NoColon(n) => {
                    match *n {
                        "data" => data = Some(data.map_or(String::new(), |d| d + "\n")),
                        "event" => event = Some(String::new()),
                        "id" => id = Some(String::new()),
                        _ => {}
                    }
                    n.to_string()
                }
            };
            put(&mut bytes, text.as_bytes(), *t, &mut prev_cr);
        }
        put(&mut bytes, b"", *blank, &mut prev_cr);
        expected.push(SseEvent {
            raw: Bytes::copy_from_slice(&bytes[start..]),
            data,
            event,
            id,
            comment_only: !lines.is_empty() && comments == lines.len(),
            complete: true,
        });
    }
    (bytes, expected)
}

/// Chunks of `input` cut at `cuts` (any positions, sorted and deduplicated).
pub(crate) fn cut<'a>(input: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut chunks = Vec::new();
    let mut prev = 0;
    for a in at.into_iter().chain([input.len()]) {
        chunks.push(&input[prev..a]);
        prev = a;
    }
    chunks
}

/// Chunks split right after every CR, so every CRLF straddles two pushes.
fn cut_after_cr(input: &[u8]) -> Vec<&[u8]> {
    input.split_inclusive(|&b| b == b'\r').collect()
}

proptest! {
    #[test]
    fn chunking_never_changes_the_events(
        model in events(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let (input, expected) = serialize(&model);
        let all = whole(&input);
        prop_assert_eq!(&all, &expected);
        prop_assert_eq!(concat(&all), input.clone());
        prop_assert_eq!(&feed(&mut SseReframer::new(), cut(&input, &cuts)), &expected);
        prop_assert_eq!(&feed(&mut SseReframer::new(), cut_after_cr(&input)), &expected);
        prop_assert_eq!(&bytewise(&input), &expected);
    }

    #[test]
    fn arbitrary_bytes_never_panic_nor_lose_bytes(
        input in prop::collection::vec(
            prop_oneof![
                3 => prop::sample::select(&b"\r\n: \xEF\xBB\xBF\0"[..]),
                2 => prop::sample::select(&b"dataeventid"[..]),
                1 => any::<u8>(),
            ],
            0..400,
        ),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
        limit in prop_oneof![Just(DEFAULT_MAX_EVENT_BYTES), 0usize..64],
    ) {
        let run = |chunks: Vec<&[u8]>| {
            let mut r = SseReframer::with_limit(limit);
            let (mut out, mut fed) = (Vec::new(), 0);
            for chunk in chunks {
                let result = r.push(chunk, &mut out);
                fed += chunk.len();
                if result.is_err() {
                    return (out, true);
                }
                let emitted = concat(&out);
                assert_eq!(emitted.len() + r.buffered(), fed);
                assert_eq!(&emitted[..], &input[..emitted.len()]);
            }
            out.extend(r.finish());
            assert_eq!(concat(&out), input);
            assert!(out.iter().all(|e| e.raw.len() <= limit));
            (out, false)
        };
        let all = run(vec![&input]);
        let chunked = run(cut(&input, &cuts));
        if !all.1 && !chunked.1 {
            prop_assert_eq!(&all.0, &chunked.0);
            prop_assert_eq!(&run(input.chunks(1).collect()).0, &all.0);
        }
        prop_assert_eq!(all.1, chunked.1, "the limit trips however the stream is chunked");
    }
}
