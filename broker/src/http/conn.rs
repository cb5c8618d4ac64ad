//! The accept loop: HTTP/1.1 connections served by hyper with the bounds a
//! hostile local client must not get past. Every connection has a slot
//! (`--max-connections`, optionally per peer); one over the cap is answered
//! a JSON 503 and closed at once, so a flood of connections cannot exhaust
//! the broker's file descriptors. Hyper's header read timeout closes a
//! connection that does not finish its request head in time, counted from
//! its start or from the end of its previous response (so idle keep-alive
//! connections and half-open ones alike go away), and its parser caps the
//! head's size (a backstop at twice `--max-header-bytes`: the request guard
//! answers the JSON 431 below that).
//!
//! HTTP/1.1 only: the OpenSandbox API and its SDKs speak HTTP/1.1, and the
//! protocol sniffing of an HTTP/2-capable server waits for a first byte with
//! no timeout of its own.
use super::limits::HttpLimits;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a connection over the cap gets before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 70\r\n\r\n\
{\"code\":\"TOO_MANY_CONNECTIONS\",\"message\":\"too many open connections\"}\n";

/// After a burst of at least this many connections has drained to
/// [`TRIM_BELOW`], the allocator is asked to give its free memory back: the
/// buffers of thousands of closed connections would otherwise stay resident.
const TRIM_AFTER: usize = 512;
const TRIM_BELOW: usize = 64;

/// Pause after an accept error (EMFILE and the like) before the next accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Open connections per peer address.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One peer's connection slot; released on drop.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    ip: IpAddr,
}

impl PeerCounts {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot { counts: self.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// A connection's slots, held until it closes.
struct Slots {
    _global: OwnedSemaphorePermit,
    _peer: Option<PeerSlot>,
}

struct Admit {
    global: Arc<Semaphore>,
    max: usize,
    peers: Arc<PeerCounts>,
    per_peer: usize,
    /// The most connections open at once since the last trim.
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

impl Admit {
    fn open(&self) -> usize {
        self.max - self.global.available_permits()
    }
}

/// Returns freed heap to the system once a burst of connections is over.
fn trim_after_burst(peak: &std::sync::atomic::AtomicUsize, open: usize) {
    use std::sync::atomic::Ordering;
    if open < TRIM_BELOW && peak.load(Ordering::Relaxed) >= TRIM_AFTER {
        peak.store(open, Ordering::Relaxed);
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free memory of glibc's arenas; it
        // takes the arenas' own locks and touches no memory still in use.
        unsafe {
            libc::malloc_trim(0);
        }
        tracing::debug!("connection burst over: free heap returned");
    }
}

impl Admit {
    fn slots(&self, ip: IpAddr) -> Option<Slots> {
        let global = self.global.clone().try_acquire_owned().ok()?;
        let peer = match self.per_peer {
            0 => None,
            max => Some(self.peers.take(ip, max)?),
        };
        Some(Slots { _global: global, _peer: peer })
    }
}

/// The hyper connection settings of `limits`.
fn builder(limits: &HttpLimits) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout())
        .keep_alive(true)
        // Hyper's own limits are the backstop; the guard answers in JSON below them.
        .max_buf_size((limits.max_header_bytes * 2).max(8192))
        .max_headers(limits.max_headers * 2);
    b
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open
/// connections finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &HttpLimits,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let admit = Admit {
        global: Arc::new(Semaphore::new(limits.max_connections)),
        max: limits.max_connections,
        peers: Arc::default(),
        per_peer: limits.max_connections_per_peer,
        peak: Arc::default(),
    };
    let builder = builder(limits);
    // Graceful shutdown, by hand: hyper-util's watcher does not take
    // connections with upgrades. `stop` tells every connection to finish its
    // request and close; `done` closes once every connection task is over.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(slots) = admit.slots(peer.ip()) else {
            refuse(tcp);
            continue;
        };
        admit.peak.fetch_max(admit.open(), std::sync::atomic::Ordering::Relaxed);
        // Small SSE frames and keep-alive clients: without TCP_NODELAY, Nagle
        // meets the client's delayed ACK and a command waits ~40 ms per frame.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        // Upgrades: `pvisor exec -it`'s terminal (api::pty).
        // An upgraded connection leaves its slot once the upgrade is done.
        let conn = builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone())).with_upgrades();
        let (global, max, peak) = (admit.global.clone(), admit.max, admit.peak.clone());
        let (mut stop, done) = (stop_rx.clone(), done_tx.clone());
        tokio::spawn(async move {
            tokio::pin!(conn);
            let r = tokio::select! {
                r = conn.as_mut() => r,
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                tracing::debug!(%peer, "connection: {e}");
            }
            drop(slots);
            trim_after_burst(&peak, max - global.available_permits());
            drop(done);
        });
    }
    drop(listener);
    let _ = stop_tx.send(());
    drop(done_tx);
    tokio::select! {
        _ = done_rx.recv() => {}
        _ = tokio::time::sleep(grace) => tracing::warn!("connections still open after {grace:?}; stopping anyway"),
    }
}

/// Answers a connection over the cap without waiting on it, then closes it.
fn refuse(tcp: TcpStream) {
    tracing::debug!("connection refused: too many open connections");
    let _ = tcp.try_write(BUSY);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_answer_is_well_formed_json() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length: ")).unwrap().parse().unwrap();
        assert_eq!(body.len(), len);
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], "TOO_MANY_CONNECTIONS");
    }

    #[test]
    fn peer_slots_are_counted_and_released() {
        let counts = Arc::new(PeerCounts::default());
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = counts.take(ip, 2).unwrap();
        let _b = counts.take(ip, 2).unwrap();
        assert!(counts.take(ip, 2).is_none());
        drop(a);
        assert!(counts.take(ip, 2).is_some());
    }
}
