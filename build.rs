//! Generates the `archivist.v1` wire types, client and server from the proto,
//! with protoc taken from the `protoc-bin-vendored` crate so that a fresh
//! machine needs nothing installed by hand.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // `prost::Name` on every message: the terminal client finds a message's
    // descriptor by its full name to print it as JSON.
    config.enable_type_names();
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("archivist_descriptor.bin"))
        .compile_with_config(
            config,
            &[PathBuf::from("proto/archivist/v1/archivist.proto")],
            &[PathBuf::from("proto"), include],
        )?;
    Ok(())
}
