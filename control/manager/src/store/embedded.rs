//! The embedded store: one `redb` file, for a single manager (the default). Every change is
//! one write transaction, made durable before it returns (redb's default: the commit is
//! fsynced), so a kill -9 leaves the store as it was before or after a change. Addresses
//! and owners are two tables, written in the same transaction; a revision counter counts
//! changes. Records are a third table, each value kept with the revision that wrote it (its
//! version).

use super::{
    Claim, First, Op, OwnerKey, Store, StoreError, Versioned, With, holds, ip_key, nothing,
    owner_value, parse_ip, parse_ip_key, parse_owner, parse_sticky, sticky_value,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::net::IpAddr;
use std::path::Path;

/// `network \0 ip` → `container \0 interface`.
const ADDRS: TableDefinition<&str, &str> = TableDefinition::new("addrs");
/// `network \0 container \0 interface` → `ip`.
const OWNERS: TableDefinition<&str, &str> = TableDefinition::new("owners");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// `network \0 ip` → `pod \0 until` (IP groups' stickiness).
const STICKY: TableDefinition<&str, &str> = TableDefinition::new("sticky");
/// Records: relative key → (version, JSON).
const RECORDS: TableDefinition<&str, (u64, &str)> = TableDefinition::new("records");
/// Records written with a time to live: key → expiry (Unix seconds).
const EXPIRES: TableDefinition<&str, u64> = TableDefinition::new("expires");

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
const REVISION: &str = "revision";

pub struct Embedded {
    db: Database,
}

fn addr_key(network: &str, ip: IpAddr) -> String {
    format!("{network}\0{}", ip_key(ip))
}

fn owner_key(network: &str, o: &OwnerKey) -> String {
    format!("{network}\0{}\0{}", o.container, o.interface)
}

impl Embedded {
    /// Opens (or creates) the store file.
    pub fn open(path: &Path) -> Result<Embedded, StoreError> {
        let db = Database::create(path)
            .map_err(|e| StoreError(format!("opening {}: {e}", path.display())))?;
        let tx = db.begin_write().map_err(StoreError::from)?;
        {
            tx.open_table(ADDRS).map_err(StoreError::from)?;
            tx.open_table(OWNERS).map_err(StoreError::from)?;
            tx.open_table(META).map_err(StoreError::from)?;
            tx.open_table(STICKY).map_err(StoreError::from)?;
            tx.open_table(RECORDS).map_err(StoreError::from)?;
            tx.open_table(EXPIRES).map_err(StoreError::from)?;
        }
        tx.commit().map_err(StoreError::from)?;
        Ok(Embedded { db })
    }

    /// Runs `f` in one write transaction; commits (and counts a revision) when it says so.
    fn write<R>(
        &self,
        f: impl FnOnce(
            &mut redb::Table<&str, &str>,
            &mut redb::Table<&str, &str>,
        ) -> Result<(R, bool), StoreError>,
    ) -> Result<R, StoreError> {
        let tx = self.db.begin_write().map_err(StoreError::from)?;
        let (r, changed) = {
            let mut addrs = tx.open_table(ADDRS).map_err(StoreError::from)?;
            let mut owners = tx.open_table(OWNERS).map_err(StoreError::from)?;
            f(&mut addrs, &mut owners)?
        };
        if changed {
            {
                let mut meta = tx.open_table(META).map_err(StoreError::from)?;
                let rev = meta.get(REVISION).map_err(StoreError::from)?.map_or(0, |v| v.value());
                meta.insert(REVISION, rev + 1).map_err(StoreError::from)?;
            }
            tx.commit().map_err(StoreError::from)?;
        } else {
            tx.abort().map_err(StoreError::from)?;
        }
        Ok(r)
    }
}

/// The revision the transaction's changes will carry.
fn next_revision(tx: &redb::WriteTransaction) -> Result<u64, StoreError> {
    let meta = tx.open_table(META).map_err(StoreError::from)?;
    Ok(meta.get(REVISION).map_err(StoreError::from)?.map_or(0, |v| v.value()) + 1)
}

/// Applies every record op at revision `rev` if every op's condition holds; says which.
/// The caller records the revision and commits (or aborts on `false`).
fn apply(tx: &redb::WriteTransaction, ops: &[Op], rev: u64) -> Result<bool, StoreError> {
    let mut records = tx.open_table(RECORDS).map_err(StoreError::from)?;
    for op in ops {
        let version = records.get(op.key.as_str()).map_err(StoreError::from)?.map(|v| v.value().0);
        if !holds(op.cond, version) {
            return Ok(false);
        }
    }
    let mut expires = tx.open_table(EXPIRES).map_err(StoreError::from)?;
    for op in ops {
        if let Some(value) = &op.put {
            records.insert(op.key.as_str(), (rev, value.as_str())).map_err(StoreError::from)?;
        } else if op.delete {
            records.remove(op.key.as_str()).map_err(StoreError::from)?;
        }
        if op.put.is_some() || op.delete {
            expires.remove(op.key.as_str()).map_err(StoreError::from)?;
        }
    }
    Ok(true)
}

/// Whether `key` was written with a time to live that has run out.
fn expired(tx: &redb::ReadTransaction, key: &str) -> Result<bool, StoreError> {
    let expires = tx.open_table(EXPIRES).map_err(StoreError::from)?;
    Ok(expires.get(key).map_err(StoreError::from)?.is_some_and(|t| t.value() <= unix_now()))
}

impl Store for Embedded {
    fn claim(&self, network: &str, ip: IpAddr, owner: &OwnerKey) -> Result<Claim, StoreError> {
        let (ak, ok) = (addr_key(network, ip), owner_key(network, owner));
        self.write(|addrs, owners| {
            if let Some(held) = owners.get(ok.as_str()).map_err(StoreError::from)? {
                let held = parse_ip(held.value())?;
                return Ok((
                    if held == ip { Claim::AlreadyYours } else { Claim::OwnerHas(held) },
                    false,
                ));
            }
            if let Some(by) = addrs.get(ak.as_str()).map_err(StoreError::from)? {
                return Ok((Claim::Taken(parse_owner(by.value())), false));
            }
            addrs.insert(ak.as_str(), owner_value(owner).as_str()).map_err(StoreError::from)?;
            owners.insert(ok.as_str(), ip.to_string().as_str()).map_err(StoreError::from)?;
            Ok((Claim::Claimed, true))
        })
    }

    fn claim_first(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
    ) -> Result<Option<IpAddr>, StoreError> {
        match self.claim_near(network, candidates, owner, &nothing)? {
            First::Claimed(ip) => Ok(Some(ip)),
            First::AllTaken | First::Raced | First::Refused => Ok(None),
        }
    }

    /// One write transaction: the owner's key, then candidates until a free one, then the
    /// records `with` makes for it (one writer at a time: no race is ever lost here).
    fn claim_near(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
        with: With,
    ) -> Result<First, StoreError> {
        let ok = owner_key(network, owner);
        let tx = self.db.begin_write().map_err(StoreError::from)?;
        let found = {
            let mut addrs = tx.open_table(ADDRS).map_err(StoreError::from)?;
            let mut owners = tx.open_table(OWNERS).map_err(StoreError::from)?;
            let held = owners
                .get(ok.as_str())
                .map_err(StoreError::from)?
                .map(|v| parse_ip(v.value()))
                .transpose()?;
            match held {
                Some(ip) => Some((ip, false)),
                None => {
                    let mut free = None;
                    for ip in candidates {
                        let ak = addr_key(network, ip);
                        if addrs.get(ak.as_str()).map_err(StoreError::from)?.is_none() {
                            addrs
                                .insert(ak.as_str(), owner_value(owner).as_str())
                                .map_err(StoreError::from)?;
                            owners
                                .insert(ok.as_str(), ip.to_string().as_str())
                                .map_err(StoreError::from)?;
                            free = Some((ip, true));
                            break;
                        }
                    }
                    free
                }
            }
        };
        let Some((ip, claimed)) = found else {
            tx.abort().map_err(StoreError::from)?;
            return Ok(First::AllTaken);
        };
        let ops = with(ip)?;
        let rev = next_revision(&tx)?;
        if !apply(&tx, &ops, rev)? {
            tx.abort().map_err(StoreError::from)?;
            return Ok(First::Refused);
        }
        if claimed || !ops.is_empty() {
            tx.open_table(META)
                .map_err(StoreError::from)?
                .insert(REVISION, rev)
                .map_err(StoreError::from)?;
            tx.commit().map_err(StoreError::from)?;
        } else {
            tx.abort().map_err(StoreError::from)?;
        }
        Ok(First::Claimed(ip))
    }

    fn owned(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        let tx = self.db.begin_read().map_err(StoreError::from)?;
        let owners = tx.open_table(OWNERS).map_err(StoreError::from)?;
        let held = owners.get(owner_key(network, owner).as_str()).map_err(StoreError::from)?;
        held.map(|v| parse_ip(v.value())).transpose()
    }

    fn release(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        let ok = owner_key(network, owner);
        self.write(|addrs, owners| {
            let Some(held) = owners.remove(ok.as_str()).map_err(StoreError::from)? else {
                return Ok((None, false));
            };
            let ip = parse_ip(held.value())?;
            drop(held);
            // Guarded by the owner: the address key goes only if it names this owner.
            let ak = addr_key(network, ip);
            let mine = addrs
                .get(ak.as_str())
                .map_err(StoreError::from)?
                .is_some_and(|v| parse_owner(v.value()) == *owner);
            if mine {
                addrs.remove(ak.as_str()).map_err(StoreError::from)?;
            }
            Ok((Some(ip), true))
        })
    }

    fn remember(&self, network: &str, ip: IpAddr, pod: &str, until: u64) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(StoreError::from)?;
        {
            let mut sticky = tx.open_table(STICKY).map_err(StoreError::from)?;
            sticky
                .insert(addr_key(network, ip).as_str(), sticky_value(pod, until).as_str())
                .map_err(StoreError::from)?;
        }
        tx.commit().map_err(StoreError::from)
    }

    fn remembered(&self, network: &str, ip: IpAddr) -> Result<Option<(String, u64)>, StoreError> {
        let tx = self.db.begin_read().map_err(StoreError::from)?;
        let sticky = tx.open_table(STICKY).map_err(StoreError::from)?;
        let Some(v) = sticky.get(addr_key(network, ip).as_str()).map_err(StoreError::from)? else {
            return Ok(None);
        };
        parse_sticky(v.value()).map(Some)
    }

    fn allocations(&self, network: &str) -> Result<Vec<(IpAddr, OwnerKey)>, StoreError> {
        let tx = self.db.begin_read().map_err(StoreError::from)?;
        let addrs = tx.open_table(ADDRS).map_err(StoreError::from)?;
        let (from, to) = (format!("{network}\0"), format!("{network}\u{1}"));
        let mut out = Vec::new();
        for row in addrs.range(from.as_str()..to.as_str()).map_err(StoreError::from)? {
            let (k, v) = row.map_err(StoreError::from)?;
            let ip = parse_ip_key(k.value().rsplit('\0').next().unwrap_or(""))?;
            out.push((ip, parse_owner(v.value())));
        }
        Ok(out)
    }

    fn revision(&self) -> Result<u64, StoreError> {
        let tx = self.db.begin_read().map_err(StoreError::from)?;
        let meta = tx.open_table(META).map_err(StoreError::from)?;
        Ok(meta.get(REVISION).map_err(StoreError::from)?.map_or(0, |v| v.value()))
    }

    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        let tx = self.db.begin_read().map_err(StoreError::from)?;
        let records = tx.open_table(RECORDS).map_err(StoreError::from)?;
        if expired(&tx, key)? {
            return Ok(None);
        }
        let row = records.get(key).map_err(StoreError::from)?;
        Ok(row.map(|v| {
            let (version, value) = v.value();
            Versioned { value: value.to_string(), version }
        }))
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let tx = self.db.begin_read().map_err(StoreError::from)?;
        let records = tx.open_table(RECORDS).map_err(StoreError::from)?;
        let mut out = Vec::new();
        for row in records.range(prefix..).map_err(StoreError::from)? {
            let (k, v) = row.map_err(StoreError::from)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            if expired(&tx, k.value())? {
                continue;
            }
            let (version, value) = v.value();
            out.push((k.value().to_string(), Versioned { value: value.to_string(), version }));
        }
        Ok(out)
    }

    fn put_expiring(&self, key: &str, value: &str, ttl_secs: u64) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(StoreError::from)?;
        {
            let mut meta = tx.open_table(META).map_err(StoreError::from)?;
            let rev = meta.get(REVISION).map_err(StoreError::from)?.map_or(0, |v| v.value()) + 1;
            meta.insert(REVISION, rev).map_err(StoreError::from)?;
            tx.open_table(RECORDS)
                .map_err(StoreError::from)?
                .insert(key, (rev, value))
                .map_err(StoreError::from)?;
            tx.open_table(EXPIRES)
                .map_err(StoreError::from)?
                .insert(key, unix_now() + ttl_secs)
                .map_err(StoreError::from)?;
        }
        tx.commit().map_err(StoreError::from)
    }

    fn commit_at(&self, ops: &[Op]) -> Result<Option<u64>, StoreError> {
        let tx = self.db.begin_write().map_err(StoreError::from)?;
        let rev = next_revision(&tx)?;
        if !apply(&tx, ops, rev)? {
            tx.abort().map_err(StoreError::from)?;
            return Ok(None);
        }
        tx.open_table(META)
            .map_err(StoreError::from)?
            .insert(REVISION, rev)
            .map_err(StoreError::from)?;
        tx.commit().map_err(StoreError::from)?;
        Ok(Some(rev))
    }
}
