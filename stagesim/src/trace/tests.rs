//! Tests of the trace format: encoding byte by byte, round trips, errors
//! with offsets, the sidecar, and proptests over arbitrary bytes and records.

use super::*;
use proptest::prelude::*;

fn raw(records: &[Record]) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    for r in records {
        r.encode(&mut v);
    }
    v
}

fn read_all(bytes: &[u8]) -> Result<Vec<Record>, TraceError> {
    let mut r = RecordReader::new(bytes);
    let mut out = Vec::new();
    while let Some(rec) = r.next_record()? {
        out.push(rec);
    }
    Ok(out)
}

fn sample() -> Vec<Record> {
    vec![
        Record::Thread(7),
        Record::Stage(2),
        Record::Fetch {
            addr: 0xffff_8000_0000_1234,
            bytes: 17,
            instrs: 4,
        },
        Record::Load {
            addr: 0x7fff_0000_0010,
            size: 8,
        },
        Record::Store { addr: 42, size: 1 },
        Record::Stage(NO_STAGE),
        Record::Thread(u32::MAX),
    ]
}

#[test]
fn encoding_matches_the_spec_bytes() {
    let mut v = Vec::new();
    Record::Fetch {
        addr: 0x0102030405060708,
        bytes: 0x0a09,
        instrs: 0x0c0b,
    }
    .encode(&mut v);
    assert_eq!(v, [2, 8, 7, 6, 5, 4, 3, 2, 1, 9, 10, 11, 12]);
    v.clear();
    Record::Thread(0x01020304).encode(&mut v);
    Record::Stage(0xFFFF).encode(&mut v);
    Record::Store { addr: 1, size: 4 }.encode(&mut v);
    assert_eq!(
        v,
        [1, 4, 3, 2, 1, 5, 0xff, 0xff, 4, 1, 0, 0, 0, 0, 0, 0, 0, 4]
    );
}

#[test]
fn compressed_round_trip() {
    let mut w = TraceWriter::new(Vec::new(), 3).unwrap();
    for r in sample() {
        w.record(r).unwrap();
    }
    let bytes = w.finish().unwrap();
    let mut r = RecordReader::from_compressed(&bytes[..]).unwrap();
    let mut got = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        got.push(rec);
    }
    let mut want = sample();
    want.push(Record::End);
    assert_eq!(got, want);
}

#[test]
fn errors_name_the_offset() {
    let e = read_all(b"STGTRC02").unwrap_err().to_string();
    assert!(e.contains("byte offset 0: bad magic"), "{e}");
    let e = read_all(b"STG").unwrap_err().to_string();
    assert!(e.contains("bad magic \"STG\""), "{e}");
    let mut v = raw(&[Record::Thread(1)]);
    v.push(0x07);
    let e = read_all(&v).unwrap_err().to_string();
    assert_eq!(e, "byte offset 13: unknown record tag 0x07");
    let mut v = raw(&[Record::Thread(1)]);
    v.extend_from_slice(&[TAG_FETCH, 1, 2, 3]);
    let e = read_all(&v).unwrap_err().to_string();
    assert_eq!(
        e,
        "byte offset 13: truncated FETCH record (4 of 13 bytes before end of stream)"
    );
    // Not zstd at all.
    let e = RecordReader::from_compressed(&b"STGTRC01\x01\0\0\0\0"[..])
        .and_then(|mut r| r.next_record())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("byte offset 0: "), "{e}");
}

#[test]
fn end_stops_reading_and_eof_ends_too() {
    let mut v = raw(&[Record::Thread(1), Record::End]);
    v.push(0xEE); // after END: ignored
    assert_eq!(read_all(&v).unwrap(), [Record::Thread(1), Record::End]);
    assert_eq!(read_all(MAGIC).unwrap(), []);
}

#[test]
fn sidecar_ignores_unknown_keys_and_rejects_duplicates() {
    let s = Sidecar::parse(
        "workload = \"oltp\"\n[[stage]]\nid = 3\nname = \"parse\"\nsymbols = [\"a\"]\n",
        "x",
    )
    .unwrap();
    assert_eq!(
        s.stages,
        [StageEntry {
            id: 3,
            name: "parse".into(),
            symbols: vec!["a".into()],
        }]
    );
    assert!(Sidecar::parse(
        "[[stage]]\nid=1\nname=\"a\"\n[[stage]]\nid=1\nname=\"b\"",
        "x"
    )
    .is_err());
    assert!(Sidecar::parse("[[stage]]\nname=\"a\"", "x").is_err());
    assert_eq!(
        Sidecar::path_for(Path::new("/t/a.stz")),
        Path::new("/t/a.stz.stages.toml")
    );
}

fn arb_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        any::<u32>().prop_map(Record::Thread),
        (any::<u64>(), any::<u16>(), any::<u16>()).prop_map(|(addr, bytes, instrs)| {
            Record::Fetch {
                addr,
                bytes,
                instrs,
            }
        }),
        (any::<u64>(), any::<u8>()).prop_map(|(addr, size)| Record::Load { addr, size }),
        (any::<u64>(), any::<u8>()).prop_map(|(addr, size)| Record::Store { addr, size }),
        any::<u16>().prop_map(Record::Stage),
    ]
}

proptest! {
    #[test]
    fn arbitrary_raw_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), magic in any::<bool>()) {
        let mut v = if magic { MAGIC.to_vec() } else { Vec::new() };
        v.extend_from_slice(&bytes);
        // Errors are fine; every error names an offset inside the input.
        if let Err(e) = read_all(&v) {
            let s = e.to_string();
            prop_assert!(s.starts_with("byte offset "));
            if let TraceError::UnknownTag { offset, .. } | TraceError::Truncated { offset, .. } = e {
                prop_assert!((offset as usize) < v.len());
            }
        }
    }

    #[test]
    fn arbitrary_compressed_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(mut r) = RecordReader::from_compressed(&bytes[..]) {
            for _ in 0..1000 {
                match r.next_record() {
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
        }
    }

    #[test]
    fn records_round_trip(recs in proptest::collection::vec(arb_record(), 0..100)) {
        let mut w = TraceWriter::new(Vec::new(), 1).unwrap();
        for r in &recs {
            w.record(*r).unwrap();
        }
        let bytes = w.finish().unwrap();
        let mut r = RecordReader::from_compressed(&bytes[..]).unwrap();
        let mut got = Vec::new();
        while let Some(rec) = r.next_record().unwrap() {
            got.push(rec);
        }
        let mut want = recs.clone();
        want.push(Record::End);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn truncation_is_reported_at_the_last_record(recs in proptest::collection::vec(arb_record(), 1..30), cut in 1usize..12) {
        let v = raw(&recs);
        let last_len = {
            let mut t = Vec::new();
            recs[recs.len() - 1].encode(&mut t);
            t.len()
        };
        prop_assume!(cut < last_len);
        let v = &v[..v.len() - cut];
        match read_all(v) {
            Err(TraceError::Truncated { offset, have, need, .. }) => {
                prop_assert_eq!(offset as usize, v.len() - (last_len - cut));
                prop_assert_eq!(have, last_len - cut);
                prop_assert_eq!(need, last_len);
            }
            other => prop_assert!(false, "{:?}", other.map(|r| r.len())),
        }
    }
}
