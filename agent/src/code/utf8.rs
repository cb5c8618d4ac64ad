//! Raw output bytes to text chunks: a UTF-8 sequence split across two reads
//! is kept whole; invalid bytes become U+FFFD.

/// One output stream's decoder (it holds at most 3 bytes between chunks).
#[derive(Default)]
pub struct Utf8Chunks {
    carry: Vec<u8>,
}

impl Utf8Chunks {
    /// Text of `bytes` (after what was carried), holding back an incomplete
    /// trailing sequence. `None` when there is nothing to emit yet.
    pub fn push(&mut self, bytes: &[u8]) -> Option<String> {
        self.carry.extend_from_slice(bytes);
        let keep = incomplete_tail(&self.carry);
        let cut = self.carry.len() - keep;
        if cut == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&self.carry[..cut]).into_owned();
        self.carry.drain(..cut);
        Some(text)
    }

    /// Whatever is left, lossily (end of a cell).
    pub fn flush(&mut self) -> Option<String> {
        if self.carry.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry.clear();
        Some(text)
    }
}

/// Length of a UTF-8 sequence at the end of `b` that has not all its bytes yet.
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_character_is_kept_whole() {
        let snow = "é☃😀".as_bytes();
        let mut d = Utf8Chunks::default();
        let mut out = String::new();
        for b in snow {
            out.extend(d.push(std::slice::from_ref(b)));
        }
        assert_eq!(out, "é☃😀");
        assert_eq!(d.flush(), None);
        assert_eq!(d.push(&[b'a', 0xE2, 0x98]).as_deref(), Some("a"));
        assert_eq!(d.flush().as_deref(), Some("\u{FFFD}"));
        assert_eq!(d.push(&[0xFF, b'b']).as_deref(), Some("\u{FFFD}b"));
    }
}
