//! Five-field cron expressions (minute, hour, day of month, month, day of
//! week) as robfig/cron's standard parser reads them: `*` or `?`, values,
//! ranges `a-b`, steps `/n` (`a/n` is `a-max/n`), lists with `,`, month and
//! weekday names (`jan`, `mon`, any case); a weekday of 7 is Sunday too.
//! When both day fields are restricted, a day matches either (cron's rule);
//! when either is `*`, it must match both.
use super::civil;

/// Days searched for the next firing: past eight years a schedule (such as
/// the 30th of February) is taken never to fire.
const HORIZON_DAYS: i64 = 8 * 366;

/// A parsed expression: one bit per allowed value of each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// The day-of-month or day-of-week field was `*` (or `?`).
    day_star: bool,
}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

const FIELDS: [Field; 5] = [
    Field { name: "minute", min: 0, max: 59, names: &[] },
    Field { name: "hour", min: 0, max: 23, names: &[] },
    Field { name: "day of month", min: 1, max: 31, names: &[] },
    Field { name: "month", min: 1, max: 12, names: &MONTHS },
    // 7 is accepted as Sunday and folded onto 0.
    Field { name: "day of week", min: 0, max: 7, names: &WEEKDAYS },
];

impl Field {
    fn value(&self, s: &str) -> Result<u32, String> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = self.names.iter().position(|n| *n == lower) {
            // Months are named from 1, weekdays from 0.
            return Ok(i as u32 + self.min);
        }
        let v: u32 = s.parse().map_err(|_| format!("{}: {s:?} is not a value", self.name))?;
        if !(self.min..=self.max).contains(&v) {
            return Err(format!("{}: {v} is outside {}-{}", self.name, self.min, self.max));
        }
        Ok(v)
    }

    /// The bits of one field; the flag says it was `*` or `?` (no step).
    fn parse(&self, expr: &str) -> Result<(u64, bool), String> {
        let mut bits = 0u64;
        let mut star = false;
        for part in expr.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s.parse().map_err(|_| format!("{}: bad step {s:?}", self.name))?;
                    if step == 0 {
                        return Err(format!("{}: a step must be at least 1", self.name));
                    }
                    (r, Some(step))
                }
                None => (part, None),
            };
            let (lo, hi, any) = match range {
                "*" | "?" => (self.min, self.max, true),
                "" => return Err(format!("{}: empty value in {expr:?}", self.name)),
                _ => match range.split_once('-') {
                    Some((a, b)) => (self.value(a)?, self.value(b)?, false),
                    // `a/n` runs from a to the field's end.
                    None if step.is_some() => (self.value(range)?, self.max, false),
                    None => {
                        let v = self.value(range)?;
                        (v, v, false)
                    }
                },
            };
            if lo > hi {
                return Err(format!("{}: range {range:?} runs backwards", self.name));
            }
            let step = step.unwrap_or(1);
            star |= any && step == 1;
            let mut v = lo;
            while v <= hi {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok((bits, star))
    }
}

impl Cron {
    /// Parses the five fields (whitespace-separated).
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), got {}",
                fields.len()
            ));
        }
        let mut parsed = [(0u64, false); 5];
        for (i, f) in FIELDS.iter().enumerate() {
            parsed[i] = f.parse(fields[i])?;
        }
        let weekdays = parsed[4].0;
        // Sunday as 7 is Sunday as 0.
        let weekdays = (weekdays | (weekdays >> 7)) & 0x7f;
        Ok(Cron {
            minutes: parsed[0].0,
            hours: parsed[1].0,
            days: parsed[2].0,
            months: parsed[3].0,
            weekdays,
            day_star: parsed[2].1 || parsed[4].1,
        })
    }

    fn day_matches(&self, day: i64) -> bool {
        let (_, month, dom) = civil::from_days(day);
        if self.months & (1 << month) == 0 {
            return false;
        }
        let d = self.days & (1 << dom) != 0;
        let w = self.weekdays & (1 << civil::weekday(day)) != 0;
        if self.day_star {
            d && w
        } else {
            d || w
        }
    }

    /// The first minute strictly after `after` (seconds since the epoch,
    /// UTC) that the expression matches, or None within [`HORIZON_DAYS`].
    pub fn next_after(&self, after: i64) -> Option<i64> {
        let start = after.div_euclid(60).checked_add(1)?.checked_mul(60)?;
        let first_day = start.div_euclid(86_400);
        for day in first_day..first_day + HORIZON_DAYS {
            if !self.day_matches(day) {
                continue;
            }
            for hour in (0..24).filter(|h| self.hours & (1 << h) != 0) {
                for minute in (0..60).filter(|m| self.minutes & (1 << m) != 0) {
                    let t = day * 86_400 + hour * 3_600 + minute * 60;
                    if t >= start {
                        return Some(t);
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-06-15 00:00:00 UTC, a Saturday.
    const SAT: i64 = 19_889 * 86_400;

    fn next(expr: &str, after: i64) -> Option<i64> {
        Cron::parse(expr).unwrap().next_after(after)
    }

    #[test]
    fn every_minute_fires_at_the_next_whole_minute() {
        assert_eq!(next("* * * * *", SAT), Some(SAT + 60), "strictly after");
        assert_eq!(next("* * * * *", SAT + 59), Some(SAT + 60));
        assert_eq!(next("* * * * *", SAT + 60), Some(SAT + 120));
    }

    #[test]
    fn steps_ranges_and_lists() {
        assert_eq!(next("*/5 * * * *", SAT + 61), Some(SAT + 300));
        assert_eq!(next("7/20 * * * *", SAT), Some(SAT + 7 * 60), "a/n runs from a");
        assert_eq!(next("7/20 * * * *", SAT + 48 * 60), Some(SAT + 3600 + 7 * 60), "7, 27, 47, then the next hour");
        assert_eq!(next("0 9-17/4 * * *", SAT), Some(SAT + 9 * 3600));
        assert_eq!(next("0 9-17/4 * * *", SAT + 14 * 3600), Some(SAT + 17 * 3600));
        assert_eq!(next("15,45 3 * * *", SAT + 3 * 3600 + 20 * 60), Some(SAT + 3 * 3600 + 45 * 60));
    }

    #[test]
    fn names_and_day_rules() {
        // Monday 2024-06-17.
        assert_eq!(next("0 0 * * mon", SAT), Some(SAT + 2 * 86_400));
        assert_eq!(next("0 0 * * MON-fri", SAT), Some(SAT + 2 * 86_400));
        // Sunday as 0 and as 7.
        assert_eq!(next("0 0 * * 0", SAT), Some(SAT + 86_400));
        assert_eq!(next("0 0 * * 7", SAT), Some(SAT + 86_400));
        // Both day fields restricted: either matches (the 20th or a Monday).
        assert_eq!(next("0 0 20 * 1", SAT), Some(SAT + 2 * 86_400));
        // One of them `*`: both must match (a Monday that is also the 1st: 2024-07-01).
        assert_eq!(next("0 0 1 * *", SAT), Some(SAT + 16 * 86_400));
        assert_eq!(next("0 0 1 jul *", SAT), Some(SAT + 16 * 86_400));
        assert_eq!(next("0 0 1 * mon", SAT), Some(SAT + 2 * 86_400), "restricted both: either");
    }

    #[test]
    fn rare_and_impossible_dates() {
        // The next 29th of February after mid-2024 is in 2028.
        let feb29_2028 = (19_889 + 1354) * 86_400;
        assert_eq!(next("0 0 29 2 *", SAT), Some(feb29_2028));
        assert_eq!(next("0 0 30 2 *", SAT), None, "never");
        assert_eq!(next("0 0 31 apr *", SAT), None);
    }

    #[test]
    fn malformed_fields_are_refused() {
        for bad in [
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * 32 * *",
            "* * * 13 *",
            "* * * * 8",
            "*/0 * * * *",
            "5-2 * * * *",
            "1,,2 * * * *",
            "a * * * *",
            "* * * foo *",
            "*/x * * * *",
            "-1 * * * *",
        ] {
            assert!(Cron::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
