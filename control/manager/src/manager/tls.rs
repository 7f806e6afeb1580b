//! TLS for the manager's two APIs: the server's certificate chain and key, and optionally a
//! CA whose client certificates it requires (mutual TLS), read from PEM files once; given
//! to tonic for gRPC and to rustls for REST. [`TlsListener`] is the REST side's listener:
//! handshakes run in their own tasks (a client that stalls its handshake holds up nobody
//! else, and gives up after 10 s), axum gets connections whose handshake finished.

use super::limits::{Gate, Guarded};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;

/// A TLS file that could not be read or used.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(String);

/// The server side of TLS, as PEM.
#[derive(Debug, Clone)]
pub struct ServerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl ServerTls {
    /// Reads the certificate chain, its key and the client CA; checks that rustls takes them.
    pub fn read(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls, TlsError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| TlsError(format!("reading {}: {e}", p.display())))
        };
        let tls = ServerTls {
            cert: read(cert)?,
            key: read(key)?,
            client_ca: client_ca.map(read).transpose()?,
        };
        tls.rustls()?;
        Ok(tls)
    }

    /// Whether clients must show a certificate the client CA signed.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca.is_some()
    }

    /// For the gRPC server.
    pub fn tonic(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let cfg = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .timeout(HANDSHAKE);
        match &self.client_ca {
            Some(ca) => cfg.client_ca_root(Certificate::from_pem(ca)),
            None => cfg,
        }
    }

    /// For the REST server (HTTP/1.1 over TLS 1.2 or 1.3).
    pub fn rustls(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let bad = |what: &str, e: &dyn std::fmt::Display| TlsError(format!("{what}: {e}"));
        let certs = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("the certificate", &e))?;
        if certs.is_empty() {
            return Err(TlsError("the certificate file holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| bad("the key", &e))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(ca) {
                    roots
                        .add(c.map_err(|e| bad("the client CA", &e))?)
                        .map_err(|e| bad("the client CA", &e))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| bad("the client CA", &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut cfg =
            builder.with_single_cert(certs, key).map_err(|e| bad("the certificate and key", &e))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// How long a client may take to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A TCP listener that hands out connections once their TLS handshake finished.
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<Guarded<TcpStream>>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts what `gate` admits on `tcp` (within a runtime); a failed handshake is logged
    /// and dropped.
    pub fn new(
        tcp: TcpListener,
        gate: Gate,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let tls = tokio_rustls::TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let (stream, peer) = gate.accept(&tcp).await;
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, tls.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake refused"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local, acceptor })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Guarded<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The acceptor task ended (only when aborted): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
