//! Property tests: no byte string makes the decoder panic or buffer past its cap.

use bytes::{BufMut, BytesMut};
use fastcp_proto::{Decoder, Frame, HEADER_LEN, encode};
use proptest::prelude::*;

const CAP: u32 = 64 << 10;

/// Feeds `input` in pieces of `step` bytes and decodes until an error or the end.
fn feed(input: &[u8], step: usize) {
    let mut decoder = Decoder::new(CAP);
    let mut buf = BytesMut::new();
    for piece in input.chunks(step.max(1)) {
        buf.put_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    // Whatever decodes re-encodes to a frame the decoder accepts again.
                    let mut again = BytesMut::new();
                    encode(&frame, &mut again);
                    assert_eq!(Decoder::new(CAP).decode(&mut again).unwrap(), Some(frame));
                }
                Ok(None) => break,
                Err(_) => return,
            }
            // The decoder never reserves room past one capped frame beyond what it was given.
            assert!(buf.capacity() <= input.len() + HEADER_LEN + CAP as usize);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn random_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..4096), step in 1usize..64) {
        feed(&input, step);
    }

    #[test]
    fn random_payloads_behind_valid_headers_never_panic(
        kind in prop::sample::select(vec![0x01u8, 0x02, 0x03, 0x04, 0x05, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x21]),
        payload in proptest::collection::vec(any::<u8>(), 0..512),
        claimed in prop::option::of(any::<u32>()),
    ) {
        let mut input = vec![kind];
        input.extend_from_slice(&claimed.unwrap_or(payload.len() as u32).to_be_bytes());
        input.extend_from_slice(&payload);
        feed(&input, 7);
    }

    #[test]
    fn huge_claimed_lengths_are_refused_up_front(kind in 0x01u8..0x22, len in (CAP + 1)..=u32::MAX) {
        let mut buf = BytesMut::new();
        buf.put_u8(kind);
        buf.put_u32(len);
        prop_assert!(Decoder::new(CAP).decode(&mut buf).is_err());
        prop_assert!(buf.capacity() < CAP as usize);
    }
}

#[test]
fn a_stream_of_frames_decodes_in_order() {
    let frames: Vec<Frame> = (0..100)
        .map(|i| {
            Frame::Data(fastcp_proto::Data {
                id: i,
                offset: i * 10,
                bytes: vec![i as u8; i as usize * 37].into(),
            })
        })
        .collect();
    let mut wire = BytesMut::new();
    for f in &frames {
        encode(f, &mut wire);
    }
    let mut decoder = Decoder::new(CAP);
    let mut out = Vec::new();
    while let Some(f) = decoder.decode(&mut wire).unwrap() {
        out.push(f);
    }
    assert_eq!(out, frames);
}
