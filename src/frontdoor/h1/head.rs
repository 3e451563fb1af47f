//! A request's head read off the wire, and an answer's head written: what HTTP/1.1 (RFC 9112)
//! asks of a server's framing, and nothing about what a request means.

use std::cell::RefCell;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::header::{
    CONNECTION, CONTENT_LENGTH, DATE, EXPECT, HeaderName, HeaderValue, TRANSFER_ENCODING,
};
use axum::http::{HeaderMap, Method, StatusCode, Uri, Version};

use crate::h1::Framing;

/// The most a request's head (request line and headers) may take.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// The most headers a request may carry.
const MAX_HEADERS: usize = 100;

/// A request's head, parsed; its header values share one copy of the head's bytes.
#[derive(Debug)]
pub(super) struct RequestHead {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    /// How its body is framed.
    pub(super) body: Framing,
    /// Whether the client lets the connection carry another request after this one.
    pub(super) keep_alive: bool,
    /// Whether the client waits to be told to send its body (`Expect: 100-continue`).
    pub(super) expects_continue: bool,
}

/// Why a head was refused: the answer's status and what it says.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

impl Refused {
    fn bad(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

/// The head at the start of `buf` and the bytes it took, `None` while it is not all there.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, Refused> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(too_large(format!(
                "the request's head is over {MAX_HEAD} bytes"
            )));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(too_large(format!(
                "the request carries more than {MAX_HEADERS} headers"
            )));
        }
        Err(httparse::Error::Version) => {
            return Err(Refused {
                status: StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                message: "this server speaks HTTP/1.0, HTTP/1.1 and HTTP/2".into(),
            });
        }
        Err(e) => {
            return Err(Refused::bad(format!(
                "the request's head is not valid HTTP/1.1 ({e})"
            )));
        }
    };
    let method = Method::from_bytes(request.method.unwrap_or_default().as_bytes())
        .map_err(|_| Refused::bad("the request's method is not valid"))?;
    let target = request.path.unwrap_or_default();
    let uri = Uri::try_from(target)
        .map_err(|_| Refused::bad(format!("the request's target {target:?} is not valid")))?;
    let version = match request.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // One copy of the head, which the header values share (the read buffer is let go).
    let copy = Bytes::copy_from_slice(&buf[..len]);
    let start = buf.as_ptr() as usize;
    let mut headers = HeaderMap::with_capacity(request.headers.len());
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut keep_alive = version == Version::HTTP_11;
    let mut expects_continue = false;
    for field in request.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| Refused::bad(format!("the header {:?} is not valid", field.name)))?;
        let at = field.value.as_ptr() as usize - start;
        let value = HeaderValue::from_maybe_shared(copy.slice(at..at + field.value.len()))
            .map_err(|_| Refused::bad(format!("the header {:?} has a value not valid", name)))?;
        if name == CONTENT_LENGTH {
            for n in value.as_bytes().split(|b| *b == b',') {
                let n = std::str::from_utf8(n.trim_ascii())
                    .ok()
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| Refused::bad("the request's content-length is not a number"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(Refused::bad(
                        "the request has two different content-lengths",
                    ));
                }
                length = Some(n);
            }
        } else if name == TRANSFER_ENCODING {
            for coding in value.as_bytes().split(|b| *b == b',') {
                let coding = coding.trim_ascii();
                if chunked || !coding.eq_ignore_ascii_case(b"chunked") {
                    return Err(Refused {
                        status: StatusCode::NOT_IMPLEMENTED,
                        message: "the only transfer coding this server reads is chunked, once"
                            .into(),
                    });
                }
                chunked = true;
            }
        } else if name == CONNECTION {
            for token in value.as_bytes().split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    keep_alive = true;
                }
            }
        } else if name == EXPECT {
            expects_continue = version == Version::HTTP_11
                && value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        }
        headers.append(name, value);
    }
    // RFC 9112 §6.1, §6.3: a request framed both ways could be read two ways (smuggling).
    let body = match (chunked, length) {
        (true, Some(_)) => {
            return Err(Refused::bad(
                "the request has both a transfer-encoding and a content-length",
            ));
        }
        (true, None) if version == Version::HTTP_10 => {
            return Err(Refused::bad("an HTTP/1.0 request cannot be chunked"));
        }
        (true, None) => Framing::Chunked,
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::Empty,
    };
    Ok(Some((
        RequestHead {
            method,
            uri,
            version,
            headers,
            body,
            keep_alive,
            expects_continue,
        },
        len,
    )))
}

fn too_large(message: String) -> Refused {
    Refused {
        status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        message,
    }
}

/// How an answer's body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnswerFraming {
    /// No body: a bodiless status, or an answer to `HEAD` (whose headers go as the handler
    /// gave them).
    None,
    /// This many bytes (`content-length`).
    Length(u64),
    /// Chunks (`transfer-encoding: chunked`), for a body of unknown length to an HTTP/1.1
    /// client.
    Chunked,
    /// Up to the connection's close (an HTTP/1.0 client, a body of unknown length).
    UntilClose,
}

/// Writes an answer's head into `out`: the status line, the handler's headers (those that
/// frame the body and the connection replaced by what `framing` and `keep_alive` say), and
/// `date` unless the handler gave one.
pub(super) fn write_answer_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    framing: AnswerFraming,
    keep_alive: bool,
    client: Version,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    let as_given = framing == AnswerFraming::None && status != StatusCode::NO_CONTENT;
    for (name, value) in headers {
        let framing_header = name == CONTENT_LENGTH || name == TRANSFER_ENCODING;
        if name == CONNECTION || (framing_header && !as_given) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        AnswerFraming::Length(n) => {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        AnswerFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        AnswerFraming::None | AnswerFraming::UntilClose => {}
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if client == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !headers.contains_key(DATE) {
        out.extend_from_slice(b"date: ");
        now(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The answer to a head refused: its status and message as plain text, and the connection's
/// close.
pub(super) fn refusal(refused: &Refused) -> Vec<u8> {
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let mut out = Vec::with_capacity(160 + refused.message.len());
    let framing = AnswerFraming::Length(refused.message.len() as u64 + 1);
    write_answer_head(
        &mut out,
        refused.status,
        &headers,
        framing,
        false,
        Version::HTTP_11,
    );
    out.extend_from_slice(refused.message.as_bytes());
    out.push(b'\n');
    out
}

thread_local! {
    /// The date as an answer carries it, and the second it was made for.
    static DATE_NOW: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Hands `use_it` the current time as an HTTP date (IMF-fixdate), made once a second.
fn now(use_it: impl FnOnce(&[u8])) {
    let time = SystemTime::now();
    let second = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    DATE_NOW.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != second {
            let mut text = [0u8; 29];
            let mut cursor = &mut text[..];
            let _ = write!(cursor, "{}", httpdate::HttpDate::from(time));
            *cached = (second, text);
        }
        use_it(&cached.1);
    });
}

#[cfg(test)]
mod tests;
