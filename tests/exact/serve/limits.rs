//! `serve` under descriptor exhaustion and slow clients (issue #41): a real exporter under a
//! soft and hard limit of 1,024 open files, 1,100 idle connections from this test, an idle
//! connection timed to its close, and a client sending a header byte a second.
//!
//! Where this test runs as root with `unshare`, the exporter runs in a PID namespace of
//! its own (it sees only itself: a first collection in well under a second, and no file
//! system of another test, such as a hung FUSE mount, can hold it up); otherwise on the
//! host, as the other serve tests.

use std::os::unix::process::CommandExt;

use super::*;

/// An exporter with `RLIMIT_NOFILE` = `nofile` (soft and hard), its stderr in `err`.
struct Limited {
    _proc: Proc,
    /// The exporter's pid (the child of `unshare` where it runs in a namespace).
    pid: u32,
    port: u16,
}

fn limited(nofile: u64, extra: &[&str], err: &Path) -> Limited {
    let port = free_port();
    let ns = crate::common::is_root() && have("unshare");
    let mut c = if ns {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(exe());
        c
    } else {
        println!("no PID namespace (not root, or no unshare): the exporter sees the host");
        Command::new(exe())
    };
    c.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--interval", "1s", "--no-prove"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = c.spawn().unwrap();
    let mut pid = child.id();
    if ns {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if let Some(k) = kids.split_whitespace().next() {
                pid = k.parse().unwrap();
                break;
            }
            assert!(Instant::now() < until, "unshare started no exporter");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let l = Limited {
        _proc: Proc(child),
        pid,
        port,
    };
    let until = Instant::now() + Duration::from_secs(120);
    while !matches!(get(port, "/metrics", None), Ok((200, _))) {
        assert!(Instant::now() < until, "no first collection in 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    l
}

/// The exporter's own descriptors and sockets with no client: the most seen over 1.5 s (a
/// collection holds a few `/proc` files for a moment; the test's first scrape may still
/// be closing).
fn at_rest(pid: u32) -> (usize, usize) {
    let until = Instant::now() + Duration::from_millis(1_500);
    let mut most = (0, 0);
    while Instant::now() < until {
        let (all, sockets) = descriptors(pid);
        most = (most.0.max(all), most.1.max(sockets));
        std::thread::sleep(Duration::from_millis(5));
    }
    most
}

/// The descriptors of `pid`, and how many of them are sockets, from one listing.
fn descriptors(pid: u32) -> (usize, usize) {
    let links: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    let sockets = links
        .iter()
        .filter(|l| l.to_string_lossy().starts_with("socket:"))
        .count();
    (links.len(), sockets)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// This process's soft limit of open files raised to its hard limit (it opens 1,100).
fn raise_own_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write a valid rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

/// 1,100 idle connections to an exporter limited to 1,024 open files: a fresh scrape is
/// answered 200 while they are open (the oldest idle one makes room for it), its open
/// descriptors stay bounded, and once they are closed scrapes and `/healthz` answer and
/// its descriptors go back down. Twice: with the default bound (a quarter of the limit,
/// 256: descriptors never run out) and with `--web.max-connections 4096` (they do: the
/// accept loop gets EMFILE, says so once, and goes on).
#[test]
fn serve_answers_after_1100_idle_connections_under_nofile_1024() {
    let _group = crate::common::group(module_path!());
    let _live = live();
    if !require(
        raise_own_nofile() >= 1_300,
        "a hard limit of 1,300 open files",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (extra, bound, emfile) in [
        (&[][..], 256, false),
        (&["--web.max-connections", "4096"][..], 1024, true),
    ] {
        let err = dir.path().join(format!("err-{emfile}"));
        let s = limited(1024, extra, &err);
        let (before, sockets_before) = at_rest(s.pid);
        let t0 = Instant::now();
        let idle: Vec<TcpStream> = (0..1_100)
            .filter_map(|_| {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.port));
                TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()
            })
            .collect();
        let opened = t0.elapsed();
        assert!(idle.len() >= 1_000, "only {} connected", idle.len());
        let t1 = Instant::now();
        let (code, body) = get(s.port, "/metrics", Some(OPENMETRICS)).unwrap();
        let scrape = t1.elapsed();
        assert_eq!(code, 200, "{body}");
        assert!(well_formed(&body));
        // The connections are what is bounded: the exporter's sockets are its own at rest,
        // the bound's connections and at most one more, accepted to be refused or to
        // replace the oldest idle one. (Its other descriptors are a collection's, a few
        // `/proc` files for a moment whatever the clients do.)
        let (during, sockets) = descriptors(s.pid);
        assert!(
            sockets <= bound + sockets_before + 1,
            "{sockets} sockets open ({sockets_before} at rest), {during} descriptors"
        );
        let warning = std::fs::read_to_string(&err).unwrap();
        if emfile {
            // The listener says it once (a collection that ran out of descriptors at the
            // same moment says so too, in its own words).
            assert_eq!(
                warning.matches("http: Too many open files").count(),
                1,
                "the exhaustion is said once: {warning}"
            );
        } else {
            assert!(warning.is_empty(), "{warning}");
        }
        drop(idle);
        let t2 = Instant::now();
        let until = t2 + Duration::from_secs(20);
        while fds(s.pid) > before + 2
            || get(s.port, "/healthz", None).map(|r| r.0).unwrap_or(0) != 200
        {
            assert!(
                Instant::now() < until,
                "{} fds, /healthz not 200",
                fds(s.pid)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let recovered = t2.elapsed();
        assert_eq!(get(s.port, "/metrics", None).unwrap().0, 200);
        println!(
            "bound {bound}: {} idle connections in {opened:.2?}; a scrape meanwhile {scrape:.2?} \
             with {during} fds open ({before} before), {sockets} sockets ({sockets_before} before); recovered {recovered:.2?} after they closed, \
             {} fds",
            1_100,
            fds(s.pid)
        );
    }
}

/// Reads until the end of the stream: when it came.
fn until_closed(s: &mut TcpStream) -> Instant {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Instant::now(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Instant::now(),
            Err(e) => panic!("not closed after {:?}: {e}", t0.elapsed()),
        }
    }
}

/// One keep-alive request on `s`: the status (the body read by its length).
fn request(s: &mut TcpStream, path: &str) -> u16 {
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed mid-answer");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// With `--web.idle-timeout 2s`, a connection that sends nothing, and one idle after two
/// answers on it (keep-alive), are closed by the exporter 2 s later.
#[test]
fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let _group = crate::common::group(module_path!());
    let _live = live();
    let dir = tempfile::tempdir().unwrap();
    let s = limited(1024, &["--web.idle-timeout", "2s"], &dir.path().join("err"));
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut kept = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    assert_eq!(request(&mut kept, "/metrics"), 200);
    assert_eq!(request(&mut kept, "/healthz"), 200, "the same connection");
    let answered = Instant::now();
    let a = until_closed(&mut silent).duration_since(t0);
    let b = until_closed(&mut kept).duration_since(answered);
    println!("closed after {a:.2?} (nothing sent) and {b:.2?} (after two answers)");
    for t in [a, b] {
        assert!(
            t >= Duration::from_millis(1_900) && t <= Duration::from_secs(4),
            "{t:?}"
        );
    }
}

/// A client sending its request head a byte a second holds its own connection only:
/// scrapes meanwhile are answered as fast as without it, and it is closed 10 s after its
/// first byte (the head's deadline).
#[test]
fn a_slowloris_client_does_not_block_other_scrapes() {
    let _group = crate::common::group(module_path!());
    let _live = live();
    let dir = tempfile::tempdir().unwrap();
    let s = limited(
        1024,
        &["--web.max-connections", "16"],
        &dir.path().join("err"),
    );
    let port = s.port;
    let slow = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let t0 = Instant::now();
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if c.write_all(&[*b]).is_err() || t0.elapsed() > Duration::from_secs(30) {
                break;
            }
            let mut peek = [0u8; 64];
            c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            match c.read(&mut peek) {
                Ok(0) => break,
                Ok(_) => panic!("the slow head was answered"),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(_) => {}
            }
        }
        t0.elapsed()
    });
    std::thread::sleep(Duration::from_secs(2));
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        assert_eq!(get(port, "/metrics", None).unwrap().0, 200);
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    let closed = slow.join().unwrap();
    println!("slowest of 20 scrapes beside the slow client: {worst:.2?}; it was closed after {closed:.2?}");
    assert!(worst < Duration::from_secs(2), "{worst:?}");
    assert!(
        closed >= Duration::from_secs(9) && closed <= Duration::from_secs(14),
        "{closed:?}"
    );
}
