//! Builds a long recording for the replay benchmark: the newest snapshot of SRC repeated
//! every INTERVAL_S seconds over DAYS days (ending now) into the new store DEST.
//! `cargo run --release --example fill_store -- SRC DEST DAYS INTERVAL_S`

use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 5,
        "usage: fill_store SRC DEST DAYS INTERVAL_S"
    );
    let (src, _) = twofold::store::Store::open_read_only(Path::new(&args[1]))?;
    let frame = src
        .nearest(u64::MAX)?
        .ok_or_else(|| anyhow::anyhow!("'{}' holds no snapshot", args[1]))?;
    let days: u64 = args[3].parse()?;
    let step: u64 = args[4].parse::<u64>()? * 1_000_000_000;
    let (mut dest, _) = twofold::store::Store::open_or_create(Path::new(&args[2]))?;
    let now = twofold::engine::now().0;
    let start = now - days * 86_400 * 1_000_000_000;
    let mut snap: twofold::engine::Snapshot = serde_json::from_slice(&frame.payload)?;
    let mut n = 0u64;
    let mut t = start;
    while t <= now {
        snap.at_unix_ns = t;
        snap.at_mono_ns = t - start;
        dest.append(t, &serde_json::to_vec(&snap)?)?;
        n += 1;
        t += step;
    }
    dest.flush()?;
    println!("{n}");
    Ok(())
}
