//! Days since the Unix epoch ⇄ proleptic Gregorian dates (Howard Hinnant's
//! `civil_from_days`), so that cron matching needs no time library.

/// The date of day `z` (days since 1970-01-01): (year, month 1-12, day 1-31).
pub fn from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Day of the week of day `z`: 0 Sunday ... 6 Saturday (1970-01-01 was a Thursday).
pub fn weekday(z: i64) -> u32 {
    (z + 4).rem_euclid(7) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(from_days(0), (1970, 1, 1));
        assert_eq!(weekday(0), 4, "a Thursday");
        assert_eq!(from_days(-1), (1969, 12, 31));
        // 2000-02-29 (a leap day of a century divisible by 400) and the day after.
        assert_eq!(from_days(11_016), (2000, 2, 29));
        assert_eq!(from_days(11_017), (2000, 3, 1));
        // 2024-06-15 was a Saturday.
        assert_eq!(from_days(19_889), (2024, 6, 15));
        assert_eq!(weekday(19_889), 6);
        // 2100 is not a leap year.
        assert_eq!(from_days(47_540), (2100, 2, 28));
        assert_eq!(from_days(47_541), (2100, 3, 1));
    }
}
