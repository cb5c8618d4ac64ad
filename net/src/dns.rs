//! The DNS wire format netd needs (RFC 1035), on byte slices.
//!
//! netd answers every DNS question of its sandbox itself: it parses the
//! question ([`parse_query`]), answers denied names with NXDOMAIN and AAAA or
//! HTTPS/SVCB questions with an empty answer ([`reply`]), forwards the rest
//! upstream under an id of its own ([`set_id`]) and reads the A records of the
//! upstream's answer ([`parse_answer`]) to bind each address to the name
//! asked for, for [`binding_ttl`] of the record's TTL.
//!
//! Only what that needs is here: one question per message, names as lower-case
//! dotted ASCII, compression pointers followed (bounded) when reading answers.
use std::net::Ipv4Addr;
use std::time::Duration;

/// Record type A (an IPv4 address).
pub const TYPE_A: u16 = 1;
/// Record type CNAME.
pub const TYPE_CNAME: u16 = 5;
/// Record type AAAA (an IPv6 address).
pub const TYPE_AAAA: u16 = 28;
/// Record type SVCB (RFC 9460).
pub const TYPE_SVCB: u16 = 64;
/// Record type HTTPS (RFC 9460; may carry address hints).
pub const TYPE_HTTPS: u16 = 65;
/// Class IN.
pub const CLASS_IN: u16 = 1;

/// Response code: no error.
pub const RCODE_NOERROR: u8 = 0;
/// Response code: the server could not parse the query.
pub const RCODE_FORMERR: u8 = 1;
/// Response code: the server failed (e.g. no upstream answered).
pub const RCODE_SERVFAIL: u8 = 2;
/// Response code: the name does not exist.
pub const RCODE_NXDOMAIN: u8 = 3;
/// Response code: the server refuses to answer.
pub const RCODE_REFUSED: u8 = 5;

/// Size of the fixed DNS header.
pub const HEADER_LEN: usize = 12;
/// Longest name in presentation form (RFC 1035 §2.3.4: 255 octets on the wire).
const MAX_NAME_LEN: usize = 253;
/// Compression pointers followed before a name is declared malformed.
const MAX_POINTERS: usize = 16;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("DNS message shorter than its header or its contents")]
    Truncated,
    #[error("not a query (QR set or opcode not QUERY)")]
    NotAQuery,
    #[error("not a response")]
    NotAResponse,
    #[error("expected exactly one question, got {0}")]
    QuestionCount(u16),
    #[error("malformed name: {0}")]
    BadName(&'static str),
}

/// The question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The query's id.
    pub id: u16,
    /// Whether the client asked for recursion (copied into replies).
    pub recursion_desired: bool,
    /// The name asked for: lower-case, dotted, no trailing dot ("" for the root).
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// Offset just past the question in the query (header + question is what
    /// a reply repeats).
    pub end: usize,
}

/// One A record of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ARecord {
    pub addr: Ipv4Addr,
    /// Seconds.
    pub ttl: u32,
}

/// What netd reads from an upstream answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: u16,
    pub rcode: u8,
    /// Every A record of the answer section (CNAME chains included: the
    /// records all belong to the name asked for).
    pub a_records: Vec<ARecord>,
}

fn u16_at(msg: &[u8], at: usize) -> Result<u16, DnsError> {
    match msg.get(at..at + 2) {
        Some(b) => Ok(u16::from_be_bytes([b[0], b[1]])),
        None => Err(DnsError::Truncated),
    }
}

fn u32_at(msg: &[u8], at: usize) -> Result<u32, DnsError> {
    match msg.get(at..at + 4) {
        Some(b) => Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(DnsError::Truncated),
    }
}

/// Reads the name at `at`, following compression pointers when `pointers` is
/// true (answers) and refusing them otherwise (a query's question). Returns
/// the name (lower-case, dotted) and the offset just past it where it starts.
fn read_name(msg: &[u8], mut at: usize, pointers: bool) -> Result<(String, usize), DnsError> {
    let mut name = String::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(at).ok_or(DnsError::Truncated)? as usize;
        match len & 0xc0 {
            0x00 => {}
            0xc0 if pointers => {
                let target = (u16_at(msg, at)? & 0x3fff) as usize;
                end.get_or_insert(at + 2);
                jumps += 1;
                // A pointer names an earlier name, never the header (whose id
                // netd rewrites: found by the dns fuzz target).
                if jumps > MAX_POINTERS || target < HEADER_LEN || target >= msg.len() {
                    return Err(DnsError::BadName("compression loop or pointer out of range"));
                }
                at = target;
                continue;
            }
            0xc0 => return Err(DnsError::BadName("compression pointer in a question")),
            _ => return Err(DnsError::BadName("reserved label type")),
        }
        if len == 0 {
            return Ok((name, end.unwrap_or(at + 1)));
        }
        let label = msg.get(at + 1..at + 1 + len).ok_or(DnsError::Truncated)?;
        if !name.is_empty() {
            name.push('.');
        }
        for &b in label {
            // A dot inside a label, or a byte that is no printable ASCII, could
            // make two different names look alike to the policy's matcher.
            if b == b'.' || !b.is_ascii_graphic() {
                return Err(DnsError::BadName("label byte outside printable ASCII, or a dot"));
            }
            name.push(b.to_ascii_lowercase() as char);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(DnsError::BadName("longer than 253 characters"));
        }
        at += 1 + len;
    }
}

/// Parses a query: a standard QUERY (QR clear, opcode 0) with one question.
pub fn parse_query(msg: &[u8]) -> Result<Question, DnsError> {
    if msg.len() < HEADER_LEN {
        return Err(DnsError::Truncated);
    }
    let flags = u16_at(msg, 2)?;
    if flags & 0x8000 != 0 || (flags >> 11) & 0xf != 0 {
        return Err(DnsError::NotAQuery);
    }
    let qdcount = u16_at(msg, 4)?;
    if qdcount != 1 {
        return Err(DnsError::QuestionCount(qdcount));
    }
    let (name, at) = read_name(msg, HEADER_LEN, false)?;
    let qtype = u16_at(msg, at)?;
    let qclass = u16_at(msg, at + 2)?;
    Ok(Question { id: u16_at(msg, 0)?, recursion_desired: flags & 0x0100 != 0, name, qtype, qclass, end: at + 4 })
}

/// Writes into `out` (cleared first) a reply to `query` (whose question is
/// `q`) with response code `rcode` and no records: the header and the question.
/// NXDOMAIN for a denied name, NOERROR for the empty answer to AAAA and
/// HTTPS/SVCB questions, SERVFAIL when no upstream answered.
pub fn reply(query: &[u8], q: &Question, rcode: u8, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR=1, opcode 0, AA=0, TC=0, RD copied, RA=1, Z/AD/CD 0.
    let mut flags: u16 = 0x8080 | u16::from(rcode & 0x0f);
    if q.recursion_desired {
        flags |= 0x0100;
    }
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&query[HEADER_LEN..q.end]);
}

/// Reads the response code and the A records of an upstream answer.
pub fn parse_answer(msg: &[u8]) -> Result<Answer, DnsError> {
    if msg.len() < HEADER_LEN {
        return Err(DnsError::Truncated);
    }
    let flags = u16_at(msg, 2)?;
    if flags & 0x8000 == 0 {
        return Err(DnsError::NotAResponse);
    }
    let qdcount = u16_at(msg, 4)?;
    let ancount = u16_at(msg, 6)?;
    let mut at = HEADER_LEN;
    for _ in 0..qdcount {
        at = read_name(msg, at, true)?.1 + 4;
    }
    let mut a_records = Vec::new();
    for _ in 0..ancount {
        at = read_name(msg, at, true)?.1;
        let rtype = u16_at(msg, at)?;
        let rclass = u16_at(msg, at + 2)?;
        let ttl = u32_at(msg, at + 4)?;
        let rdlen = u16_at(msg, at + 8)? as usize;
        let rdata = msg.get(at + 10..at + 10 + rdlen).ok_or(DnsError::Truncated)?;
        if rtype == TYPE_A && rclass == CLASS_IN && rdlen == 4 {
            a_records.push(ARecord { addr: Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]), ttl });
        }
        at += 10 + rdlen;
    }
    Ok(Answer { id: u16_at(msg, 0)?, rcode: (flags & 0x0f) as u8, a_records })
}

/// Whether a response has TC set: it did not fit its datagram (RFC 1035
/// §4.1.1), and the full answer is to be asked for over TCP.
pub fn is_truncated(msg: &[u8]) -> bool {
    msg.len() >= HEADER_LEN && msg[2] & 0x80 != 0 && msg[2] & 0x02 != 0
}

/// Rewrites a message's id (netd forwards queries under ids of its own).
pub fn set_id(msg: &mut [u8], id: u16) {
    if let Some(b) = msg.get_mut(0..2) {
        b.copy_from_slice(&id.to_be_bytes());
    }
}

/// How long an address learned from an A record stays bound to its name: the
/// record's TTL plus 60 s, clamped to 60–360 s (as OpenSandbox's dns+nft).
pub fn binding_ttl(ttl: u32) -> Duration {
    Duration::from_secs(u64::from(ttl).saturating_add(60).clamp(60, 360))
}

#[cfg(test)]
mod tests;
