//! The guest's serial console: a bounded log (memory and file), so a guest
//! that floods its console cannot grow the log without bound, with the last
//! lines at hand for error reports.
use crate::error::{Result, WorkerError};
use pvisor_vmm::devices::console::{ConsoleLog, SharedConsole};
use std::io::Read;
use std::path::Path;

/// Bytes of console output kept in memory (for the tail).
pub const MEMORY_CAP: usize = 16 << 10;
/// Bytes the console file may reach before it starts over.
pub const FILE_CAP: u64 = 1 << 20;
/// Lines of the tail given in error reports.
pub const TAIL_LINES: usize = 8;

#[derive(Clone)]
pub struct Console(SharedConsole);

impl Console {
    pub fn open(path: &Path) -> Result<Console> {
        let file =
            std::fs::File::create(path).map_err(|e| WorkerError::sys(format!("console {}", path.display()), e))?;
        Ok(Console(ConsoleLog::new(MEMORY_CAP).with_file(file, FILE_CAP).shared()))
    }

    /// A console the VMM already writes to (its serial device).
    pub fn from_shared(log: SharedConsole) -> Console {
        Console(log)
    }

    /// Appends everything `from` yields, on a thread of its own.
    pub fn follow(&self, mut from: impl Read + Send + 'static) {
        let log = self.0.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.lock().unwrap_or_else(|e| e.into_inner()).append(&buf[..n]);
            }
        });
    }

    /// The last lines, joined with " | ", after the lines that say why a
    /// guest stopped (the agent's own messages, a kernel panic, an oops with
    /// the code it hit) when those scrolled out of the tail (a register dump
    /// follows them).
    pub fn tail(&self) -> String {
        let log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let kept = String::from_utf8_lossy(&log.contents()).into_owned();
        drop(log);
        tail_of(&kept)
    }
}

/// Lines that say why a guest stopped.
const REASONS: [&str; 6] = ["pvisor-agent", "Kernel panic", "Attempted to kill init", "BUG:", "Oops:", "RIP:"];
/// Reason lines kept before the tail (the first ones: a second oops follows from the first).
const MAX_REASONS: usize = 6;

/// [`Console::tail`] of the console text `kept`.
fn tail_of(kept: &str) -> String {
    let lines: Vec<&str> = kept.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    let reasons =
        lines[..lines.len() - tail.len()].iter().filter(|l| REASONS.iter().any(|r| l.contains(r))).take(MAX_REASONS);
    reasons.chain(tail.iter()).copied().collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oops_that_scrolled_out_of_the_tail_is_still_named() {
        let mut text = String::from("[    1.0] Linux version 6.1\n");
        text += "[    2.8] BUG: unable to handle page fault for address: ffff888001e00000\n";
        text += "[    2.8] Oops: 0002 [#1] PREEMPT SMP NOPTI\n";
        text += "[    2.8] RIP: 0010:clear_page_erms+0x7/0x10\n";
        for i in 0..20 {
            text += &format!("[    2.9] R{i:02}: 0000000000000000\n");
        }
        let t = tail_of(&text);
        let parts: Vec<&str> = t.split(" | ").collect();
        assert_eq!(parts.len(), 3 + TAIL_LINES, "{t}");
        assert!(parts[0].contains("BUG: unable to handle page fault"), "{t}");
        assert!(parts[2].contains("RIP: 0010:clear_page_erms"), "{t}");
        assert!(parts[3].contains("R12:"), "the tail follows: {t}");
        assert!(!t.contains("Linux version"), "{t}");
    }

    #[test]
    fn a_short_console_is_given_whole_and_reasons_are_bounded() {
        assert_eq!(tail_of("a\n\nb\n"), "a | b");
        let text = "RIP: x\n".repeat(40) + &"line\n".repeat(TAIL_LINES);
        assert_eq!(tail_of(&text).split(" | ").count(), MAX_REASONS + TAIL_LINES);
    }
}
