//! The sealed TCP transport: record layer attacks, and joins on 127.0.0.1.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::BytesMut;
use fastcp_crypto::{
    CipherSuite, Direction, JoinKind, KeyConfig, Provider, SessionSecret, join_proof,
};
use fastcp_proto::{Frame, Join};
use fastcp_transport::tcp::{
    self, Error, Joined, MAX_RECORD_LEN, RecordError, Rejection, SealedStream, TcpConfig,
    TcpRendezvous,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A small deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn keys(suite: CipherSuite) -> KeyConfig {
    KeyConfig::new(suite, Provider::fastest_for(suite))
}

fn secret() -> SessionSecret {
    SessionSecret::from_bytes([7; 32])
}

fn sealed<S>(inner: S, secret: &SessionSecret, sends: Direction, index: u16) -> SealedStream<S> {
    SealedStream::new(
        inner,
        secret,
        &keys(CipherSuite::Aes128Gcm),
        sends,
        index,
        1 << 16,
    )
    .unwrap()
}

/// The wire bytes of a client-to-server stream 1 carrying `records`, one record each,
/// followed by the end record when `end` is set.
async fn wire(records: &[&[u8]], end: bool) -> Vec<u8> {
    let mut w = sealed(Vec::new(), &secret(), Direction::ClientToServer, 1);
    for r in records {
        w.write_all(r).await.unwrap();
        w.flush().await.unwrap();
    }
    if end {
        w.shutdown().await.unwrap();
    }
    w.get_ref().clone()
}

/// Where each record of `wire` starts and ends, from the headers.
fn record_spans(wire: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let word = u32::from_be_bytes(wire[at..at + 4].try_into().unwrap());
        let end = at + 4 + (word & 0x7fff_ffff) as usize + 16;
        spans.push(at..end);
        at = end;
    }
    spans
}

/// Reads `wire` as server-side stream `index` with `secret`, both ways a stream can be read
/// (which must agree): what came out before the first error, and how it ended.
async fn read_all(wire: &[u8], secret: &SessionSecret, index: u16) -> (Vec<u8>, io::Result<()>) {
    let (got, end) = read_bytes(wire, secret, index).await;
    let (records, record_end) = read_records(wire, secret, index).await;
    assert_eq!(records, got, "both read paths return the same bytes");
    match (&end, &record_end) {
        (Ok(()), Ok(())) => {}
        (Err(a), Err(b)) => {
            assert_eq!(a.kind(), b.kind());
            assert_eq!(a.to_string(), b.to_string());
        }
        _ => panic!("the read paths end differently: {end:?} and {record_end:?}"),
    }
    (got, end)
}

/// [`read_all`] through `AsyncRead`, in small reads.
async fn read_bytes(wire: &[u8], secret: &SessionSecret, index: u16) -> (Vec<u8>, io::Result<()>) {
    let mut r = sealed(wire, secret, Direction::ServerToClient, index);
    let mut got = Vec::new();
    let mut buf = [0u8; 1000];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => {
                // Poisoned: the same error again, and still nothing more.
                let again = r.read(&mut buf).await.unwrap_err();
                assert_eq!(again.kind(), e.kind());
                assert_eq!(again.to_string(), e.to_string());
                return (got, Err(e));
            }
        }
    }
}

/// [`read_all`] through `read_record`, which must leave the buffer as it was on an error.
async fn read_records(
    wire: &[u8],
    secret: &SessionSecret,
    index: u16,
) -> (Vec<u8>, io::Result<()>) {
    let mut r = sealed(wire, secret, Direction::ServerToClient, index);
    let mut buf = BytesMut::new();
    loop {
        let before = buf.len();
        match r.read_record(&mut buf).await {
            Ok(0) => return (buf.to_vec(), Ok(())),
            Ok(n) => assert_eq!(buf.len(), before + n),
            Err(e) => {
                assert_eq!(buf.len(), before, "a failed record leaves nothing behind");
                let again = r.read_record(&mut buf).await.unwrap_err();
                assert_eq!(again.to_string(), e.to_string());
                assert_eq!(buf.len(), before);
                return (buf.to_vec(), Err(e));
            }
        }
    }
}

fn record_error(e: &io::Error) -> &RecordError {
    RecordError::from_io(e).unwrap_or_else(|| panic!("not a record error: {e:?}"))
}

#[tokio::test]
async fn clean_round_trip_through_records() {
    let (got, end) = read_all(&wire(&[b"first", b"second", b""], true).await, &secret(), 1).await;
    end.unwrap();
    assert_eq!(got, b"firstsecond");
    // Only a shutdown with nothing written: an empty stream, cleanly ended.
    let (got, end) = read_all(&wire(&[], true).await, &secret(), 1).await;
    end.unwrap();
    assert!(got.is_empty());
}

/// Several MiB both ways at once over a small in-memory pipe, with random write and read
/// sizes, for each suite and for record sizes from 1 byte to the maximum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_random_sizes_both_directions() {
    for (suite, record_len, size) in [
        (CipherSuite::Aes128Gcm, 1 << 16, 6 << 20),
        (CipherSuite::ChaCha20Poly1305, 256 << 10, 6 << 20),
        (CipherSuite::Aes256Gcm, MAX_RECORD_LEN, 5 << 20),
        (CipherSuite::Aes128Gcm, 1000, 1 << 20),
        (CipherSuite::ChaCha20Poly1305, 1, 20_000),
    ] {
        let secret = SessionSecret::generate().unwrap();
        let k = keys(suite);
        let (a, b) = tokio::io::duplex(50_000);
        let a =
            SealedStream::new(a, &secret, &k, Direction::ClientToServer, 3, record_len).unwrap();
        let b =
            SealedStream::new(b, &secret, &k, Direction::ServerToClient, 3, record_len).unwrap();
        let up = Rng(size as u64).bytes(size);
        let down = Rng(!(size as u64)).bytes(size / 2 + 17);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let t1 = tokio::spawn(pump(aw, up.clone(), 1));
        let t2 = tokio::spawn(pump(bw, down.clone(), 2));
        let t3 = tokio::spawn(drain(br, 3));
        let t4 = tokio::spawn(drain(ar, 4));
        t1.await.unwrap();
        t2.await.unwrap();
        assert!(
            t3.await.unwrap() == up,
            "{suite} {record_len}: upstream differs"
        );
        assert!(
            t4.await.unwrap() == down,
            "{suite} {record_len}: downstream differs"
        );
    }
}

async fn pump<W: AsyncWrite + Unpin>(mut w: W, data: Vec<u8>, seed: u64) {
    let mut rng = Rng(seed);
    let mut at = 0;
    while at < data.len() {
        let n = (1 + rng.below(300_000)).min(data.len() - at);
        w.write_all(&data[at..at + n]).await.unwrap();
        if rng.below(8) == 0 {
            w.flush().await.unwrap();
        }
        at += n;
    }
    w.shutdown().await.unwrap();
}

async fn drain<R: AsyncRead + Unpin>(mut r: R, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 400_000];
    loop {
        let want = 1 + rng.below(buf.len());
        match r.read(&mut buf[..want]).await.unwrap() {
            0 => return got,
            n => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Flipping any bit of the second record (header, ciphertext or tag) fails the stream, and
/// no byte of that record comes out.
#[tokio::test]
async fn altered_record_fails_and_returns_none_of_it() {
    let first = vec![1u8; 3000];
    let second = vec![2u8; 100];
    let clean = wire(&[&first, &second], true).await;
    let spans = record_spans(&clean);
    assert_eq!(spans.len(), 3);
    for pos in spans[1].clone() {
        for bit in [0, 7] {
            let mut bad = clean.clone();
            bad[pos] ^= 1 << bit;
            let (got, end) = read_all(&bad, &secret(), 1).await;
            let err = end.expect_err("an altered record must fail");
            assert_eq!(
                got, first,
                "byte {pos} bit {bit}: only the first record comes out"
            );
            let rec = record_error(&err);
            if pos >= spans[1].start + 4 {
                assert_eq!(rec, &RecordError::Authentication { stream: 1 });
                assert_eq!(err.kind(), io::ErrorKind::InvalidData);
                assert_eq!(
                    err.to_string(),
                    "data stream 1: authentication failed: the data was altered in transit"
                );
            }
        }
    }
}

/// `read_record` takes up where `poll_read` left a record, and goes on record by record.
#[tokio::test]
async fn the_read_paths_mix() {
    let clean = wire(&[b"first", b"second", b"third"], true).await;
    let mut r = sealed(&clean[..], &secret(), Direction::ServerToClient, 1);
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"fi");
    let mut buf = BytesMut::new();
    assert_eq!(r.read_record(&mut buf).await.unwrap(), 3);
    assert_eq!(r.read_record(&mut buf).await.unwrap(), 6);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).await.unwrap();
    assert_eq!((&buf[..], &rest[..]), (&b"rstsecond"[..], &b"third"[..]));
}

/// A `read_record` dropped in the middle of a record leaves the buffer as it was and the
/// stream failed: the record's bytes are gone from the connection, so nothing after them
/// could be trusted to line up.
#[tokio::test]
async fn a_record_read_cancelled_midway_fails_the_stream() {
    let clean = wire(&[&[9u8; 5000]], true).await;
    let (mut tx, rx) = tokio::io::duplex(1 << 16);
    tx.write_all(&clean[..2000]).await.unwrap();
    let mut r = sealed(rx, &secret(), Direction::ServerToClient, 1);
    let mut buf = BytesMut::from(&b"kept"[..]);
    let cut = tokio::time::timeout(Duration::from_millis(50), r.read_record(&mut buf)).await;
    assert!(cut.is_err(), "the record is not all there yet");
    assert_eq!(&buf[..], b"kept");
    tx.write_all(&clean[2000..]).await.unwrap();
    let err = r.read_record(&mut buf).await.unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    assert_eq!(&buf[..], b"kept");
}

#[tokio::test]
async fn replayed_record_fails() {
    let clean = wire(&[b"pay 10", b"then stop"], true).await;
    let spans = record_spans(&clean);
    let mut bad = clean[..spans[0].end].to_vec();
    bad.extend_from_slice(&clean[spans[0].clone()]);
    bad.extend_from_slice(&clean[spans[1].start..]);
    let (got, end) = read_all(&bad, &secret(), 1).await;
    assert_eq!(got, b"pay 10");
    assert_eq!(
        record_error(&end.unwrap_err()),
        &RecordError::Authentication { stream: 1 }
    );
}

#[tokio::test]
async fn reordered_records_fail() {
    let clean = wire(&[b"one", b"two"], true).await;
    let spans = record_spans(&clean);
    let mut bad = clean[spans[1].clone()].to_vec();
    bad.extend_from_slice(&clean[spans[0].clone()]);
    bad.extend_from_slice(&clean[spans[2].clone()]);
    let (got, end) = read_all(&bad, &secret(), 1).await;
    assert!(got.is_empty());
    assert_eq!(
        record_error(&end.unwrap_err()),
        &RecordError::Authentication { stream: 1 }
    );
}

#[tokio::test]
async fn dropped_record_fails() {
    let clean = wire(&[b"one", b"two", b"three"], true).await;
    let spans = record_spans(&clean);
    let mut bad = clean[spans[0].clone()].to_vec();
    bad.extend_from_slice(&clean[spans[2].start..]);
    let (got, end) = read_all(&bad, &secret(), 1).await;
    assert_eq!(got, b"one");
    assert_eq!(
        record_error(&end.unwrap_err()),
        &RecordError::Authentication { stream: 1 }
    );
}

/// Cut anywhere: inside a record it is truncation, between records a missing end; never a
/// clean end of stream, and never a byte of the cut record.
#[tokio::test]
async fn truncation_anywhere_is_an_error() {
    let clean = wire(&[b"alpha", b"beta"], true).await;
    let spans = record_spans(&clean);
    for cut in 0..clean.len() {
        let (got, end) = read_all(&clean[..cut], &secret(), 1).await;
        let err = end.expect_err("a cut stream must not end cleanly");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        let whole = spans.iter().filter(|s| s.end <= cut).count();
        let expected: &[u8] = match whole {
            0 => b"",
            1 => b"alpha",
            _ => b"alphabeta",
        };
        assert_eq!(got, expected, "cut at {cut}");
        let rec = record_error(&err);
        if spans.iter().any(|s| s.end == cut) || cut == 0 {
            assert_eq!(
                rec,
                &RecordError::Unterminated { stream: 1 },
                "cut at {cut}"
            );
        } else {
            assert_eq!(rec, &RecordError::Truncated { stream: 1 }, "cut at {cut}");
        }
    }
}

#[tokio::test]
async fn wrong_key_direction_or_stream_fails() {
    let clean = wire(&[b"secret data"], true).await;
    // Another session's secret.
    let (got, end) = read_all(&clean, &SessionSecret::from_bytes([8; 32]), 1).await;
    assert!(got.is_empty());
    assert_eq!(
        record_error(&end.unwrap_err()),
        &RecordError::Authentication { stream: 1 }
    );
    // The same session, another stream.
    let (got, end) = read_all(&clean, &secret(), 2).await;
    assert!(got.is_empty());
    assert_eq!(
        record_error(&end.unwrap_err()),
        &RecordError::Authentication { stream: 2 }
    );
    // Reflected back to the end that sealed it (it opens the other direction).
    let mut r = sealed(&clean[..], &secret(), Direction::ClientToServer, 1);
    let err = r.read_to_end(&mut Vec::new()).await.unwrap_err();
    assert_eq!(
        record_error(&err),
        &RecordError::Authentication { stream: 1 }
    );
    // Another suite.
    let mut r = SealedStream::new(
        &clean[..],
        &secret(),
        &keys(CipherSuite::ChaCha20Poly1305),
        Direction::ServerToClient,
        1,
        1 << 16,
    )
    .unwrap();
    let err = r.read_to_end(&mut Vec::new()).await.unwrap_err();
    assert_eq!(
        record_error(&err),
        &RecordError::Authentication { stream: 1 }
    );
}

#[tokio::test]
async fn oversized_header_is_refused_before_reading_the_body() {
    for word in [MAX_RECORD_LEN as u32 + 1, 0x7fff_ffff, 0xffff_ffff] {
        let bad = word.to_be_bytes();
        let (got, end) = read_all(&bad, &secret(), 1).await;
        assert!(got.is_empty());
        let err = end.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(matches!(record_error(&err), RecordError::TooLong { len, .. } if *len == word));
    }
}

/// An end record with data (properly sealed, so only a broken peer could send it).
#[tokio::test]
async fn end_record_with_data_is_refused() {
    let mut sealer = secret()
        .sealer(&keys(CipherSuite::Aes128Gcm), Direction::ClientToServer, 1)
        .unwrap();
    let header = (3u32 | 1 << 31).to_be_bytes();
    let mut body = b"abc".to_vec();
    sealer.seal_record(&header, &mut body).unwrap();
    let mut bad = header.to_vec();
    bad.extend_from_slice(&body);
    let (got, end) = read_all(&bad, &secret(), 1).await;
    assert!(got.is_empty());
    assert_eq!(
        record_error(&end.unwrap_err()),
        &RecordError::BadEnd { stream: 1, len: 3 }
    );
}

#[tokio::test]
async fn write_after_shutdown_fails() {
    let mut w = sealed(Vec::new(), &secret(), Direction::ClientToServer, 1);
    w.write_all(b"x").await.unwrap();
    w.shutdown().await.unwrap();
    let err = w.write_all(b"y").await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(record_error(&err), &RecordError::Closed { stream: 1 });
    let err = w.write_sealed(&mut [1, 2, 3]).await.unwrap_err();
    assert_eq!(record_error(&err), &RecordError::Closed { stream: 1 });
}

/// Buffered writes and buffers sealed in place, mixed: the reader gets every byte in order,
/// each sealed buffer as whole records of at most the record size after a record of what
/// was buffered before it, and the sealed buffers hold ciphertext.
#[tokio::test]
async fn sealed_in_place_writes_mix_with_buffered_ones() {
    let mut rng = Rng(11);
    let mut w = sealed(Vec::new(), &secret(), Direction::ClientToServer, 1);
    let mut expected = Vec::new();
    let mut records = 0;
    for round in 0..20 {
        let n = rng.below(3000);
        let small = rng.bytes(n);
        w.write_all(&small).await.unwrap();
        expected.extend_from_slice(&small);
        let n = 1 + rng.below(200_000);
        let plain = rng.bytes(n);
        let mut data = plain.clone();
        let before = w.get_ref().len();
        w.write_sealed(&mut data).await.unwrap();
        assert_ne!(data, plain, "round {round}: sealed in place");
        expected.extend_from_slice(&plain);
        let spans = record_spans(&w.get_ref()[before..]);
        let buffered = usize::from(!small.is_empty());
        assert_eq!(
            spans.len(),
            buffered + plain.len().div_ceil(1 << 16),
            "round {round}"
        );
        records += spans.len();
    }
    w.shutdown().await.unwrap();
    let wire = w.get_ref().clone();
    assert_eq!(record_spans(&wire).len(), records + 1);
    let (got, end) = read_all(&wire, &secret(), 1).await;
    end.unwrap();
    assert!(got == expected);
}

/// Writes buffer up to a record: nothing reaches the wire before a record fills or a flush.
#[tokio::test]
async fn writes_are_gathered_into_records() {
    let mut w = sealed(Vec::new(), &secret(), Direction::ClientToServer, 1);
    for _ in 0..100 {
        w.write_all(&[5; 100]).await.unwrap();
    }
    assert!(w.get_ref().is_empty());
    w.flush().await.unwrap();
    assert_eq!(record_spans(w.get_ref()).len(), 1);
    w.write_all(&vec![6; (1 << 16) * 2 + 1]).await.unwrap();
    w.shutdown().await.unwrap();
    // 1 record + 3 records (64 KiB, 64 KiB, 1 byte) + the end record.
    assert_eq!(record_spans(w.get_ref()).len(), 5);
}

// ---------------------------------------------------------------------------------------
// Joining over TCP on 127.0.0.1.

fn quick() -> TcpConfig {
    let mut c = TcpConfig::default();
    c.join_timeout = Duration::from_millis(300);
    c.connect_timeout = Duration::from_secs(2);
    c
}

async fn rendezvous() -> (TcpRendezvous, SocketAddr) {
    let r = TcpRendezvous::bind(LOCALHOST, None, quick()).unwrap();
    let addr = r.local_addr();
    (r, addr)
}

type Accepted = tokio::task::JoinHandle<Result<Joined, Error>>;

fn spawn_accept(r: TcpRendezvous, n: u16, secret: &SessionSecret, suite: CipherSuite) -> Accepted {
    let secret = secret.clone();
    tokio::spawn(async move {
        r.accept(n, &secret, &keys(suite), Duration::from_secs(10))
            .await
    })
}

/// Connects by hand: reads the challenge and returns it with the connection.
async fn raw_challenge(addr: SocketAddr) -> (TcpStream, [u8; 32]) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 37];
    conn.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf[0], fastcp_proto::kind::CHALLENGE);
    (conn, buf[5..].try_into().unwrap())
}

fn join_bytes(index: u16, proof: [u8; 32]) -> BytesMut {
    let mut out = BytesMut::new();
    fastcp_proto::encode(&Frame::Join(Join { index, proof }), &mut out);
    out
}

fn rejection(result: Result<Joined, Error>) -> Rejection {
    match result {
        Err(Error::Rejected { reason, .. }) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// What the server refused while the session joined, once the real client has joined too.
async fn refused_then_joined(
    server: Accepted,
    addr: SocketAddr,
    secret: &SessionSecret,
    n: u16,
) -> Vec<Rejection> {
    let _client = tcp::connect(addr, n, secret, &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap();
    let joined = server.await.unwrap().unwrap();
    assert_eq!(joined.streams.len(), usize::from(n));
    assert_eq!(joined.refused_count, joined.refused.len());
    joined.refused.into_iter().map(|(_, why)| why).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_joins_both_suites() {
    for suite in [CipherSuite::Aes128Gcm, CipherSuite::ChaCha20Poly1305] {
        let secret = SessionSecret::generate().unwrap();
        let (r, addr) = rendezvous().await;
        let server = spawn_accept(r, 4, &secret, suite);
        let mut client = tcp::connect(addr, 4, &secret, &keys(suite), &quick())
            .await
            .unwrap();
        let mut server = server.await.unwrap().unwrap().streams;
        assert_eq!(client.len(), 4);
        assert_eq!(server.len(), 4);
        for (i, (c, s)) in client.iter_mut().zip(server.iter_mut()).enumerate() {
            let index = i as u16 + 1;
            assert_eq!((c.index(), s.index()), (index, index));
            let up = Rng(u64::from(index)).bytes(300_000);
            c.write_all(&up).await.unwrap();
            c.shutdown().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            assert!(got == up, "stream {index} upstream");
            s.write_all(format!("reply {index}").as_bytes())
                .await
                .unwrap();
            s.shutdown().await.unwrap();
            let mut got = String::new();
            c.read_to_string(&mut got).await.unwrap();
            assert_eq!(got, format!("reply {index}"));
        }
    }
}

/// The streams' halves work from separate tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_halves() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let client = tcp::connect(addr, 1, &secret, &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap();
    let server = server.await.unwrap().unwrap().streams;
    let (mut cr, mut cw) = client.into_iter().next().unwrap().into_split();
    let (mut sr, mut sw) = server.into_iter().next().unwrap().into_split();
    let data = Rng(9).bytes(2 << 20);
    let sent = data.clone();
    let t = tokio::spawn(async move {
        cw.write_all(&sent).await.unwrap();
        cw.shutdown().await.unwrap();
    });
    let echo = tokio::spawn(async move {
        let mut got = Vec::new();
        sr.read_to_end(&mut got).await.unwrap();
        sw.write_all(&got[..1000]).await.unwrap();
        sw.shutdown().await.unwrap();
        got
    });
    let mut back = Vec::new();
    cr.read_to_end(&mut back).await.unwrap();
    t.await.unwrap();
    assert!(echo.await.unwrap() == data);
    assert_eq!(back, data[..1000]);
}

#[tokio::test]
async fn wrong_secret_is_refused_and_the_session_goes_on() {
    let secret = secret();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let other = SessionSecret::from_bytes([9; 32]);
    let client = tcp::connect(addr, 1, &other, &keys(CipherSuite::Aes128Gcm), &quick()).await;
    // The client's side joined (it cannot tell yet); the server drops it, and the client
    // learns at its first read: the connection is gone, not a clean end.
    let mut client = client.unwrap();
    let err = client[0].read_to_end(&mut Vec::new()).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ),
        "{err:?}"
    );
    // The session's own client still joins.
    assert_eq!(
        refused_then_joined(server, addr, &secret, 1).await,
        [Rejection::BadProof { index: 1 }]
    );
}

/// A stranger that connects during the join window with a made-up proof is dropped, and the
/// session's client joins all the same.
#[tokio::test]
async fn foreign_connection_is_dropped_and_the_session_goes_on() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 2, &secret, CipherSuite::Aes128Gcm);
    let (mut conn, _) = raw_challenge(addr).await;
    conn.write_all(&join_bytes(1, [0x42; 32])).await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(conn.read_to_end(&mut rest).await.unwrap_or(0), 0);
    assert_eq!(
        refused_then_joined(server, addr, &secret, 2).await,
        [Rejection::BadProof { index: 1 }]
    );
    // The port is closed now.
    let again = TcpStream::connect(addr).await;
    assert_eq!(again.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
}

/// A Join seen on one connection is worthless on another: the challenge differs.
#[tokio::test]
async fn replayed_join_is_refused() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let (mut first, nonce) = raw_challenge(addr).await;
    let seen = join_bytes(1, join_proof(&secret, JoinKind::Tcp, &nonce, 1));
    // The replay goes in before the original, on a connection with its own challenge.
    let (mut second, _) = raw_challenge(addr).await;
    second.write_all(&seen).await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(second.read_to_end(&mut rest).await.unwrap_or(0), 0);
    first.write_all(&seen).await.unwrap();
    let joined = server.await.unwrap().unwrap();
    assert_eq!(joined.streams.len(), 1);
    let refused: Vec<Rejection> = joined.refused.into_iter().map(|(_, r)| r).collect();
    assert_eq!(refused, [Rejection::BadProof { index: 1 }]);
}

/// Strangers flooding the port cannot crowd out the client: past a few at a time they are
/// closed unchallenged, while the client's own connections are always challenged.
#[tokio::test]
async fn a_flood_of_strangers_does_not_crowd_out_the_client() {
    let secret = SessionSecret::generate().unwrap();
    let mut r = TcpRendezvous::bind(LOCALHOST, None, quick()).unwrap();
    let addr = r.local_addr();
    // The client is "somewhere else": every connection here counts as a stranger's, so the
    // real client below comes from 127.0.0.2, the expected address.
    r.expect_client("127.0.0.2".parse().unwrap());
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let mut strangers = Vec::new();
    for _ in 0..12 {
        strangers.push(TcpStream::connect(addr).await.unwrap());
    }
    let from = tokio::net::TcpSocket::new_v4().unwrap();
    from.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let conn = from.connect(addr).await.unwrap();
    let joiner = tokio::spawn({
        let secret = secret.clone();
        async move {
            let mut conn = conn;
            let mut buf = [0u8; 37];
            conn.read_exact(&mut buf).await.unwrap();
            let nonce: [u8; 32] = buf[5..].try_into().unwrap();
            let proof = join_proof(&secret, JoinKind::Tcp, &nonce, 1);
            conn.write_all(&join_bytes(1, proof)).await.unwrap();
            conn
        }
    });
    let _conn = joiner.await.unwrap();
    let joined = server.await.unwrap().unwrap();
    assert_eq!(joined.streams.len(), 1);
    assert!(
        joined.refused.iter().any(|(_, r)| *r == Rejection::Busy),
        "{:?}",
        joined.refused
    );
    drop(strangers);
}

#[tokio::test]
async fn duplicate_and_out_of_range_indices_are_rejected() {
    let secret = SessionSecret::generate().unwrap();
    for (indices, want) in [
        (vec![2, 2], Rejection::Duplicate { index: 2 }),
        (
            vec![3],
            Rejection::IndexOutOfRange {
                index: 3,
                streams: 2,
            },
        ),
        (
            vec![0],
            Rejection::IndexOutOfRange {
                index: 0,
                streams: 2,
            },
        ),
    ] {
        let (r, addr) = rendezvous().await;
        let server = spawn_accept(r, 2, &secret, CipherSuite::Aes128Gcm);
        let mut keep = Vec::new();
        for index in indices {
            let (mut conn, nonce) = raw_challenge(addr).await;
            let proof = join_proof(&secret, JoinKind::Tcp, &nonce, index);
            conn.write_all(&join_bytes(index, proof)).await.unwrap();
            keep.push(conn);
        }
        assert_eq!(rejection(server.await.unwrap()), want);
    }
}

/// Once every stream joined the port is closed: extra connections are refused.
#[tokio::test]
async fn connections_beyond_n_are_refused() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let _client = tcp::connect(addr, 1, &secret, &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().unwrap().streams.len(), 1);
    let extra = tcp::connect(addr, 1, &secret, &keys(CipherSuite::Aes128Gcm), &quick()).await;
    let err = extra.unwrap_err();
    assert!(err.is_unreachable(), "{err}");
}

/// A client that asks for more streams than the server takes: the server returns exactly its
/// n, or aborts on the out-of-range index if that one came first.
#[tokio::test]
async fn surplus_client_streams_are_not_taken() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let client = tcp::connect(addr, 2, &secret, &keys(CipherSuite::Aes128Gcm), &quick()).await;
    match server.await.unwrap() {
        // Index 1 came first: the surplus index 2 is out of range, or never challenged.
        Ok(joined) => assert_eq!(joined.streams.len(), 1),
        // Index 2 came first: out of range, the session aborts.
        Err(Error::Rejected {
            reason:
                Rejection::IndexOutOfRange {
                    index: 2,
                    streams: 1,
                },
            ..
        }) => {}
        Err(e) => panic!("unexpected {e}"),
    }
    drop(client);
}

/// A connection that never sends its Join is dropped after the join timeout and does not
/// stop the real client.
#[tokio::test]
async fn silent_connection_is_dropped_and_ignored() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let (mut silent, _) = raw_challenge(addr).await;
    // The server hangs up on it after its join timeout (300 ms here).
    let mut rest = Vec::new();
    assert_eq!(silent.read_to_end(&mut rest).await.unwrap_or(0), 0);
    // A connection that closes without a byte is ignored too.
    drop(TcpStream::connect(addr).await.unwrap());
    let _client = tcp::connect(addr, 1, &secret, &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().unwrap().streams.len(), 1);
}

/// A stranger still being challenged when the last stream joins is closed and reported, not
/// dropped unseen: whichever way the joins race, the server says someone else knocked.
#[tokio::test]
async fn a_stranger_still_joining_at_the_end_is_reported() {
    let secret = SessionSecret::generate().unwrap();
    let mut config = quick();
    config.join_timeout = Duration::from_secs(30);
    let r = TcpRendezvous::bind(LOCALHOST, None, config.clone()).unwrap();
    let addr = r.local_addr();
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let (mut stranger, _) = raw_challenge(addr).await;
    let _client = tcp::connect(addr, 1, &secret, &keys(CipherSuite::Aes128Gcm), &config)
        .await
        .unwrap();
    let joined = server.await.unwrap().unwrap();
    assert_eq!(joined.streams.len(), 1);
    let refused: Vec<Rejection> = joined.refused.into_iter().map(|(_, r)| r).collect();
    assert_eq!(refused, [Rejection::Late]);
    // Its connection was closed unanswered.
    let mut rest = Vec::new();
    assert_eq!(stranger.read_to_end(&mut rest).await.unwrap_or(0), 0);
}

#[tokio::test]
async fn nobody_joining_times_out() {
    let (r, _addr) = rendezvous().await;
    let err = r
        .accept(
            2,
            &secret(),
            &keys(CipherSuite::Aes128Gcm),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::JoinTimeout {
                joined: 0,
                expected: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn garbage_and_partial_joins_are_refused() {
    for (bytes, want) in [
        (
            b"GET / HTTP/1.0\r\n\r\n".to_vec(),
            Rejection::NotAJoin("bytes starting with 0x47".into()),
        ),
        (
            join_bytes(1, [0; 32])[..20].to_vec(),
            Rejection::Incomplete { got: 20 },
        ),
    ] {
        let secret = secret();
        let (r, addr) = rendezvous().await;
        let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
        let (mut conn, _) = raw_challenge(addr).await;
        conn.write_all(&bytes).await.unwrap();
        conn.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(conn.read_to_end(&mut rest).await.unwrap_or(0), 0);
        assert_eq!(refused_then_joined(server, addr, &secret, 1).await, [want]);
    }
}

/// A connection that is cut (not shut down) reads as an error on the other side.
#[tokio::test]
async fn cut_connection_is_an_error_not_an_end() {
    let secret = SessionSecret::generate().unwrap();
    let (r, addr) = rendezvous().await;
    let server = spawn_accept(r, 1, &secret, CipherSuite::Aes128Gcm);
    let mut client = tcp::connect(addr, 1, &secret, &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap();
    let mut server = server.await.unwrap().unwrap().streams;
    client[0].write_all(&[1; 100_000]).await.unwrap();
    client[0].flush().await.unwrap();
    drop(client);
    let mut got = Vec::new();
    let err = server[0].read_to_end(&mut got).await.unwrap_err();
    // Every flushed byte arrived; then the cut.
    assert_eq!(got.len(), 100_000);
    assert_eq!(record_error(&err), &RecordError::Unterminated { stream: 1 });
}

#[tokio::test]
async fn closed_port_is_unreachable() {
    let addr = {
        let l = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
        l.local_addr().unwrap()
    };
    let err = tcp::connect(addr, 2, &secret(), &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(
        err.to_string().contains("cannot reach the data port"),
        "{err}"
    );
}

/// Something else on the port (an SSH server, say) is a join failure, not "unreachable".
#[tokio::test]
async fn foreign_server_fails_the_join() {
    let l = tokio::net::TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        c.write_all(b"SSH-2.0-OpenSSH_9.6 something else entirely\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let err = tcp::connect(addr, 1, &secret(), &keys(CipherSuite::Aes128Gcm), &quick())
        .await
        .unwrap_err();
    assert!(!err.is_unreachable());
    assert!(matches!(err, Error::Join { index: 1, .. }), "{err}");
}

#[tokio::test]
async fn port_range_is_honoured() {
    let taken = TcpRendezvous::bind(LOCALHOST, None, quick()).unwrap();
    let p = taken.port();
    // A range of one taken port.
    let err = TcpRendezvous::bind(LOCALHOST, Some(p..=p), quick()).unwrap_err();
    assert!(matches!(err, Error::NoFreePort { .. }), "{err}");
    // Invalid ranges.
    #[allow(clippy::reversed_empty_ranges)]
    let empty = 5..=4;
    assert!(matches!(
        TcpRendezvous::bind(LOCALHOST, Some(empty), quick()),
        Err(Error::PortRange { .. })
    ));
    assert!(matches!(
        TcpRendezvous::bind(LOCALHOST, Some(0..=10), quick()),
        Err(Error::PortRange { .. })
    ));
    // Once free, the port is found.
    drop(taken);
    for _ in 0..5 {
        let r = TcpRendezvous::bind(LOCALHOST, Some(p..=p), quick()).unwrap();
        assert_eq!(r.port(), p);
    }
}

/// A port that drops connection attempts (a full accept queue stands in for a firewall)
/// is unreachable after the connect timeout.
#[tokio::test]
async fn filtered_port_times_out_as_unreachable() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(LOCALHOST, 0)).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    // Fill the accept queue; the kernel then drops further SYNs.
    let mut fillers = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            Ok(Ok(c)) => fillers.push(c),
            _ => break,
        }
        assert!(fillers.len() < 64, "the accept queue never filled");
    }
    let mut config = quick();
    config.connect_timeout = Duration::from_millis(300);
    let err = tcp::connect(addr, 1, &secret(), &keys(CipherSuite::Aes128Gcm), &config)
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    match &err {
        Error::Unreachable { source, .. } => assert_eq!(source.kind(), io::ErrorKind::TimedOut),
        other => panic!("{other}"),
    }
    drop(listener);
}
