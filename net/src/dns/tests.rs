//! The DNS wire format on captured bytes: queries and answers produced by
//! dnspython 2.9 (`dns.message.make_query`/`make_response`, to_wire), and an
//! NXDOMAIN this host's resolver really sent.
use super::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// `make_query("pkgs.example.org", "A", use_edns=0, payload=1232)`, id 0xbeef.
const QUERY_A: &str = "beef0100000100000000000104706b6773076578616d706c65036f7267000001000100002904d0000000000000";
/// Its answer: a CNAME to cdn.example.net (TTL 300), then two A records of it
/// (TTL 30) through compression pointers, and the OPT record.
const ANSWER_A: &str = "beef8100000100030000000104706b6773076578616d706c65036f72670000010001c00c000500010000012c00110363646e076578616d706c65036e657400c02e000100010000001e0004cb00710ac02e000100010000001e0004cb00710b0000292000000000000000";
/// `make_query("Pkgs.Example.ORG", "AAAA")`, id 0x0a0a (no EDNS).
const QUERY_AAAA: &str = "0a0a0100000100000000000004506b6773074578616d706c65034f524700001c0001";
/// `make_query("pkgs.example.org", "HTTPS", use_edns=0)`, id 0x0b0b.
const QUERY_HTTPS: &str = "0b0b0100000100000000000104706b6773076578616d706c65036f7267000041000100002904d0000000000000";
/// What this host's resolver answered to an A query for crates.io: NXDOMAIN.
const UPSTREAM_NXDOMAIN: &str = "1234818300010000000000000663726174657302696f0000010001";

#[test]
fn parses_the_question_of_real_queries() {
    let q = parse_query(&hex(QUERY_A)).unwrap();
    assert_eq!((q.id, q.name.as_str(), q.qtype, q.qclass), (0xbeef, "pkgs.example.org", TYPE_A, CLASS_IN));
    assert!(q.recursion_desired);
    assert_eq!(q.end, 12 + 18 + 4);
    let q = parse_query(&hex(QUERY_AAAA)).unwrap();
    assert_eq!((q.name.as_str(), q.qtype), ("pkgs.example.org", TYPE_AAAA), "names are lower-cased");
    assert_eq!(parse_query(&hex(QUERY_HTTPS)).unwrap().qtype, TYPE_HTTPS);
}

#[test]
fn nxdomain_and_empty_replies_repeat_the_question_only() {
    let query = hex(QUERY_A);
    let q = parse_query(&query).unwrap();
    let mut out = Vec::new();
    reply(&query, &q, RCODE_NXDOMAIN, &mut out);
    assert_eq!(&out[..12], &[0xbe, 0xef, 0x81, 0x83, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&out[12..], &query[12..q.end], "question copied, OPT record dropped");
    let a = parse_answer(&out).unwrap();
    assert_eq!((a.id, a.rcode, a.a_records.len()), (0xbeef, RCODE_NXDOMAIN, 0));

    reply(&query, &q, RCODE_NOERROR, &mut out);
    let a = parse_answer(&out).unwrap();
    assert_eq!((a.rcode, a.a_records.len()), (RCODE_NOERROR, 0));
}

#[test]
fn reads_a_records_through_cnames_and_compression() {
    let a = parse_answer(&hex(ANSWER_A)).unwrap();
    assert_eq!((a.id, a.rcode), (0xbeef, RCODE_NOERROR));
    assert_eq!(
        a.a_records,
        [
            ARecord { addr: Ipv4Addr::new(203, 0, 113, 10), ttl: 30 },
            ARecord { addr: Ipv4Addr::new(203, 0, 113, 11), ttl: 30 }
        ]
    );
    let nx = parse_answer(&hex(UPSTREAM_NXDOMAIN)).unwrap();
    assert_eq!((nx.id, nx.rcode, nx.a_records.len()), (0x1234, RCODE_NXDOMAIN, 0));
}

#[test]
fn rejects_what_it_cannot_trust() {
    assert_eq!(parse_query(&hex(ANSWER_A)), Err(DnsError::NotAQuery));
    assert_eq!(parse_answer(&hex(QUERY_A)), Err(DnsError::NotAResponse));
    let query = hex(QUERY_A);
    for cut in [5, 12, 20, 31] {
        assert!(parse_query(&query[..cut]).is_err(), "cut at {cut}");
    }
    let answer = hex(ANSWER_A);
    assert_eq!(parse_answer(&answer[..60]), Err(DnsError::Truncated));
    // A pointer to itself in the answer's first name.
    let mut looped = answer.clone();
    looped[34] = 0xc0;
    looped[35] = 34;
    assert!(matches!(parse_answer(&looped), Err(DnsError::BadName(_))));
    // A dot inside a label ("p.gs" as one label) is refused.
    let mut dotted = query.clone();
    dotted[14] = b'.';
    assert!(matches!(parse_query(&dotted), Err(DnsError::BadName(_))));
    // Two questions.
    let mut two = query;
    two[5] = 2;
    assert_eq!(parse_query(&two), Err(DnsError::QuestionCount(2)));
}

#[test]
fn ids_are_rewritten_and_ttls_clamped() {
    let mut m = hex(QUERY_A);
    set_id(&mut m, 0x0102);
    assert_eq!(parse_query(&m).unwrap().id, 0x0102);
    assert_eq!(binding_ttl(0), Duration::from_secs(60));
    assert_eq!(binding_ttl(30), Duration::from_secs(90));
    assert_eq!(binding_ttl(3600), Duration::from_secs(360));
    assert_eq!(binding_ttl(u32::MAX), Duration::from_secs(360));
}

#[test]
fn truncation_is_read_from_responses_only() {
    let mut answer = hex(ANSWER_A);
    assert!(!is_truncated(&answer), "a full answer");
    answer[2] |= 0x02;
    assert!(is_truncated(&answer), "TC set");
    let mut query = hex(QUERY_A);
    query[2] |= 0x02;
    assert!(!is_truncated(&query), "TC on a query means nothing");
    assert!(!is_truncated(&answer[..HEADER_LEN - 1]), "shorter than a header");
}

/// Found by the dns fuzz target: a compression pointer into the header read
/// the id as a label, so the same answer parsed or not depending on its id.
#[test]
fn pointers_into_the_header_are_malformed() {
    let mut msg = vec![0x00, 0x03, 0x81, 0x80, 0, 0, 0, 1, 0, 0, 0, 0];
    // An A record whose name points at offset 0 (the id: a 0 label, then 3).
    msg.extend_from_slice(&[0xc0, 0x00, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1]);
    assert_eq!(parse_answer(&msg), Err(DnsError::BadName("compression loop or pointer out of range")));
}
