//! The languages a context can speak, and where their interpreters are.
use super::error::{CodeError, Result};
use crate::config::AgentConfig;
use crate::spawn::find_program;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Language {
    Python,
    JavaScript,
    Bash,
}

impl Language {
    /// Parses a request's language; empty means python.
    pub fn parse(s: &str) -> Result<Language> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "python" | "python3" | "py" => Ok(Language::Python),
            "javascript" | "js" | "node" => Ok(Language::JavaScript),
            "bash" | "sh" | "shell" => Ok(Language::Bash),
            _ => Err(CodeError::UnknownLanguage(s.to_string())),
        }
    }

    /// The canonical name, as contexts report it.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::Bash => "bash",
        }
    }

    /// Candidate interpreter programs, in order of preference.
    fn programs(self) -> &'static [&'static str] {
        match self {
            Language::Python => &["python3", "python"],
            Language::JavaScript => &["node"],
            Language::Bash => &["bash"],
        }
    }

    /// The interpreter on the image's PATH, or INVALID_ARGUMENT naming what
    /// is missing.
    pub fn interpreter(self, cfg: &AgentConfig) -> Result<PathBuf> {
        self.programs().iter().find_map(|p| find_program(cfg, p)).ok_or(CodeError::MissingInterpreter {
            language: self.name(),
            programs: match self {
                Language::Python => "python3 or python",
                Language::JavaScript => "node",
                Language::Bash => "bash",
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        assert_eq!(Language::parse("").unwrap(), Language::Python);
        assert_eq!(Language::parse("JS").unwrap(), Language::JavaScript);
        assert_eq!(Language::parse("bash").unwrap().name(), "bash");
        assert!(matches!(Language::parse("cobol"), Err(CodeError::UnknownLanguage(_))));
    }

    #[test]
    fn a_missing_interpreter_is_named() {
        let cfg = AgentConfig { env: vec!["PATH=/nonexistent".into()], ..Default::default() };
        let e = Language::JavaScript.interpreter(&cfg).unwrap_err();
        assert!(e.to_string().contains("node"), "{e}");
    }
}
