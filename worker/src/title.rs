//! The worker's process title: once it has a sandbox, its command line
//! (`/proc/<pid>/cmdline`, what `ps -ef`, `top -c` and `systemd-cgls` show)
//! becomes `pvisor-worker sbx <id>`, so an operator maps a process to its
//! sandbox without asking pvisor.
//!
//! The title is written over the process's own argument area (from
//! `arg_start` to `arg_end` of `/proc/self/stat`) through `/proc/self/mem`,
//! cut to the area's size and NUL-padded; the area never grows. The broker
//! gives every worker room for it ([`crate::launch::command`]). `comm` (the
//! 15-byte name) stays `pvisor-worker`: it is the name a restarted broker
//! checks before re-adopting a worker, and it could not hold an id anyway.
use std::os::unix::fs::FileExt;

#[derive(Debug, thiserror::Error)]
pub enum TitleError {
    #[error("reading /proc/self/stat: {0}")]
    Stat(std::io::Error),
    #[error("/proc/self/stat has no argument area")]
    NoArgArea,
    #[error("writing the argument area: {0}")]
    Write(std::io::Error),
}

/// Bytes the title needs: `pvisor-worker sbx ` and a 36-character id, plus NUL.
pub const ROOM: usize = PREFIX.len() + 36 + 1;

const PREFIX: &str = "pvisor-worker sbx ";

/// The argument area (`arg_start`, `arg_end`: fields 48 and 49 of `stat`).
fn arg_area(stat: &str) -> Option<(u64, u64)> {
    // Fields after `(comm)` start at field 3; comm may hold spaces and parentheses.
    let mut rest = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().skip(48 - 3);
    let start = rest.next()?.parse().ok()?;
    let end = rest.next()?.parse().ok()?;
    (end > start).then_some((start, end))
}

/// `title` cut to an area of `len` bytes, NUL-padded (the last byte stays NUL).
fn fill(title: &str, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let n = title.len().min(len.saturating_sub(1));
    buf[..n].copy_from_slice(&title.as_bytes()[..n]);
    buf
}

/// Sets the command line of this process to `title` (cut to fit).
pub fn set(title: &str) -> Result<(), TitleError> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(TitleError::Stat)?;
    let (start, end) = arg_area(&stat).ok_or(TitleError::NoArgArea)?;
    let buf = fill(title, (end - start) as usize);
    let mem = std::fs::OpenOptions::new().write(true).open("/proc/self/mem").map_err(TitleError::Write)?;
    mem.write_all_at(&buf, start).map_err(TitleError::Write)
}

/// The title of a worker running sandbox `id`.
pub fn of_sandbox(id: &str) -> String {
    format!("{PREFIX}{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_area_is_read_past_a_comm_with_spaces_and_parentheses() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[48 - 3] = "1000".into();
        fields[49 - 3] = "1056".into();
        let stat = format!("42 (a) b (c) {}", fields.join(" "));
        assert_eq!(arg_area(&stat), Some((1000, 1056)));
        assert_eq!(arg_area("42 (x) 1 2"), None);
    }

    #[test]
    fn the_title_is_cut_to_the_area_and_ends_in_nul() {
        assert_eq!(fill("abc", 6), b"abc\0\0\0");
        assert_eq!(fill("abcdef", 4), b"abc\0");
        assert_eq!(of_sandbox(&"x".repeat(36)).len() + 1, ROOM);
    }

    #[test]
    fn a_process_title_shows_in_its_cmdline() {
        // A child process, so the test runner's own command line stays.
        let me = std::env::current_exe().unwrap();
        let out = std::process::Command::new(me)
            .args(["--exact", "title::tests::child_sets_its_title", "--nocapture", "--include-ignored"])
            .arg("x".repeat(ROOM))
            .env("PVISOR_TITLE_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("cmdline=[pvisor-worker sbx 0123]"), "{stdout}");
    }

    #[test]
    #[ignore = "run by a_process_title_shows_in_its_cmdline in a child process"]
    fn child_sets_its_title() {
        if std::env::var_os("PVISOR_TITLE_CHILD").is_none() {
            return;
        }
        set(&of_sandbox("0123")).unwrap();
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
        let shown = String::from_utf8_lossy(&cmdline).trim_end_matches('\0').to_string();
        println!("cmdline=[{shown}]");
    }
}
