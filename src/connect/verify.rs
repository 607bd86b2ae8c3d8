//! The rustls side of [`super::tls`]: a client configuration for each kind of verification, and the connector that
//! records how far the handshake got (so that errors can say whether TLS was refused, failed, or not involved).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

use super::sqlstate::WireStream;
use crate::error::{Error, Result};

/// What the server's certificate must prove.
pub(super) enum Verify {
    /// Nothing (`prefer`/`require` without roots): encryption against passive listeners only.
    Nothing,
    /// It chains to one of these roots, whatever host name it names (`verify-ca`).
    Chain(Arc<RootCertStore>),
    /// It chains to one of these roots and names the host (`verify-full`).
    ChainAndName(Arc<RootCertStore>),
}

/// ring, chosen here rather than through rustls's process-wide default, which panics when an application
/// links two providers.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn client_config(
    verify: Verify,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let tls_error = |cause: String| Error::Tls {
        target: String::new(),
        cause,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?;
    let builder = match verify {
        Verify::ChainAndName(roots) => builder.with_root_certificates(roots),
        Verify::Chain(roots) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly { roots, provider })),
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate { provider })),
    };
    let mut config = match client {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_error(format!("sslcert/sslkey: {e}")))?,
        None => builder.with_no_client_auth(),
    };
    // What libpq 17 sends; required by servers that accept direct TLS connections (`sslnegotiation=direct`).
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}

fn verify_signatures_12(
    provider: &CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls12_signature(
        message,
        cert,
        dss,
        &provider.signature_verification_algorithms,
    )
}

fn verify_signatures_13(
    provider: &CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls13_signature(
        message,
        cert,
        dss,
        &provider.signature_verification_algorithms,
    )
}

/// `verify-ca`: the chain is checked, the name is not. The handshake's signatures are checked as always
/// (the server holds the key of the certificate it showed).
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_signatures_12(&self.provider, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_signatures_13(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `prefer`/`require` without roots: any certificate (libpq's semantics: encryption, no authentication of the
/// server). The handshake's signatures are still checked.
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_signatures_12(&self.provider, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_signatures_13(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// How far the handshake of the latest connection attempt got.
#[derive(Debug, Default)]
pub(super) struct Progress {
    started: AtomicBool,
    finished: AtomicBool,
}

impl Progress {
    pub(super) fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    pub(super) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }
}

/// tokio-postgres-rustls's connector, recording into [`Progress`]. tokio-postgres calls `make_tls_connect` once
/// per host attempt, and `connect` only once the server agreed to TLS.
#[derive(Clone)]
pub(super) struct MakeTls {
    inner: tokio_postgres_rustls::MakeRustlsConnect,
    progress: Arc<Progress>,
}

impl MakeTls {
    pub(super) fn new(inner: tokio_postgres_rustls::MakeRustlsConnect) -> MakeTls {
        MakeTls {
            inner,
            progress: Arc::default(),
        }
    }

    /// The progress of this connector's latest attempt (shared by its clones).
    pub(super) fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }
}

type Inner = tokio_postgres_rustls::MakeRustlsConnect;
type InnerConnect<S> = <Inner as MakeTlsConnect<S>>::TlsConnect;
type HandshakeError<S> = <InnerConnect<S> as TlsConnect<S>>::Error;

/// The decrypted stream of a TLS connection over `S`, read through a [`WireStream`] for its error codes.
pub(crate) type Decrypted<S> = WireStream<<Inner as MakeTlsConnect<S>>::Stream>;

impl<S> MakeTlsConnect<S> for MakeTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Decrypted<S>;
    type TlsConnect = Handshake<S>;
    type Error = <Inner as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> std::result::Result<Handshake<S>, Self::Error> {
        self.progress.started.store(false, Ordering::SeqCst);
        self.progress.finished.store(false, Ordering::SeqCst);
        Ok(Handshake {
            inner: <Inner as MakeTlsConnect<S>>::make_tls_connect(&mut self.inner, domain)?,
            progress: self.progress.clone(),
        })
    }
}

pub(crate) struct Handshake<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    inner: InnerConnect<S>,
    progress: Arc<Progress>,
}

impl<S> TlsConnect<S> for Handshake<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Decrypted<S>;
    type Error = HandshakeError<S>;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Decrypted<S>, HandshakeError<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        self.progress.started.store(true, Ordering::SeqCst);
        let handshake = self.inner.connect(stream);
        let progress = self.progress;
        Box::pin(async move {
            let stream = handshake.await?;
            progress.finished.store(true, Ordering::SeqCst);
            Ok(WireStream::messages(stream))
        })
    }
}
