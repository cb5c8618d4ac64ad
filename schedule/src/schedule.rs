//! A periodic hook's schedule: cron, a descriptor or `@every`.
use super::cron::Cron;
use super::duration;

/// Time zones a schedule may name: all of them UTC.
const UTC_NAMES: [&str; 4] = ["UTC", "Etc/UTC", "GMT", "Etc/GMT"];

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule is empty")]
    Empty,
    #[error("unknown descriptor {0:?} (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration>)")]
    UnknownDescriptor(String),
    #[error("@every {0}")]
    Every(String),
    #[error("time zone {0:?}: schedules run in UTC, so only UTC may be named")]
    TimeZone(String),
    #[error("{0}")]
    Cron(String),
    #[error("{0:?} never fires")]
    Never(String),
}

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// `@every`: a fixed interval, in whole seconds (at least one).
    Every(u64),
    /// Minutes matching a cron expression (descriptors are cron too).
    Cron(Cron),
}

impl Schedule {
    /// Parses a schedule as robfig/cron's standard parser would, with UTC as
    /// the only time zone; one that can never fire is refused too.
    pub fn parse(text: &str) -> Result<Schedule, ScheduleError> {
        let mut s = text.trim();
        for prefix in ["CRON_TZ=", "TZ="] {
            if let Some(rest) = s.strip_prefix(prefix) {
                let (zone, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                if !UTC_NAMES.contains(&zone) {
                    return Err(ScheduleError::TimeZone(zone.into()));
                }
                s = rest.trim_start();
                break;
            }
        }
        if s.is_empty() {
            return Err(ScheduleError::Empty);
        }
        let cron = match s.split_once(char::is_whitespace).map_or((s, ""), |(a, b)| (a, b.trim())) {
            ("@every", d) => return every(d),
            ("@yearly" | "@annually", "") => "0 0 1 1 *",
            ("@monthly", "") => "0 0 1 * *",
            ("@weekly", "") => "0 0 * * 0",
            ("@daily" | "@midnight", "") => "0 0 * * *",
            ("@hourly", "") => "0 * * * *",
            (d, _) if d.starts_with('@') => return Err(ScheduleError::UnknownDescriptor(s.into())),
            _ => s,
        };
        let parsed = Cron::parse(cron).map_err(ScheduleError::Cron)?;
        // Never firing within the search horizon from now or from any other
        // instant are the same: the horizon covers every calendar cycle but
        // the century's leap rule.
        if parsed.next_after(0).is_none() {
            return Err(ScheduleError::Never(s.into()));
        }
        Ok(Schedule::Cron(parsed))
    }

    /// The first firing strictly after `after` (seconds since the epoch,
    /// UTC); None when there is none (a cron expression past its horizon).
    pub fn next_after(&self, after: i64) -> Option<i64> {
        match self {
            Schedule::Every(secs) => after.checked_add(i64::try_from(*secs).ok()?),
            Schedule::Cron(c) => c.next_after(after),
        }
    }
}

fn every(d: &str) -> Result<Schedule, ScheduleError> {
    const SECOND: u128 = 1_000_000_000;
    let nanos = duration::parse_nanos(d).map_err(ScheduleError::Every)?;
    if nanos < SECOND || nanos % SECOND != 0 {
        return Err(ScheduleError::Every(format!(
            "{d:?}: the interval must be a whole number of seconds, at least one"
        )));
    }
    Ok(Schedule::Every((nanos / SECOND) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_takes_whole_seconds() {
        assert_eq!(Schedule::parse("@every 30s"), Ok(Schedule::Every(30)));
        assert_eq!(Schedule::parse("  @every   1h30m "), Ok(Schedule::Every(5400)));
        assert!(Schedule::parse("@every 1500ms").unwrap_err().to_string().contains("whole number"));
        for bad in ["@every 0s", "@every 500ms", "@every", "@every 5", "@every -5s", "@every 1x"] {
            assert!(matches!(Schedule::parse(bad), Err(ScheduleError::Every(_))), "{bad:?}");
        }
        assert_eq!(Schedule::parse("@every 10s").unwrap().next_after(100), Some(110));
    }

    #[test]
    fn descriptors_are_cron() {
        let hourly = Schedule::parse("@hourly").unwrap();
        assert_eq!(hourly, Schedule::Cron(Cron::parse("0 * * * *").unwrap()));
        assert_eq!(hourly.next_after(0), Some(3600));
        assert_eq!(Schedule::parse("@daily").unwrap().next_after(0), Some(86_400));
        assert_eq!(Schedule::parse("@midnight"), Schedule::parse("@daily"));
        assert_eq!(Schedule::parse("@annually"), Schedule::parse("@yearly"));
        // 1970-01-04 was the first Sunday.
        assert_eq!(Schedule::parse("@weekly").unwrap().next_after(0), Some(3 * 86_400));
        for bad in ["@reboot", "@hourly 5", "@every_5s", "@"] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn only_utc_may_be_named() {
        let utc = Schedule::parse("0 3 * * *").unwrap();
        assert_eq!(Schedule::parse("TZ=UTC 0 3 * * *"), Ok(utc.clone()));
        assert_eq!(Schedule::parse("CRON_TZ=Etc/UTC 0 3 * * *"), Ok(utc));
        assert_eq!(Schedule::parse("TZ=UTC @every 5s"), Ok(Schedule::Every(5)));
        assert_eq!(Schedule::parse("TZ=Asia/Shanghai 0 3 * * *"), Err(ScheduleError::TimeZone("Asia/Shanghai".into())));
        assert_eq!(Schedule::parse("TZ=UTC"), Err(ScheduleError::Empty));
    }

    #[test]
    fn a_schedule_that_never_fires_is_refused() {
        assert!(matches!(Schedule::parse("0 0 30 2 *"), Err(ScheduleError::Never(_))));
        assert!(Schedule::parse("0 0 29 2 *").is_ok(), "leap days fire");
        assert_eq!(Schedule::parse("   "), Err(ScheduleError::Empty));
        assert!(matches!(Schedule::parse("* * *"), Err(ScheduleError::Cron(_))));
    }
}
