//! The sockets pgfence opens itself, with tokio-postgres's settings (connect timeout per address, `TCP_NODELAY`,
//! keepalives, `tcp_user_timeout`), so that every byte of its own connections passes through a
//! [`WireStream`](super::sqlstate::WireStream).

/// A TCP or Unix-domain socket to one PostgreSQL server, opened by pgfence itself (with tokio-postgres's
/// settings: connect timeout, `TCP_NODELAY`, keepalives, `tcp_user_timeout`) so that its plaintext bytes too pass
/// through a [`WireStream`](super::sqlstate::WireStream). diesel-async accepts only tokio-postgres's own socket type for the connections it
/// drives, so these are used for pgfence's pool, whose connections pgfence drives itself.
#[derive(Debug)]
pub(crate) struct Socket(SocketKind);

#[derive(Debug)]
enum SocketKind {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Socket {
    /// Opens a socket to `host` (a name, an address or, on Unix, a socket directory) and `port`, trying each
    /// address the name resolves to; `hostaddr` skips the lookup. Each attempt is bounded by the connect timeout.
    pub(super) async fn open(
        config: &tokio_postgres::Config,
        host: &tokio_postgres::config::Host,
        hostaddr: Option<std::net::IpAddr>,
        port: u16,
    ) -> std::io::Result<Socket> {
        use tokio_postgres::config::Host;
        let timeout = config.get_connect_timeout().copied();
        let bounded =
            |what: String| move |_| std::io::Error::new(std::io::ErrorKind::TimedOut, what);
        let addresses: Vec<std::net::SocketAddr> =
            match (host, hostaddr) {
                (_, Some(ip)) => vec![(ip, port).into()],
                (Host::Tcp(name), None) => tokio::net::lookup_host((name.as_str(), port))
                    .await?
                    .collect(),
                #[cfg(unix)]
                (Host::Unix(dir), None) => {
                    let path = dir.join(format!(".s.PGSQL.{port}"));
                    let connecting = tokio::net::UnixStream::connect(&path);
                    let stream =
                        match timeout {
                            Some(limit) => tokio::time::timeout(limit, connecting).await.map_err(
                                bounded(format!("connecting to {} timed out", path.display())),
                            )??,
                            None => connecting.await?,
                        };
                    return Ok(Socket(SocketKind::Unix(stream)));
                }
            };
        let mut last = None;
        for address in addresses {
            let connecting = tokio::net::TcpStream::connect(address);
            let stream = match timeout {
                Some(limit) => match tokio::time::timeout(limit, connecting).await {
                    Ok(stream) => stream,
                    Err(elapsed) => Err(bounded(format!("connecting to {address} timed out"))(
                        elapsed,
                    )),
                },
                None => connecting.await,
            };
            match stream.and_then(|stream| Self::tune(config, stream)) {
                Ok(socket) => return Ok(socket),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "could not resolve any addresses",
            )
        }))
    }

    /// tokio-postgres's socket settings: no Nagle delay, keepalives as configured, `tcp_user_timeout`.
    fn tune(
        config: &tokio_postgres::Config,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<Socket> {
        stream.set_nodelay(true)?;
        let socket = socket2::SockRef::from(&stream);
        #[cfg(target_os = "linux")]
        if let Some(limit) = config.get_tcp_user_timeout() {
            socket.set_tcp_user_timeout(Some(*limit))?;
        }
        if config.get_keepalives() {
            #[allow(unused_mut)]
            let mut keepalive =
                socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
            #[cfg(not(any(
                target_os = "aix",
                target_os = "redox",
                target_os = "solaris",
                target_os = "openbsd"
            )))]
            if let Some(interval) = config.get_keepalives_interval() {
                keepalive = keepalive.with_interval(interval);
            }
            #[cfg(not(any(
                target_os = "aix",
                target_os = "redox",
                target_os = "solaris",
                target_os = "windows",
                target_os = "openbsd"
            )))]
            if let Some(retries) = config.get_keepalives_retries() {
                keepalive = keepalive.with_retries(retries);
            }
            socket.set_tcp_keepalive(&keepalive)?;
        }
        Ok(Socket(SocketKind::Tcp(stream)))
    }
}

impl tokio::io::AsyncRead for Socket {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Socket {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            SocketKind::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            SocketKind::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}
