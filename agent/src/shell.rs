//! The shell a command string runs in: `bash` where the image has it on the
//! `PATH` commands get, as the reference execd does (so `{1..3}`, `[[ ]]`,
//! arrays and `set -o pipefail` work as agents expect), else `/bin/sh`.
use crate::config::AgentConfig;
use crate::spawn::find_program;

/// The shell used when the image has no bash.
pub const FALLBACK: &str = "/bin/sh";

/// The shell program for command strings and sessions, looked up at every
/// call (an image may install bash while the sandbox runs).
pub fn program(cfg: &AgentConfig) -> String {
    find_program(cfg, "bash").map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|| FALLBACK.into())
}

/// Whether `program` is bash (it gets bash's own options).
pub fn is_bash(program: &str) -> bool {
    std::path::Path::new(program).file_name().is_some_and(|n| n == "bash")
}

/// argv running `command` through the shell: `bash -c COMMAND` or `/bin/sh -c COMMAND`.
pub fn argv(cfg: &AgentConfig, command: &str) -> Vec<String> {
    vec![program(cfg), "-c".into(), command.into()]
}

/// argv of an interactive-less persistent shell reading commands from stdin
/// (sessions): bash without profile or rc files, else plain `/bin/sh`.
pub fn session_argv(cfg: &AgentConfig) -> Vec<String> {
    let program = program(cfg);
    let bash = is_bash(&program);
    let mut argv = vec![program];
    if bash {
        argv.extend(["--noprofile".into(), "--norc".into()]);
    }
    argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn cfg_with_path(path: &str) -> AgentConfig {
        AgentConfig { env: vec![format!("PATH={path}")], ..Default::default() }
    }

    fn exe(dir: &std::path::Path, name: &str, mode: u32) {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn bash_on_the_path_is_chosen() {
        let empty = tempfile::tempdir().unwrap();
        let with = tempfile::tempdir().unwrap();
        exe(with.path(), "bash", 0o755);
        let cfg = cfg_with_path(&format!("{}:{}", empty.path().display(), with.path().display()));
        let want = with.path().join("bash").display().to_string();
        assert_eq!(argv(&cfg, "echo {1..3}"), vec![want.clone(), "-c".into(), "echo {1..3}".into()]);
        assert_eq!(session_argv(&cfg), vec![want, "--noprofile".into(), "--norc".into()]);
    }

    #[test]
    fn no_bash_falls_back_to_sh() {
        let empty = tempfile::tempdir().unwrap();
        // Not executable, and a directory named bash: neither counts.
        exe(empty.path(), "bash", 0o644);
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join("bash")).unwrap();
        let cfg = cfg_with_path(&format!("{}:{}", empty.path().display(), other.path().display()));
        assert_eq!(argv(&cfg, "true"), vec!["/bin/sh".to_string(), "-c".into(), "true".into()]);
        assert_eq!(session_argv(&cfg), vec!["/bin/sh".to_string()]);
    }

    #[test]
    fn bash_is_recognised_by_name() {
        assert!(is_bash("/usr/bin/bash"));
        assert!(!is_bash("/bin/sh"));
        assert!(!is_bash("/opt/bashful"));
    }
}
