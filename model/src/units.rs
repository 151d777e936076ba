//! Byte sizes: IEC formatting for people and parsing of user-given sizes.

/// Formats bytes in IEC units with one decimal (`1.5 GiB`), exact bytes below 1 KiB.
/// A fraction as a whole percentage; "<1%" where it is above 0 and would print as 0%
/// (1 MiB of a 272 MiB file is a copy, not none).
pub fn percent(fraction: f64) -> String {
    if fraction > 0.0 && fraction < 0.005 {
        "<1%".to_string()
    } else {
        format!("{:.0}%", fraction * 100.0)
    }
}

pub fn iec(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Like [`iec`], `n/a` for unknown.
pub fn iec_opt(bytes: Option<u64>) -> String {
    bytes.map(iec).unwrap_or_else(|| "n/a".to_string())
}

/// `n` and the noun in the right number: `1 process`, `2 processes`, `0 files`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Parses `64M`, `64MiB`, `1.5G`, `4096` (bytes). Suffixes are binary (K = 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("'{text}' is not a size (e.g. 64M, 1.5G, 4096)"));
    }
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("unknown size unit in '{text}' (use K, M, G or T)")),
    };
    let out_of_range = || format!("size '{text}' is out of range");
    // Whole numbers exactly (f64 has 53 bits: `18446744073709551616` would round down to
    // u64::MAX and pass), fractions through f64 with the bound checked before the cast.
    if !num.contains('.') {
        let n: u64 = num.parse().map_err(|_| out_of_range())?;
        return n.checked_mul(1u64 << shift).ok_or_else(out_of_range);
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a size (e.g. 64M, 1.5G, 4096)"))?;
    let bytes = value * (1u64 << shift) as f64;
    // 2^64 is the first f64 that does not fit.
    if !(0.0..18_446_744_073_709_551_616.0).contains(&bytes) {
        return Err(out_of_range());
    }
    Ok(bytes as u64)
}

/// Parses `500ms`, `10s`, `2m`, `1h`, or plain seconds (`1.5`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (e.g. 500ms, 10s, 2m)"))?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "unknown duration unit in '{text}' (use ms, s, m or h)"
            ))
        }
    };
    // A week bounds every deadline twofold sets, far from `Instant + Duration` overflow.
    if !secs.is_finite() || secs > MAX_DURATION_SECS {
        return Err(format!(
            "duration '{text}' is out of range (at most 7 days)"
        ));
    }
    std::time::Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("duration '{text}' is out of range"))
}

/// The longest duration [`parse_duration`] accepts: 7 days.
pub const MAX_DURATION_SECS: f64 = 7.0 * 24.0 * 3600.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(iec(0), "0 B");
        assert_eq!(iec(1023), "1023 B");
        assert_eq!(iec(1536), "1.5 KiB");
        assert_eq!(iec(256 << 20), "256.0 MiB");
        assert_eq!(iec(u64::MAX), "16.0 EiB");
        assert_eq!(iec_opt(None), "n/a");
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(1.0 / 272.0), "<1%");
        assert_eq!(percent(0.029), "3%");
        assert_eq!(percent(0.125), "12%");
    }

    #[test]
    fn counts_pluralize() {
        assert_eq!(count(1u32, "process", "processes"), "1 process");
        assert_eq!(count(0u32, "process", "processes"), "0 processes");
        assert_eq!(count(2u64, "file", "files"), "2 files");
    }

    #[test]
    fn parses() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5X").is_err());
        assert!(parse_size("99999999999T").is_err());
        // One past u64::MAX, as an integer and as a fraction: refused, not saturated.
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("18446744073709551616").is_err());
        assert!(parse_size("18446744073709551616.0").is_err());
        assert!(parse_size("16777216T").is_err());
        assert_eq!(parse_size("16777215T").unwrap(), 16_777_215 << 40);
    }

    #[test]
    fn parses_durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 days").is_err());
        assert_eq!(parse_duration("7d").ok(), None);
        assert_eq!(
            parse_duration("168h").unwrap(),
            Duration::from_secs(604_800)
        );
        assert!(parse_duration("169h").is_err());
        assert!(parse_duration("99999999999h").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("nan").is_err());
        assert!(parse_duration("inf").is_err());
        assert!(parse_duration("1e308").is_err());
    }
}
