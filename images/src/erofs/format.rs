//! The erofs on-disk structures this crate writes, and their little-endian
//! encodings: the superblock, compact (32-byte) and extended (64-byte)
//! inodes, directory entries and the inline xattr body.
//!
//! Only the uncompressed subset is covered (`FLAT_PLAIN` and `FLAT_INLINE`
//! data layouts, no shared xattrs, no extra devices, 4 KiB blocks). Field
//! offsets follow the kernel's `fs/erofs/erofs_fs.h`; decoders exist for the
//! few structures tests and readers of the produced image need.

/// log2 of the block size.
pub const BLOCK_BITS: u8 = 12;
/// Block size: 4 KiB, the only one the view produces.
pub const BLOCK_SIZE: usize = 1 << BLOCK_BITS;
/// The superblock starts at this absolute byte offset.
pub const SUPER_OFFSET: usize = 1024;
/// `erofs_super_block.magic`.
pub const SUPER_MAGIC: u32 = 0xE0F5_E1E2;
/// Size of the superblock without extension slots.
pub const SUPER_SIZE: usize = 128;
/// Inodes are addressed in slots of this size: `offset = meta_blkaddr *
/// BLOCK_SIZE + nid * INODE_SLOT`.
pub const INODE_SLOT: usize = 32;
/// `struct erofs_inode_compact`.
pub const COMPACT_INODE_SIZE: usize = 32;
/// `struct erofs_inode_extended`.
pub const EXTENDED_INODE_SIZE: usize = 64;
/// `struct erofs_dirent`.
pub const DIRENT_SIZE: usize = 12;
/// `struct erofs_xattr_ibody_header`.
pub const XATTR_IBODY_HEADER_SIZE: usize = 12;
/// `struct erofs_xattr_entry` (without its name and value).
pub const XATTR_ENTRY_HEADER_SIZE: usize = 4;
/// Longest file name a directory entry may hold.
pub const NAME_LEN: usize = 255;

/// `feature_compat`: the superblock carries a crc32c (not used here).
pub const FEATURE_COMPAT_SB_CHKSUM: u32 = 0x1;

/// Xattr name indexes (`e_name_index`): the prefix each stands for.
pub const XATTR_INDEX_NONE: u8 = 0;
pub const XATTR_INDEX_USER: u8 = 1;
pub const XATTR_INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const XATTR_INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const XATTR_INDEX_TRUSTED: u8 = 4;
pub const XATTR_INDEX_SECURITY: u8 = 6;

/// How an inode's data is stored (bits 1..=3 of `i_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataLayout {
    /// All data in consecutive blocks starting at the inode's block address.
    FlatPlain = 0,
    /// All but the last partial block in consecutive blocks; that tail
    /// right after the inode (and its xattrs) in the metadata.
    FlatInline = 2,
}

impl DataLayout {
    fn from_bits(bits: u16) -> Option<DataLayout> {
        match bits {
            0 => Some(DataLayout::FlatPlain),
            2 => Some(DataLayout::FlatInline),
            _ => None,
        }
    }
}

/// Directory entry file types (`EROFS_FT_*`, the kernel's `FT_*`).
pub mod file_type {
    pub const UNKNOWN: u8 = 0;
    pub const REG_FILE: u8 = 1;
    pub const DIR: u8 = 2;
    pub const CHRDEV: u8 = 3;
    pub const BLKDEV: u8 = 4;
    pub const FIFO: u8 = 5;
    pub const SOCK: u8 = 6;
    pub const SYMLINK: u8 = 7;

    /// The type code of an `st_mode`.
    pub fn from_mode(mode: u32) -> u8 {
        match mode & 0o170000 {
            0o100000 => REG_FILE,
            0o040000 => DIR,
            0o020000 => CHRDEV,
            0o060000 => BLKDEV,
            0o010000 => FIFO,
            0o140000 => SOCK,
            0o120000 => SYMLINK,
            _ => UNKNOWN,
        }
    }
}

fn put_u16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// `struct erofs_super_block` (the fields this crate sets; the rest are 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuperBlock {
    pub feature_compat: u32,
    /// Node number of the root directory (16 bits without the 48-bit feature).
    pub root_nid: u16,
    /// Number of inodes.
    pub inos: u64,
    /// Seconds since the epoch; the timestamp of every compact inode.
    pub build_time: u64,
    pub build_time_nsec: u32,
    /// Size of the file system in blocks.
    pub blocks: u32,
    /// Block where node number 0 lives.
    pub meta_blkaddr: u32,
    /// Block of the shared xattr area (unused: 0).
    pub xattr_blkaddr: u32,
    pub uuid: [u8; 16],
    pub volume_name: [u8; 16],
    pub feature_incompat: u32,
}

impl SuperBlock {
    /// The 128 bytes stored at [`SUPER_OFFSET`] (checksum 0).
    pub fn encode(&self) -> [u8; SUPER_SIZE] {
        let mut b = [0u8; SUPER_SIZE];
        put_u32(&mut b, 0x00, SUPER_MAGIC);
        put_u32(&mut b, 0x04, 0); // checksum: FEATURE_COMPAT_SB_CHKSUM is off
        put_u32(&mut b, 0x08, self.feature_compat);
        b[0x0C] = BLOCK_BITS;
        b[0x0D] = 0; // sb_extslots
        put_u16(&mut b, 0x0E, self.root_nid);
        put_u64(&mut b, 0x10, self.inos);
        put_u64(&mut b, 0x18, self.build_time);
        put_u32(&mut b, 0x20, self.build_time_nsec);
        put_u32(&mut b, 0x24, self.blocks);
        put_u32(&mut b, 0x28, self.meta_blkaddr);
        put_u32(&mut b, 0x2C, self.xattr_blkaddr);
        b[0x30..0x40].copy_from_slice(&self.uuid);
        b[0x40..0x50].copy_from_slice(&self.volume_name);
        put_u32(&mut b, 0x50, self.feature_incompat);
        // 0x54..: compression, devices, dirblkbits (0 = block size), long
        // xattr prefixes, packed inode: all unused.
        b
    }

    /// Parses the superblock at the start of `b` (which must hold at least
    /// [`SUPER_SIZE`] bytes); None if the magic or block size is wrong.
    pub fn decode(b: &[u8]) -> Option<SuperBlock> {
        if b.len() < SUPER_SIZE || get_u32(b, 0) != SUPER_MAGIC || b[0x0C] != BLOCK_BITS {
            return None;
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[0x30..0x40]);
        let mut volume_name = [0u8; 16];
        volume_name.copy_from_slice(&b[0x40..0x50]);
        Some(SuperBlock {
            feature_compat: get_u32(b, 0x08),
            root_nid: get_u16(b, 0x0E),
            inos: get_u64(b, 0x10),
            build_time: get_u64(b, 0x18),
            build_time_nsec: get_u32(b, 0x20),
            blocks: get_u32(b, 0x24),
            meta_blkaddr: get_u32(b, 0x28),
            xattr_blkaddr: get_u32(b, 0x2C),
            uuid,
            volume_name,
            feature_incompat: get_u32(b, 0x50),
        })
    }
}

/// An on-disk inode, compact or extended.
///
/// A compact inode has 16-bit ids and link count, a 32-bit size and no
/// timestamp of its own (it takes the superblock's `build_time`); whoever
/// builds one checks [`DiskInode::fits_compact`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskInode {
    pub extended: bool,
    pub layout: DataLayout,
    /// See [`xattr_icount`]; 0 without xattrs.
    pub xattr_icount: u16,
    /// `st_mode` (type and permission bits).
    pub mode: u16,
    pub nlink: u32,
    pub size: u64,
    /// `i_u`: the first data block (files, directories, symlinks) or the
    /// device number in the kernel's `new_encode_dev` form (devices).
    pub i_u: u32,
    /// Inode number for 32-bit `stat` (the kernel derives `st_ino` from the nid).
    pub ino: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch (extended inodes only).
    pub mtime: i64,
}

impl DiskInode {
    /// Whether the inode can be stored compact without losing anything,
    /// given the superblock's `build_time`.
    pub fn fits_compact(&self, build_time: i64) -> bool {
        self.mtime == build_time
            && self.uid <= u32::from(u16::MAX)
            && self.gid <= u32::from(u16::MAX)
            && self.nlink <= u32::from(u16::MAX)
            && self.size <= u64::from(u32::MAX)
    }

    /// Bytes of the inode itself (without xattrs or inline data).
    pub fn disk_size(&self) -> usize {
        if self.extended {
            EXTENDED_INODE_SIZE
        } else {
            COMPACT_INODE_SIZE
        }
    }

    fn format(&self) -> u16 {
        u16::from(self.extended) | ((self.layout as u16) << 1)
    }

    /// Writes the inode at the start of `out` ([`DiskInode::disk_size`]
    /// bytes). Values a compact inode cannot hold are truncated: check
    /// [`DiskInode::fits_compact`] first.
    pub fn encode_into(&self, out: &mut [u8]) {
        let out = &mut out[..self.disk_size()];
        out.fill(0);
        put_u16(out, 0x00, self.format());
        put_u16(out, 0x02, self.xattr_icount);
        put_u16(out, 0x04, self.mode);
        put_u32(out, 0x10, self.i_u);
        put_u32(out, 0x14, self.ino);
        if self.extended {
            // 0x06: i_nb (reserved without the 48-bit feature).
            put_u64(out, 0x08, self.size);
            put_u32(out, 0x18, self.uid);
            put_u32(out, 0x1C, self.gid);
            put_u64(out, 0x20, self.mtime as u64);
            put_u32(out, 0x28, 0); // mtime_nsec
            put_u32(out, 0x2C, self.nlink);
        } else {
            put_u16(out, 0x06, self.nlink as u16);
            put_u32(out, 0x08, self.size as u32);
            // 0x0C: mtime relative to build_time in newer kernels; older
            // ones ignore it. Always 0: compact inodes carry build_time.
            put_u16(out, 0x18, self.uid as u16);
            put_u16(out, 0x1A, self.gid as u16);
        }
    }

    /// Parses an inode at the start of `b`; `build_time` is the compact
    /// inodes' timestamp. None if the format bits are unknown or `b` is short.
    pub fn decode(b: &[u8], build_time: i64) -> Option<DiskInode> {
        if b.len() < COMPACT_INODE_SIZE {
            return None;
        }
        let format = get_u16(b, 0);
        if format & !0x0F != 0 {
            return None;
        }
        let layout = DataLayout::from_bits((format >> 1) & 0x7)?;
        let extended = format & 1 == 1;
        let common = |nlink, size, uid, gid, mtime| DiskInode {
            extended,
            layout,
            xattr_icount: get_u16(b, 0x02),
            mode: get_u16(b, 0x04),
            nlink,
            size,
            i_u: get_u32(b, 0x10),
            ino: get_u32(b, 0x14),
            uid,
            gid,
            mtime,
        };
        if extended {
            if b.len() < EXTENDED_INODE_SIZE {
                return None;
            }
            Some(common(
                get_u32(b, 0x2C),
                get_u64(b, 0x08),
                get_u32(b, 0x18),
                get_u32(b, 0x1C),
                get_u64(b, 0x20) as i64,
            ))
        } else {
            Some(common(
                u32::from(get_u16(b, 0x06)),
                u64::from(get_u32(b, 0x08)),
                u32::from(get_u16(b, 0x18)),
                u32::from(get_u16(b, 0x1A)),
                build_time,
            ))
        }
    }
}

/// `struct erofs_dirent`: one entry of a directory block. Names follow the
/// array of entries, unterminated; `nameoff` of the first entry divided by
/// [`DIRENT_SIZE`] is the number of entries in the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskDirent {
    pub nid: u64,
    /// Offset of the name within the directory block.
    pub nameoff: u16,
    pub file_type: u8,
}

impl DiskDirent {
    pub fn encode_into(&self, out: &mut [u8]) {
        put_u64(out, 0, self.nid);
        put_u16(out, 8, self.nameoff);
        out[10] = self.file_type;
        out[11] = 0;
    }

    pub fn decode(b: &[u8]) -> DiskDirent {
        DiskDirent { nid: get_u64(b, 0), nameoff: get_u16(b, 8), file_type: b[10] }
    }
}

/// Bytes of an inline xattr body (`i_xattr_icount` → size).
pub fn xattr_ibody_size(icount: u16) -> usize {
    match icount {
        0 => 0,
        n => XATTR_IBODY_HEADER_SIZE + 4 * (usize::from(n) - 1),
    }
}

/// `i_xattr_icount` of an inline xattr body of `len` bytes (a multiple of 4,
/// at least the header); None if the body is too large to describe.
pub fn xattr_icount(len: usize) -> Option<u16> {
    match len {
        0 => Some(0),
        _ if len < XATTR_IBODY_HEADER_SIZE || len & 3 != 0 => None,
        _ => u16::try_from((len - XATTR_IBODY_HEADER_SIZE) / 4 + 1).ok(),
    }
}

/// Bytes one xattr entry takes (header, name suffix, value, 4-byte padding).
pub fn xattr_entry_size(name_len: usize, value_len: usize) -> usize {
    (XATTR_ENTRY_HEADER_SIZE + name_len + value_len).next_multiple_of(4)
}

/// Writes the xattr body header with no shared xattrs (`h_name_filter` 0:
/// the filter feature is off).
pub fn encode_xattr_ibody_header(out: &mut [u8]) {
    out[..XATTR_IBODY_HEADER_SIZE].fill(0);
}

/// Writes one xattr entry at the start of `out`
/// ([`xattr_entry_size`] bytes, padding zeroed).
pub fn encode_xattr_entry(out: &mut [u8], index: u8, name: &[u8], value: &[u8]) {
    let size = xattr_entry_size(name.len(), value.len());
    let out = &mut out[..size];
    out.fill(0);
    out[0] = name.len() as u8;
    out[1] = index;
    put_u16(out, 2, value.len() as u16);
    let name_end = XATTR_ENTRY_HEADER_SIZE + name.len();
    out[XATTR_ENTRY_HEADER_SIZE..name_end].copy_from_slice(name);
    out[name_end..name_end + value.len()].copy_from_slice(value);
}

/// The kernel's `new_encode_dev`: the 32-bit device number erofs stores.
/// Majors above 4095 or minors above 2^20-1 do not fit and are truncated.
pub fn encode_dev(major: u64, minor: u64) -> u32 {
    let (major, minor) = (major as u32 & 0xfff, minor as u32 & 0xf_ffff);
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// The inverse of [`encode_dev`]: (major, minor).
pub fn decode_dev(dev: u32) -> (u64, u64) {
    let major = (dev & 0xfff00) >> 8;
    let minor = (dev & 0xff) | ((dev >> 12) & 0xfff00);
    (u64::from(major), u64::from(minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_sb() -> SuperBlock {
        SuperBlock {
            feature_compat: 0,
            root_nid: 36,
            inos: 1234,
            build_time: 1_700_000_000,
            build_time_nsec: 0,
            blocks: 0x0102_0304,
            meta_blkaddr: 0,
            xattr_blkaddr: 0,
            uuid: *b"0123456789abcdef",
            volume_name: *b"pvisor\0\0\0\0\0\0\0\0\0\0",
            feature_incompat: 0,
        }
    }

    #[test]
    fn superblock_layout() {
        let sb = sample_sb();
        let b = sb.encode();
        assert_eq!(b.len(), 128);
        assert_eq!(&b[0..4], &[0xE2, 0xE1, 0xF5, 0xE0], "magic, little-endian");
        assert_eq!(&b[4..8], &[0; 4], "no checksum");
        assert_eq!(b[12], 12, "blkszbits");
        assert_eq!(b[13], 0, "sb_extslots");
        assert_eq!(&b[14..16], &36u16.to_le_bytes());
        assert_eq!(&b[16..24], &1234u64.to_le_bytes());
        assert_eq!(&b[24..32], &1_700_000_000u64.to_le_bytes());
        assert_eq!(&b[36..40], &0x0102_0304u32.to_le_bytes());
        assert_eq!(&b[48..64], b"0123456789abcdef");
        assert_eq!(&b[64..70], b"pvisor");
        assert_eq!(&b[80..84], &[0; 4], "no incompatible features");
        assert!(b[84..].iter().all(|&x| x == 0));
        assert_eq!(SuperBlock::decode(&b), Some(sb));
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(SuperBlock::decode(&bad), None);
    }

    fn sample_inode(extended: bool) -> DiskInode {
        DiskInode {
            extended,
            layout: DataLayout::FlatInline,
            xattr_icount: 3,
            mode: 0o040755,
            nlink: 7,
            size: 4096 + 100,
            i_u: 42,
            ino: 9,
            uid: 1000,
            gid: 100,
            mtime: if extended { -5 } else { 1_600_000_000 },
        }
    }

    #[test]
    fn compact_inode_layout() {
        let i = sample_inode(false);
        assert_eq!(i.disk_size(), 32);
        let mut b = [0xAAu8; 32];
        i.encode_into(&mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 2 << 1, "compact, FLAT_INLINE");
        assert_eq!(&b[2..4], &3u16.to_le_bytes());
        assert_eq!(&b[4..6], &0o040755u16.to_le_bytes());
        assert_eq!(&b[6..8], &7u16.to_le_bytes());
        assert_eq!(&b[8..12], &4196u32.to_le_bytes());
        assert_eq!(&b[12..16], &[0; 4]);
        assert_eq!(&b[16..20], &42u32.to_le_bytes());
        assert_eq!(&b[20..24], &9u32.to_le_bytes());
        assert_eq!(&b[24..26], &1000u16.to_le_bytes());
        assert_eq!(&b[26..28], &100u16.to_le_bytes());
        assert_eq!(&b[28..32], &[0; 4]);
        assert_eq!(DiskInode::decode(&b, 1_600_000_000), Some(i.clone()));
        assert!(i.fits_compact(1_600_000_000));
        assert!(!i.fits_compact(1));
        assert!(!DiskInode { uid: 70_000, ..i.clone() }.fits_compact(1_600_000_000));
        assert!(!DiskInode { size: 1 << 32, ..i }.fits_compact(1_600_000_000));
    }

    #[test]
    fn extended_inode_layout() {
        let i = DiskInode { layout: DataLayout::FlatPlain, uid: 100_000, ..sample_inode(true) };
        assert_eq!(i.disk_size(), 64);
        let mut b = [0xAAu8; 64];
        i.encode_into(&mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 1, "extended, FLAT_PLAIN");
        assert_eq!(&b[6..8], &[0; 2]);
        assert_eq!(&b[8..16], &4196u64.to_le_bytes());
        assert_eq!(&b[16..20], &42u32.to_le_bytes());
        assert_eq!(&b[24..28], &100_000u32.to_le_bytes());
        assert_eq!(&b[28..32], &100u32.to_le_bytes());
        assert_eq!(&b[32..40], &(-5i64).to_le_bytes());
        assert_eq!(&b[40..44], &[0; 4]);
        assert_eq!(&b[44..48], &7u32.to_le_bytes());
        assert!(b[48..].iter().all(|&x| x == 0));
        assert_eq!(DiskInode::decode(&b, 0), Some(i));
    }

    #[test]
    fn dirent_layout() {
        let d = DiskDirent { nid: 0x1122_3344_5566, nameoff: 36, file_type: file_type::SYMLINK };
        let mut b = [0xAAu8; DIRENT_SIZE];
        d.encode_into(&mut b);
        assert_eq!(&b[0..8], &0x1122_3344_5566u64.to_le_bytes());
        assert_eq!(&b[8..10], &36u16.to_le_bytes());
        assert_eq!(b[10], 7);
        assert_eq!(b[11], 0);
        assert_eq!(DiskDirent::decode(&b), d);
    }

    #[test]
    fn xattr_sizes() {
        assert_eq!(xattr_ibody_size(0), 0);
        assert_eq!(xattr_ibody_size(1), 12);
        assert_eq!(xattr_ibody_size(4), 24);
        assert_eq!(xattr_icount(0), Some(0));
        assert_eq!(xattr_icount(12), Some(1));
        assert_eq!(xattr_icount(24), Some(4));
        assert_eq!(xattr_icount(13), None);
        assert_eq!(xattr_icount(12 + 4 * 70_000), None);
        for n in [1u16, 2, 100, u16::MAX] {
            assert_eq!(xattr_icount(xattr_ibody_size(n)), Some(n));
        }
        assert_eq!(xattr_entry_size(3, 0), 8);
        assert_eq!(xattr_entry_size(4, 4), 12);
        let mut b = [0xAAu8; 12];
        encode_xattr_entry(&mut b, XATTR_INDEX_USER, b"abc", b"xyz");
        assert_eq!(b, [3, 1, 3, 0, b'a', b'b', b'c', b'x', b'y', b'z', 0, 0]);
    }

    #[test]
    fn device_numbers() {
        assert_eq!(encode_dev(1, 3), 0x103);
        assert_eq!(encode_dev(8, 1), 0x801);
        assert_eq!(encode_dev(4, 300), (300 & 0xff) | (4 << 8) | ((300 & !0xff) << 12));
        for (major, minor) in [(0, 0), (1, 3), (4095, 0xf_ffff), (253, 65_536), (136, 255), (10, 256)] {
            assert_eq!(decode_dev(encode_dev(major, minor)), (major, minor));
        }
    }

    #[test]
    fn file_types() {
        assert_eq!(file_type::from_mode(0o100644), file_type::REG_FILE);
        assert_eq!(file_type::from_mode(0o040755), file_type::DIR);
        assert_eq!(file_type::from_mode(0o120777), file_type::SYMLINK);
        assert_eq!(file_type::from_mode(0o020666), file_type::CHRDEV);
        assert_eq!(file_type::from_mode(0o060660), file_type::BLKDEV);
        assert_eq!(file_type::from_mode(0o010644), file_type::FIFO);
    }
}
