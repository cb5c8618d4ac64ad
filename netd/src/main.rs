//! pvisor-netd (see the library's documentation for the process contract).
fn main() {
    eprintln!("pvisor-netd: not implemented yet");
    std::process::exit(2);
}
