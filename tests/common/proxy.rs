//! A TCP proxy on loopback that can hold traffic in either direction: a partition that delays everything (or
//! only the replies) and then heals without losing a byte, and a redirect to another server.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Forward everything.
pub const PASS: u8 = 0;
/// Hold traffic in both directions.
pub const HOLD_ALL: u8 = 1;
/// Forward requests, hold replies (the server commits, the client never hears).
pub const HOLD_REPLIES: u8 = 2;

/// A running proxy.
#[derive(Clone)]
pub struct Proxy {
    pub port: u16,
    /// The user (and password) of the upstream URL the proxy was started for, reused in [`Proxy::url`].
    credentials: String,
    mode: Arc<AtomicU8>,
    changed: Arc<tokio::sync::Notify>,
    upstream: Arc<std::sync::Mutex<u16>>,
    kill: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
}

impl Proxy {
    /// A proxy to the server of `upstream_url` (on loopback), whose [`url`](Self::url)s log in as that URL does.
    pub async fn start(upstream_url: &str) -> Proxy {
        let config: tokio_postgres::Config = upstream_url.parse().expect("a valid connection URL");
        let upstream = *config
            .get_ports()
            .first()
            .expect("a port in the upstream URL");
        // Verbatim, so that a percent-encoded password stays encoded.
        let authority = upstream_url
            .split_once("://")
            .and_then(|(_, rest)| rest.split(['/', '?']).next())
            .unwrap_or_default();
        let credentials = authority
            .rsplit_once('@')
            .map_or("postgres", |(userinfo, _)| userinfo)
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            port: listener.local_addr().unwrap().port(),
            credentials,
            mode: Arc::new(AtomicU8::new(PASS)),
            changed: Arc::new(tokio::sync::Notify::new()),
            upstream: Arc::new(std::sync::Mutex::new(upstream)),
            kill: Arc::new(AtomicBool::new(false)),
            accepted: Arc::new(AtomicUsize::new(0)),
        };
        let p = proxy.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                p.accepted.fetch_add(1, Ordering::SeqCst);
                let port = *p.upstream.lock().unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, p.clone(), false));
                tokio::spawn(pump(sr, cw, p.clone(), true));
            }
        });
        proxy
    }

    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{database}",
            self.credentials, self.port
        )
    }

    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// How many client connections the proxy has accepted, including those it dropped because the upstream
    /// refused.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Points new connections at another server and cuts the current ones.
    pub fn redirect(&self, upstream: u16) {
        *self.upstream.lock().unwrap() = upstream;
        self.kill.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

/// Copies bytes one way; while held, keeps what it read and delivers it on heal (nothing is lost, only late).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    proxy: Proxy,
    reply: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let started_epoch = proxy.kill.load(Ordering::SeqCst);
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            if proxy.kill.load(Ordering::SeqCst) != started_epoch {
                return; // redirected: this connection is cut
            }
            let held = match proxy.mode.load(Ordering::SeqCst) {
                HOLD_ALL => true,
                HOLD_REPLIES => reply,
                _ => false,
            };
            if !held {
                break;
            }
            let changed = proxy.changed.notified();
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
