//! The capabilities a sandbox keeps: Docker's default set. Every other
//! capability leaves the bounding set before the sandbox's workload runs, in
//! the ns backend (the init, before it execs the agent) and in the vm backend
//! (the guest agent, once it has built the sandbox's root).

use caps::Capability;

/// Docker's default capability set.
pub const SANDBOX_CAPS: [Capability; 14] = {
    use caps::Capability::*;
    [
        CAP_CHOWN,
        CAP_DAC_OVERRIDE,
        CAP_FOWNER,
        CAP_FSETID,
        CAP_KILL,
        CAP_SETGID,
        CAP_SETUID,
        CAP_SETPCAP,
        CAP_NET_BIND_SERVICE,
        CAP_NET_RAW,
        CAP_SYS_CHROOT,
        CAP_MKNOD,
        CAP_AUDIT_WRITE,
        CAP_SETFCAP,
    ]
};

/// Drops every capability not in [`SANDBOX_CAPS`] from the calling thread's
/// bounding, effective, permitted and inheritable sets.
pub fn drop_to_sandbox_caps() -> Result<(), String> {
    use caps::{CapSet, CapsHashSet};
    let keep: CapsHashSet = SANDBOX_CAPS.into_iter().collect();
    for cap in caps::all() {
        if !keep.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| format!("drop {cap}: {e}"))?;
        }
    }
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        let cur = caps::read(None, set).map_err(|e| format!("read caps: {e}"))?;
        caps::set(None, set, &cur.intersection(&keep).cloned().collect()).map_err(|e| format!("set caps: {e}"))?;
    }
    Ok(())
}
