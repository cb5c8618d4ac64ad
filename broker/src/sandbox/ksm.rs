//! The host's kernel same-page merging (KSM) under `pvisor serve
//! --memory-merge` (issue 13).
//!
//! Each ns sandbox's init opts the sandbox into KSM (pvisor_worker::ksm);
//! pages are merged only while the host's ksmd runs (`/sys/kernel/mm/ksm/run`
//! = 1). At start a broker that may write `/sys/kernel/mm/ksm` (root) sets
//! the scan rate below and `run` = 1, after saving the host's previous
//! settings in `<data>/state/ksm-previous.json` (only the first broker to change
//! them saves, so a restarted broker does not take pvisor's own settings for
//! the host's). One that may not (unprivileged, read-only sysfs) leaves the
//! host's settings alone and says whether KSM runs: where it is off,
//! sandboxes are mergeable but nothing merges until the host turns it on.
//!
//! Scan rate: ksmd wakes every [`SLEEP_MILLISECS`] and looks at
//! [`PAGES_TO_SCAN`] pages, i.e. up to 50 000 pages (195 MiB) a second
//! instead of the kernel's default 5 000. A page merges on the scan after
//! the one that found its content stable, so 4 × 64 MiB of identical data
//! (65 536 pages) merges within a few full passes: 6–10 s measured on the
//! busy 2-core development host for 0.5 s of ksmd CPU
//! (bench/results/2026-12-01-memory-merge), where the kernel's default rate
//! would take about ten times as long. The cost is ksmd's CPU while there is
//! mergeable memory to walk (about 2% of a core holding those pages merged,
//! more while they change); `smart_scan` (on by default since 6.7) makes it
//! skip pages that repeatedly failed to merge.
//!
//! At a clean stop that leaves no sandbox running (`--stop-sandboxes-on-exit`,
//! or none were left) the saved settings are written back and the file
//! removed; merged pages stay merged until written (`run` = 0 only stops
//! scanning). A stop that leaves sandboxes running keeps KSM on for them and
//! the file for the broker that re-adopts them.
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where the kernel exposes KSM.
pub const KSM_DIR: &str = "/sys/kernel/mm/ksm";
/// Pages ksmd scans per wake-up (kernel default 100).
pub const PAGES_TO_SCAN: u64 = 1000;
/// ksmd's sleep between wake-ups, in milliseconds (kernel default 20).
pub const SLEEP_MILLISECS: u64 = 20;
/// The file (in the data dir's `state`) holding the host's settings from before pvisor.
pub const SAVED_FILE: &str = "ksm-previous.json";

#[derive(Debug, thiserror::Error)]
pub enum KsmError {
    #[error("--memory-merge: this kernel has no KSM ({0} is missing)")]
    Missing(PathBuf),
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path}: not a number: {text:?}")]
    Parse { path: PathBuf, text: String },
    #[error("{path}: {source}")]
    Saved { path: PathBuf, source: serde_json::Error },
}

type Result<T> = std::result::Result<T, KsmError>;

/// The host's page size in bytes (what KSM merges).
pub fn page_size() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(n)) if n > 0 => n as u64,
        _ => 4096,
    }
}

/// The settings pvisor changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub run: u64,
    pub pages_to_scan: u64,
    pub sleep_millisecs: u64,
}

/// pvisor's own settings.
pub const OURS: Settings = Settings { run: 1, pages_to_scan: PAGES_TO_SCAN, sleep_millisecs: SLEEP_MILLISECS };

/// What the broker did about the host's KSM at start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "control")]
pub enum Control {
    /// pvisor set [`OURS`] (and saved the host's previous settings).
    Pvisor,
    /// The broker may not change the settings; ksmd runs with the host's.
    Host,
    /// The broker may not change the settings and ksmd does not run:
    /// nothing merges.
    Off { reason: String },
}

/// The host's ksmd counters (`/sys/kernel/mm/ksm/*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub run: u64,
    pub pages_to_scan: u64,
    pub sleep_millisecs: u64,
    /// Merged pages in use (one per distinct content).
    pub pages_shared: u64,
    /// Page-table entries pointing at them beyond the first: pages saved.
    pub pages_sharing: u64,
    pub pages_unshared: u64,
    pub full_scans: u64,
    /// Bytes saved minus KSM's bookkeeping, host-wide.
    pub general_profit: i64,
}

pub struct HostKsm {
    dir: PathBuf,
    saved: PathBuf,
    pub control: Control,
}

fn read_num<T: std::str::FromStr>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| KsmError::Io {
        what: "read",
        path: path.to_path_buf(),
        source,
    })?;
    text.trim().parse().map_err(|_| KsmError::Parse { path: path.to_path_buf(), text: text.trim().to_string() })
}

fn write_num(path: &Path, v: u64) -> std::result::Result<(), std::io::Error> {
    std::fs::write(path, v.to_string())
}

fn read_settings(dir: &Path) -> Result<Settings> {
    Ok(Settings {
        run: read_num(&dir.join("run"))?,
        pages_to_scan: read_num(&dir.join("pages_to_scan"))?,
        sleep_millisecs: read_num(&dir.join("sleep_millisecs"))?,
    })
}

/// Writes `s`, `run` last (scanning starts at the rate asked for).
fn write_settings(dir: &Path, s: &Settings) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    for (name, v) in [("pages_to_scan", s.pages_to_scan), ("sleep_millisecs", s.sleep_millisecs), ("run", s.run)] {
        let p = dir.join(name);
        write_num(&p, v).map_err(|e| (p, e))?;
    }
    Ok(())
}

/// Whether an error means "not allowed here" rather than "broken".
fn refused(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::EROFS))
}

/// What a broker that may not change the settings (`e`) reports.
fn not_ours(dir: &Path, run: u64, e: &std::io::Error) -> Control {
    match run {
        1 => Control::Host,
        _ => Control::Off {
            reason: format!(
                "KSM is off ({}/run = {run}) and this broker may not turn it on ({e}); sandboxes are mergeable, \
                 but nothing merges until the host writes 1 there",
                dir.display()
            ),
        },
    }
}

impl HostKsm {
    /// Takes charge of the host's KSM in `dir` (normally [`KSM_DIR`]),
    /// saving its settings in `state_dir` (kept across broker restarts).
    pub fn start(dir: &Path, state_dir: &Path) -> Result<HostKsm> {
        if !dir.join("run").exists() {
            return Err(KsmError::Missing(dir.join("run")));
        }
        let saved = state_dir.join(SAVED_FILE);
        let before = read_settings(dir)?;
        let mut ksm = HostKsm { dir: dir.to_path_buf(), saved, control: Control::Pvisor };
        // Probe: writing the value it already has changes nothing.
        match write_num(&dir.join("pages_to_scan"), before.pages_to_scan) {
            Ok(()) => {}
            Err(e) if refused(&e) => {
                ksm.control = not_ours(dir, before.run, &e);
                return Ok(ksm);
            }
            Err(source) => return Err(KsmError::Io { what: "write", path: dir.join("pages_to_scan"), source }),
        }
        if !ksm.saved.exists() {
            let text =
                serde_json::to_vec(&before).map_err(|source| KsmError::Saved { path: ksm.saved.clone(), source })?;
            let tmp = ksm.saved.with_extension("tmp");
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, &ksm.saved))
                .map_err(|source| KsmError::Io { what: "write", path: ksm.saved.clone(), source })?;
        }
        write_settings(dir, &OURS).map_err(|(path, source)| KsmError::Io { what: "write", path, source })?;
        Ok(ksm)
    }

    /// The host's counters now (zeros for any that cannot be read).
    pub fn totals(&self) -> Totals {
        HostKsm::observe(&self.dir)
    }

    /// The counters of the KSM in `dir`, for a server that does not merge.
    pub fn observe(dir: &Path) -> Totals {
        let n = |name: &str| read_num::<u64>(&dir.join(name)).unwrap_or(0);
        Totals {
            run: n("run"),
            pages_to_scan: n("pages_to_scan"),
            sleep_millisecs: n("sleep_millisecs"),
            pages_shared: n("pages_shared"),
            pages_sharing: n("pages_sharing"),
            pages_unshared: n("pages_unshared"),
            full_scans: n("full_scans"),
            general_profit: read_num(&dir.join("general_profit")).unwrap_or(0),
        }
    }

    /// Writes the host's saved settings back and forgets them (nothing
    /// where pvisor did not change them).
    pub fn restore(&self) -> Result<()> {
        if self.control != Control::Pvisor || !self.saved.exists() {
            return Ok(());
        }
        let text = std::fs::read(&self.saved).map_err(|source| KsmError::Io {
            what: "read",
            path: self.saved.clone(),
            source,
        })?;
        let before: Settings =
            serde_json::from_slice(&text).map_err(|source| KsmError::Saved { path: self.saved.clone(), source })?;
        write_settings(&self.dir, &before).map_err(|(path, source)| KsmError::Io { what: "write", path, source })?;
        std::fs::remove_file(&self.saved).map_err(|source| KsmError::Io {
            what: "remove",
            path: self.saved.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `/sys/kernel/mm/ksm` and a run dir, removed with the returned guard.
    fn fake_sysfs(run: u64) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let base = tempfile::tempdir().unwrap();
        let (dir, run_dir) = (base.path().join("ksm"), base.path().join("run"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&run_dir).unwrap();
        for (f, v) in [("run", run), ("pages_to_scan", 100), ("sleep_millisecs", 20), ("pages_sharing", 7)] {
            std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
        }
        std::fs::write(dir.join("general_profit"), "-5\n").unwrap();
        (base, dir, run_dir)
    }

    #[test]
    fn start_sets_ours_and_restore_puts_the_host_back() {
        let (_base, dir, run_dir) = fake_sysfs(0);
        let k = HostKsm::start(&dir, &run_dir).unwrap();
        assert_eq!(k.control, Control::Pvisor);
        assert_eq!(read_settings(&dir).unwrap(), OURS);
        let t = k.totals();
        assert_eq!((t.run, t.pages_sharing, t.general_profit), (1, 7, -5));
        // A second broker (a restart) keeps the host's original settings saved.
        let again = HostKsm::start(&dir, &run_dir).unwrap();
        again.restore().unwrap();
        assert_eq!(read_settings(&dir).unwrap(), Settings { run: 0, pages_to_scan: 100, sleep_millisecs: 20 });
        assert!(!run_dir.join(SAVED_FILE).exists());
        // Nothing saved any more: a further restore changes nothing.
        k.restore().unwrap();
        assert_eq!(read_settings(&dir).unwrap().run, 0);
    }

    #[test]
    fn no_ksm_is_an_error() {
        let (_base, dir, run_dir) = fake_sysfs(0);
        std::fs::remove_file(dir.join("run")).unwrap();
        assert!(matches!(HostKsm::start(&dir, &run_dir), Err(KsmError::Missing(_))));
    }

    #[test]
    fn a_broker_that_may_not_write_reports_what_runs() {
        let e = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(refused(&e) && refused(&std::io::Error::from_raw_os_error(libc::EROFS)));
        assert!(!refused(&std::io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(not_ours(Path::new(KSM_DIR), 1, &e), Control::Host);
        match not_ours(Path::new(KSM_DIR), 0, &e) {
            Control::Off { reason } => assert!(reason.contains("/sys/kernel/mm/ksm/run = 0"), "{reason}"),
            c => panic!("{c:?}"),
        }
    }
}
