//! Value parsers of the flags, and the bounds they check.

use std::time::Duration;

pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s)
}

pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s)
}

/// An age such as 7d, 48h or 30m (up to 10 years).
pub(super) fn parse_age(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (n, mult) = match t.strip_suffix('d') {
        Some(n) => (n, 86_400.0),
        None => match t.strip_suffix('h') {
            Some(n) => (n, 3600.0),
            None => (t.strip_suffix('m').unwrap_or(t), 60.0),
        },
    };
    let v: f64 = n
        .parse()
        .map_err(|_| format!("'{s}' is not an age (e.g. 7d, 48h, 30m)"))?;
    let secs = v * mult;
    if !secs.is_finite() || secs <= 0.0 || secs > 3650.0 * 86_400.0 {
        return Err(format!(
            "age '{s}' is out of range (above 0, at most 3650d)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Longest duration any flag takes (7 days): beyond it, deadlines are absurd and
/// `Instant + Duration` could overflow.
pub const MAX_SECONDS: u64 = crate::units::MAX_DURATION_SECS as u64;

/// Smallest `--memory-max`: below it no loader even starts.
pub const MIN_MEMORY_MAX: u64 = 16 << 20;

/// Most of anything counted (readers, cycles, rounds, steps).
pub const MAX_COUNT: usize = 10_000;

/// A duration above zero (and, as every duration, at most [`MAX_SECONDS`]).
pub(super) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("'{s}' must be more than zero"));
    }
    Ok(d)
}

/// Seconds as a float, validated like [`parse_positive_duration`].
pub(super) fn parse_positive_seconds(s: &str) -> Result<f64, String> {
    parse_positive_duration(s).map(|d| d.as_secs_f64())
}

/// A count from 1 to [`MAX_COUNT`].
pub(super) fn parse_count(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number"))?;
    if n == 0 || n > MAX_COUNT {
        return Err(format!("'{s}' is not between 1 and {MAX_COUNT}"));
    }
    Ok(n)
}

/// A fraction in (0, 1].
pub(super) fn parse_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(f > 0.0 && f <= 1.0) {
        return Err(format!("'{s}' is not a fraction in (0, 1]"));
    }
    Ok(f)
}

/// A tolerance band in (0, 1): 0 would make a tie of two measured times a matter of
/// exact equality, never met.
pub(super) fn parse_band(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(f > 0.0 && f < 1.0) {
        return Err(format!("'{s}' is not a fraction in (0, 1)"));
    }
    Ok(f)
}

/// A size of at least one page (4 KiB).
pub(super) fn parse_page_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < crate::sample::PAGE_BYTES {
        return Err(format!("'{s}' is less than one page (4 KiB)"));
    }
    Ok(v)
}

/// A memory limit of at least [`MIN_MEMORY_MAX`] (checked against MemAvailable when the
/// campaign starts).
pub(super) fn parse_memory_max(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < MIN_MEMORY_MAX {
        return Err(format!(
            "'{s}' is less than the smallest limit, {}",
            crate::units::iec(MIN_MEMORY_MAX)
        ));
    }
    Ok(v)
}
