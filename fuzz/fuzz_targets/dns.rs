//! DNS messages as netd reads them (`pvisor_net::dns`): a sandbox's queries
//! and upstream answers.
//!
//! Invariants: a parsed query names a canonical name (lower-case printable
//! ASCII labels, no empty label, at most 253 characters) and ends inside the
//! message; the reply netd writes to it parses as an answer with the same id
//! and response code and no records, repeats the question unchanged, and is
//! never taken for a query; an answer keeps its records under a new id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvisor_net::dns::{self, DnsError, HEADER_LEN};

fn check_name(name: &str) {
    assert!(name.len() <= 253, "name of {} characters", name.len());
    if name.is_empty() {
        return;
    }
    for label in name.split('.') {
        assert!(!label.is_empty() && label.len() <= 63, "bad label in {name:?}");
        assert!(label.bytes().all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase()), "bad byte in {name:?}");
    }
}

fuzz_target!(|msg: &[u8]| {
    if let Ok(q) = dns::parse_query(msg) {
        assert!(q.end > HEADER_LEN && q.end <= msg.len());
        check_name(&q.name);
        let rcode = msg.len() as u8 & 0x0f;
        let mut out = Vec::new();
        dns::reply(msg, &q, rcode, &mut out);
        assert_eq!(out.len(), q.end);
        let answer = dns::parse_answer(&out).expect("netd's own reply must parse as an answer");
        assert_eq!((answer.id, answer.rcode), (q.id, rcode));
        assert!(answer.a_records.is_empty());
        assert_eq!(dns::parse_query(&out), Err(DnsError::NotAQuery));
        assert!(!dns::is_truncated(&out));
        // The question is repeated unchanged: as a query again it reads the same.
        out[2] &= 0x7f;
        let again = dns::parse_query(&out).expect("the repeated question parses");
        assert_eq!((again.name, again.qtype, again.qclass, again.end), (q.name, q.qtype, q.qclass, q.end));
    }
    if let Ok(a) = dns::parse_answer(msg) {
        let ancount = u16::from_be_bytes([msg[6], msg[7]]) as usize;
        assert!(a.a_records.len() <= ancount);
        assert!(a.rcode <= 0x0f);
        let mut copy = msg.to_vec();
        let id = a.id.wrapping_add(1);
        dns::set_id(&mut copy, id);
        let b = dns::parse_answer(&copy).expect("an answer under a new id still parses");
        assert_eq!((b.id, b.rcode, &b.a_records), (id, a.rcode, &a.a_records));
        assert_eq!(dns::is_truncated(&copy), dns::is_truncated(msg));
        for r in &a.a_records {
            let ttl = dns::binding_ttl(r.ttl).as_secs();
            assert!((60..=360).contains(&ttl));
        }
    }
    let _ = dns::is_truncated(msg);
});
