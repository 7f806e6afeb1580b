fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every message also serializes to JSON (`knitterctl -o json`); an object's owner by
    // name ("local", "manager", "attach"), as knitterctl's tables say it.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let mut b = tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("knitter_descriptor.bin"))
        .type_attribute(".", "#[derive(serde::Serialize)]");
    for field in ["Bridge", "Port", "Vtep", "DeleteRequest", "ClearVtepRequest"] {
        b = b.field_attribute(
            format!(".knitter.node.v1.{field}.owner"),
            "#[serde(serialize_with = \"crate::owner_name\")]",
        );
    }
    b
        // The manager's messages carry the REST API's JSON field for field: one serde
        // conversion serves both APIs.
        .type_attribute(".knitter.manager", "#[derive(serde::Deserialize)] #[serde(default)]")
        .compile_protos(
            &["proto/knitter/node/v1/node.proto", "proto/knitter/manager/v1/manager.proto"],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
