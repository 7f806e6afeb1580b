//! The manager's tenants: created (with a quota), listed, their quotas changed, deleted
//! once they own no network.

use super::objects::{Quota, Tenant, TenantSpec, tenant_key};
use super::{ADMIN, Manager, ManagerError, ROUNDS, Result, check_name, json, now};
use crate::store::Op;

impl Manager {
    /// Creates a tenant (with the configured default quota unless given); the same tenant
    /// again is a no-op (`false`), another quota a conflict.
    pub fn create_tenant(&self, name: &str, quota: Option<Quota>) -> Result<(Tenant, bool)> {
        self.create_tenant_with(TenantSpec { name: name.into(), quota, namespaces: Vec::new() })
    }

    /// [`Manager::create_tenant`] with the namespaces that belong to it without a label
    /// (`tenancy.rs`); the same tenant with other namespaces is a conflict.
    pub fn create_tenant_with(&self, spec: TenantSpec) -> Result<(Tenant, bool)> {
        let TenantSpec { name, quota, namespaces } = spec;
        let name = name.as_str();
        check_name("tenant", name)?;
        for ns in &namespaces {
            super::tenancy::check_namespace_entry(ns)?;
        }
        let t = Tenant {
            name: name.into(),
            quota: quota.unwrap_or(self.config.default_quota),
            created: now(),
            namespaces: namespaces.clone(),
        };
        let key = tenant_key(name);
        for _ in 0..ROUNDS {
            if let Some((have, _)) = self.load::<Tenant>(&key)? {
                if quota.is_some_and(|q| q != have.quota) {
                    return Err(ManagerError::Conflict(format!(
                        "tenant {name:?} exists with another quota (change it with a quota update)"
                    )));
                }
                if !namespaces.is_empty() && namespaces != have.namespaces {
                    return Err(ManagerError::Conflict(format!(
                        "tenant {name:?} exists with other namespaces (change them with a namespaces update)"
                    )));
                }
                return Ok((have, false));
            }
            self.check_unlisted(name, &namespaces)?;
            if self.store.commit(&[Op::create(&key, json(&t)?)])? {
                return Ok((t, true));
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }

    pub fn tenant(&self, name: &str) -> Result<Tenant> {
        self.load(&tenant_key(name))?
            .map(|(t, _)| t)
            .ok_or_else(|| ManagerError::NotFound { what: "tenant", name: name.into() })
    }

    pub fn tenants(&self) -> Result<Vec<Tenant>> {
        Ok(self.load_all("tenants/")?.into_iter().map(|(t, _)| t).collect())
    }

    pub fn set_quota(&self, name: &str, quota: Quota) -> Result<Tenant> {
        let key = tenant_key(name);
        for _ in 0..ROUNDS {
            let (mut t, v) = self
                .load::<Tenant>(&key)?
                .ok_or_else(|| ManagerError::NotFound { what: "tenant", name: name.into() })?;
            t.quota = quota;
            if self.store.commit(&[Op::replace(&key, Some(v), json(&t)?)])? {
                return Ok(t);
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }

    /// Deletes a tenant that owns no network; `None` if there was none.
    pub fn delete_tenant(&self, name: &str) -> Result<Option<Tenant>> {
        if name == ADMIN {
            return Err(ManagerError::Invalid("the admin tenant cannot be deleted".into()));
        }
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let Some((t, v)) = self.load::<Tenant>(&tenant_key(name))? else { return Ok(None) };
            let owned: Vec<String> = self
                .networks()?
                .into_iter()
                .filter(|n| n.spec.tenant == name)
                .map(|n| n.spec.name)
                .collect();
            if !owned.is_empty() {
                return Err(ManagerError::InUse(format!(
                    "tenant {name:?} still owns networks {}: delete them first",
                    owned.join(", ")
                )));
            }
            if self.store.commit(&[self.bump_guard(guard), Op::delete(tenant_key(name), v)])? {
                return Ok(Some(t));
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }
}
