//! etcd's own request counters, read from its `/metrics` endpoint: how many transactions,
//! range reads and raft proposals (writes, failed compares included) the IPAM cost. Shared
//! by the tests and the allocation bench.

use std::io::{Read, Write};

/// etcd's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Requests {
    pub txn: f64,
    pub range: f64,
    pub proposals: f64,
}

impl std::ops::Sub for Requests {
    type Output = Requests;
    fn sub(self, o: Requests) -> Requests {
        Requests {
            txn: self.txn - o.txn,
            range: self.range - o.range,
            proposals: self.proposals - o.proposals,
        }
    }
}

/// The counters of the etcd at `client_url` (`http://host:port`); zeros when unreachable.
pub fn requests(client_url: &str) -> Requests {
    let addr = client_url.trim_start_matches("http://");
    let mut body = String::new();
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        let _ = s.read_to_string(&mut body);
    }
    let sum = |pred: &dyn Fn(&str) -> bool| -> f64 {
        body.lines()
            .filter(|l| !l.starts_with('#') && pred(l))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let handled = |method: &str| {
        let m = format!("grpc_method=\"{method}\"");
        sum(&|l: &str| l.starts_with("grpc_server_handled_total") && l.contains(&m))
    };
    Requests {
        txn: handled("Txn"),
        range: handled("Range"),
        proposals: sum(&|l: &str| l.starts_with("etcd_server_proposals_committed_total")),
    }
}
