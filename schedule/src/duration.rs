//! The duration of `@every` in Go's `time.ParseDuration` syntax (what the
//! reference's schedules are written in): decimal numbers, each with a unit
//! (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), as in `30s`, `1h30m` or `1.5h`.

/// Nanoseconds per unit.
const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Nanoseconds of a Go duration (`0` alone is allowed without a unit).
/// A sign, or a value past `u64::MAX` nanoseconds, is an error here: an
/// `@every` interval is positive and bounded.
pub fn parse_nanos(s: &str) -> Result<u128, String> {
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s.starts_with(['-', '+']) {
        return Err(format!("duration {s:?} must not have a sign"));
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(format!("duration {s:?}: expected a number at {rest:?}"));
        }
        // The unit is the whole run up to the next number, as Go reads it.
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let unit = &after[..unit_len];
        let Some(&(_, per)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(match unit {
                "" => format!("duration {s:?}: a number needs a unit (ns, us, ms, s, m, h)"),
                _ => format!("duration {s:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)"),
            });
        };
        let whole: u128 =
            if int.is_empty() { 0 } else { int.parse().map_err(|_| format!("duration {s:?} is too long"))? };
        let mut value = whole.checked_mul(per).ok_or_else(|| format!("duration {s:?} is too long"))?;
        // The fraction, digit by digit (18 are enough below a nanosecond).
        let mut scale = per;
        for d in frac.bytes().take(18) {
            scale /= 10;
            value += u128::from(d - b'0') * scale;
        }
        total = total.checked_add(value).ok_or_else(|| format!("duration {s:?} is too long"))?;
        if total > u128::from(u64::MAX) {
            return Err(format!("duration {s:?} is too long"));
        }
        rest = &after[unit.len()..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u128 = 1_000_000_000;

    #[test]
    fn go_durations() {
        assert_eq!(parse_nanos("30s"), Ok(30 * S));
        assert_eq!(parse_nanos("1h30m"), Ok(5400 * S));
        assert_eq!(parse_nanos("1.5h"), Ok(5400 * S));
        assert_eq!(parse_nanos(".5s"), Ok(S / 2));
        assert_eq!(parse_nanos("5.s"), Ok(5 * S));
        assert_eq!(parse_nanos("1500ms"), Ok(3 * S / 2));
        assert_eq!(parse_nanos("2m0s"), Ok(120 * S));
        assert_eq!(parse_nanos("1µs"), Ok(1_000));
        assert_eq!(parse_nanos("1us1ns"), Ok(1_001));
        assert_eq!(parse_nanos("0"), Ok(0));
    }

    #[test]
    fn malformed_durations_are_refused() {
        for bad in ["", "5", "s", ".s", "-5s", "+5s", "5x", "5 s", "1h 30m", "9999999999999999999999h"] {
            assert!(parse_nanos(bad).is_err(), "{bad:?} accepted");
        }
    }
}
