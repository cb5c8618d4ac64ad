//! Line-ranged reads: which bytes of a file, read chunk by chunk, lie in a
//! window of lines. A line ends after a `\n` byte (a CRLF line keeps its
//! `\r`); the file's last line may have no newline. Bytes are passed on as
//! they are (binary files included), and no line is ever buffered whole.
use crate::error::{AgentError, Result};
use pvisor_proto::agent::DataChunk;
use std::fs::File;
use tokio_stream::wrappers::ReceiverStream;

/// Bytes read from the file at a time.
const READ: usize = 256 * 1024;

/// The lines `first..first + count` (1-based; `count` 0 = to the end).
#[derive(Debug)]
pub struct LineWindow {
    /// The line the next byte belongs to.
    line: u64,
    first: u64,
    /// One past the last line sent; `None`: to the end.
    end: Option<u64>,
}

impl LineWindow {
    pub fn new(first: u64, count: u64) -> Result<Self> {
        if first == 0 {
            return Err(AgentError::InvalidArgument("line numbers start at 1".into()));
        }
        let end = (count > 0).then(|| first.saturating_add(count));
        Ok(LineWindow { line: 1, first, end })
    }

    /// Whether every line of the window has been passed.
    pub fn done(&self) -> bool {
        self.end.is_some_and(|end| self.line >= end)
    }

    /// The part of `chunk` (the file's next bytes) inside the window. The
    /// lines of the window are contiguous, so this is one slice.
    pub fn take<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let (mut start, mut stop) = (None, 0);
        let mut pos = 0;
        while pos < chunk.len() && !self.done() {
            let newline = chunk[pos..].iter().position(|&b| b == b'\n').map(|i| pos + i);
            let seg_end = newline.map_or(chunk.len(), |n| n + 1);
            if self.line >= self.first {
                start.get_or_insert(pos);
                stop = seg_end;
            }
            if newline.is_some() {
                self.line += 1;
            }
            pos = seg_end;
        }
        start.map_or(&[][..], |s| &chunk[s..stop])
    }
}

/// Streams the bytes of `file` (from its current position) inside `window`,
/// reading no further than the window's last line.
pub fn send(mut file: File, mut window: LineWindow) -> ReceiverStream<std::result::Result<DataChunk, tonic::Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        while !window.done() {
            let chunk = match crate::files::read_chunk(&mut file, READ) {
                Ok(c) if c.is_empty() => break,
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e.into()));
                    break;
                }
            };
            let part = window.take(&chunk);
            if !part.is_empty() && tx.blocking_send(Ok(DataChunk { data: part.to_vec() })).is_err() {
                break;
            }
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::LineWindow;

    /// The window over `data` fed in chunks of `size` bytes.
    fn read(data: &[u8], first: u64, count: u64, size: usize) -> Vec<u8> {
        let mut w = LineWindow::new(first, count).unwrap();
        let mut out = Vec::new();
        for chunk in data.chunks(size) {
            if w.done() {
                break;
            }
            out.extend_from_slice(w.take(chunk));
        }
        out
    }

    fn all_sizes(data: &[u8], first: u64, count: u64, want: &[u8]) {
        for size in [1, 2, 3, 7, 4096] {
            assert_eq!(read(data, first, count, size), want, "first {first} count {count} chunks of {size}");
        }
    }

    #[test]
    fn middle_lines() {
        all_sizes(b"a\nb\nc\nd\n", 2, 2, b"b\nc\n");
        all_sizes(b"a\nb\nc\nd\n", 1, 1, b"a\n");
        all_sizes(b"a\nb\nc\nd\n", 4, 1, b"d\n");
    }

    #[test]
    fn count_zero_reads_to_the_end() {
        all_sizes(b"a\nb\nc", 2, 0, b"b\nc");
        all_sizes(b"a\nb\nc", 1, 0, b"a\nb\nc");
    }

    #[test]
    fn past_the_end_is_empty() {
        all_sizes(b"a\nb\n", 3, 5, b"");
        all_sizes(b"a\nb", 3, 1, b"");
        all_sizes(b"", 1, 1, b"");
        all_sizes(b"a\nb\n", 2, 100, b"b\n");
    }

    #[test]
    fn last_line_without_newline() {
        all_sizes(b"one\ntwo", 2, 1, b"two");
        all_sizes(b"one\ntwo", 1, 2, b"one\ntwo");
    }

    #[test]
    fn crlf_lines_keep_their_carriage_return() {
        all_sizes(b"a\r\nb\r\nc\r\n", 2, 1, b"b\r\n");
        // A lone \r does not end a line.
        all_sizes(b"a\rb\nc\n", 1, 1, b"a\rb\n");
    }

    #[test]
    fn binary_bytes_pass_unchanged() {
        let data: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        // \n is byte 10: line 1 is 0..=10, line 2 is 11..=255 and 0..=10, ...
        let mut want: Vec<u8> = (11..=255u8).collect();
        want.extend(0..=10u8);
        all_sizes(&data, 2, 1, &want);
        all_sizes(&data, 3, 0, &(11..=255u8).collect::<Vec<_>>());
    }

    #[test]
    fn empty_lines_count() {
        all_sizes(b"\n\nx\n", 3, 1, b"x\n");
        all_sizes(b"\n\nx\n", 2, 1, b"\n");
    }

    #[test]
    fn huge_counts_do_not_overflow() {
        all_sizes(b"a\nb\n", 2, u64::MAX, b"b\n");
        all_sizes(b"a\nb\n", u64::MAX, 1, b"");
    }

    #[test]
    fn line_zero_is_refused() {
        assert!(LineWindow::new(0, 1).is_err());
    }
}
