//! Human-readable names of places in a deep tree, for messages.
use std::ffi::CString;

/// Names shown at each end of a long path.
const KEEP: usize = 3;

/// `root/first/…(N levels)…/last` for the `total` names `at(0..total)`;
/// only the first and last [`KEEP`] are read.
pub fn describe<'a>(root: &str, total: usize, at: impl Fn(usize) -> &'a CString) -> String {
    let show = |i: usize| String::from_utf8_lossy(at(i).to_bytes()).into_owned();
    let mut s = root.trim_end_matches('/').to_owned();
    let push = |i: usize, s: &mut String| {
        s.push('/');
        s.push_str(&show(i));
    };
    if total <= 2 * KEEP {
        (0..total).for_each(|i| push(i, &mut s));
    } else {
        (0..KEEP).for_each(|i| push(i, &mut s));
        s.push_str(&format!("/…({} levels)…", total - 2 * KEEP));
        (total - KEEP..total).for_each(|i| push(i, &mut s));
    }
    if s.len() > 1024 {
        let mut cut = 1024;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}
