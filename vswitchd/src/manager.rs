//! The node's one client of knitter-manager, shared by the attach API (ports created and
//! released), the sync stream and joining: one channel to the manager (connected lazily and
//! again after a failure; HTTP/2 keep-alives, so a manager gone silent ends the long sync
//! stream), the node's bearer token on every request (the bootstrap token only to join), a
//! deadline on every unary call (the sync stream has none: it lasts as long as the manager
//! serves it), and the manager's errors said for the node's users. What the manager's
//! messages mean to the switch (a network's bridge domain, a policer) is read here too, once
//! for the attach API and the sync stream.

use crate::settings::ManagerLink;
use knitter_api::manager as pb;
use pb::manager_client::ManagerClient;
use std::future::Future;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// How long a unary call (a port created or released, a join) may take, connecting included.
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// How long the attach API's status waits for the manager's answer.
const PROBE_DEADLINE: Duration = Duration::from_secs(3);

/// The manager as the node reaches it. Clones share the channel.
#[derive(Clone)]
pub struct Manager {
    link: ManagerLink,
    channel: Channel,
}

impl Manager {
    /// The client (call within the runtime: the channel connects at its first use).
    pub fn new(link: ManagerLink) -> anyhow::Result<Manager> {
        let channel = knitter_api::endpoint(&link.address, link.tls.clone())
            .map_err(|e| anyhow::anyhow!("manager address {:?}: {e}", link.address))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Manager { link, channel })
    }

    pub fn link(&self) -> &ManagerLink {
        &self.link
    }

    /// `msg` with the node's token; refused while a node that joins has none yet.
    fn request<T>(&self, msg: T) -> Result<Request<T>, Status> {
        let link = &self.link;
        if link.join.is_some() && link.token.get().is_none() {
            return Err(Status::unavailable(format!(
                "this node has not joined the manager at {} yet (the bootstrap token; see the daemon's log)",
                link.address
            )));
        }
        let mut r = Request::new(msg);
        if let Some(t) = &link.token.get() {
            knitter_api::process::bearer(&mut r, t)
                .map_err(|e| Status::internal(format!("the manager token: {e}")))?;
        }
        Ok(r)
    }

    /// One unary call with `req`, bounded by `deadline`.
    async fn call<T, R, Fut>(
        &self,
        req: Request<T>,
        deadline: Duration,
        f: impl FnOnce(ManagerClient<Channel>, Request<T>) -> Fut,
    ) -> Result<R, Status>
    where
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        match tokio::time::timeout(deadline, f(ManagerClient::new(self.channel.clone()), req)).await
        {
            Ok(r) => r.map(Response::into_inner),
            Err(_) => Err(Status::deadline_exceeded(format!("no answer within {deadline:?}"))),
        }
    }

    /// The manager's port for a pod's interface (made, or the one it has).
    pub async fn create_port(&self, spec: pb::PortSpec) -> Result<pb::Port, Status> {
        let req = self.request(spec)?;
        let made = self
            .call(req, CALL_DEADLINE, |mut c, r| async move { c.create_port(r).await })
            .await
            .map_err(|s| self.said(s))?;
        made.port.ok_or_else(|| Status::internal("the manager returned no port"))
    }

    /// Releases a pod interface's port (one the manager does not have is released).
    pub async fn delete_port(&self, name: pb::PortName) -> Result<(), Status> {
        let req = self.request(name)?;
        match self.call(req, CALL_DEADLINE, |mut c, r| async move { c.delete_port(r).await }).await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(s),
        }
    }

    /// Whether the manager answers this node (a list it may read), or why not.
    pub async fn reachable(&self) -> Result<(), String> {
        let req = self.request(pb::ListRequest::default()).map_err(|s| s.message().to_string())?;
        self.call(req, PROBE_DEADLINE, |mut c, r| async move { c.list_nodes(r).await })
            .await
            .map(drop)
            .map_err(|s| s.message().to_string())
    }

    /// Joins as this node with the bootstrap token: the node's own token.
    pub async fn join(&self, bootstrap: &str) -> Result<String, Status> {
        let mut req = Request::new(pb::Name { name: self.link.node_name.clone() });
        knitter_api::process::bearer(&mut req, bootstrap)
            .map_err(|e| Status::internal(format!("the bootstrap token: {e}")))?;
        Ok(self
            .call(req, CALL_DEADLINE, |mut c, r| async move { c.join_node(r).await })
            .await?
            .token)
    }

    /// Opens the sync stream, once the node has its token (waiting up to 30 s for a join).
    pub async fn sync(&self, msg: pb::SyncRequest) -> anyhow::Result<Streaming<pb::DesiredState>> {
        if self.link.join.is_some()
            && self.link.token.ready(Duration::from_secs(30)).await.is_none()
        {
            anyhow::bail!("not joined yet (the bootstrap token)");
        }
        let req = self.request(msg)?;
        Ok(ManagerClient::new(self.channel.clone()).sync(req).await?.into_inner())
    }

    /// The manager's refusal, or its absence, said for a CNI user: where the node looked for
    /// it, and what to check.
    fn said(&self, s: Status) -> Status {
        let address = &self.link.address;
        let unreachable = std::error::Error::source(&s).is_some()
            || matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
            );
        if unreachable {
            return Status::unavailable(format!(
                "the manager at {address} is unreachable (is knitter-manager running, and is --manager right?): {}",
                s.message()
            ));
        }
        Status::new(s.code(), format!("the manager at {address} refused: {}", s.message()))
    }
}
