//! Request heads as clients send them and as they must not: each framing read as RFC 9112 says,
//! each head that could be read two ways refused with the status it calls for.

use super::*;

fn parsed(head: &str) -> RequestHead {
    match parse(head.as_bytes()) {
        Ok(Some((head, _))) => head,
        other => panic!("{head:?} did not parse: {other:?}"),
    }
}

fn refused(head: &str) -> Refused {
    match parse(head.as_bytes()) {
        Err(refused) => refused,
        other => panic!("{head:?} was not refused: {other:?}"),
    }
}

#[test]
fn a_head_is_read_with_its_framing_and_the_connection_it_allows() {
    let text = "POST /v1/agent/execute?wait=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Two: a\r\nx-two: b\r\n\r\n{\"rest\":1}";
    let Ok(Some((head, len))) = parse(text.as_bytes()) else {
        panic!("did not parse");
    };
    assert_eq!(len, text.len() - "{\"rest\":1}".len());
    assert_eq!(head.method, Method::POST);
    assert_eq!(head.uri.path(), "/v1/agent/execute");
    assert_eq!(head.uri.query(), Some("wait=1"));
    assert_eq!(head.version, Version::HTTP_11);
    assert_eq!(head.body, Framing::Length(12));
    assert!(head.keep_alive && !head.expects_continue);
    let twos: Vec<_> = head.headers.get_all("x-two").iter().collect();
    assert_eq!(twos, ["a", "b"]);
    assert_eq!(head.headers["host"], "a");

    let chunked = parsed(
        "PUT / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(chunked.body, Framing::Chunked);
    assert!(chunked.expects_continue && !chunked.keep_alive);
    // The same length twice is one length.
    assert_eq!(
        parsed("POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n").body,
        Framing::Length(3)
    );
    assert_eq!(parsed("GET / HTTP/1.1\r\n\r\n").body, Framing::Empty);
}

#[test]
fn http_1_0_closes_unless_it_asks_to_keep_the_connection() {
    let old = parsed("GET / HTTP/1.0\r\n\r\n");
    assert_eq!(old.version, Version::HTTP_10);
    assert!(!old.keep_alive);
    assert!(parsed("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
    // An HTTP/1.0 client is not told to go on: it does not wait to be.
    assert!(
        !parsed("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
            .expects_continue
    );
}

#[test]
fn a_head_not_all_there_is_waited_for_up_to_its_bound() {
    assert!(matches!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n"), Ok(None)));
    assert!(matches!(parse(b"GE"), Ok(None)));
    let mut endless = b"GET / HTTP/1.1\r\nx-long: ".to_vec();
    endless.resize(MAX_HEAD, b'a');
    assert!(matches!(
        parse(&endless),
        Err(Refused {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ..
        })
    ));
}

#[test]
fn heads_that_could_be_read_two_ways_or_not_at_all_are_refused() {
    let cases = [
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            400,
            "both",
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            400,
            "two different",
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
            400,
            "not a number",
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            400,
            "not a number",
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            501,
            "chunked",
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            501,
            "once",
        ),
        (
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "HTTP/1.0",
        ),
        ("GET / HTTP/2.0\r\n\r\n", 505, "HTTP/1.1"),
        ("GET /\x01 HTTP/1.1\r\n\r\n", 400, "not valid"),
        ("GET / HTTP/1.1\r\nbad header\r\n\r\n", 400, "not valid"),
        (
            "\x16\x03\x01\x02\x00\x01\x00\x01\x7c\x03\x03",
            400,
            "not valid",
        ),
    ];
    for (head, status, says) in cases {
        let refused = refused(head);
        assert_eq!(refused.status.as_u16(), status, "{head:?}: {refused:?}");
        assert!(refused.message.contains(says), "{head:?}: {refused:?}");
    }
    let mut many = "GET / HTTP/1.1\r\n".to_string();
    for i in 0..=MAX_HEADERS {
        many.push_str(&format!("x-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    assert_eq!(
        refused(&many).status,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
}

#[test]
fn an_answer_head_carries_its_framing_the_connection_and_a_date() {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    // What the handler said of framing and the connection is replaced by what is true.
    headers.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    let written = |framing, keep_alive, client| {
        let mut out = Vec::new();
        write_answer_head(
            &mut out,
            StatusCode::OK,
            &headers,
            framing,
            keep_alive,
            client,
        );
        String::from_utf8(out).unwrap_or_else(|e| panic!("{e}"))
    };
    let sized = written(AnswerFraming::Length(12), true, Version::HTTP_11);
    assert!(
        sized.starts_with(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\ndate: "
        ),
        "{sized}"
    );
    assert!(sized.ends_with(" GMT\r\n\r\n"), "{sized}");
    assert!(
        !sized.contains("999") && !sized.contains("upgrade") && !sized.contains("connection"),
        "{sized}"
    );
    let date = sized.split("date: ").nth(1).unwrap_or_default();
    assert!(
        httpdate::parse_http_date(date.trim_end()).is_ok(),
        "{date:?}"
    );

    let streamed = written(AnswerFraming::Chunked, false, Version::HTTP_11);
    assert!(
        streamed.contains("transfer-encoding: chunked\r\nconnection: close\r\n"),
        "{streamed}"
    );
    let old = written(AnswerFraming::UntilClose, true, Version::HTTP_10);
    assert!(
        old.contains("connection: keep-alive\r\n") && !old.contains("content-length"),
        "{old}"
    );
    // An answer to HEAD keeps the length its GET would have had.
    let head = written(AnswerFraming::None, true, Version::HTTP_11);
    assert!(head.contains("content-length: 999\r\n"), "{head}");
}

#[test]
fn a_refusal_says_why_and_closes() {
    let answer = refusal(&Refused::bad(
        "the request's head is not valid HTTP/1.1 (x)",
    ));
    let text = String::from_utf8(answer).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert!(text.contains("content-length: 45\r\n"), "{text}");
    assert!(
        text.ends_with("\r\n\r\nthe request's head is not valid HTTP/1.1 (x)\n"),
        "{text}"
    );
}
