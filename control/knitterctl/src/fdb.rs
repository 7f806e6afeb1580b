//! `knitterctl fdb`: the node's forwarding table, shown and flushed.

use crate::Output;
use crate::out::{structured, table};
use anyhow::Result;
use clap::Subcommand;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub(crate) enum FdbCmd {
    Show {
        #[arg(long)]
        bridge: Option<String>,
    },
    /// Remove learned entries of a bridge domain or a port.
    Flush {
        #[arg(long, conflicts_with = "port", required_unless_present = "port")]
        bridge: Option<String>,
        #[arg(long)]
        port: Option<String>,
    },
}

pub(crate) async fn run(c: &mut NodeClient<Channel>, out: Output, cmd: FdbCmd) -> Result<()> {
    match cmd {
        FdbCmd::Show { bridge } => {
            let f = c
                .fdb_dump(pb::FdbRequest { bridge: bridge.unwrap_or_default() })
                .await?
                .into_inner();
            if out != Output::Table {
                return structured(out, &f);
            }
            table(
                &["bridge", "mac", "dest", "type", "age"],
                f.entries
                    .iter()
                    .map(|e| {
                        let age = if e.is_static { "-".into() } else { format!("{}s", e.age_secs) };
                        vec![
                            e.bridge.clone(),
                            e.mac.clone(),
                            e.dest.clone(),
                            if e.is_static { "static" } else { "learned" }.into(),
                            age,
                        ]
                    })
                    .collect(),
            );
        }
        FdbCmd::Flush { bridge, port } => {
            let r = c
                .fdb_flush(pb::FdbFlushRequest {
                    bridge: bridge.unwrap_or_default(),
                    port: port.unwrap_or_default(),
                })
                .await?;
            let r = r.into_inner();
            if out != Output::Table {
                structured(out, &r)?
            } else {
                println!("{} entries removed", r.removed)
            }
        }
    }
    Ok(())
}
