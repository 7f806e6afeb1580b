//! Bindings to the installed DPDK (pkg-config `libdpdk`), generated at build time, and the
//! shim compiled with DPDK's cflags. Without DPDK (or with `KNITTER_NO_DPDK=1`) the crate
//! builds empty and says so through `dpdk_sys::AVAILABLE`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(dpdk)");
    for f in ["wrapper.h", "shim.h", "shim.c"] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=KNITTER_NO_DPDK");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if std::env::var_os("KNITTER_NO_DPDK").is_some_and(|v| v != "0") {
        return;
    }
    // The pkg-config crate's `Library` drops `-include rte_config.h` and `-march`: the raw
    // cflags go to both cc and bindgen.
    let Some(cflags) = Command::new("pkg-config")
        .args(["--cflags", "libdpdk"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        })
    else {
        println!(
            "cargo:warning=DPDK (libdpdk-dev) not found by pkg-config: knitter-dpdk-sys builds without it"
        );
        return;
    };
    if let Err(e) = pkg_config::Config::new().probe("libdpdk") {
        println!("cargo:warning=libdpdk: {e}: knitter-dpdk-sys builds without it");
        return;
    }
    let mut cc = cc::Build::new();
    cc.file("shim.c").opt_level(3).warnings(false);
    for f in &cflags {
        cc.flag(f);
    }
    cc.compile("knitter_dpdk_shim");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&cflags)
        .allowlist_function("rte_.*|shim_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*")
        .derive_default(true)
        .layout_tests(false)
        .prepend_enum_name(false)
        // A packed struct with a flexible array cannot derive Debug (rte_flow, pulled in by
        // rte_ethdev.h).
        .no_debug("rte_flow_item_gtp_psc")
        .wrap_unsafe_ops(true)
        .generate()
        .expect("bindgen over DPDK's headers (libclang-dev installed?)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings");
    println!("cargo:rustc-cfg=dpdk");
    println!("cargo:have=1");
}
