//! Generates the gRPC code and a file descriptor set for server reflection.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "pvisor/agent/v1/agent.proto",
        "pvisor/isolator/v1/isolator.proto",
        "pvisor/net/v1/net.proto",
        "pvisor/worker/v1/worker.proto",
        "pvisor/worker/v1/config.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("pvisor_descriptor.bin"))
        .compile_protos(&protos, &["."])?;
    Ok(())
}
