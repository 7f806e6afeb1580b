//! The manager's objects as a document: what `knitterctl manager tenant|network|ipgroup
//! list|show -o yaml|json` prints (`tenants:`, `networks:`, `ipgroups:`, each object in the
//! REST API's JSON) and `knitterctl manager apply -f` takes back: what is missing created,
//! a tenant's quota and namespaces changed in place, an object as it is left alone.

use crate::Output;
use crate::out::{line, structured};
use crate::target::{Target, authed};
use anyhow::{Context, Result, bail};
use knitter_api::manager as pb;
use pb::manager_client::ManagerClient;
use serde::Serialize;
use serde_json::Value;
use tonic::transport::Channel;

/// The kinds a document holds, each under its key.
#[derive(Debug, Default)]
pub(crate) struct Document {
    /// Each tenant with whether it gives its namespaces (without, they are left as they are).
    tenants: Vec<(pb::Tenant, bool)>,
    networks: Vec<pb::Network>,
    ipgroups: Vec<pb::IpGroup>,
}

/// Prints `items` as a document of one kind (`tenants`, `networks`, `ipgroups`).
pub(crate) fn print<T: Serialize>(out: Output, kind: &str, items: &[T]) -> Result<()> {
    structured(out, &serde_json::json!({ kind: items }))
}

impl Document {
    /// Reads a document (`yaml` or `json`). Fields are checked as a strict parser would: one
    /// the API does not have (a typo) is refused, not ignored.
    pub(crate) fn parse(text: &str, format: &str) -> Result<Document> {
        let v: Value = match format {
            "" | "yaml" | "yml" => {
                knitter_api::yaml::from_str(text).context("the document (YAML)")?
            }
            "json" => serde_json::from_str(text).context("the document (JSON)")?,
            f => bail!("unknown document format {f:?}: yaml or json"),
        };
        let mut doc = Document::default();
        let Value::Object(map) = v else {
            bail!("a document is a map of tenants, networks and ipgroups")
        };
        for (key, items) in map {
            if !matches!(key.as_str(), "tenants" | "networks" | "ipgroups") {
                bail!("unknown kind {key:?}: tenants, networks or ipgroups");
            }
            let items = match items {
                Value::Null => Vec::new(),
                Value::Array(items) => items,
                _ => bail!("{key}: a list"),
            };
            for item in items {
                match key.as_str() {
                    "tenants" => {
                        let namespaces = item.get("namespaces").is_some();
                        doc.tenants.push((strict(item, "tenant")?, namespaces))
                    }
                    "networks" => doc.networks.push(strict(item, "network")?),
                    _ => doc.ipgroups.push(strict(item, "ipgroup")?),
                }
            }
        }
        Ok(doc)
    }
}

/// `item` as a `T`, refused if it has a field `T` does not (at any depth).
fn strict<T: serde::de::DeserializeOwned + Serialize>(item: Value, what: &str) -> Result<T> {
    let name = item.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    let t: T = serde_json::from_value(item.clone()).with_context(|| format!("{what} {name:?}"))?;
    if let Some(field) = unknown_field(&item, &serde_json::to_value(&t)?, "") {
        bail!("{what} {name:?}: unknown field {field:?}");
    }
    Ok(t)
}

/// The first field of `given` that `known` (every field of the type, written out) lacks.
fn unknown_field(given: &Value, known: &Value, path: &str) -> Option<String> {
    let (Value::Object(g), Value::Object(k)) = (given, known) else { return None };
    g.iter().find_map(|(key, v)| {
        let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        match k.get(key) {
            None => Some(at),
            Some(Value::Null) => None,
            Some(known) => unknown_field(v, known, &at),
        }
    })
}

/// Applies `doc`: tenants first, then networks, then IP groups (each may need the one
/// before). Each object's outcome is printed as it is known; a refusal stops there, with
/// the manager's reason (what came before it stays applied).
pub(crate) async fn apply(
    c: &mut ManagerClient<Channel>,
    t: &Target,
    out: Output,
    doc: Document,
) -> Result<()> {
    let mut report = Report::default();
    for (want, namespaces) in doc.tenants {
        let name = want.name.clone();
        let have = match c.get_tenant(authed(t, pb::Name { name: name.clone() })?).await {
            Err(s) if s.code() == tonic::Code::NotFound => None,
            r => Some(r?.into_inner()),
        };
        let Some(have) = have else {
            c.create_tenant(authed(
                t,
                pb::TenantSpec {
                    name: name.clone(),
                    quota: want.quota,
                    namespaces: want.namespaces,
                },
            )?)
            .await?;
            report.note(out, "tenant", &name, Outcome::Created);
            continue;
        };
        let mut outcome = Outcome::Unchanged;
        if want.quota.is_some() && want.quota != have.quota {
            c.set_quota(authed(t, pb::SetQuotaRequest { name: name.clone(), quota: want.quota })?)
                .await?;
            outcome = Outcome::Changed;
        }
        if namespaces && want.namespaces != have.namespaces {
            c.set_namespaces(authed(
                t,
                pb::SetNamespacesRequest { name: name.clone(), namespaces: want.namespaces },
            )?)
            .await?;
            outcome = Outcome::Changed;
        }
        report.note(out, "tenant", &name, outcome);
    }
    // A network and an IP group do not change in place: the same definition again is
    // unchanged, another one refused by the manager with its reason.
    for want in doc.networks {
        let name = want.name.clone();
        let r = c.create_network(authed(t, want)?).await?.into_inner();
        report.note(
            out,
            "network",
            &name,
            if r.created { Outcome::Created } else { Outcome::Unchanged },
        );
    }
    for want in doc.ipgroups {
        let name = format!("{}/{}", want.network, want.name);
        let spec = pb::IpGroupSpec {
            name: want.name,
            network: want.network,
            members: want.members,
            size: None,
            grace_secs: (want.grace_secs > 0).then_some(want.grace_secs),
        };
        let r = c.create_ip_group(authed(t, spec)?).await?.into_inner();
        report.note(
            out,
            "ipgroup",
            &name,
            if r.created { Outcome::Created } else { Outcome::Unchanged },
        );
    }
    match out {
        Output::Table if report.created.is_empty() && report.changed.is_empty() => {
            line(format_args!("nothing to change"))
        }
        Output::Table => {}
        out => structured(out, &report)?,
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Created,
    Changed,
    Unchanged,
}

/// What an apply did, by outcome ("tenant red", "ipgroup red/sbc").
#[derive(Debug, Default, Serialize)]
struct Report {
    created: Vec<String>,
    changed: Vec<String>,
    unchanged: Vec<String>,
}

impl Report {
    fn note(&mut self, out: Output, kind: &str, name: &str, outcome: Outcome) {
        let what = format!("{kind} {name}");
        let (list, verb) = match outcome {
            Outcome::Created => (&mut self.created, "created"),
            Outcome::Changed => (&mut self.changed, "changed"),
            Outcome::Unchanged => (&mut self.unchanged, "unchanged"),
        };
        if out == Output::Table {
            line(format_args!("{what}: {verb}"));
        }
        list.push(what);
    }
}

#[cfg(test)]
mod tests {
    use super::Document;

    #[test]
    fn a_field_the_api_lacks_is_refused_at_any_depth() {
        let ok = Document::parse("tenants:\n  - {name: red, quota: {networks: 3}}\nnetworks:\n  - {name: n, tenant: red, kind: vxlan, ipv4: {cidr: 10.0.0.0/24}}\n", "yaml").unwrap();
        assert_eq!((ok.tenants.len(), ok.networks.len()), (1, 1));
        let e = Document::parse(
            "networks:\n  - {name: n, ipv4: {cidr: 10.0.0.0/24, gatway: 10.0.0.1}}\n",
            "yaml",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("network \"n\": unknown field \"ipv4.gatway\""), "{e:#}");
        let e =
            Document::parse("ipgroups:\n  - {name: g, network: n, size: 4}\n", "yaml").unwrap_err();
        assert!(format!("{e:#}").contains("unknown field \"size\""), "{e:#}");
        let e = Document::parse("tenant: []\n", "yaml").unwrap_err();
        assert!(format!("{e:#}").contains("unknown kind \"tenant\""), "{e:#}");
        let quota_only =
            Document::parse("tenants:\n  - {name: red, quota: {networks: 8}}\nnetworks:\n", "yaml")
                .unwrap();
        assert!(!quota_only.tenants[0].1, "namespaces not given: left as they are");
    }
}
