//! Signed endpoints (OpenSandbox OSEP-0011): a route that carries its own
//! credential, so a URL opens one port of one sandbox, without the
//! data-plane token, until a given second.
//!
//! The route material is `{expires_b36}/{signature}`: `expires_b36` is the
//! expiry (Unix seconds) in lowercase base 36 without leading zeros, and
//! `signature` is the first 8 hex digits of the SHA-256 of
//! `BE32(len key) key BE32(len c) c`, where `c` is
//! `v1\nshort\n{sandbox_id}\n{port}\n{expires_b36}\n`, followed by the
//! one-character id of the key. The key is this server's, made once per data
//! dir ([`SigningKey::load_or_create`]) and never shown by the API.
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The file of the key, in the data dir.
pub const KEY_FILE: &str = "endpoint-signing.key";
/// The id of the only key (OSEP-0011 keys are named by one `[0-9a-z]`).
pub const KEY_ID: char = 'a';
const KEY_LEN: usize = 32;
/// `u64::MAX` in base 36 has 13 digits.
const MAX_B36_LEN: usize = 13;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    /// The route material is not of the signed shape (an HTTP 400).
    #[error("malformed signed route: {0}")]
    Malformed(&'static str),
    /// Well formed, but not this server's signature for this sandbox and port.
    #[error("invalid signature")]
    BadSignature,
    /// Signed, but its second has passed.
    #[error("signed endpoint expired")]
    Expired,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}: not a {KEY_LEN}-byte key (remove it to make a new one)")]
    Corrupt(String),
}

/// Encodes seconds in lowercase base 36, `0` for zero.
pub fn encode_b36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::with_capacity(MAX_B36_LEN);
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii digits")
}

/// Decodes what [`encode_b36`] makes, and only that: 1 to 13 of `[0-9a-z]`,
/// no leading zero, no overflow.
pub fn decode_b36(s: &str) -> Result<u64, SignError> {
    if s.is_empty() || s.len() > MAX_B36_LEN {
        return Err(SignError::Malformed("expires must be 1 to 13 base-36 digits"));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(SignError::Malformed("expires has a leading zero"));
    }
    s.bytes().try_fold(0u64, |acc, b| {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'z' => b - b'a' + 10,
            _ => return Err(SignError::Malformed("expires is not lowercase base 36")),
        };
        acc.checked_mul(36)
            .and_then(|v| v.checked_add(u64::from(d)))
            .ok_or(SignError::Malformed("expires overflows 64 bits"))
    })
}

/// The server's signing key.
pub struct SigningKey {
    secret: Vec<u8>,
}

impl SigningKey {
    #[cfg(test)]
    pub fn from_secret(secret: Vec<u8>) -> Self {
        Self { secret }
    }

    /// Reads `<data_dir>/endpoint-signing.key`, or makes it (random, 0600)
    /// when there is none, so signed URLs outlive a broker restart.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, KeyError> {
        let path = data_dir.join(KEY_FILE);
        let io = |source| KeyError::Io { path: path.display().to_string(), source };
        match std::fs::read(&path) {
            Ok(secret) if secret.len() == KEY_LEN => return Ok(Self { secret }),
            Ok(_) => return Err(KeyError::Corrupt(path.display().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let secret: [u8; KEY_LEN] = rand::random();
        // Written whole under another name, then renamed: a crash leaves no half key.
        let tmp = data_dir.join(format!("{KEY_FILE}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
        f.write_all(&secret).and_then(|()| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok(Self { secret: secret.to_vec() })
    }

    /// The 9-character signature of `sandbox_id`'s `port` until `expires_b36`.
    fn signature(&self, sandbox_id: &str, port: u16, expires_b36: &str) -> String {
        let canonical = format!("v1\nshort\n{sandbox_id}\n{port}\n{expires_b36}\n");
        let mut h = Sha256::new();
        h.update((self.secret.len() as u32).to_be_bytes());
        h.update(&self.secret);
        h.update((canonical.len() as u32).to_be_bytes());
        h.update(canonical.as_bytes());
        let digest = h.finalize();
        let mut sig: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        sig.push(KEY_ID);
        sig
    }

    /// The route material `{expires_b36}/{signature}` of a signed endpoint.
    pub fn sign(&self, sandbox_id: &str, port: u16, expires: u64) -> String {
        let exp = encode_b36(expires);
        let sig = self.signature(sandbox_id, port, &exp);
        format!("{exp}/{sig}")
    }

    /// Checks route material against the sandbox and port it arrived for, at
    /// `now` (Unix seconds): the shape first, then the signature, then the time.
    pub fn verify(&self, sandbox_id: &str, port: u16, expires_b36: &str, sig: &str, now: u64) -> Result<(), SignError> {
        let expires = decode_b36(expires_b36)?;
        let b = sig.as_bytes();
        if b.len() != 9
            || !b[..8].iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
            || !matches!(b[8], b'0'..=b'9' | b'a'..=b'z')
        {
            return Err(SignError::Malformed("signature must be 8 hex digits and a key id"));
        }
        let want = self.signature(sandbox_id, port, expires_b36);
        if !crate::api::auth::constant_time_eq(want.as_bytes(), sig.as_bytes()) {
            return Err(SignError::BadSignature);
        }
        if now > expires {
            return Err(SignError::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_secret(b"0123456789abcdef0123456789abcdef".to_vec())
    }

    fn split(m: &str) -> (String, String) {
        let (a, b) = m.split_once('/').unwrap();
        (a.to_string(), b.to_string())
    }

    #[test]
    fn base36_round_trips_and_rejects_non_canonical() {
        assert_eq!(encode_b36(0), "0");
        assert_eq!(encode_b36(2_000_000_000), "x2qxvk");
        assert_eq!(encode_b36(u64::MAX), "3w5e11264sgsf");
        for n in [0, 1, 35, 36, 1_700_000_000, u64::MAX] {
            assert_eq!(decode_b36(&encode_b36(n)), Ok(n));
        }
        for bad in ["", "X2QXVK", "0x2", "x2-q", "3w5e11264sgsg", "00000000000000"] {
            assert!(matches!(decode_b36(bad), Err(SignError::Malformed(_))), "{bad}");
        }
    }

    #[test]
    fn signature_has_the_osep_shape_and_verifies() {
        let (exp, sig) = split(&key().sign("sb-1", 8080, 2_000_000_000));
        assert_eq!(exp, "x2qxvk");
        assert_eq!(sig.len(), 9);
        assert!(sig.ends_with(KEY_ID));
        assert_eq!(key().verify("sb-1", 8080, &exp, &sig, 1_999_999_999), Ok(()));
        // The last second is still in.
        assert_eq!(key().verify("sb-1", 8080, &exp, &sig, 2_000_000_000), Ok(()));
    }

    #[test]
    fn tampering_another_target_or_key_is_refused() {
        let (exp, sig) = split(&key().sign("sb-1", 8080, 2_000_000_000));
        let now = 1_000;
        let mut flipped = sig.clone().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(key().verify("sb-1", 8080, &exp, &flipped, now), Err(SignError::BadSignature));
        assert_eq!(key().verify("sb-1", 8081, &exp, &sig, now), Err(SignError::BadSignature));
        assert_eq!(key().verify("sb-2", 8080, &exp, &sig, now), Err(SignError::BadSignature));
        // A later expiry with the old signature.
        assert_eq!(key().verify("sb-1", 8080, "x2qxvl", &sig, now), Err(SignError::BadSignature));
        let other = SigningKey::from_secret(vec![7; KEY_LEN]);
        assert_eq!(other.verify("sb-1", 8080, &exp, &sig, now), Err(SignError::BadSignature));
        assert!(matches!(key().verify("sb-1", 8080, &exp, "zzzzzzzza", now), Err(SignError::Malformed(_))));
        assert!(matches!(key().verify("sb-1", 8080, &exp, &sig[..8], now), Err(SignError::Malformed(_))));
    }

    #[test]
    fn an_expired_signature_is_refused() {
        let (exp, sig) = split(&key().sign("sb-1", 8080, 100));
        assert_eq!(key().verify("sb-1", 8080, &exp, &sig, 101), Err(SignError::Expired));
    }

    #[test]
    fn the_key_file_is_made_once_private_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pvisor-signkey-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = SigningKey::load_or_create(&dir).unwrap();
        let mode = std::fs::metadata(dir.join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = SigningKey::load_or_create(&dir).unwrap();
        assert_eq!(a.sign("x", 1, 5), b.sign("x", 1, 5));
        std::fs::write(dir.join(KEY_FILE), b"short").unwrap();
        assert!(matches!(SigningKey::load_or_create(&dir), Err(KeyError::Corrupt(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
