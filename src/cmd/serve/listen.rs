//! The listener of `serve` and the bound on its connections.
//!
//! One thread accepts (blocking in `accept(2)`; woken to stop by `shutdown(2)` of the
//! listening socket); each connection is answered on a thread of its own (`conn.rs`), so a
//! slow client holds only its own. A thread whose connection closed waits up to [`KEEP`]
//! for the next one (at most [`PARKED`] wait) (starting a thread per connection showed in the p99 of 50 concurrent
//! scrapers). At most [`Conns::max`] connections are open at once: a
//! new one beyond it closes the oldest idle one (waiting for, or still reading, a request;
//! never one being answered), or, when every one is being answered, is answered 503 and
//! closed. When descriptors run out (`EMFILE`, `ENFILE`: the soft limit of open files, or
//! the system's), the loop closes the oldest idle connection and accepts again, or, with
//! none idle, backs off (1 ms doubling to 1 s) and goes on: it never ends on an accept
//! error that can pass (see accept(2), "Error handling"). On any other error the listener
//! is gone: `/healthz` answers 503 and the exporter stops with the error.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::Scope;
use std::time::{Duration, Instant};

use super::conn::{self, Held};
use super::http::{Site, TOO_MANY};

/// The stack of a connection's thread (what it touches is resident, the rest is not).
const STACK: usize = 512 << 10;
/// The longest pause of the accept loop when descriptors have run out.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a thread waits for another connection after one has closed.
const KEEP: Duration = Duration::from_secs(60);
/// Threads kept waiting for a connection at most (each keeps its stack's touched pages).
const PARKED: usize = 8;
/// Answers built at once (as many as the 4 workers before).
const ANSWERING: usize = 4;
/// At most one warning about exhausted descriptors in this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A connection handed to a parked thread: its slot's id and its socket.
type Handed = (u64, TcpStream);

/// One open connection.
struct Slot {
    id: u64,
    fd: RawFd,
    /// When it was accepted or last answered: the oldest idle one is closed first.
    since: Instant,
    /// Being answered: never closed by the bound.
    busy: bool,
    /// Shut down by the bound; its thread has not closed it yet.
    evicted: bool,
}

#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    next: u64,
    /// Stopping: every connection is shut down, a new one is not served.
    closing: bool,
}

/// The open connections, as their threads report them.
pub struct Conns {
    table: Mutex<Table>,
    max: usize,
    /// Tickets given and answers built: the ticket `t` builds its answer once
    /// `t < built + ANSWERING` (first come, first served).
    answering: Mutex<(u64, u64)>,
    turn: Condvar,
    /// Threads waiting for their next connection ([`KEEP`] at most): a connection is
    /// handed to one of them rather than to a new thread.
    parked: Mutex<Vec<(u64, SyncSender<Handed>)>>,
    /// False once the accept loop has ended on an error.
    pub listening: AtomicBool,
}

/// Shuts a connection down for both directions: its thread's read or write returns, and
/// the thread closes it. The descriptor is open: its slot is still in the table, and a
/// thread removes its slot before it closes the descriptor.
fn shut(fd: RawFd) {
    // SAFETY: shutdown only changes the state of the socket `fd` names.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

impl Conns {
    pub fn new(max: usize) -> Conns {
        Conns {
            table: Mutex::new(Table::default()),
            max: max.max(1),
            answering: Mutex::new((0, 0)),
            turn: Condvar::new(),
            parked: Mutex::new(Vec::new()),
            listening: AtomicBool::new(true),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shuts down the oldest idle connection not already shut down; false when none is.
    fn evict_oldest(t: &mut Table) -> bool {
        let oldest = t
            .slots
            .iter_mut()
            .filter(|s| !s.busy && !s.evicted)
            .min_by_key(|s| s.since);
        match oldest {
            Some(s) => {
                s.evicted = true;
                shut(s.fd);
                true
            }
            None => false,
        }
    }

    /// Registers a new connection; at the bound, shuts down the oldest idle one first.
    /// None when every open one is being answered, or when stopping.
    fn admit(&self, fd: RawFd) -> Option<u64> {
        let mut t = self.lock();
        if t.closing {
            return None;
        }
        let live = t.slots.iter().filter(|s| !s.evicted).count();
        if live >= self.max && !Self::evict_oldest(&mut t) {
            return None;
        }
        t.next += 1;
        let id = t.next;
        t.slots.push(Slot {
            id,
            fd,
            since: Instant::now(),
            busy: false,
            evicted: false,
        });
        Some(id)
    }

    /// The connection is being answered (true) or idle again (false).
    pub fn set_busy(&self, id: u64, busy: bool) {
        let mut t = self.lock();
        if let Some(s) = t.slots.iter_mut().find(|s| s.id == id) {
            s.busy = busy;
            s.since = Instant::now();
        }
    }

    /// Waits for a turn to build an answer: at most [`ANSWERING`] at once, in the order
    /// they came (many concurrent scrapes share the cores one after the other
    /// rather than all at once). Writing it out takes no turn: a client that reads slowly
    /// holds nobody up.
    pub fn turn(&self) -> Turn<'_> {
        let mut q = self.answering.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = q.0;
        q.0 += 1;
        while ticket >= q.1 + ANSWERING as u64 {
            q = self.turn.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        Turn(self)
    }

    /// The connection's thread is about to close it.
    pub fn leave(&self, id: u64) {
        self.lock().slots.retain(|s| s.id != id);
    }

    /// Descriptors ran out: true when a connection shut down by the bound is on its way
    /// out, or the oldest idle one was shut down now (accept again soon); false when
    /// none can be (back off).
    fn free_one(&self) -> bool {
        let mut t = self.lock();
        t.slots.iter().any(|s| s.evicted) || Self::evict_oldest(&mut t)
    }

    /// Open connections (those shut down and not yet closed included).
    pub fn open(&self) -> usize {
        self.lock().slots.len()
    }

    /// Hands a connection to a parked thread; gives it back when none is parked.
    fn hand_over(&self, mut conn: Handed) -> Result<(), Handed> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        // Sent under the lock: a thread that finds itself no longer parked has it queued.
        while let Some((_, tx)) = parked.pop() {
            match tx.try_send(conn) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(c) | TrySendError::Disconnected(c)) => conn = c,
            }
        }
        Err(conn)
    }

    /// After a connection: waits up to [`KEEP`] for the next one handed over.
    fn next_conn(&self, worker: u64) -> Option<Handed> {
        let (tx, rx) = sync_channel(1);
        {
            let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            if self.lock().closing || parked.len() >= PARKED {
                return None;
            }
            parked.push((worker, tx));
        }
        if let Ok(c) = rx.recv_timeout(KEEP) {
            return Some(c);
        }
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let before = parked.len();
        parked.retain(|(w, _)| *w != worker);
        // Still parked: nothing came. Taken off by `hand_over`: what it sent is queued.
        if parked.len() < before {
            return None;
        }
        rx.try_recv().ok()
    }

    /// Stops: shuts down every connection and the listener (which wakes the accept loop),
    /// and lets the parked threads go.
    pub fn close_all(&self, listener: &TcpListener) {
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let mut t = self.lock();
        t.closing = true;
        for s in &t.slots {
            shut(s.fd);
        }
        shut(listener.as_raw_fd());
    }
}

/// A turn to build an answer ([`Conns::turn`]), given back when dropped.
pub struct Turn<'a>(&'a Conns);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut q = self.0.answering.lock().unwrap_or_else(|e| e.into_inner());
        q.1 += 1;
        self.0.turn.notify_all();
    }
}

/// An accept error that passes: descriptors or memory ran out (back off), or the
/// connection failed before it was accepted (accept again).
fn passing(e: &std::io::Error) -> Option<bool> {
    let out_of = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    );
    let network = matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EPERM
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
                | libc::ETIMEDOUT
                | libc::ECONNRESET
        )
    );
    (out_of || network).then_some(out_of)
}

/// A connection beyond the bound with none idle: 503 (plain HTTP; a TLS one is closed),
/// written without waiting (it fits a new socket's buffer), then closed.
fn refuse(tcp: TcpStream, tls: bool) {
    if !tls {
        let _ = tcp.set_nonblocking(true);
        let _ = (&tcp).write_all(TOO_MANY);
        let _ = tcp.shutdown(std::net::Shutdown::Write);
    }
}

/// Accepts connections until `stop` (set before [`Conns::close_all`] wakes it), each
/// answered on a thread of `scope`. Returns the error that ended it otherwise.
#[allow(clippy::too_many_arguments)]
pub fn accept_loop<'s>(
    scope: &'s Scope<'s, '_>,
    listener: &TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    site: &'s Site<'s>,
    conns: &'s Conns,
    idle: Duration,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut backoff = Duration::from_millis(1);
    let mut warned: Option<Instant> = None;
    let mut workers = 0u64;
    loop {
        let (tcp, _) = match listener.accept() {
            Ok(a) => a,
            Err(_) if stop.load(Ordering::Relaxed) => return Ok(()),
            Err(e) => match passing(&e) {
                Some(true) => {
                    if warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                        eprintln!(
                            "twofold: warning: http: {e} ({} connections open): closing the oldest idle connection, or waiting for one to close",
                            conns.open()
                        );
                        warned = Some(Instant::now());
                    }
                    if conns.free_one() {
                        std::thread::sleep(Duration::from_millis(1));
                    } else {
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                    continue;
                }
                Some(false) => continue,
                None => {
                    conns.listening.store(false, Ordering::Relaxed);
                    return Err(e);
                }
            },
        };
        backoff = Duration::from_millis(1);
        let Some(id) = conns.admit(tcp.as_raw_fd()) else {
            refuse(tcp, tls.is_some());
            continue;
        };
        let Err((id, tcp)) = conns.hand_over((id, tcp)) else {
            continue;
        };
        let held = Held { conns, id, tcp };
        let tls = tls.clone();
        workers += 1;
        let worker = workers;
        let spawned = std::thread::Builder::new()
            .name("twofold-http".to_string())
            .stack_size(STACK)
            .spawn_scoped(scope, move || {
                conn::serve(held, tls.clone(), site, idle);
                while let Some((id, tcp)) = conns.next_conn(worker) {
                    conn::serve(Held { conns, id, tcp }, tls.clone(), site, idle);
                }
            });
        if let Err(e) = spawned {
            // The connection went with the closure (its slot left first).
            eprintln!("twofold: warning: http: cannot start a thread for a connection: {e}");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_closes_the_oldest_idle_connection_first() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let served: Vec<TcpStream> = (0..3).map(|_| listener.accept().unwrap().0).collect();
        let conns = Conns::new(2);
        let a = conns.admit(served[0].as_raw_fd()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let b = conns.admit(served[1].as_raw_fd()).unwrap();
        conns.set_busy(b, true);
        // The third closes the oldest idle (a); its client reads the end of the stream.
        let _c = conns.admit(served[2].as_raw_fd()).unwrap();
        let mut buf = [0u8; 1];
        clients[0]
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(std::io::Read::read(&mut &clients[0], &mut buf).unwrap(), 0);
        assert!(conns.free_one(), "a is on its way out");
        conns.leave(a);
        assert_eq!(conns.open(), 2);
        // c is idle: it goes for the next; then only b (busy) is left: refused.
        conns.set_busy(_c, true);
        assert!(conns.admit(served[2].as_raw_fd()).is_none());
        assert!(!conns.free_one());
        conns.close_all(&listener);
        assert!(conns.admit(served[2].as_raw_fd()).is_none(), "stopping");
        assert!(passing(&std::io::Error::from_raw_os_error(libc::EMFILE)) == Some(true));
        assert!(passing(&std::io::Error::from_raw_os_error(libc::ECONNABORTED)) == Some(false));
        assert!(passing(&std::io::Error::from_raw_os_error(libc::EBADF)).is_none());
    }
}
