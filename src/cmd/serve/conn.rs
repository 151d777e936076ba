//! One connection of `serve`, plain HTTP or TLS (rustls), on a thread of its own: requests
//! read and answered in turn (HTTP/1.1 keep-alive) until the client closes, asks to close,
//! or a deadline passes. Every read and write has a deadline, checked between system calls
//! (so a client that sends or reads a byte a second still meets it):
//! - [`super::listen`]'s idle timeout (`--web.idle-timeout`) for the first byte of a request;
//! - [`HEAD_TIMEOUT`] from that byte to the end of the request head (at most [`MAX_HEAD`]),
//!   and, on TLS, from the connection to the end of the handshake;
//! - [`WRITE_TIMEOUT`] for the whole answer.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::http::{bad_request, respond, Site};
use super::listen::Conns;

/// From the first byte of a request to the end of its head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// For writing one answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// A connection registered in [`Conns`]: its slot leaves the table before the socket is
/// closed (the fields drop after `drop`), so the bound never shuts down a descriptor
/// that was closed and reused.
pub struct Held<'a> {
    pub conns: &'a Conns,
    pub id: u64,
    pub tcp: TcpStream,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.conns.leave(self.id);
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::from(ErrorKind::TimedOut)
}

/// The time left before `deadline`, or a timeout error.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out());
    }
    Ok(left)
}

/// A socket timeout surfaces as `WouldBlock` (EAGAIN): a timeout.
fn timeouts(e: std::io::Error) -> std::io::Error {
    if e.kind() == ErrorKind::WouldBlock {
        timed_out()
    } else {
        e
    }
}

struct Conn<'a> {
    held: Held<'a>,
    tls: Option<Box<rustls::ServerConnection>>,
    accepted: Instant,
}

impl Conn<'_> {
    /// Reads some bytes by `deadline`: `Ok(0)` at the end of the stream.
    fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> std::io::Result<usize> {
        let tcp = &self.held.tcp;
        let Some(tls) = self.tls.as_mut() else {
            tcp.set_read_timeout(Some(left(deadline)?))?;
            return (&mut &*tcp).read(buf).map_err(timeouts);
        };
        loop {
            match tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let deadline = if tls.is_handshaking() {
                deadline.min(self.accepted + HEAD_TIMEOUT)
            } else {
                deadline
            };
            flush_tls(tls, tcp, deadline)?;
            tcp.set_read_timeout(Some(left(deadline)?))?;
            if tls.read_tls(&mut &*tcp).map_err(timeouts)? == 0 {
                return Ok(0);
            }
            if let Err(e) = tls.process_new_packets() {
                // The alert that says why, if it goes out at once.
                let _ = flush_tls(tls, tcp, Instant::now() + Duration::from_millis(100));
                return Err(std::io::Error::new(ErrorKind::InvalidData, e));
            }
        }
    }

    /// Writes all of `data` by `deadline`.
    fn write_by(&mut self, mut data: &[u8], deadline: Instant) -> std::io::Result<()> {
        let tcp = &self.held.tcp;
        let Some(tls) = self.tls.as_mut() else {
            while !data.is_empty() {
                tcp.set_write_timeout(Some(left(deadline)?))?;
                match (&mut &*tcp).write(data).map_err(timeouts)? {
                    0 => return Err(ErrorKind::WriteZero.into()),
                    n => data = &data[n..],
                }
            }
            return Ok(());
        };
        while !data.is_empty() {
            let n = tls.writer().write(data)?;
            data = &data[n..];
            if n == 0 && !tls.wants_write() {
                return Err(ErrorKind::WriteZero.into());
            }
            flush_tls(tls, tcp, deadline)?;
        }
        Ok(())
    }

    /// The next request head (up to and without the blank line's end), `buf` keeping what
    /// came after it; `Ok(None)` when it is longer than [`MAX_HEAD`]; an error at the end
    /// of the stream or past a deadline.
    fn read_head(&mut self, buf: &mut Vec<u8>, idle: Duration) -> std::io::Result<Option<Vec<u8>>> {
        let mut deadline = Instant::now() + if buf.is_empty() { idle } else { HEAD_TIMEOUT };
        let mut started = !buf.is_empty();
        let mut chunk = [0u8; 4096];
        let mut looked = 0;
        loop {
            if let Some(end) = buf[looked..].windows(4).position(|w| w == b"\r\n\r\n") {
                let end = looked + end + 4;
                return Ok(Some(buf.drain(..end).collect()));
            }
            looked = buf.len().saturating_sub(3);
            if buf.len() > MAX_HEAD {
                return Ok(None);
            }
            let n = self.read_by(&mut chunk, deadline)?;
            if n == 0 {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            if !started {
                started = true;
                deadline = Instant::now() + HEAD_TIMEOUT;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Writes what rustls has to send (handshake, records, alerts) by `deadline`.
fn flush_tls(
    tls: &mut rustls::ServerConnection,
    tcp: &TcpStream,
    deadline: Instant,
) -> std::io::Result<()> {
    while tls.wants_write() {
        tcp.set_write_timeout(Some(left(deadline)?))?;
        if tls.write_tls(&mut &*tcp).map_err(timeouts)? == 0 {
            return Err(ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// Answers the requests of one connection until it ends, then closes it.
pub fn serve(held: Held, tls: Option<Arc<rustls::ServerConfig>>, site: &Site, idle: Duration) {
    let _ = held.tcp.set_nodelay(true);
    let tls = match tls.map(rustls::ServerConnection::new) {
        None => None,
        Some(Ok(c)) => Some(Box::new(c)),
        Some(Err(_)) => return,
    };
    let mut c = Conn {
        held,
        tls,
        accepted: Instant::now(),
    };
    let mut buf = Vec::new();
    loop {
        let (bytes, close) = match c.read_head(&mut buf, idle) {
            Ok(Some(head)) => {
                c.held.conns.set_busy(c.held.id, true);
                let _turn = c.held.conns.turn();
                respond(&head, site)
            }
            Ok(None) => (bad_request(), true),
            // The end of the stream, a deadline passed, shut down by the bound or to stop.
            Err(_) => break,
        };
        let written = c.write_by(&bytes, Instant::now() + WRITE_TIMEOUT);
        c.held.conns.set_busy(c.held.id, false);
        if written.is_err() || close {
            break;
        }
    }
    if let Some(tls) = c.tls.as_mut() {
        tls.send_close_notify();
        let _ = flush_tls(tls, &c.held.tcp, Instant::now() + Duration::from_secs(1));
    }
}
