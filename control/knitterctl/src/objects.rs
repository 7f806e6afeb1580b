//! What the node's object commands (`bridge`, `port`, `vtep`, `node export`) share: a
//! change's outcome, the objects as a topology document (`-o yaml|json`, what `apply -f`
//! takes back), and one object picked by name.

use crate::Output;
use crate::out::{line, structured};
use anyhow::Result;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use tonic::transport::Channel;

/// A change the daemon applied: its configuration generation.
pub(crate) fn applied(out: Output, a: pb::Applied) -> Result<()> {
    if out != Output::Table {
        return structured(out, &a);
    }
    println!("ok (configuration generation {})", a.generation);
    Ok(())
}

/// Prints what the daemon exports for `req`: a topology document.
pub(crate) async fn print_export(
    c: &mut NodeClient<Channel>,
    req: pb::ExportRequest,
) -> Result<()> {
    let r = c.export(req).await?.into_inner();
    line(format_args!("{}", r.document.trim_end()));
    Ok(())
}

/// What an object command's `-o json|yaml` prints: the objects of `kind` (`bridges`,
/// `ports`, `vtep`; one if `name`), every owner's, as a topology document `apply -f` takes
/// back unchanged.
pub(crate) async fn document(
    c: &mut NodeClient<Channel>,
    out: Output,
    kind: &str,
    name: Option<String>,
) -> Result<()> {
    let format = if out == Output::Yaml { "yaml" } else { "json" };
    print_export(
        c,
        pb::ExportRequest {
            format: format.into(),
            kind: kind.into(),
            name: name.unwrap_or_default(),
            all_owners: true,
        },
    )
    .await
}

/// `items`, or only the one called `name` (refused as NOT_FOUND, as the daemon would, when
/// there is none).
pub(crate) fn named<T>(
    mut items: Vec<T>,
    name: Option<String>,
    kind: &str,
    name_of: impl Fn(&T) -> &str,
) -> Result<Vec<T>> {
    if let Some(name) = name {
        items.retain(|i| name_of(i) == name);
        if items.is_empty() {
            return Err(tonic::Status::not_found(format!("no {kind} {name:?}")).into());
        }
    }
    Ok(items)
}

/// Who owns an object, as the tables show it.
pub(crate) fn owner(o: i32) -> &'static str {
    match pb::Owner::try_from(o) {
        Ok(pb::Owner::Manager) => "manager",
        Ok(pb::Owner::Attach) => "attach",
        _ => "local",
    }
}

/// A policer's rates, as `knitterctl port add` takes them ("-": none).
pub(crate) fn policer(p: Option<&pb::Policer>) -> String {
    let Some(p) = p else { return "-".into() };
    let mut parts = Vec::new();
    if p.pps > 0 {
        parts.push(format!("{} pps", p.pps));
    }
    if p.bps > 0 {
        parts.push(format!("{} bps", p.bps));
    }
    parts.join(", ")
}
