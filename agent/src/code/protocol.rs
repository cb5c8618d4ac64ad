//! The JSON-lines control protocol between the agent and a driver
//! (`PROTOCOL.md` next to this file), typed.
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Agent → driver (fd 3).
#[derive(Serialize, Debug)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ToDriver<'a> {
    Exec { code: &'a str },
}

impl ToDriver<'_> {
    /// The message as one `\n`-terminated line.
    pub fn line(&self) -> Vec<u8> {
        // Serializing a struct of strings cannot fail.
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// Driver → agent (fd 4).
#[derive(Deserialize, Debug, PartialEq)]
#[serde(tag = "t", rename_all = "lowercase")]
pub enum FromDriver {
    Ready {
        #[serde(default)]
        version: String,
    },
    Result {
        data: HashMap<String, serde_json::Value>,
        #[serde(default)]
        main: bool,
    },
    Error {
        ename: String,
        #[serde(default)]
        evalue: String,
        #[serde(default)]
        traceback: Vec<String>,
    },
    Done {
        count: u32,
    },
    /// A message this agent does not know (a newer driver): ignored.
    #[serde(other)]
    Unknown,
}

impl FromDriver {
    pub fn parse(line: &[u8]) -> Result<FromDriver, serde_json::Error> {
        serde_json::from_slice(line)
    }
}

/// A result bundle's values as strings: strings as they are, anything else
/// (a driver sending JSON inline) as its JSON text.
pub fn bundle(data: HashMap<String, serde_json::Value>) -> HashMap<String, String> {
    data.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        assert_eq!(ToDriver::Exec { code: "1+\n1" }.line(), b"{\"op\":\"exec\",\"code\":\"1+\\n1\"}\n");
        assert_eq!(FromDriver::parse(br#"{"t":"done","count":3}"#).unwrap(), FromDriver::Done { count: 3 });
        assert_eq!(FromDriver::parse(br#"{"t":"later","x":1}"#).unwrap(), FromDriver::Unknown);
        let FromDriver::Result { data, main } =
            FromDriver::parse(br#"{"t":"result","data":{"text/plain":"4","application/json":{"a":1}},"main":true}"#)
                .unwrap()
        else {
            panic!("not a result")
        };
        assert!(main);
        let b = bundle(data);
        assert_eq!((b["text/plain"].as_str(), b["application/json"].as_str()), ("4", r#"{"a":1}"#));
        assert!(FromDriver::parse(b"{\"t\":\"error\"}").is_err(), "an error needs its ename");
    }
}
