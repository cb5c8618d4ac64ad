//! The env file: `KEY=VALUE` entries that `commands.set_env` of the SDK
//! appends (a shell command writing to the file `$EXECD_ENVS` names) and
//! that every later command, session, code context and terminal gets, over
//! the image's environment and under the request's own `envs`, as the
//! reference execd does.
//!
//! Entries, one per line (blank lines and `#` comments skipped, as are
//! malformed entries):
//!
//! ```text
//! KEY=value     trimmed; $NAME and ${NAME} expanded
//! KEY="v a l"   kept as written but for \n \r \t \\ \" escapes; $NAME expanded
//! KEY='v a l'   literal, may span lines (the lossless form)
//! ```
//!
//! `$NAME` is looked up in the environment the file applies to, entries
//! above it included; an unknown name is empty. The last entry of a key wins.
use crate::expand::{expand, is_name};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The variable that names the file, in every command's environment.
pub const VAR: &str = "EXECD_ENVS";
/// Its value unless the image sets one (the reference's default).
pub const DEFAULT_PATH: &str = "/opt/opensandbox/.env";
/// Larger files are not read (every command reads it).
const MAX_BYTES: u64 = 1 << 20;

/// The file `env` names: its `EXECD_ENVS` when absolute, else none.
pub fn path(env: &BTreeMap<String, String>) -> Option<PathBuf> {
    env.get(VAR).map(PathBuf::from).filter(|p| p.is_absolute())
}

/// Applies the file at `path` to `env`, for a process running as `uid`. The
/// file is read only when it is a regular file owned by root or by `uid`
/// that others cannot write: another user's file must not set root's
/// `PATH` or `LD_PRELOAD`. Missing, unreadable or refused files change nothing.
pub fn apply(path: &Path, uid: u32, env: &mut BTreeMap<String, String>) {
    let Ok(mut f) = std::fs::File::open(path) else { return };
    let Ok(md) = f.metadata() else { return };
    if !md.is_file() || !(md.uid() == 0 || md.uid() == uid) || md.mode() & 0o002 != 0 || md.len() > MAX_BYTES {
        return;
    }
    let mut data = String::new();
    if f.by_ref().take(MAX_BYTES).read_to_string(&mut data).is_err() {
        return;
    }
    parse_into(&data, env);
}

/// Parses `data` and sets its entries in `env`, expanding against `env`.
pub fn parse_into(data: &str, env: &mut BTreeMap<String, String>) {
    let mut rest = data;
    while !rest.is_empty() {
        let (entry, next) = entry(rest);
        if let Some((key, value)) = entry {
            let value = match value {
                Value::Literal(v) => v,
                Value::Expand(v) => expand(&v, |n| env.get(n).cloned()).0,
            };
            env.insert(key, value);
        }
        rest = next;
    }
}

enum Value {
    Literal(String),
    Expand(String),
}

/// The first physical line of `s` and what follows it.
fn split_line(s: &str) -> (&str, &str) {
    match s.find('\n') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    }
}

/// One entry from the start of `s` (None: a blank, comment or malformed
/// line) and what follows it.
fn entry(s: &str) -> (Option<(String, Value)>, &str) {
    let (line, after_line) = split_line(s);
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return (None, after_line);
    }
    let Some(eq) = line.find('=') else { return (None, after_line) };
    let (key, value) = (line[..eq].trim(), &line[eq + 1..]);
    if !is_name(key) {
        return (None, after_line);
    }
    // A quoted value may go on past this line: look at it in all of `s`.
    let lead = value.len() - value.trim_start_matches([' ', '\t']).len();
    let quoted = &s[eq + 1 + lead..];
    match quoted.chars().next() {
        Some(q @ ('\'' | '"')) => match closing(&quoted[1..], q) {
            Some(end) => {
                let inner = &quoted[1..1 + end];
                let (tail, next) = split_line(&quoted[2 + end..]);
                if !tail.trim().is_empty() {
                    return (None, after_line);
                }
                let value = if q == '\'' { Value::Literal(inner.into()) } else { Value::Expand(unescape(inner)) };
                (Some((key.into(), value)), next)
            }
            None => (None, after_line),
        },
        _ => (Some((key.into(), Value::Expand(value.trim().into()))), after_line),
    }
}

/// Where the quote `q` that closes `s` is: the next `'`; the next `"` not
/// escaped by a backslash.
fn closing(s: &str, q: char) -> Option<usize> {
    if q == '\'' {
        return s.find('\'');
    }
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// `\n`, `\r`, `\t`, `\\` and `\"` decoded; other backslashes kept.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn parsed(data: &str) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([("BASE".to_string(), "/opt/base".to_string())]);
        parse_into(data, &mut env);
        env.remove("BASE");
        env
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn plain_entries_are_trimmed_and_expanded() {
        let got = parsed("# comment\nFOO=bar\n  SPACED =  a b  \nP=$BASE/bin:${FOO}\nEMPTY=\n\nMALFORMED\n9X=1\n");
        assert_eq!(got, map(&[("FOO", "bar"), ("SPACED", "a b"), ("P", "/opt/base/bin:bar"), ("EMPTY", "")]));
    }

    #[test]
    fn single_quotes_are_literal_and_may_span_lines() {
        let got = parsed("A='$BASE  x\\n'\nB='one\ntwo'\nC=after\n");
        assert_eq!(got, map(&[("A", "$BASE  x\\n"), ("B", "one\ntwo"), ("C", "after")]));
    }

    #[test]
    fn double_quotes_unescape_and_expand() {
        let got = parsed(r#"A="it's \"q\" a\tb\nc \\ \x $BASE""#);
        assert_eq!(got, map(&[("A", "it's \"q\" a\tb\nc \\ \\x /opt/base")]));
    }

    #[test]
    fn what_the_sdk_writes_round_trips() {
        // opensandbox 1.1.1 build_set_env_command: KEY='value' unless the value has a
        // single quote, then KEY="escaped".
        let got = parsed("K1='a b $HOME \\n'\nK2=\"it's \\\\ \\\"x\\\"\\n\"\n");
        assert_eq!(got, map(&[("K1", "a b $HOME \\n"), ("K2", "it's \\ \"x\"\n")]));
    }

    #[test]
    fn bad_quoted_entries_are_skipped() {
        let got = parsed("A='unterminated\nB=ok\nC=\"x\" trailing\nD=\"open\n");
        assert_eq!(got, map(&[("B", "ok")]));
    }

    #[test]
    fn the_last_entry_wins_and_sees_the_earlier() {
        let got = parsed("X=1\nX=$X-2\n");
        assert_eq!(got, map(&[("X", "1-2")]));
    }

    #[test]
    fn the_file_is_read_only_when_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("env");
        std::fs::write(&f, "A=1\n").unwrap();
        let me = nix::unistd::getuid().as_raw();
        let mut env = BTreeMap::new();
        apply(&f, me, &mut env);
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        // Writable by others: ignored.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut env = BTreeMap::new();
        apply(&f, me, &mut env);
        assert!(env.is_empty());
        // Missing, or a directory: nothing.
        apply(&dir.path().join("none"), me, &mut env);
        apply(dir.path(), me, &mut env);
        assert!(env.is_empty());
    }

    #[test]
    fn the_path_is_absolute() {
        assert_eq!(path(&map(&[(VAR, "/x/.env")])), Some(PathBuf::from("/x/.env")));
        assert_eq!(path(&map(&[(VAR, "rel/.env")])), None);
        assert_eq!(path(&map(&[])), None);
    }
}
