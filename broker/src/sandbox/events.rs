//! A sandbox's lifecycle events (created, ready, paused, resumed, renewed,
//! failed with its reason, terminating), kept by the broker for the
//! diagnostics API. Bounded: past [`MAX_EVENTS`] the oldest go first, and
//! the count of dropped ones is kept so a reader knows the list is cut.
use super::record::rfc3339;
use chrono::{DateTime, Utc};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Events kept per sandbox.
pub const MAX_EVENTS: usize = 256;
/// Longest detail kept with one event (a failure message can carry a log tail).
const MAX_DETAIL: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Ready,
    Paused,
    Resumed,
    Renewed,
    Failed,
    Terminating,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "Created",
            EventKind::Ready => "Ready",
            EventKind::Paused => "Paused",
            EventKind::Resumed => "Resumed",
            EventKind::Renewed => "Renewed",
            EventKind::Failed => "Failed",
            EventKind::Terminating => "Terminating",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub kind: EventKind,
    pub detail: Option<String>,
}

impl Event {
    /// One line: `<time> <kind>[: <detail>]`.
    pub fn line(&self) -> String {
        match &self.detail {
            Some(d) => format!("{} {}: {d}", rfc3339(&self.at), self.kind.as_str()),
            None => format!("{} {}", rfc3339(&self.at), self.kind.as_str()),
        }
    }
}

#[derive(Default)]
struct Inner {
    events: VecDeque<Event>,
    dropped: u64,
}

/// The bounded list; cheap to push from any state change.
#[derive(Default)]
pub struct EventLog {
    inner: Mutex<Inner>,
}

/// What a reader gets: the kept events, oldest first, and how many were dropped before them.
pub struct EventsSnapshot {
    pub events: Vec<Event>,
    pub dropped: u64,
}

impl EventLog {
    pub fn push(&self, kind: EventKind, detail: Option<String>) {
        let detail = detail.map(|mut d| {
            if d.len() > MAX_DETAIL {
                let mut cut = MAX_DETAIL;
                while !d.is_char_boundary(cut) {
                    cut -= 1;
                }
                d.truncate(cut);
                d.push('…');
            }
            d
        });
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.events.len() == MAX_EVENTS {
            g.events.pop_front();
            g.dropped += 1;
        }
        g.events.push_back(Event { at: Utc::now(), kind, detail });
    }

    pub fn snapshot(&self) -> EventsSnapshot {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        EventsSnapshot { events: g.events.iter().cloned().collect(), dropped: g.dropped }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_drops_the_oldest_past_the_bound() {
        let log = EventLog::default();
        log.push(EventKind::Created, None);
        log.push(EventKind::Failed, Some("WORKER_EXITED: boom".into()));
        let s = log.snapshot();
        assert_eq!(s.events.iter().map(|e| e.kind).collect::<Vec<_>>(), [EventKind::Created, EventKind::Failed]);
        assert!(s.events[1].line().ends_with(" Failed: WORKER_EXITED: boom"), "{}", s.events[1].line());
        for _ in 0..MAX_EVENTS {
            log.push(EventKind::Paused, None);
        }
        let s = log.snapshot();
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.dropped, 2);
        assert!(s.events.iter().all(|e| e.kind == EventKind::Paused));
    }

    #[test]
    fn long_details_are_cut_on_a_char_boundary() {
        let log = EventLog::default();
        log.push(EventKind::Failed, Some("é".repeat(MAX_DETAIL)));
        let d = log.snapshot().events[0].detail.clone().unwrap();
        assert!(d.len() <= MAX_DETAIL + '…'.len_utf8() && d.ends_with('…'));
    }
}
