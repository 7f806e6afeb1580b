//! What one client may hold of the manager's servers, REST and gRPC alike: a bound on
//! connections in all and from each client address (a client over its share is closed at
//! once, so one that opens connections and sends nothing cannot take the others' places),
//! and an idle deadline on every connection (no byte either way for [`Limits::idle`]: closed).
//! Per-request bounds — header and request deadlines, body and message sizes — are the
//! servers' own (`rest.rs`, `knitter-manager`), from the same [`Limits`].

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The manager's server limits (`knitter-manager --max-connections` and the like).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once, both APIs counted apart.
    pub connections: usize,
    /// Connections open at once from one client address.
    pub per_client: usize,
    /// A connection with no byte read or written for this long is closed (gRPC connections
    /// carry keep-alive pings, so a live sync stream is never idle).
    pub idle: Duration,
    /// A REST request's headers must arrive within this (also the wait for the next request
    /// on a kept-alive connection).
    pub header: Duration,
    /// A REST request, or a unary gRPC call, must be answered within this (the body read
    /// included: a body trickled in gets 503).
    pub request: Duration,
    /// A REST request body's largest size.
    pub body: usize,
    /// A gRPC message's largest size, either way.
    pub message: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 1024,
            per_client: 64,
            idle: Duration::from_secs(60),
            header: Duration::from_secs(10),
            request: Duration::from_secs(30),
            body: 1 << 20,
            message: 4 << 20,
        }
    }
}

/// Admits connections within [`Limits`]; one per server.
#[derive(Debug, Clone)]
pub struct Gate {
    limits: Limits,
    total: Arc<Semaphore>,
    clients: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A connection's place in its [`Gate`], given back when the connection closes.
#[derive(Debug)]
pub struct Ticket {
    _permit: OwnedSemaphorePermit,
    client: IpAddr,
    clients: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.client);
            }
        }
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            total: Arc::new(Semaphore::new(limits.connections.max(1))),
            clients: Arc::default(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A place for a connection from `client`, if the limits leave one.
    pub fn admit(&self, client: IpAddr) -> Option<Ticket> {
        let permit = self.total.clone().try_acquire_owned().ok()?;
        let mut c = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.entry(client).or_default();
        if *n >= self.limits.per_client {
            return None;
        }
        *n += 1;
        Some(Ticket { _permit: permit, client, clients: self.clients.clone() })
    }

    /// The next admitted connection on `tcp`; others are closed as they come (and counted
    /// in the log). Accept errors (out of descriptors) wait a little rather than spin.
    pub async fn accept(&self, tcp: &TcpListener) -> (Guarded<TcpStream>, SocketAddr) {
        loop {
            let (stream, peer) = match tcp.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(ticket) = self.admit(peer.ip()) else {
                tracing::debug!(%peer, "connection refused: over the limit (--max-connections, --max-client-connections)");
                continue;
            };
            let _ = stream.set_nodelay(true);
            return (Guarded::new(stream, self.limits.idle, ticket), peer);
        }
    }
}

/// A connection that holds its [`Ticket`] and closes itself (an I/O error, `TimedOut`)
/// after `idle` without a byte either way.
#[derive(Debug)]
pub struct Guarded<IO> {
    io: IO,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    _ticket: Ticket,
}

impl<IO> Guarded<IO> {
    pub fn new(io: IO, idle: Duration, ticket: Ticket) -> Guarded<IO> {
        Guarded { io, idle, deadline: Box::pin(tokio::time::sleep(idle)), _ticket: ticket }
    }

    fn progressed(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// What a write came back with: progress resets the idle deadline, waiting runs it.
    fn wrote(
        &mut self,
        r: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.progressed();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.stalled(cx),
        }
    }

    /// After an operation that is not ready: an error once the connection sat idle too long
    /// (the deadline's waker brings the server back here when it passes).
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection was idle too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.progressed();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.stalled(cx),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(r, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A listener handing out the connections its gate admits (the REST server's, without TLS).
#[derive(Debug)]
pub struct GatedListener {
    pub tcp: TcpListener,
    pub gate: Gate,
}

impl axum::serve::Listener for GatedListener {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.gate.accept(&self.tcp).await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// The admitted connections of `tcp`, as tonic takes them.
pub fn incoming(
    tcp: TcpListener,
    gate: Gate,
) -> impl futures_util::Stream<Item = io::Result<Guarded<TcpStream>>> {
    futures_util::stream::unfold((tcp, gate), |(tcp, gate)| async move {
        let (c, _) = gate.accept(&tcp).await;
        Some((Ok(c), (tcp, gate)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_gets_its_share_and_places_come_back() {
        let g = Gate::new(Limits { connections: 3, per_client: 2, ..Limits::default() });
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = g.admit(a).unwrap();
        let _a2 = g.admit(a).unwrap();
        assert!(g.admit(a).is_none(), "over a's share");
        let b1 = g.admit(b).unwrap();
        assert!(g.admit(b).is_none(), "over the total");
        drop(a1);
        assert!(g.admit(a).is_some(), "a's place came back");
        drop(b1);
        assert!(
            g.clients.lock().unwrap().get(&b).is_none(),
            "no count kept for a client with none open"
        );
    }
}
