//! The HTTP side of `serve`: one [`answer`] for every request, from the request head a
//! connection read ([`respond`]: HTTP/1.1, keep-alive, HEAD) to the bytes it writes back.
//! The connections themselves (plain or TLS, their timeouts): `conn.rs`; the listener and
//! the bound on connections: `listen.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::web::Auth;
use super::{scrape_body, wants_text_004, Bodies, Clock, Latest, STALE_INTERVALS};

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
const PLAIN: &str = "text/plain; charset=utf-8";

/// What every answer needs: the latest bodies, the clock, the users, and whether the
/// listener still accepts connections.
pub struct Site<'a> {
    pub latest: &'a Latest,
    pub clock: Clock,
    pub auth: &'a Auth,
    pub listening: &'a AtomicBool,
}

/// What a request says that matters here.
pub struct Request<'a> {
    /// GET or HEAD; anything else is 405.
    pub read_only: bool,
    pub path: &'a str,
    pub accept: Option<&'a str>,
    pub authorization: Option<&'a str>,
}

/// What to send back.
pub struct Reply {
    pub code: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// 401: ask for basic authentication.
    pub challenge: bool,
}

fn plain(code: u16, body: &str) -> Reply {
    Reply {
        code,
        content_type: PLAIN,
        body: body.as_bytes().to_vec(),
        challenge: false,
    }
}

/// The answer to one request.
pub fn answer(req: &Request, site: &Site) -> Reply {
    let (latest, clock, auth) = (site.latest, site.clock, site.auth);
    if !req.read_only {
        return plain(405, "method not allowed\n");
    }
    if !auth.allows(req.authorization) {
        return Reply {
            challenge: true,
            ..plain(401, "unauthorized\n")
        };
    }
    let bodies = match latest.read() {
        Ok(l) => Arc::clone(&l),
        Err(_) => Arc::new(Bodies::default()),
    };
    let path = req.path.split('?').next().unwrap_or("");
    match path {
        "/metrics" if !bodies.ready => plain(503, "the first collection is still running\n"),
        "/metrics" => {
            let text = wants_text_004(req.accept);
            Reply {
                code: 200,
                content_type: if text { TEXT_004 } else { OPENMETRICS },
                body: scrape_body(&bodies, text, Instant::now()),
                challenge: false,
            }
        }
        "/healthz" if !site.listening.load(Ordering::Relaxed) => plain(
            503,
            "the listener has stopped: new connections are refused\n",
        ),
        "/healthz" if clock.healthy(&bodies, Instant::now()) => plain(200, "ok\n"),
        "/healthz" => {
            let why = match bodies.at {
                Some(at) => format!(
                    "stale: the last good collection finished {:.0} s ago (more than {STALE_INTERVALS} intervals of {:.1} s)\n",
                    at.elapsed().as_secs_f64(),
                    clock.interval.as_secs_f64()
                ),
                None => format!(
                    "no good collection in the {:.0} s since the start (more than {STALE_INTERVALS} intervals of {:.1} s)\n",
                    clock.started.elapsed().as_secs_f64(),
                    clock.interval.as_secs_f64()
                ),
            };
            plain(503, &why)
        }
        _ => plain(404, "not found: try /metrics\n"),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// A request head (request line and fields, up to the blank line), parsed.
struct Head<'a> {
    method: &'a str,
    path: &'a str,
    /// HTTP/1.0: the connection closes after the answer.
    http10: bool,
    fields: Vec<(&'a str, &'a str)>,
}

impl<'a> Head<'a> {
    /// None when it is not an HTTP/1.x request head.
    fn parse(raw: &'a [u8]) -> Option<Head<'a>> {
        let text = std::str::from_utf8(raw).ok()?;
        // A client may send an empty line before a request (RFC 9112, 2.2).
        let mut lines = text.trim_start_matches("\r\n").split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, path, version) = (first.next()?, first.next()?, first.next()?);
        if first.next().is_some() || method.is_empty() || !path.starts_with('/') {
            return None;
        }
        let http10 = match version {
            "HTTP/1.1" => false,
            "HTTP/1.0" => true,
            _ => return None,
        };
        let mut fields = Vec::new();
        for l in lines.take_while(|l| !l.is_empty()) {
            let (k, v) = l.split_once(':')?;
            fields.push((k.trim(), v.trim()));
        }
        Some(Head {
            method,
            path,
            http10,
            fields,
        })
    }

    fn field(&self, name: &str) -> Option<&'a str> {
        self.fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// Whether the connection closes after this answer: HTTP/1.0, `Connection: close`, or a
    /// request with a body (never read: nothing here takes one).
    fn closes(&self) -> bool {
        let has = |name: &str, token: &str| {
            self.field(name)
                .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        };
        self.http10
            || has("Connection", "close")
            || self.field("Transfer-Encoding").is_some()
            || self
                .field("Content-Length")
                .is_some_and(|n| n.trim() != "0")
    }
}

/// The bytes to write for one request head, and whether to close the connection after
/// them. A head that is not HTTP/1.x is answered 400 and the connection closed.
pub fn respond(raw_head: &[u8], site: &Site) -> (Vec<u8>, bool) {
    let Some(head) = Head::parse(raw_head) else {
        return (bad_request(), true);
    };
    let reply = answer(
        &Request {
            read_only: head.method == "GET" || head.method == "HEAD",
            path: head.path,
            accept: head.field("Accept"),
            authorization: head.field("Authorization"),
        },
        site,
    );
    let close = head.closes();
    (encode(&reply, head.method == "HEAD", close), close)
}

/// 400, for a head that is not HTTP/1.x or is too long (the connection closes after it).
pub fn bad_request() -> Vec<u8> {
    encode(&plain(400, "bad request\n"), false, true)
}

/// The status line, fields and (unless `head_only`) body of `r`.
fn encode(r: &Reply, head_only: bool, close: bool) -> Vec<u8> {
    let challenge = if r.challenge {
        "WWW-Authenticate: Basic realm=\"twofold\"\r\n"
    } else {
        ""
    };
    let connection = if close { "Connection: close\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{challenge}{connection}\r\n",
        r.code,
        reason(r.code),
        r.content_type,
        r.body.len()
    );
    let mut out = Vec::with_capacity(head.len() + if head_only { 0 } else { r.body.len() });
    out.extend_from_slice(head.as_bytes());
    if !head_only {
        out.extend_from_slice(&r.body);
    }
    out
}

/// What a connection beyond the bound gets when no idle one can be closed for it.
pub const TOO_MANY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::RwLock;
    use std::time::Duration;

    fn site_answers(raw: &str) -> (String, bool) {
        let latest: Latest = Arc::new(RwLock::new(Arc::new(Bodies::default())));
        let auth = Auth::default();
        let listening = AtomicBool::new(true);
        let site = Site {
            latest: &latest,
            clock: Clock {
                started: Instant::now(),
                interval: Duration::from_secs(5),
            },
            auth: &auth,
            listening: &listening,
        };
        let (bytes, close) = respond(raw.as_bytes(), &site);
        (String::from_utf8(bytes).unwrap(), close)
    }

    #[test]
    fn heads_keep_alive_and_bad_requests() {
        let (r, close) = site_answers("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nok\n"),
            "{r}"
        );
        assert!(!close && !r.contains("Connection: close"));
        let (r, close) = site_answers("\r\nHEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 503 ") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        assert!(close && r.contains("Content-Length: 38\r\n"), "{r}");
        let (r, close) = site_answers("GET /x HTTP/1.1\r\nconnection: Close\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404 ") && close);
        let (r, close) = site_answers("POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405 ") && close);
        for bad in [
            "GET\r\n\r\n",
            "GET /metrics HTTP/2.0\r\n\r\n",
            "GET /m HTTP/1.1\r\nno colon\r\n\r\n",
        ] {
            let (r, close) = site_answers(bad);
            assert!(r.starts_with("HTTP/1.1 400 ") && close, "{bad:?}: {r}");
        }
        let listening = AtomicBool::new(false);
        let latest: Latest = Arc::new(RwLock::new(Arc::new(Bodies::default())));
        let auth = Auth::default();
        let site = Site {
            latest: &latest,
            clock: Clock {
                started: Instant::now(),
                interval: Duration::from_secs(5),
            },
            auth: &auth,
            listening: &listening,
        };
        let (r, _) = respond(b"GET /healthz HTTP/1.1\r\n\r\n", &site);
        assert!(String::from_utf8_lossy(&r).contains("the listener has stopped"));
    }
}
