//! The etcd store: several managers on one etcd cluster, all serving. One key per address
//! and one per owner, under a configurable prefix:
//!
//! ```text
//! <prefix>/addrs/<network>/<ip-key>             → container \0 interface
//! <prefix>/owners/<network>/<container>/<iface> → ip
//! <prefix>/sticky/<network>/<ip-key>            → pod \0 until
//! <prefix>/records/<key>                         → JSON (version: the key's mod revision)
//! ```
//!
//! A claim is one transaction that creates both keys only if neither exists (create-revision
//! compares), and otherwise reads them back: no key that every allocation contends on, and a
//! retried request finds the address its first attempt took. Release deletes both keys only
//! while they still name each other. The trait is synchronous: calls run on the store's own
//! small runtime (call them from blocking threads, not from async tasks).

use super::{
    Claim, Cond, First, Op, OwnerKey, Store, StoreError, Versioned, With, ip_key, nothing,
    owner_value, parse_ip, parse_ip_key, parse_owner, parse_sticky, sticky_value,
};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use std::net::IpAddr;

pub struct Etcd {
    /// Always `Some` until dropped (then shut down without blocking, so an `Etcd` may be
    /// dropped anywhere, async tasks included).
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    prefix: String,
    /// The lease each expiring record is attached to (kept alive on each write).
    leases: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

/// How many candidates one range read covers.
const WINDOW: usize = 256;

fn err(e: etcd_client::Error) -> StoreError {
    StoreError(format!("etcd: {e}"))
}

fn text(v: &[u8]) -> Result<&str, StoreError> {
    std::str::from_utf8(v)
        .map_err(|_| StoreError("etcd: a value that is not UTF-8 under the prefix".into()))
}

/// How the manager proves itself to etcd: TLS (the CA etcd's certificate chains to, a client
/// certificate for `--client-cert-auth`) and a user with its password (etcd's `auth enable`).
#[derive(Debug, Clone, Default)]
pub struct EtcdAccess {
    /// PEM.
    pub ca: Option<Vec<u8>>,
    /// Certificate chain and key, PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// User name and password.
    pub user: Option<(String, String)>,
}

impl Etcd {
    /// Connects to `endpoints` (e.g. `http://127.0.0.1:2379`); keys go under `prefix`.
    pub fn connect(endpoints: &[String], prefix: &str) -> Result<Etcd, StoreError> {
        Etcd::connect_with(endpoints, prefix, &EtcdAccess::default())
    }

    /// As [`Etcd::connect`], with TLS and credentials (`https://` endpoints with `access.ca`).
    pub fn connect_with(
        endpoints: &[String],
        prefix: &str,
        access: &EtcdAccess,
    ) -> Result<Etcd, StoreError> {
        use etcd_client::{Certificate, Identity, TlsOptions};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(StoreError::from)?;
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(5))
            .with_timeout(std::time::Duration::from_secs(10));
        if access.ca.is_some() || access.identity.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &access.ca {
                tls = tls.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &access.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(tls);
        }
        if let Some((user, password)) = &access.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        let client = rt.block_on(Client::connect(endpoints, Some(opts))).map_err(err)?;
        Ok(Etcd {
            rt: Some(rt),
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            leases: Default::default(),
        })
    }

    fn addr_key(&self, network: &str, ip: IpAddr) -> String {
        format!("{}/addrs/{network}/{}", self.prefix, ip_key(ip))
    }

    fn owner_key(&self, network: &str, o: &OwnerKey) -> String {
        format!("{}/owners/{network}/{}/{}", self.prefix, o.container, o.interface)
    }

    fn sticky_key(&self, network: &str, ip: IpAddr) -> String {
        format!("{}/sticky/{network}/{}", self.prefix, ip_key(ip))
    }

    fn record_key(&self, key: &str) -> String {
        format!("{}/records/{key}", self.prefix)
    }

    /// The value of `key`, if it exists.
    fn get(&self, key: String) -> Result<Option<String>, StoreError> {
        let mut c = self.client.clone();
        let r = self.rt().block_on(c.get(key, None)).map_err(err)?;
        r.kvs().first().map(|kv| text(kv.value()).map(str::to_string)).transpose()
    }
}

/// The first key-value of a transaction's get responses, for each get in order.
fn gets(r: &etcd_client::TxnResponse) -> Vec<Option<String>> {
    r.op_responses()
        .iter()
        .map(|op| match op {
            TxnOpResponse::Get(g) => {
                g.kvs().first().and_then(|kv| text(kv.value()).ok().map(str::to_string))
            }
            _ => None,
        })
        .collect()
}

impl Store for Etcd {
    fn claim(&self, network: &str, ip: IpAddr, owner: &OwnerKey) -> Result<Claim, StoreError> {
        // Without records to write nothing but the claim's own keys can refuse it.
        Ok(self
            .claim_with(network, ip, owner, &[])?
            .unwrap_or(Claim::Taken(OwnerKey::new("(released meanwhile)", ""))))
    }

    fn claim_first(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
    ) -> Result<Option<IpAddr>, StoreError> {
        match self.scan_and_claim(network, candidates, owner, false, &nothing)? {
            First::Claimed(ip) => Ok(Some(ip)),
            First::AllTaken | First::Raced | First::Refused => Ok(None),
        }
    }

    fn claim_near(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
        with: With,
    ) -> Result<First, StoreError> {
        self.scan_and_claim(network, candidates, owner, true, with)
    }

    fn owned(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        self.get(self.owner_key(network, owner))?.map(|v| parse_ip(&v)).transpose()
    }

    fn release(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        let ok = self.owner_key(network, owner);
        // A few rounds: another manager may release or claim in between.
        for _ in 0..5 {
            let Some(held) = self.get(ok.clone())? else { return Ok(None) };
            let ip = parse_ip(&held)?;
            let ak = self.addr_key(network, ip);
            let txn = Txn::new()
                .when(vec![
                    Compare::value(ok.as_str(), CompareOp::Equal, held.as_str()),
                    Compare::value(ak.as_str(), CompareOp::Equal, owner_value(owner)),
                ])
                .and_then(vec![TxnOp::delete(ak.as_str(), None), TxnOp::delete(ok.as_str(), None)])
                .or_else(vec![TxnOp::get(ok.as_str(), None), TxnOp::get(ak.as_str(), None)]);
            let mut c = self.client.clone();
            let r = self.rt().block_on(c.txn(txn)).map_err(err)?;
            if r.succeeded() {
                return Ok(Some(ip));
            }
            if let [Some(now), by] = gets(&r).as_slice()
                && *now == held
                && by.as_deref() != Some(owner_value(owner).as_str())
            {
                // The owner key names an address another owner holds: drop only ours.
                let txn = Txn::new()
                    .when(vec![Compare::value(ok.as_str(), CompareOp::Equal, held.as_str())])
                    .and_then(vec![TxnOp::delete(ok.as_str(), None)]);
                let mut c = self.client.clone();
                if self.rt().block_on(c.txn(txn)).map_err(err)?.succeeded() {
                    return Ok(Some(ip));
                }
            }
        }
        Err(StoreError(format!("etcd: releasing {owner} in {network} kept racing; try again")))
    }

    fn remember(&self, network: &str, ip: IpAddr, pod: &str, until: u64) -> Result<(), StoreError> {
        let mut c = self.client.clone();
        self.rt()
            .block_on(c.put(self.sticky_key(network, ip), sticky_value(pod, until), None))
            .map_err(err)
            .map(drop)
    }

    fn remembered(&self, network: &str, ip: IpAddr) -> Result<Option<(String, u64)>, StoreError> {
        self.get(self.sticky_key(network, ip))?.map(|v| parse_sticky(&v)).transpose()
    }

    fn allocations(&self, network: &str) -> Result<Vec<(IpAddr, OwnerKey)>, StoreError> {
        let from = format!("{}/addrs/{network}/", self.prefix);
        let mut c = self.client.clone();
        let r = self
            .rt()
            .block_on(c.get(from.as_str(), Some(GetOptions::new().with_prefix())))
            .map_err(err)?;
        let mut out = Vec::with_capacity(r.kvs().len());
        for kv in r.kvs() {
            let k = text(kv.key())?;
            out.push((parse_ip_key(&k[from.len()..])?, parse_owner(text(kv.value())?)));
        }
        out.sort();
        Ok(out)
    }

    fn revision(&self) -> Result<u64, StoreError> {
        let mut c = self.client.clone();
        let r = self
            .rt()
            .block_on(c.get(format!("{}/", self.prefix), Some(GetOptions::new().with_count_only())))
            .map_err(err)?;
        Ok(r.header().map_or(0, |h| h.revision().max(0) as u64))
    }

    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(self.list_raw(&self.record_key(key), false)?.into_iter().next().map(|(_, v)| v))
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let base = self.record_key("");
        let rows = self.list_raw(&self.record_key(prefix), true)?;
        Ok(rows.into_iter().map(|(k, v)| (k[base.len()..].to_string(), v)).collect())
    }

    fn put_expiring(&self, key: &str, value: &str, ttl_secs: u64) -> Result<(), StoreError> {
        let k = self.record_key(key);
        self.rt().block_on(async {
            let id = self.lease_for(key, ttl_secs).await.map_err(err)?;
            let mut c = self.client.clone();
            c.put(k, value, Some(PutOptions::new().with_lease(id))).await.map_err(err).map(drop)
        })
    }

    /// An etcd watch on the records from `after + 1`; a compacted start revision ends it at
    /// once (the caller re-reads everything, which is what a compaction asks for).
    fn wait_change(&self, after: u64, timeout: std::time::Duration) -> Result<u64, StoreError> {
        let mut c = self.client.clone();
        let opts = WatchOptions::new().with_prefix().with_start_revision(after as i64 + 1);
        let changed = self.rt().block_on(async {
            let mut stream = c.watch(self.record_key(""), Some(opts)).await.map_err(err)?;
            let watched = async {
                while let Some(r) = stream.message().await.map_err(err)? {
                    if r.canceled() || !r.events().is_empty() {
                        return Ok::<_, StoreError>(());
                    }
                }
                Ok(())
            };
            match tokio::time::timeout(timeout, watched).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        });
        changed?;
        self.revision()
    }

    fn commit_at(&self, ops: &[Op]) -> Result<Option<u64>, StoreError> {
        let (when, then) = self.txn_parts(ops);
        let mut c = self.client.clone();
        let r = self.rt().block_on(c.txn(Txn::new().when(when).and_then(then))).map_err(err)?;
        Ok(r.succeeded().then(|| r.header().map_or(0, |h| h.revision().max(0) as u64)))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Etcd {
    /// Compacts etcd's history up to now (operators schedule this; etcd can do it itself
    /// with `--auto-compaction-retention`). Watches from before it end, and readers re-read.
    pub fn compact(&self) -> Result<u64, StoreError> {
        let rev = self.revision()?;
        let mut c = self.client.clone();
        self.rt().block_on(c.compact(rev as i64, None)).map_err(err)?;
        Ok(rev)
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the store")
    }

    /// A lease of `ttl_secs` for `key`: the one it has, kept alive, or a new one.
    async fn lease_for(&self, key: &str, ttl_secs: u64) -> Result<i64, etcd_client::Error> {
        let mut c = self.client.clone();
        let held = self.leases.lock().ok().and_then(|l| l.get(key).copied());
        if let Some(id) = held {
            let (mut keeper, mut answers) = c.lease_keep_alive(id).await?;
            keeper.keep_alive().await?;
            if answers.message().await?.is_some_and(|a| a.ttl() > 0) {
                return Ok(id);
            }
        }
        let id = c.lease_grant(ttl_secs.max(1) as i64, None).await?.id();
        if let Ok(mut l) = self.leases.lock() {
            l.insert(key.to_string(), id);
        }
        Ok(id)
    }

    /// Record ops as a transaction's compares and writes.
    fn txn_parts(&self, ops: &[Op]) -> (Vec<Compare>, Vec<TxnOp>) {
        let keys: Vec<String> = ops.iter().map(|op| self.record_key(&op.key)).collect();
        let when = ops
            .iter()
            .zip(&keys)
            .filter_map(|(op, k)| match op.cond? {
                Cond::Absent => Some(Compare::create_revision(k.as_str(), CompareOp::Equal, 0)),
                Cond::Version(v) => {
                    Some(Compare::mod_revision(k.as_str(), CompareOp::Equal, v as i64))
                }
            })
            .collect();
        let then = ops
            .iter()
            .zip(&keys)
            .filter_map(|(op, k)| match (&op.put, op.delete) {
                (Some(v), _) => Some(TxnOp::put(k.as_str(), v.as_str(), None)),
                (None, true) => Some(TxnOp::delete(k.as_str(), None)),
                (None, false) => None,
            })
            .collect();
        (when, then)
    }

    /// One transaction that creates `ip`'s and `owner`'s keys, and applies the record `ops`,
    /// only if neither key exists and every op's condition holds; otherwise reads the keys
    /// back. `None`: the keys were free but an op's condition failed (nothing written).
    fn claim_with(
        &self,
        network: &str,
        ip: IpAddr,
        owner: &OwnerKey,
        ops: &[Op],
    ) -> Result<Option<Claim>, StoreError> {
        let (ak, ok) = (self.addr_key(network, ip), self.owner_key(network, owner));
        let (mut when, mut then) = self.txn_parts(ops);
        when.extend([
            Compare::create_revision(ak.as_str(), CompareOp::Equal, 0),
            Compare::create_revision(ok.as_str(), CompareOp::Equal, 0),
        ]);
        then.extend([
            TxnOp::put(ak.as_str(), owner_value(owner), None),
            TxnOp::put(ok.as_str(), ip.to_string(), None),
        ]);
        let txn = Txn::new()
            .when(when)
            .and_then(then)
            .or_else(vec![TxnOp::get(ok.as_str(), None), TxnOp::get(ak.as_str(), None)]);
        let mut c = self.client.clone();
        let r = self.rt().block_on(c.txn(txn)).map_err(err)?;
        if r.succeeded() {
            return Ok(Some(Claim::Claimed));
        }
        match gets(&r).as_slice() {
            [Some(held), _] => {
                let held = parse_ip(held)?;
                Ok(Some(if held == ip { Claim::AlreadyYours } else { Claim::OwnerHas(held) }))
            }
            [None, Some(by)] => Ok(Some(Claim::Taken(parse_owner(by)))),
            // Both free: an op's condition failed, or a release raced us (without ops).
            _ => Ok(None),
        }
    }

    /// Applies the record `ops` for an address `owner` already holds, only while it holds
    /// it and every op's condition holds.
    fn records_for_held(
        &self,
        network: &str,
        owner: &OwnerKey,
        held: IpAddr,
        ops: &[Op],
    ) -> Result<bool, StoreError> {
        if ops.is_empty() {
            return Ok(true);
        }
        let ok = self.owner_key(network, owner);
        let (mut when, then) = self.txn_parts(ops);
        when.push(Compare::value(ok.as_str(), CompareOp::Equal, held.to_string()));
        let mut c = self.client.clone();
        Ok(self
            .rt()
            .block_on(c.txn(Txn::new().when(when).and_then(then)))
            .map_err(err)?
            .succeeded())
    }

    /// Claims the first free address of `candidates` for `owner`, reading which are held a
    /// window at a time (one keys-only range read of the window's span) and claiming only
    /// addresses read as free: a claim costs one read and one transaction however many
    /// addresses before it are taken, where claiming candidate by candidate cost one
    /// transaction each (3 003 for a replica's first allocation with 3 000 taken). A
    /// candidate read as free but claimed first by another allocator is a lost race: with
    /// `stop_on_race` the scan ends there ([`First::Raced`]); else it goes on.
    fn scan_and_claim(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
        stop_on_race: bool,
        with: With,
    ) -> Result<First, StoreError> {
        let mut window = Vec::with_capacity(WINDOW);
        let mut next = candidates.next();
        while let Some(first) = next.take() {
            // An ascending run of candidates: its span is one key range.
            window.clear();
            window.push(first);
            for ip in &mut *candidates {
                if window.len() == WINDOW || window.last().is_some_and(|last| ip <= *last) {
                    next = Some(ip);
                    break;
                }
                window.push(ip);
            }
            let (held, read_up_to) = self.held_between(network, &window)?;
            for &ip in window.iter().filter(|ip| held.binary_search(ip).is_err()) {
                let ops = with(ip)?;
                let owned = match self.claim_with(network, ip, owner, &ops)? {
                    Some(Claim::Claimed) => return Ok(First::Claimed(ip)),
                    Some(Claim::AlreadyYours) => ip,
                    Some(Claim::OwnerHas(held)) => held,
                    Some(Claim::Taken(_)) if stop_on_race && ip <= read_up_to => {
                        return Ok(First::Raced);
                    }
                    Some(Claim::Taken(_)) => continue,
                    None if ops.is_empty() => continue,
                    None => return Ok(First::Refused),
                };
                // A retry: the owner holds an address already; its records go with it.
                let ops = if owned == ip { ops } else { with(owned)? };
                return Ok(if self.records_for_held(network, owner, owned, &ops)? {
                    First::Claimed(owned)
                } else {
                    First::Refused
                });
            }
        }
        Ok(First::AllTaken)
    }

    /// The held addresses among an ascending `window` (sorted), and up to which address the
    /// read is complete (a read cut short by its limit knows nothing past its last key).
    fn held_between(
        &self,
        network: &str,
        window: &[IpAddr],
    ) -> Result<(Vec<IpAddr>, IpAddr), StoreError> {
        let (Some(&first), Some(&last)) = (window.first(), window.last()) else {
            return Err(StoreError("etcd: an empty window".into()));
        };
        let (from, to) =
            (self.addr_key(network, first), format!("{}\0", self.addr_key(network, last)));
        let base = format!("{}/addrs/{network}/", self.prefix);
        let opts = GetOptions::new().with_range(to).with_keys_only().with_limit(4 * WINDOW as i64);
        let mut c = self.client.clone();
        let r = self.rt().block_on(c.get(from, Some(opts))).map_err(err)?;
        let held = r
            .kvs()
            .iter()
            .map(|kv| parse_ip_key(&text(kv.key())?[base.len()..]))
            .collect::<Result<Vec<_>, _>>()?;
        let read_up_to = if r.more() { held.last().copied().unwrap_or(first) } else { last };
        Ok((held, read_up_to))
    }

    /// The records at `key` (or under it, as a prefix), with their versions.
    fn list_raw(&self, key: &str, prefix: bool) -> Result<Vec<(String, Versioned)>, StoreError> {
        let mut c = self.client.clone();
        let opts = prefix.then(|| GetOptions::new().with_prefix());
        let r = self.rt().block_on(c.get(key, opts)).map_err(err)?;
        r.kvs()
            .iter()
            .map(|kv| {
                let v = Versioned {
                    value: text(kv.value())?.to_string(),
                    version: kv.mod_revision().max(0) as u64,
                };
                Ok((text(kv.key())?.to_string(), v))
            })
            .collect()
    }
}
