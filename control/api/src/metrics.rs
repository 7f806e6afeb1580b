//! The Prometheus text exposition format (0.0.4), as knitter-vswitchd's and knitter-manager's
//! `GET /metrics` write it.

use std::fmt::Write;

/// A label value as the exposition format quotes it.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One metric family: its help, type and samples (value of `label`, value); an empty
/// `label` writes each sample without one.
pub fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (String, f64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (l, v) in samples {
        if label.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {v}", escape(&l));
        }
    }
}

/// `knitter_build_info{component,version} 1`: which build answers (as Prometheus' own
/// `*_build_info` gauges), so dashboards can tell nodes that run another version.
pub fn build_info(out: &mut String, component: &str, version: &str) {
    let name = "knitter_build_info";
    let _ = writeln!(
        out,
        "# HELP {name} 1, labelled with the component and its version.\n# TYPE {name} gauge"
    );
    let _ = writeln!(
        out,
        "{name}{{component=\"{}\",version=\"{}\"}} 1",
        escape(component),
        escape(version)
    );
}
