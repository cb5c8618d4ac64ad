//! The guest kernel's command line: the kernel's own settings and the
//! agent's `pvisor.*` keys (read by the agent from `/proc/cmdline`).
use crate::config::VmConfig;

/// The vsock port the guest agent listens on.
pub const AGENT_PORT: u32 = 1024;

/// The command line for a sandbox (without the virtio-mmio device list,
/// which the engine appends where it places the devices). Both engines
/// attach the image disk first and the scratch disk second, so they are
/// `vda` and `vdb`. With `net`, `pvisor.net=1` tells the agent it has a
/// virtio-net device to configure as `eth0`.
pub fn cmdline(vm: &VmConfig, hostname: &str, net: bool) -> String {
    // reboot=t: a guest reboot ends in a triple fault, which ends the VM;
    // panic=-1: a panic reboots at once (so it ends the VM too).
    let mut c = format!(
        "console=ttyS0 reboot=t panic=-1 quiet i8042.noaux i8042.nomux i8042.nopnp \
         pvisor.root=/dev/vda pvisor.scratch=/dev/vdb pvisor.port={AGENT_PORT} pvisor.hostname={hostname}"
    );
    if net {
        c.push_str(" pvisor.net=1");
    }
    if !vm.cmdline_extra.is_empty() {
        c.push(' ');
        c.push_str(&vm.cmdline_extra);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_key_only_with_a_network() {
        let vm = VmConfig::default();
        assert!(!cmdline(&vm, "box", false).contains("pvisor.net"));
        let with = cmdline(&vm, "box", true);
        assert!(with.contains(" pvisor.net=1"), "{with}");
        assert!(with.contains("pvisor.hostname=box"), "{with}");
    }
}
