//! TCP tunnels to ports inside the sandbox's network namespace.
use pvisor_proto::agent::TunnelData;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

pub type TunnelTx = mpsc::Sender<Result<TunnelData, Status>>;

async fn connect(port: u16) -> std::io::Result<TcpStream> {
    match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => Ok(s),
        Err(e) => TcpStream::connect(("::1", port)).await.map_err(|_| e),
    }
}

/// Opens the connection named by the first message and pumps bytes both ways
/// until either side closes.
pub async fn open(mut inbound: Streaming<TunnelData>, tx: TunnelTx) -> Result<(), Status> {
    let first = inbound.message().await?.ok_or_else(|| Status::invalid_argument("tunnel opened without a port"))?;
    let port = u16::try_from(first.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Status::invalid_argument(format!("invalid port {}", first.port)))?;
    let sock =
        connect(port).await.map_err(|e| Status::unavailable(format!("connect to port {port} in the sandbox: {e}")))?;
    let (mut rd, mut wr) = sock.into_split();
    if !first.data.is_empty() {
        wr.write_all(&first.data).await.map_err(|e| Status::unavailable(e.to_string()))?;
    }
    tokio::spawn(async move {
        while let Ok(Some(m)) = inbound.message().await {
            if wr.write_all(&m.data).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let msg = TunnelData { port: 0, data: buf[..n].to_vec() };
                    if tx.send(Ok(msg)).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    Ok(())
}
