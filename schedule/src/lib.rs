//! The schedule of a periodic lifecycle hook (OpenSandbox OSEP-0020
//! `periodic[].schedule`): a five-field cron expression, a descriptor
//! (`@hourly`, `@daily`, ...) or `@every <duration>`, the grammar of
//! robfig/cron's standard parser that the reference execd uses.
//!
//! Shared by the broker, which refuses a bad schedule with a 400 before any
//! state, and the agent, which runs the hooks. Times are seconds since the
//! Unix epoch and schedules are evaluated in UTC (a `TZ=`/`CRON_TZ=` prefix
//! may only name UTC): a sandbox has no time zone of its own here.
mod civil;
mod cron;
mod duration;
mod schedule;

pub use cron::Cron;
pub use schedule::{Schedule, ScheduleError};
