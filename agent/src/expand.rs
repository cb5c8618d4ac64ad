//! `$NAME` and `${NAME}` in a string, replaced by variables' values (the
//! env file's values and working directories of commands). Nothing else of
//! the shell: no defaults, no commands, no quoting; a `$` that starts no
//! name stays as it is.

/// Whether `name` is a variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A part of a string: text, or a variable reference.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    /// `$NAME` or `${NAME}`: the name.
    Var(&'a str),
}

/// `s` cut into text and `$NAME`/`${NAME}` references; a `$` that starts
/// no name is text.
pub fn pieces(s: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        if i > 0 {
            out.push(Piece::Text(&rest[..i]));
        }
        let after = &rest[i + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) if is_name(&braced[..end]) => (&braced[..end], end + 2),
                _ => ("", 0),
            }
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            if is_name(&after[..end]) {
                (&after[..end], end)
            } else {
                ("", 0)
            }
        };
        if len == 0 {
            out.push(Piece::Text("$"));
            rest = after;
        } else {
            out.push(Piece::Var(name));
            rest = &after[len..];
        }
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    out
}

/// `s` with every `$NAME` and `${NAME}` replaced by `lookup(NAME)`; the names
/// `lookup` does not know are replaced by nothing and listed, in order.
pub fn expand(s: &str, lookup: impl Fn(&str) -> Option<String>) -> (String, Vec<String>) {
    let mut out = String::with_capacity(s.len());
    let mut missing = Vec::new();
    for p in pieces(s) {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(name) => match lookup(name) {
                Some(v) => out.push_str(&v),
                None => missing.push(name.to_string()),
            },
        }
    }
    (out, missing)
}

#[cfg(test)]
mod tests {
    use super::{expand, is_name, pieces, Piece};

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/root".into()),
            "A_1" => Some("x".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn names_and_braces() {
        assert_eq!(expand("$HOME/work", env), ("/root/work".into(), vec![]));
        assert_eq!(expand("${HOME}/work", env), ("/root/work".into(), vec![]));
        assert_eq!(expand("/a/${A_1}b/$A_1.c", env), ("/a/xb/x.c".into(), vec![]));
        assert_eq!(expand("$EMPTY/x", env), ("/x".into(), vec![]));
        assert_eq!(expand("${HOME}${A_1}", env), ("/rootx".into(), vec![]));
    }

    #[test]
    fn unknown_names_are_listed() {
        assert_eq!(expand("/$NOPE/${ALSO}", env), ("//".into(), vec!["NOPE".to_string(), "ALSO".to_string()]));
    }

    #[test]
    fn a_dollar_without_a_name_stays() {
        assert_eq!(expand("a$", env), ("a$".into(), vec![]));
        assert_eq!(expand("$1 $- ${ ${1x} ${HOME", env), ("$1 $- ${ ${1x} ${HOME".into(), vec![]));
        assert_eq!(expand("$$HOME", env), ("$/root".into(), vec![]));
        assert_eq!(expand("ünï$HOME✓", env), ("ünï/root✓".into(), vec![]));
    }

    #[test]
    fn pieces_of_a_string() {
        assert_eq!(
            pieces("a$B${C}d$"),
            vec![Piece::Text("a"), Piece::Var("B"), Piece::Var("C"), Piece::Text("d"), Piece::Text("$")]
        );
        assert_eq!(pieces(""), vec![]);
    }

    #[test]
    fn variable_names() {
        assert!(is_name("_a9") && is_name("PATH"));
        assert!(!is_name("") && !is_name("9a") && !is_name("a-b") && !is_name("é"));
    }
}
