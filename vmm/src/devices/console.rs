//! The guest console's log: bounded in memory and on disk.
//!
//! A guest can write to its serial port as fast as it likes; nothing it writes may grow the
//! VMM's memory or the sandbox's log file without bound. [`ConsoleLog`] keeps the last
//! `memory_cap` bytes in a ring (what failure reports quote as "the guest's last console
//! lines"), and, given a file, writes through to it until `file_cap` bytes, then truncates the
//! file and starts over with a marker line, so the file holds at most `file_cap` bytes plus the
//! marker and always the most recent output.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

/// The marker a truncated log file starts with.
pub const TRUNCATED_MARKER: &[u8] = b"[pvisor: console log truncated, older output dropped]\n";

/// The guest console's output.
pub struct ConsoleLog {
    ring: VecDeque<u8>,
    memory_cap: usize,
    total: u64,
    file: Option<(File, u64)>,
    file_len: u64,
    file_error: Option<io::Error>,
}

impl ConsoleLog {
    /// A log that keeps the last `memory_cap` bytes in memory.
    pub fn new(memory_cap: usize) -> Self {
        ConsoleLog {
            ring: VecDeque::with_capacity(memory_cap.min(64 << 10)),
            memory_cap,
            total: 0,
            file: None,
            file_len: 0,
            file_error: None,
        }
    }

    /// Also writes through to `file` (from its start), keeping it under `file_cap` bytes.
    pub fn with_file(mut self, file: File, file_cap: u64) -> Self {
        self.file = Some((file, file_cap.max(TRUNCATED_MARKER.len() as u64 * 2)));
        self
    }

    /// A shared handle, for the serial device and for readers.
    pub fn shared(self) -> SharedConsole {
        Arc::new(Mutex::new(self))
    }

    /// Appends guest output.
    pub fn append(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let keep = &bytes[bytes.len().saturating_sub(self.memory_cap)..];
        let overflow = (self.ring.len() + keep.len()).saturating_sub(self.memory_cap);
        self.ring.drain(..overflow);
        self.ring.extend(keep);
        if let Err(e) = self.write_file(bytes) {
            // The file is best effort: the guest keeps running, the error is kept for reports.
            self.file_error.get_or_insert(e);
        }
    }

    fn write_file(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some((file, cap)) = &self.file else { return Ok(()) };
        let cap = *cap;
        let mut bytes = bytes;
        while !bytes.is_empty() {
            let room = cap.saturating_sub(self.file_len);
            if room == 0 {
                file.set_len(0)?;
                file.write_all_at(TRUNCATED_MARKER, 0)?;
                self.file_len = TRUNCATED_MARKER.len() as u64;
                continue;
            }
            let n = bytes.len().min(room as usize);
            file.write_all_at(&bytes[..n], self.file_len)?;
            self.file_len += n as u64;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// What is kept in memory (the most recent output).
    pub fn contents(&self) -> Vec<u8> {
        self.ring.iter().copied().collect()
    }

    /// The last `lines` lines kept in memory, lossily decoded.
    pub fn tail(&self, lines: usize) -> String {
        let text = String::from_utf8_lossy(&self.contents()).into_owned();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Bytes the guest wrote in all (kept or not).
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// The first error writing the file, if any.
    pub fn file_error(&self) -> Option<&io::Error> {
        self.file_error.as_ref()
    }
}

/// A console log shared between the serial device and its readers.
pub type SharedConsole = Arc<Mutex<ConsoleLog>>;

/// The `Write` end the serial device writes to.
pub struct ConsoleWriter(pub SharedConsole);

impl Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_keeps_the_most_recent_bytes() {
        let mut log = ConsoleLog::new(8);
        log.append(b"hello ");
        log.append(b"world");
        assert_eq!(log.contents(), b"lo world");
        log.append(b"0123456789abc");
        assert_eq!(log.contents(), b"56789abc");
        assert_eq!(log.total_bytes(), 24);
    }

    #[test]
    fn tail_returns_the_last_lines() {
        let mut log = ConsoleLog::new(1024);
        log.append(b"one\ntwo\nthree\nfour\n");
        assert_eq!(log.tail(2), "three\nfour");
        assert_eq!(log.tail(10), "one\ntwo\nthree\nfour");
    }

    #[test]
    fn the_file_stays_under_its_cap_and_holds_recent_output() {
        let file = tempfile::tempfile().unwrap();
        let mut log = ConsoleLog::new(16).with_file(file.try_clone().unwrap(), 256);
        for i in 0..1000 {
            log.append(format!("line {i}\n").as_bytes());
        }
        let len = file.metadata().unwrap().len();
        assert!(len <= 256, "file grew to {len}");
        let mut content = vec![0u8; len as usize];
        file.read_exact_at(&mut content, 0).unwrap();
        assert!(content.starts_with(TRUNCATED_MARKER));
        assert!(String::from_utf8_lossy(&content).contains("line 999\n"));
        assert!(log.file_error().is_none());
        assert_eq!(log.contents().len(), 16);
    }
}
