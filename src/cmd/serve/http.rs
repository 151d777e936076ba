//! The HTTP side of `serve`: one [`answer`] for every request, whichever listener took it:
//! `tiny_http` for plain HTTP, or a TLS listener (rustls) when `--web.config.file` has a
//! `tls_server_config`. The TLS listener answers one request per connection (`Connection:
//! close`), reading at most 16 KiB of request head within 10 s; at most
//! [`MAX_TLS_CONNECTIONS`] are served at once, more are closed unanswered.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::web::Auth;
use super::{scrape_body, wants_text_004, Bodies, Clock, Latest, STALE_INTERVALS};

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
const PLAIN: &str = "text/plain; charset=utf-8";
pub const MAX_TLS_CONNECTIONS: usize = 64;
const MAX_HEAD: usize = 16 * 1024;
const TIMEOUT: Duration = Duration::from_secs(10);

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
pub fn answer(req: &Request, latest: &Latest, clock: Clock, auth: &Auth) -> Reply {
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

/// A header of this module's ASCII constants (never refused; if it were, it is left out).
fn header(name: &str, value: &str) -> Vec<tiny_http::Header> {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .into_iter()
        .collect()
}

/// Answers a request `tiny_http` read.
pub fn respond(req: tiny_http::Request, latest: &Latest, clock: Clock, auth: &Auth) {
    use tiny_http::{Method, Response, StatusCode};
    let field = |name: &'static str| {
        req.headers()
            .iter()
            .find(|h| h.field.equiv(name))
            .map(|h| h.value.as_str().to_string())
    };
    let (accept, authorization) = (field("Accept"), field("Authorization"));
    let r = answer(
        &Request {
            read_only: matches!(req.method(), Method::Get | Method::Head),
            path: req.url(),
            accept: accept.as_deref(),
            authorization: authorization.as_deref(),
        },
        latest,
        clock,
        auth,
    );
    let mut headers = header("Content-Type", r.content_type);
    if r.challenge {
        headers.extend(header("WWW-Authenticate", "Basic realm=\"twofold\""));
    }
    let len = r.body.len();
    let resp = Response::new(
        StatusCode(r.code),
        headers,
        std::io::Cursor::new(r.body),
        Some(len),
        None,
    );
    let _ = req.respond(resp);
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

/// Reads one request head (to the blank line), at most [`MAX_HEAD`] bytes.
fn read_head(s: &mut impl Read) -> std::io::Result<Option<String>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8(head).ok())
}

/// One TLS connection: the handshake, one request, one answer, close.
fn tls_connection(
    tcp: TcpStream,
    cfg: Arc<rustls::ServerConfig>,
    latest: &Latest,
    clock: Clock,
    auth: &Auth,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(TIMEOUT))?;
    tcp.set_write_timeout(Some(TIMEOUT))?;
    let conn = rustls::ServerConnection::new(cfg).map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let reply = match read_head(&mut s)? {
        None => plain(400, "bad request\n"),
        Some(head) => {
            let mut lines = head.split("\r\n");
            let mut first = lines.next().unwrap_or("").split(' ');
            let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
            let field = |name: &str| {
                head.split("\r\n").skip(1).find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
                })
            };
            let r = answer(
                &Request {
                    read_only: method == "GET" || method == "HEAD",
                    path,
                    accept: field("Accept"),
                    authorization: field("Authorization"),
                },
                latest,
                clock,
                auth,
            );
            if method == "HEAD" {
                Reply {
                    body: Vec::new(),
                    ..r
                }
            } else {
                r
            }
        }
    };
    let challenge = if reply.challenge {
        "WWW-Authenticate: Basic realm=\"twofold\"\r\n"
    } else {
        ""
    };
    write!(
        s,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{challenge}Connection: close\r\n\r\n",
        reply.code,
        reason(reply.code),
        reply.content_type,
        reply.body.len()
    )?;
    s.write_all(&reply.body)?;
    s.conn.send_close_notify();
    s.flush()
}

/// Accepts TLS connections on `listener` until `stop`, each answered on a thread of its
/// own within `scope`.
pub fn serve_tls<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    listener: TcpListener,
    cfg: Arc<rustls::ServerConfig>,
    latest: &'s Latest,
    clock: Clock,
    auth: &'s Auth,
    stop: &'s AtomicBool,
) {
    let active = Arc::new(AtomicUsize::new(0));
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("twofold: warning: https: {e}");
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((tcp, _)) => {
                let _ = tcp.set_nonblocking(false);
                if active.fetch_add(1, Ordering::AcqRel) >= MAX_TLS_CONNECTIONS {
                    active.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let (cfg, active) = (Arc::clone(&cfg), Arc::clone(&active));
                scope.spawn(move || {
                    let _ = tls_connection(tcp, cfg, latest, clock, auth);
                    active.fetch_sub(1, Ordering::AcqRel);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                eprintln!("twofold: warning: https: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
