fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every message also serializes to JSON (`knitterctl -o json`), enums by name.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("knitter_descriptor.bin"))
        .type_attribute(".", "#[derive(serde::Serialize)]")
        .compile_protos(&["proto/knitter/node/v1/node.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
