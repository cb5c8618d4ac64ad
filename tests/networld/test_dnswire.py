"""The test resolver's wire format on fixed bytes (no network, no root)."""
import socket
import struct

import pytest

from networld import addresses as A
from networld import dnswire, payload

# dig's query for example.com A: id 0xabcd, RD+AD, one question, one EDNS OPT record.
DIG_QUERY = bytes.fromhex("abcd01200001000000000001" "076578616d706c6503636f6d00" "00010001"
                          "0000291000000000000000")
# A resolver's answer: allowed.test A 203.0.113.10 TTL 5, the name compressed to offset 12.
ANSWER = bytes.fromhex("1234818000010001000000000" "7616c6c6f77656404746573740000010001"
                       "c00c000100010000000500" "04cb00710a")


def test_parses_a_dig_query_with_edns():
    qid, flags, name, qtype, qclass, end = dnswire.parse_query(DIG_QUERY)
    assert (qid, flags, name, qtype, qclass) == (0xABCD, 0x0120, "example.com", 1, 1)
    assert end == 12 + 13 + 4


def test_unknown_name_is_nxdomain_echoing_the_question():
    resp = dnswire.answer(DIG_QUERY, A.RECORDS, A.TTL)
    qid, flags, qd, an = struct.unpack("!HHHH", resp[:8])
    assert qid == 0xABCD and flags & 0x8000 and flags & 0xF == dnswire.RCODE_NXDOMAIN
    assert (qd, an) == (1, 0)
    assert resp[12:] == DIG_QUERY[12:12 + 17]


def test_known_name_answers_its_record_and_ttl():
    q = dnswire.build_query("B.C.Wild.Test.", qid=7)
    resp = dnswire.answer(q, A.RECORDS, A.TTL)
    assert dnswire.parse_answer(resp) == (7, 0, [(A.WILD_BC, A.TTL)])


def test_aaaa_of_a_known_name_is_nodata():
    resp = dnswire.answer(dnswire.build_query("allowed.test", qtype=dnswire.TYPE_AAAA), A.RECORDS, A.TTL)
    assert dnswire.parse_answer(resp) == (0x1234, 0, [])


def test_reads_a_compressed_answer():
    assert dnswire.parse_answer(ANSWER) == (0x1234, 0, [("203.0.113.10", 5)])


@pytest.mark.parametrize("bad", [b"", b"\x00" * 11, DIG_QUERY[:20],
                                 bytes.fromhex("0001010000010000000000" "00c00c00010001")])  # pointer loop
def test_garbage_is_formerr_or_dropped(bad):
    resp = dnswire.answer(bad, A.RECORDS, A.TTL)
    if len(bad) < 2:
        assert resp == b""
    else:
        assert resp[:2] == bad[:2] and struct.unpack("!H", resp[2:4])[0] & 0xF == dnswire.RCODE_FORMERR


def test_payload_is_deterministic_and_chunked():
    n = payload.BLOCK_SIZE + 123
    data = b"".join(bytes(c) for c in payload.chunks(n))
    assert len(data) == n and data[payload.BLOCK_SIZE:] == payload.BLOCK[:123]
    import hashlib
    assert payload.digest(n) == hashlib.sha256(data).hexdigest()
    assert socket.inet_aton(A.WEB_A)  # the table holds addresses
