fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every message also serializes to JSON (`knitterctl -o json`), enums by name.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("knitter_descriptor.bin"))
        .type_attribute(".", "#[derive(serde::Serialize)]")
        // The manager's messages carry the REST API's JSON field for field: one serde
        // conversion serves both APIs.
        .type_attribute(".knitter.manager", "#[derive(serde::Deserialize)] #[serde(default)]")
        .compile_protos(&["proto/knitter/node/v1/node.proto", "proto/knitter/manager/v1/manager.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
