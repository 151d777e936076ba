//! The process's stop request: SIGINT or SIGTERM to a long-running command (`serve`,
//! `record`, `top`), seen by long work inside a snapshot (the proof's searches) so that a
//! stop asked in the middle of one ends it at the next window of memory, not seconds later.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Once};

static STOP: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));
static REGISTER: Once = Once::new();

/// Routes SIGINT and SIGTERM (and `more`) to the stop request, once; the signals' other
/// handlers stay.
pub fn watch_signals(more: &[i32]) {
    REGISTER.call_once(|| {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let _ = signal_hook::flag::register(sig, Arc::clone(&STOP));
        }
    });
    for &sig in more {
        let _ = signal_hook::flag::register(sig, Arc::clone(&STOP));
    }
}

/// Whether a stop was asked: work that can be left unfinished ends now.
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}
