//! Points in time on the command line (`replay --at`, `dump --from/--to`): RFC 3339
//! (`2026-11-30T03:12:00Z`, `2026-11-30 03:12`, with an offset or `Z`; without one, UTC),
//! a Unix epoch in seconds (`1764472320`, `@1764472320.5`), `now`, relative forms
//! (`10m ago`, `2h ago`, `1d ago`), and `today HH:MM[:SS]` / `yesterday HH:MM[:SS]` (UTC).
//! All return nanoseconds since the Unix epoch.

const NS: i128 = 1_000_000_000;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn hms(t: &str) -> Option<i128> {
    let mut it = t.split(':');
    let h: i128 = it.next()?.parse().ok()?;
    let m: i128 = it.next()?.parse().ok()?;
    let s: f64 = it.next().map_or(Some(0.0), |s| s.parse().ok())?;
    if it.next().is_some() || h > 23 || m > 59 || !(0.0..61.0).contains(&s) {
        return None;
    }
    Some((h * 3600 + m * 60) * NS + (s * 1e9) as i128)
}

fn rfc3339(t: &str) -> Option<i128> {
    let (date, rest) = t.split_at(t.find(['T', 't', ' '])?);
    let rest = &rest[1..];
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let mo: u32 = d.next()?.parse().ok()?;
    let da: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    let (time, offset) = if let Some(x) = rest.strip_suffix(['Z', 'z']) {
        (x, 0)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (x, off) = rest.split_at(i);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        (x, sign * hms(&off[1..])?)
    } else {
        (rest, 0)
    };
    Some(days_from_civil(y, mo, da) as i128 * 86_400 * NS + hms(time)? - offset)
}

fn relative(t: &str) -> Option<i128> {
    let n = t.strip_suffix("ago")?.trim();
    let split = n.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = n.split_at(split);
    let v: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86_400.0,
        "w" | "week" | "weeks" => 604_800.0,
        _ => return None,
    };
    let ns = v * secs * 1e9;
    (ns.is_finite() && ns >= 0.0).then_some(ns as i128)
}

/// Parses `text` relative to `now_ns`.
pub fn parse(text: &str, now_ns: u64) -> Result<u64, String> {
    let t = text.trim();
    let now = now_ns as i128;
    let day = 86_400 * NS;
    let v = if t == "now" {
        Some(now)
    } else if let Some(ago) = relative(t) {
        Some(now - ago)
    } else if let Some(x) = t.strip_prefix("today ") {
        hms(x.trim()).map(|h| now - now.rem_euclid(day) + h)
    } else if let Some(x) = t.strip_prefix("yesterday ") {
        hms(x.trim()).map(|h| now - now.rem_euclid(day) - day + h)
    } else if let Ok(secs) = t.trim_start_matches('@').parse::<f64>() {
        secs.is_finite().then_some((secs * 1e9) as i128)
    } else {
        rfc3339(t)
    };
    match v {
        Some(ns) if (0..=u64::MAX as i128).contains(&ns) => Ok(ns as u64),
        _ => Err(format!(
            "'{text}' is not a time (RFC 3339 like 2026-11-30T03:12:00Z, an epoch in seconds, 'now', '10m ago', 'yesterday 03:12')"
        )),
    }
}

/// RFC 3339 in UTC with milliseconds, for display.
pub fn format(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Inverse of days_from_civil.
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ns % 1_000_000_000 / 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_472_320_000_000_000; // 2025-11-30T03:12:00Z

    #[test]
    fn parses_every_form() {
        assert_eq!(parse("2025-11-30T03:12:00Z", 0), Ok(NOW));
        assert_eq!(parse("2025-11-30 03:12", 0), Ok(NOW));
        assert_eq!(parse("2025-11-30T05:12:00+02:00", 0), Ok(NOW));
        assert_eq!(parse("1764472320", 0), Ok(NOW));
        assert_eq!(parse("@1764472320.5", 0), Ok(NOW + 500_000_000));
        assert_eq!(parse("now", NOW), Ok(NOW));
        assert_eq!(parse("10m ago", NOW), Ok(NOW - 600_000_000_000));
        assert_eq!(parse("1d ago", NOW), Ok(NOW - 86_400_000_000_000));
        assert_eq!(parse("3 days ago", NOW), Ok(NOW - 3 * 86_400_000_000_000));
        assert_eq!(parse("2 hours ago", NOW), Ok(NOW - 7_200_000_000_000));
        assert_eq!(parse("90 seconds ago", NOW), Ok(NOW - 90_000_000_000));
        assert_eq!(parse("today 03:12", NOW + 5_000_000_000), Ok(NOW));
        assert_eq!(parse("yesterday 03:12", NOW + 86_400_000_000_000), Ok(NOW));
        for bad in ["", "soon", "2025-13-01T00:00Z", "10x ago", "nan", "-5"] {
            assert!(parse(bad, NOW).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_back() {
        assert_eq!(format(NOW + 123_000_000), "2025-11-30T03:12:00.123Z");
        assert_eq!(parse(&format(NOW), 0), Ok(NOW));
        assert_eq!(format(0), "1970-01-01T00:00:00.000Z");
    }
}
