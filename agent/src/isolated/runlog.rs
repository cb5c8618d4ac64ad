//! A background run's output: bytes addressed by their offset in the whole
//! output (the API's cursor), the newest [`RUN_CAP`] kept. All runs of all
//! sessions share [`TOTAL_CAP`]: past it, a run that adds output drops its own
//! oldest bytes (the agent must not be what exhausts the sandbox's memory).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Output kept per run, and the most one read returns.
pub const RUN_CAP: usize = 16 << 20;
/// Output kept across every run.
pub const TOTAL_CAP: usize = 64 << 20;

static RETAINED: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
pub struct RunLog {
    bytes: VecDeque<u8>,
    /// Offset of `bytes[0]` in the whole output.
    first: u64,
}

impl RunLog {
    pub fn push(&mut self, data: &[u8]) {
        self.bytes.extend(data);
        RETAINED.fetch_add(data.len(), Relaxed);
        let over_run = self.bytes.len().saturating_sub(RUN_CAP);
        let over_total = RETAINED.load(Relaxed).saturating_sub(TOTAL_CAP).min(self.bytes.len());
        let drop = over_run.max(over_total);
        if drop > 0 {
            self.bytes.drain(..drop);
            self.first += drop as u64;
            RETAINED.fetch_sub(drop, Relaxed);
        }
    }

    /// Offset of the end of the output so far.
    pub fn end(&self) -> u64 {
        self.first + self.bytes.len() as u64
    }

    /// Output from `cursor` (or the oldest byte kept, if later), at most
    /// [`RUN_CAP`] bytes, and the cursor to ask for next.
    pub fn since(&self, cursor: u64) -> (Vec<u8>, u64) {
        let from = cursor.clamp(self.first, self.end());
        let skip = (from - self.first) as usize;
        let out: Vec<u8> = self.bytes.iter().skip(skip).take(RUN_CAP).copied().collect();
        let next = from + out.len() as u64;
        (out, next)
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        RETAINED.fetch_sub(self.bytes.len(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_address_the_whole_output() {
        let mut l = RunLog::default();
        l.push(b"hello ");
        l.push(b"world\n");
        assert_eq!(l.since(0), (b"hello world\n".to_vec(), 12));
        assert_eq!(l.since(6), (b"world\n".to_vec(), 12));
        assert_eq!(l.since(12), (vec![], 12));
        assert_eq!(l.since(99), (vec![], 12), "a cursor past the end waits at the end");
    }

    #[test]
    fn old_output_leaves_past_the_cap() {
        let mut l = RunLog::default();
        l.push(&vec![b'a'; RUN_CAP]);
        l.push(b"bc");
        assert_eq!(l.end(), RUN_CAP as u64 + 2);
        let (data, next) = l.since(0);
        assert_eq!(
            (data.len(), next),
            (RUN_CAP, RUN_CAP as u64 + 2),
            "a cursor before the kept window starts at its start"
        );
        assert_eq!(&data[data.len() - 2..], b"bc");
    }
}
