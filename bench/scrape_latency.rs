//! Scrape latency of an exporter, from a compiled client (a Python client's own thread
//! switches showed in its p99): `scrape_latency PORT THREADS SCRAPES_EACH` prints
//! `p50_ms p99_ms errors` over every scrape (connect, GET /metrics, read to the end).
//! Built by bench/serve_limits.py with `rustc -O`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let port: u16 = a[1].parse().expect("PORT");
    let threads: usize = a[2].parse().expect("THREADS");
    let each: usize = a[3].parse().expect("SCRAPES_EACH");
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(each);
                let mut errors = 0;
                let mut buf = Vec::new();
                for _ in 0..each {
                    let t0 = Instant::now();
                    let ok = (|| -> std::io::Result<bool> {
                        let mut s = TcpStream::connect(("127.0.0.1", port))?;
                        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
                        buf.clear();
                        s.read_to_end(&mut buf)?;
                        Ok(buf.starts_with(b"HTTP/1.1 200") || buf.starts_with(b"HTTP/1.0 200"))
                    })();
                    lat.push(t0.elapsed().as_secs_f64() * 1e3);
                    if !matches!(ok, Ok(true)) {
                        errors += 1;
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.join().expect("a scraper panicked");
        all.extend(l);
        errors += e;
    }
    all.sort_by(f64::total_cmp);
    let p = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    println!("{:.3} {:.3} {errors}", p(0.5), p(0.99));
}
