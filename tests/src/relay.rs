//! A TCP relay on loopback that can leave its connections half-open: the fault a peer
//! that dies without closing (a host gone, a partition) or a network that drops every
//! packet makes, which no signal to a local process reproduces (a stopped MariaDB's
//! kernel still completes handshakes and acknowledges bytes, and SIGCONT ends it).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Relays each connection to `target` until [`stall_open_connections`]; dropped, it
/// closes every connection it holds. On a thread and runtime of its own, as a network
/// would be: what the core's runtime does never holds its bytes up.
///
/// [`stall_open_connections`]: StallingRelay::stall_open_connections
pub struct StallingRelay {
    pub port: u16,
    stalls: watch::Sender<u64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StallingRelay {
    pub async fn start(target: SocketAddr) -> StallingRelay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stalls, watch) = watch::channel(0u64);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                // Every connection is a task of this runtime: it ends (and they close)
                // when the relay is dropped.
                let accept = async {
                    while let Ok((client, _)) = listener.accept().await {
                        tokio::spawn(relay(client, target, watch.clone()));
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        });
        StallingRelay {
            port,
            stalls,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Every connection open now stops carrying bytes, either way, and stays open: its
    /// ends wait for an answer that never comes. Connections opened later are relayed.
    pub fn stall_open_connections(&self) {
        self.stalls.send_modify(|n| *n += 1);
    }
}

impl Drop for StallingRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn relay(mut client: TcpStream, target: SocketAddr, mut stalls: watch::Receiver<u64>) {
    let born = *stalls.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if server.write_all(&up[..n]).await.is_err() { return },
            },
            read = server.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if client.write_all(&down[..n]).await.is_err() { return },
            },
            changed = stalls.changed() => {
                if changed.is_err() || *stalls.borrow() > born {
                    // Half-open from now on: both sockets held, nothing read or written.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}
