//! Splitting a byte stream into lines, with a cap on line length.
use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest line emitted as one event; longer lines are split.
pub const MAX_LINE: usize = 1 << 20;

/// Reads `r` to EOF, calling `emit` for each line (without its newline, lossily
/// decoded as UTF-8). A final line without newline is emitted too.
pub async fn for_each_line<R, F, Fut>(mut r: R, mut emit: F)
where
    R: AsyncRead + Unpin,
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut start = 0;
        for i in 0..n {
            if buf[i] == b'\n' {
                pending.extend_from_slice(&buf[start..i]);
                start = i + 1;
                let line = String::from_utf8_lossy(&pending).into_owned();
                pending.clear();
                if !emit(line).await {
                    return;
                }
            }
        }
        pending.extend_from_slice(&buf[start..n]);
        while pending.len() >= MAX_LINE {
            let rest = pending.split_off(MAX_LINE);
            let line = String::from_utf8_lossy(&pending).into_owned();
            pending = rest;
            if !emit(line).await {
                return;
            }
        }
    }
    if !pending.is_empty() {
        emit(String::from_utf8_lossy(&pending).into_owned()).await;
    }
}
