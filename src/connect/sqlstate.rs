//! The code ([`SqlState`]) of every error the server sends on pgfence's own connections, read from the protocol
//! stream.
//!
//! diesel 2.3 turns a database error into a coarse kind plus the server's text fields (message, detail, hint):
//! the SQLSTATE itself does not survive, and the message is in the language of the server's `lc_messages`, which
//! an application role cannot change. Classifying errors by their text would silently stop working on a
//! server set up in another language: deadlocks would not be retried, a missing schema would not be named.
//!
//! So every connection pgfence opens reads the server's bytes through a [`WireStream`]: it follows the framing of
//! the backend messages (a type byte and a length) and, for each ErrorResponse, records its SQLSTATE (field `C`)
//! keyed by the fields diesel keeps (message, detail, hint). When the error reaches pgfence through diesel,
//! [`sqlstate_of`] finds the code again. The stream is never altered; bytes pass through unchanged, and anything
//! the reader does not understand turns it off for that connection rather than disturbing it.
//!
//! The record is process-wide and bounded (the latest [`REMEMBERED`] errors), and every error is recorded before
//! the driver can parse it (the reader sees its bytes first), so the lookup that follows a failed call finds it.
//! Two errors with identical message, detail and hint but different codes would be confused; PostgreSQL gives a
//! message text one code.
//!
//! Stores built from an application's own pool ([`Store::from_pool`](crate::Store::from_pool)) use connections
//! pgfence did not open: their errors carry only the codes diesel classifies itself (see
//! [`Error::sqlstate`](crate::Error::sqlstate)).

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sqlstate::SqlState;

/// How many recent errors (all connections together) keep their SQLSTATE for [`sqlstate_of`].
pub(crate) const REMEMBERED: usize = 4096;

/// An ErrorResponse larger than this is passed through without reading its code (PostgreSQL's are far smaller).
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The SSLRequest packet: length 8, request code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

static RECENT: Mutex<VecDeque<(u64, [u8; 5])>> = Mutex::new(VecDeque::new());

fn key(message: &str, detail: Option<&str>, hint: Option<&str>) -> u64 {
    let mut hasher = DefaultHasher::new();
    (message, detail, hint).hash(&mut hasher);
    hasher.finish()
}

fn remember(key: u64, code: [u8; 5]) {
    let mut recent = RECENT.lock().unwrap_or_else(|p| p.into_inner());
    if recent.len() == REMEMBERED {
        recent.pop_front();
    }
    recent.push_back((key, code));
}

/// The SQLSTATE the server sent with the error whose message, detail and hint these are, if it came through a
/// connection pgfence opened and is among the latest [`REMEMBERED`] errors.
pub(crate) fn sqlstate_of(
    message: &str,
    detail: Option<&str>,
    hint: Option<&str>,
) -> Option<SqlState> {
    let wanted = key(message, detail, hint);
    let recent = RECENT.lock().unwrap_or_else(|p| p.into_inner());
    recent
        .iter()
        .rev()
        .find(|(k, _)| *k == wanted)
        .and_then(|(_, code)| SqlState::parse(std::str::from_utf8(code).ok()?))
}

/// A connection's byte stream, read through a reader of the backend protocol's framing that records the SQLSTATE of
/// every ErrorResponse (see the module docs). Reads and writes pass through unchanged.
///
/// pgfence wraps both layers of a connection it opens: the socket (whose reader stops at a TLS handshake, after
/// which the bytes are ciphertext) and, for TLS, the decrypted stream.
#[derive(Debug)]
pub struct WireStream<S> {
    inner: S,
    reader: Reader,
    /// On the socket layer: the first bytes the client wrote, until they show whether it asked for TLS.
    watch: Option<Watch>,
}

impl<S> WireStream<S> {
    /// The socket layer: the client may begin with an SSLRequest, whose one-byte answer precedes the messages
    /// (`N`), or a TLS handshake (`S`: nothing more to read here).
    pub(crate) fn socket(inner: S) -> WireStream<S> {
        WireStream {
            inner,
            reader: Reader::default(),
            watch: Some(Watch::default()),
        }
    }

    /// A stream that carries protocol messages from its first byte (the decrypted side of TLS).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn messages(inner: S) -> WireStream<S> {
        WireStream {
            inner,
            reader: Reader::default(),
            watch: None,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn wrote(&mut self, bytes: &[u8]) {
        let Some(watch) = &mut self.watch else {
            return;
        };
        let take = bytes.len().min(SSL_REQUEST.len() - watch.seen);
        watch.first[watch.seen..watch.seen + take].copy_from_slice(&bytes[..take]);
        watch.seen += take;
        if watch.first[..watch.seen] != SSL_REQUEST[..watch.seen] {
            self.watch = None; // a startup packet: messages follow from the server's first byte
        } else if watch.seen == SSL_REQUEST.len() {
            self.watch = None;
            self.reader.phase = Phase::SslReply;
        }
    }
}

#[derive(Debug, Default)]
struct Watch {
    first: [u8; 8],
    seen: usize,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Phase {
    #[default]
    Messages,
    /// The next byte answers an SSLRequest.
    SslReply,
    /// TLS runs over this layer, or the stream was not understood: pass through without reading.
    Off,
}

/// Follows the backend messages' framing: a type byte, a 4-byte big-endian length that counts itself, a body.
#[derive(Debug, Default)]
struct Reader {
    phase: Phase,
    header: [u8; 5],
    have: usize,
    remaining: usize,
    /// The body of the ErrorResponse being read.
    error: Option<Vec<u8>>,
}

impl Reader {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.phase {
                Phase::Off => return,
                Phase::SslReply => {
                    self.phase = if bytes[0] == b'N' {
                        Phase::Messages
                    } else {
                        Phase::Off
                    };
                    bytes = &bytes[1..];
                    continue;
                }
                Phase::Messages => {}
            }
            if self.have < self.header.len() {
                let take = bytes.len().min(self.header.len() - self.have);
                self.header[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                self.have += take;
                bytes = &bytes[take..];
                if self.have < self.header.len() {
                    return;
                }
                let length = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                let Some(body) = length.checked_sub(4) else {
                    self.phase = Phase::Off;
                    return;
                };
                self.remaining = body;
                self.error = (self.header[0] == b'E' && body <= MAX_ERROR_BYTES)
                    .then(|| Vec::with_capacity(body));
            }
            let take = bytes.len().min(self.remaining);
            if let Some(error) = &mut self.error {
                error.extend_from_slice(&bytes[..take]);
            }
            self.remaining -= take;
            bytes = &bytes[take..];
            if self.remaining == 0 {
                if let Some(error) = self.error.take() {
                    record(&error);
                }
                self.have = 0;
            }
        }
    }
}

/// Records the code of one ErrorResponse body: fields of a type byte and a NUL-terminated text, then a NUL.
fn record(body: &[u8]) {
    let (mut code, mut message, mut detail, mut hint) = (None, None, None, None);
    let mut rest = body;
    while let Some((&field, after)) = rest.split_first() {
        if field == 0 {
            break;
        }
        let Some(end) = after.iter().position(|&b| b == 0) else {
            return;
        };
        let Ok(text) = std::str::from_utf8(&after[..end]) else {
            return;
        };
        match field {
            b'C' => code = Some(text),
            b'M' => message = Some(text),
            b'D' => detail = Some(text),
            b'H' => hint = Some(text),
            _ => {}
        }
        rest = &after[end + 1..];
    }
    if let (Some(code), Some(message)) = (code, message) {
        if let Ok(code) = <[u8; 5]>::try_from(code.as_bytes()) {
            remember(key(message, detail, hint), code);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WireStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.reader.feed(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WireStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            this.wrote(&buf[..written]);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tokio_postgres::tls::TlsStream + Unpin> tokio_postgres::tls::TlsStream for WireStream<S> {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        self.inner.channel_binding()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn error_response(code: &str, text: &str, detail: Option<&str>) -> Vec<u8> {
        let mut body = Vec::new();
        for (field, value) in [
            (b'S', Some("ERROR")),
            (b'C', Some(code)),
            (b'M', Some(text)),
        ]
        .into_iter()
        .chain([(b'D', detail)])
        {
            if let Some(value) = value {
                body.push(field);
                body.extend_from_slice(value.as_bytes());
                body.push(0);
            }
        }
        body.push(0);
        message(b'E', &body)
    }

    /// The code of an error is found however the bytes are cut into reads, among other messages before and after
    /// it (a DataRow larger than any error, a ReadyForQuery).
    #[test]
    fn an_error_code_is_read_at_every_split_of_the_stream() {
        let text = "Verklemmung (Deadlock) entdeckt";
        let mut stream = message(b'D', &[7; 70_000]);
        stream.extend(error_response("40P01", text, Some("Prozess 1 wartet")));
        stream.extend(message(b'Z', b"I"));
        for split in [1, 2, 3, 5, 7, 4096, stream.len()] {
            let mut reader = Reader::default();
            let marker = format!("{text} #{split}");
            let mut bytes = message(b'D', &[7; 70_000]);
            bytes.extend(error_response("40P01", &marker, Some("Prozess 1 wartet")));
            bytes.extend(message(b'Z', b"I"));
            for chunk in bytes.chunks(split) {
                reader.feed(chunk);
            }
            assert_eq!(
                sqlstate_of(&marker, Some("Prozess 1 wartet"), None)
                    .map(|s| s.to_string())
                    .as_deref(),
                Some("40P01"),
                "split {split}"
            );
            assert_eq!(reader.phase, Phase::Messages);
        }
    }

    /// On the socket layer, an SSLRequest answered `S` turns the reader off (what follows is TLS), and one answered
    /// `N` leaves the messages that follow readable.
    #[test]
    fn the_socket_layer_stops_at_tls_and_reads_after_a_refusal() {
        let mut tls = WireStream::socket(());
        tls.wrote(&SSL_REQUEST[..3]);
        tls.wrote(&SSL_REQUEST[3..]);
        tls.reader.feed(b"S");
        tls.reader.feed(&error_response(
            "XX000",
            "ciphertext that looks like an error",
            None,
        ));
        assert_eq!(tls.reader.phase, Phase::Off);
        assert_eq!(
            sqlstate_of("ciphertext that looks like an error", None, None),
            None
        );

        let mut plain = WireStream::socket(());
        plain.wrote(&SSL_REQUEST);
        let mut bytes = b"N".to_vec();
        bytes.extend(error_response(
            "28P01",
            "password authentication failed (N)",
            None,
        ));
        plain.reader.feed(&bytes);
        assert_eq!(
            sqlstate_of("password authentication failed (N)", None, None)
                .map(|s| s.to_string())
                .as_deref(),
            Some("28P01")
        );

        // No SSLRequest: a startup packet first, messages from the server's first byte.
        let mut direct = WireStream::socket(());
        direct.wrote(&[0, 0, 0, 40, 0, 3, 0, 0]);
        assert!(direct.watch.is_none());
        direct.reader.feed(&error_response(
            "3D000",
            "database does not exist (direct)",
            None,
        ));
        assert_eq!(
            sqlstate_of("database does not exist (direct)", None, None)
                .map(|s| s.to_string())
                .as_deref(),
            Some("3D000")
        );
    }

    /// What the reader costs: a typical guarded write's reply (RowDescription, one DataRow, CommandComplete,
    /// ReadyForQuery: ~150 bytes) fed a million times. Prints the time per reply; run it in a release build:
    /// `cargo test --release --lib wire::tests::reader_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement"]
    fn reader_cost() {
        let mut reply = message(b'T', &[0; 60]);
        reply.extend(message(b'D', &[1; 40]));
        reply.extend(message(b'C', b"SELECT 1\0"));
        reply.extend(message(b'Z', b"I"));
        let mut reader = Reader::default();
        let rounds = 1_000_000;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            reader.feed(std::hint::black_box(&reply));
        }
        let elapsed = started.elapsed();
        assert_eq!(reader.phase, Phase::Messages);
        println!(
            "{} bytes per reply: {:.1} ns per reply ({:.2} GB/s)",
            reply.len(),
            elapsed.as_nanos() as f64 / rounds as f64,
            (reply.len() * rounds) as f64 / elapsed.as_secs_f64() / 1e9
        );
    }

    /// A length that cannot be a message's turns the reader off instead of misreading what follows.
    #[test]
    fn a_malformed_length_turns_the_reader_off() {
        let mut reader = Reader::default();
        reader.feed(&[b'E', 0, 0, 0, 2]);
        assert_eq!(reader.phase, Phase::Off);
    }
}
