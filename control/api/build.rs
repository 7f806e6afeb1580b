fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every message also serializes to JSON (`knitterctl -o json`), enums by name.
    tonic_prost_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize)]")
        .compile_protos(&["proto/knitter/node/v1/node.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
