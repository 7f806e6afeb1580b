//! `cfg(dpdk)` when knitter-dpdk-sys was built with DPDK.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(dpdk)");
    println!("cargo:rerun-if-env-changed=DEP_KNITTER_DPDK_HAVE");
    if std::env::var_os("DEP_KNITTER_DPDK_HAVE").is_some() {
        println!("cargo:rustc-cfg=dpdk");
    }
}
