//! Mount options of an image's FUSE mount.

use fuser::{Config, MountOption, SessionACL};

/// Worker threads serving requests. They share the one `/dev/fuse` fd (each blocks in `read`
/// and the kernel hands a request to one of them), so a slow chunk read (cold pack file,
/// decompression) does not hold up lookups and cached reads from other sandboxes.
pub const DEFAULT_THREADS: usize = 4;

/// What the mount of one image looks like.
#[derive(Clone, Debug)]
pub struct MountSpec<'a> {
    /// The image's id (`sha256:<hex>`); its first 12 hex digits name the mount.
    pub image_id: &'a str,
    /// `allow_other`: let every user reach the mount, not only the server's. Needed (and only
    /// allowed) as root, whose sandboxes run as other host uids.
    pub allow_other: bool,
    /// Worker threads; at least 1.
    pub threads: usize,
}

/// The fsname of an image's mount: `pvisor:<first 12 hex digits of the id>`.
pub fn fsname(image_id: &str) -> String {
    let hex = image_id.strip_prefix("sha256:").unwrap_or(image_id);
    format!("pvisor:{}", &hex[..hex.len().min(12)])
}

/// The fuser configuration of a mount: read-only, the kernel checks permissions
/// (`default_permissions`), no devices, no setuid, `allow_other` as root, fsname
/// `pvisor:<id>`, type `fuse.pvisor`.
///
/// The subtype goes in as a raw `subtype=` option: fuser's own `Subtype` is dropped by its
/// direct mount(2) path, while the kernel (and fusermount3) understand `subtype=`.
pub fn mount_config(spec: &MountSpec<'_>) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::FSName(fsname(spec.image_id)),
        MountOption::CUSTOM("subtype=pvisor".into()),
    ];
    config.acl = if spec.allow_other { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(spec.threads.max(1));
    // FUSE_DEV_IOC_CLONE would open /dev/fuse once per thread when the session starts, which
    // is after the seccomp filter; the threads share the mount's fd instead.
    config.clone_fd = false;
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_options() {
        assert_eq!(fsname("sha256:0123456789abcdef0123"), "pvisor:0123456789ab");
        assert_eq!(fsname("abc"), "pvisor:abc");
        let c = mount_config(&MountSpec { image_id: "sha256:ff", allow_other: true, threads: 0 });
        assert_eq!(c.acl, SessionACL::All);
        assert_eq!(c.n_threads, Some(1));
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(c.mount_options.contains(&MountOption::DefaultPermissions));
        assert!(c.mount_options.contains(&MountOption::FSName("pvisor:ff".into())));
        let c = mount_config(&MountSpec { image_id: "sha256:ff", allow_other: false, threads: 4 });
        assert_eq!(c.acl, SessionACL::Owner);
    }
}
