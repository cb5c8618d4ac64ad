//! `pvisor-imaged`: serves one image of the pool read-only through FUSE. See
//! `pvisor_images::fuse::server` for the command line and the life cycle.

fn main() -> std::process::ExitCode {
    pvisor_images::fuse::server::main(std::env::args_os().skip(1))
}
