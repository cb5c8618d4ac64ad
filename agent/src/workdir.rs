//! Working directories as clients write them: a leading `~` (the home of
//! the user the command runs as: its `HOME`) and `$NAME`/`${NAME}`, as the
//! SDK documents and the reference execd expands them. A variable that is
//! not set is an error, not an empty string (`$PROJECT/src` must not become
//! `/src`).
use crate::error::{AgentError, Result};
use crate::expand::{expand, pieces, Piece};
use std::collections::BTreeMap;

/// `cwd` split into the home prefix (`~` alone or `~/…`) and the rest.
fn split_home(cwd: &str) -> (bool, &str) {
    match cwd.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => (true, rest),
        _ => (false, cwd),
    }
}

/// `cwd` expanded against `env`, the environment of the process that will
/// run in it.
pub fn resolve(cwd: &str, env: &BTreeMap<String, String>) -> Result<String> {
    let (home, rest) = split_home(cwd);
    let (mut out, mut missing) = expand(rest, |n| env.get(n).cloned());
    if home {
        match env.get("HOME") {
            Some(h) => out.insert_str(0, h),
            None => missing.insert(0, "HOME".into()),
        }
    }
    if !missing.is_empty() {
        missing.dedup();
        return Err(AgentError::InvalidArgument(format!(
            "working directory {cwd:?} uses variables that are not set: {}",
            missing.join(", ")
        )));
    }
    Ok(out)
}

/// Quotes `s` as one shell word.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The shell text that changes a session's shell to `cwd`, expanded by that
/// shell (its own variables count, `export`s of earlier runs included),
/// followed by `&& `. A variable that is not set fails the run with status 1
/// and a message on stderr, as a missing directory does.
pub fn session_cd(cwd: &str) -> String {
    let (home, rest) = split_home(cwd);
    let parts = pieces(rest);
    let mut names: Vec<&str> = Vec::new();
    if home {
        names.push("HOME");
    }
    let mut word = String::from(if home { "\"${HOME}\"" } else { "" });
    if !parts.is_empty() || !home {
        word.push('"');
        for p in &parts {
            match p {
                Piece::Text(t) => {
                    for c in t.chars() {
                        if matches!(c, '"' | '\\' | '$' | '`') {
                            word.push('\\');
                        }
                        word.push(c);
                    }
                }
                Piece::Var(n) => {
                    word.push_str(&format!("${{{n}}}"));
                    if !names.contains(n) {
                        names.push(*n);
                    }
                }
            }
        }
        word.push('"');
    }
    let mut out = String::new();
    for n in names {
        let msg = quote(&format!("working directory {cwd:?} uses a variable that is not set: {n}"));
        out.push_str(&format!("{{ [ -n \"${{{n}+x}}\" ] || {{ printf '%s\\n' {msg} >&2; false; }}; }} && "));
    }
    out.push_str(&format!("cd {word} && "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        [("HOME", "/home/app"), ("P", "/srv/p"), ("SP", "a b")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn home_and_variables() {
        assert_eq!(resolve("~", &env()).unwrap(), "/home/app");
        assert_eq!(resolve("~/x", &env()).unwrap(), "/home/app/x");
        assert_eq!(resolve("$P/src", &env()).unwrap(), "/srv/p/src");
        assert_eq!(resolve("${P}x/$SP", &env()).unwrap(), "/srv/px/a b");
        assert_eq!(resolve("~/$SP", &env()).unwrap(), "/home/app/a b");
        assert_eq!(resolve("/plain/dir", &env()).unwrap(), "/plain/dir");
    }

    #[test]
    fn a_tilde_elsewhere_is_a_name() {
        assert_eq!(resolve("~app", &env()).unwrap(), "~app");
        assert_eq!(resolve("/a/~", &env()).unwrap(), "/a/~");
    }

    #[test]
    fn unset_variables_are_errors() {
        let e = resolve("$NOPE/x/${ALSO}", &env()).unwrap_err().to_string();
        assert!(e.contains("NOPE, ALSO"), "{e}");
        let mut no_home = env();
        no_home.remove("HOME");
        assert!(resolve("~/x", &no_home).unwrap_err().to_string().contains("HOME"));
    }

    /// Runs `script` in `sh` with `vars` and returns (status, stdout, stderr).
    fn sh(script: &str, vars: &[(&str, &str)]) -> (i32, String, String) {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .env_clear()
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap().trim_end().to_string();
        (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
    }

    #[test]
    fn session_cd_expands_in_the_shell() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a \"$\" `c` \\d 'e' $1");
        std::fs::create_dir(&odd).unwrap();
        let base = dir.path().display().to_string();
        let want = odd.display().to_string();
        // Literal text, quotes and all, is not expanded by the shell.
        assert_eq!(sh(&format!("{}pwd", session_cd(&want)), &[]), (0, want.clone(), String::new()));
        // Variables and ~ are.
        let cd = session_cd("~/a \"$\" `c` \\d 'e' $1");
        assert_eq!(sh(&format!("{cd}pwd"), &[("HOME", &base)]).1, want);
        let cd = session_cd("${BASE}/a \"$\" `c` \\d 'e' $1");
        assert_eq!(sh(&format!("{cd}pwd"), &[("BASE", &base)]).1, want);
        assert_eq!(sh(&format!("{}pwd", session_cd("~")), &[("HOME", &base)]).1, base);
        // An empty value is set.
        assert_eq!(sh(&format!("{}pwd", session_cd("$E/")), &[("E", "")]).1, "/");
    }

    #[test]
    fn session_cd_fails_on_unset_variables() {
        let (code, out, err) = sh(&format!("{}echo ran", session_cd("/tmp/$NOPE")), &[]);
        assert_eq!((code, out.as_str()), (1, ""));
        assert!(err.contains("not set: NOPE"), "{err}");
    }
}
