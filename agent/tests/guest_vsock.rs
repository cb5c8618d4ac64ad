//! The guest's vsock listener on this host's own vsock, through the
//! loopback transport: connect to the local CID twice (repeated accept),
//! bytes both ways, the peer's address as tonic's connect info.
//!
//! Needs the `vsock_loopback` transport. Where the host kernel lacks it (a
//! connect to the own CID fails with ENODEV; these hosts: vsock is built in
//! with only the virtio guest transport, no loadable modules) it cannot run,
//! so it is `#[ignore]`d (the runner reports it). The same listener is exercised for real inside the guest by
//! `guest_boot.rs` (the guest kernel has the loopback transport) and over
//! Unix sockets by the module's unit tests.
use pvisor_agent::guest::vsock::{local_cid, VsockListener, VsockStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::server::Connected;

const PORT: u32 = 47_123;

#[tokio::test]
#[ignore = "needs the vsock loopback transport (vsock_loopback), which these hosts' kernels lack (ENODEV); \
            the guest's vsock path is tested under QEMU by guest_boot; run with --ignored where it exists"]
async fn connects_twice_to_the_listener_over_loopback() {
    // Loads the transport where it is a module; failure just means it is not one.
    let _ = std::process::Command::new("modprobe").arg("vsock_loopback").output();
    let cid = match local_cid() {
        Ok(cid) => cid,
        Err(e) => panic!("no /dev/vsock to ask for the local CID ({e})"),
    };
    let listener = VsockListener::bind(PORT).expect("binding a vsock port works wherever /dev/vsock exists");
    assert_eq!(listener.local_port().unwrap(), PORT);
    for round in 0..2u8 {
        let mut client = match VsockStream::connect(cid, PORT).await {
            Ok(c) => c,
            Err(e) => panic!("round {round}: connect to CID {cid}: {e}"),
        };
        let mut server = listener.accept().await.unwrap();
        let peer = server.connect_info().peer.expect("a vsock peer has an address");
        assert_eq!(peer.cid, cid, "round {round}");
        client.write_all(&[round; 3]).await.unwrap();
        let mut buf = [0u8; 3];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, [round; 3]);
        server.write_all(b"ack").await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ack");
    }
}
