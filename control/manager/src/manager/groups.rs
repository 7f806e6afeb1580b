//! The manager's IP groups: a network's addresses held for a group (its members taken from
//! the network's space by the group itself) and handed to its pods.

use super::managed::ManagedBy;
use super::objects::{IpGroupRecord, IpGroupSpec, group_key, network_key};
use super::{
    Manager, ManagerError, Result, check_name, family, group_space, json, member_owner, space,
};
use crate::ipam::{self, Addressing, IpamError};
use crate::network::Network;
use crate::store::{Cond, Op, OwnerKey, With, nothing};
use std::net::IpAddr;

impl Manager {
    pub(super) fn addressing_for(net: &Network, v4: bool) -> Result<&Addressing> {
        net.families().find(|a| a.subnet().is_ipv4() == v4).ok_or_else(|| {
            ManagerError::Invalid(format!(
                "network {:?} has no {} subnet",
                net.spec.name,
                if v4 { "IPv4" } else { "IPv6" }
            ))
        })
    }

    /// Where an allocation in `space` starts looking: each concurrent request gets the
    /// next ticket, so requests in flight on this manager try different addresses instead
    /// of racing for one.
    pub(super) fn ticket(&self, space: &str, a: &Addressing) -> u128 {
        let Ok(mut c) = self.cursors.lock() else { return a.start_point() };
        let t = c.entry(space.to_string()).or_insert_with(|| a.start_point());
        let mine = *t;
        *t = t.wrapping_add(1);
        mine
    }

    /// After an allocation from ticket `t` got `ip`: skip what it found taken, or follow
    /// it back to the pools' start when it wrapped.
    pub(super) fn advance(&self, space: &str, t: u128, ip: IpAddr) {
        let n = ipam::hint_of(ip);
        if n == t.wrapping_add(1) {
            return;
        }
        if let Ok(mut c) = self.cursors.lock() {
            let cur = c.entry(space.to_string()).or_insert(0);
            *cur = if n <= t { n } else { (*cur).max(n) };
        }
    }

    /// An address of `space` for `owner` from this manager's cursor, with the records `with`
    /// makes for it written in the claim's transaction ([`ipam::allocate_with`]).
    pub(super) fn allocate(
        &self,
        space: &str,
        a: &Addressing,
        owner: &OwnerKey,
        with: With,
    ) -> Result<IpAddr, IpamError> {
        let t = self.ticket(space, a);
        let ip = ipam::allocate_with(self.store.as_ref(), space, a, owner, t, with)?;
        self.advance(space, t, ip);
        Ok(ip)
    }

    /// Reserves a group's members in the network's address space (claimed by the group).
    pub fn create_group(&self, spec: IpGroupSpec) -> Result<(IpGroupRecord, bool)> {
        self.create_group_by(spec, None)
    }

    /// [`Manager::create_group`] for `by` (a Kubernetes resource, recorded with the group in
    /// one commit) or over the API (`None`).
    pub fn create_group_by(
        &self,
        spec: IpGroupSpec,
        by: Option<&ManagedBy>,
    ) -> Result<(IpGroupRecord, bool)> {
        check_name("IP group", &spec.name)?;
        let (net, _) = self.network(&spec.network)?;
        let key = group_key(&spec.network, &spec.name);
        let same = |have: &IpGroupRecord| {
            have.grace_secs == spec.grace()
                && if spec.members.is_empty() {
                    spec.size == Some(have.members.len() as u32)
                } else {
                    have.members == spec.members
                }
        };
        if let Some((have, _)) = self.load::<IpGroupRecord>(&key)? {
            self.check_made_by(&key, "IP group", &format!("{}/{}", spec.network, spec.name), by)?;
            return if same(&have) {
                Ok((have, false))
            } else {
                Err(ManagerError::Conflict(format!(
                    "IP group {:?} of network {:?} exists with other members",
                    spec.name, spec.network
                )))
            };
        }
        let count = if spec.members.is_empty() {
            spec.size.unwrap_or(0) as usize
        } else {
            spec.members.len()
        };
        if !(1..=32).contains(&count)
            || (!spec.members.is_empty() && spec.size.is_some_and(|s| s as usize != count))
        {
            return Err(ManagerError::Invalid("an IP group has 1-32 members: give `members`, or `size` for that many free addresses".into()));
        }
        let v4 = spec.members.first().map_or(net.ipv4.is_some(), IpAddr::is_ipv4);
        if let Some(m) = spec.members.iter().find(|m| m.is_ipv4() != v4) {
            return Err(ManagerError::Invalid(format!(
                "IP group members are of one family: {m} is not {}",
                family(&spec.members[0])
            )));
        }
        if let Some((i, m)) =
            spec.members.iter().enumerate().find(|(i, m)| spec.members[..*i].contains(m))
        {
            return Err(ManagerError::Invalid(format!(
                "IP group member {m} is listed twice (position {i})"
            )));
        }
        let a = Self::addressing_for(&net, v4)?;
        let sp = space(&spec.network, v4);
        let mut members = Vec::with_capacity(count);
        for i in 0..count {
            let owner = member_owner(&spec.name, i);
            let r = match spec.members.get(i) {
                Some(m) => ipam::allocate_fixed(self.store.as_ref(), &sp, a, &owner, *m)
                    .map_err(ManagerError::from),
                None => self.allocate(&sp, a, &owner, &nothing).map_err(ManagerError::from),
            };
            match r {
                Ok(ip) => members.push(ip),
                Err(e) => {
                    self.release_members(&sp, &spec.name, i)?;
                    return Err(e);
                }
            }
        }
        let record = IpGroupRecord {
            name: spec.name.clone(),
            network: spec.network.clone(),
            members,
            grace_secs: spec.grace(),
        };
        let mut ops = vec![
            Op::create(&key, json(&record)?),
            Op::check(network_key(&spec.network), Cond::Version(self.network(&spec.network)?.1)),
        ];
        ops.extend(by.map(|b| b.record(&key)).transpose()?);
        if self.store.commit(&ops)? {
            return Ok((record, true));
        }
        // A concurrent create of the same group won (it holds these very claims): its record
        // is ours. Anything else: give the members back.
        match self.load::<IpGroupRecord>(&key)? {
            Some((have, _)) if have == record => Ok((have, false)),
            _ => {
                self.release_members(&sp, &spec.name, count)?;
                Err(ManagerError::Conflict(format!(
                    "IP group {:?} of network {:?} changed while being created",
                    spec.name, spec.network
                )))
            }
        }
    }

    pub(super) fn release_members(&self, sp: &str, group: &str, count: usize) -> Result<()> {
        for i in 0..count {
            self.store.release(sp, &member_owner(group, i))?;
        }
        Ok(())
    }

    pub fn get_group(&self, network: &str, name: &str) -> Result<IpGroupRecord> {
        self.load(&group_key(network, name))?.map(|(g, _)| g).ok_or_else(|| {
            ManagerError::NotFound { what: "IP group", name: format!("{network}/{name}") }
        })
    }

    /// The IP groups of `network` (every network's when empty).
    pub fn list_groups(&self, network: &str) -> Result<Vec<IpGroupRecord>> {
        let prefix = if network.is_empty() {
            "ipgroups/".to_string()
        } else {
            format!("ipgroups/{network}/")
        };
        Ok(self.load_all(&prefix)?.into_iter().map(|(g, _)| g).collect())
    }

    /// Deletes a group none of whose members a pod holds; its members go back to the network.
    /// A group a Kubernetes resource made is refused: deleting the resource deletes it.
    pub fn delete_group(&self, network: &str, name: &str) -> Result<Option<IpGroupRecord>> {
        self.delete_group_by(network, name, None)
    }

    /// [`Manager::delete_group`] for `by` (the resource that made it) or over the API.
    pub fn delete_group_by(
        &self,
        network: &str,
        name: &str,
        by: Option<&ManagedBy>,
    ) -> Result<Option<IpGroupRecord>> {
        let key = group_key(network, name);
        let Some((g, v)) = self.load::<IpGroupRecord>(&key)? else { return Ok(None) };
        let made_by = self.check_deleted_by(&key, "IP group", &format!("{network}/{name}"), by)?;
        let v4 = g.members.first().is_none_or(IpAddr::is_ipv4);
        let held = self.store.allocations(&group_space(network, v4, name))?;
        if let Some((ip, by)) = held.first() {
            return Err(ManagerError::InUse(format!(
                "IP group {name:?} still has {} members in use ({ip} by {by})",
                held.len()
            )));
        }
        let mut ops = vec![Op::delete(&key, v)];
        ops.extend(made_by);
        if !self.store.commit(&ops)? {
            return Err(ManagerError::Busy(format!("IP group {name:?} changed meanwhile")));
        }
        self.release_members(&space(network, v4), name, g.members.len())?;
        Ok(Some(g))
    }
}
