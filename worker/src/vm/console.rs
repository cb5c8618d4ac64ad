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
    /// guest stopped (the agent's own messages, a kernel panic) when those
    /// scrolled out of the tail (a panic's register dump follows it).
    pub fn tail(&self) -> String {
        let log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let kept = String::from_utf8_lossy(&log.contents()).into_owned();
        drop(log);
        let lines: Vec<&str> = kept.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect();
        let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
        let reasons = lines[..lines.len() - tail.len()].iter().filter(|l| {
            l.contains("pvisor-agent") || l.contains("Kernel panic") || l.contains("Attempted to kill init")
        });
        reasons.chain(tail.iter()).copied().collect::<Vec<_>>().join(" | ")
    }
}
